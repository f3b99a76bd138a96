// The first element where two results of the attention kernels differ in their bits, named as a GPU
// engineer needs it: tensor, head, row, column, both values with their bits, and which thread block,
// warp, lane and register fragment of the tensor-core kernels (kernels/cuda/mma_attention.hpp) wrote it
// (O and dQ: blocks of 64 query rows; dK and dV: blocks of 64 keys; warps of 16 rows; the C fragment
// layout of mma.m16n8k16, kernels/cuda/mma_layout.hpp). Used by the CPU test of the warp simulation and
// the GPU tests, so that one failing run says where to look.
//
// B batch, H heads, N sequence, d head dim; tensors [B*H, N, d] row-major (lse: d = 1).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace fastudy::gpu_test {

// "" when a and b are equal bit for bit, else the description of their first difference.
inline std::string first_mismatch(const char* tensor, const std::vector<float>& got, const std::vector<float>& want,
                                  std::int64_t n, std::int64_t d) {
  if (got.size() != want.size()) {
    return std::string(tensor) + ": " + std::to_string(got.size()) + " values against " + std::to_string(want.size());
  }
  std::size_t differ = 0, first = got.size();
  for (std::size_t x = 0; x < got.size(); ++x) {
    if (std::memcmp(&got[x], &want[x], sizeof(float)) != 0) {
      if (differ == 0) first = x;
      ++differ;
    }
  }
  if (differ == 0) return "";
  const std::int64_t x = static_cast<std::int64_t>(first), head = x / (n * d), row = (x / d) % n, col = x % d;
  std::uint32_t gb, wb;
  std::memcpy(&gb, &got[first], 4);
  std::memcpy(&wb, &want[first], 4);
  const std::int64_t r16 = row % 16;
  const int lane = static_cast<int>(4 * (r16 % 8) + (col % 8) / 2);
  char buf[512];
  if (d == 1) {
    std::snprintf(buf, sizeof buf,
                  "%s[head %lld][row %lld]: %.9g (0x%08x) against %.9g (0x%08x); %zu of %zu values differ; "
                  "block %lld, warp %lld, lane %d (the quad's thread 0 of rows g, g + 8)",
                  tensor, static_cast<long long>(head), static_cast<long long>(row), static_cast<double>(got[first]),
                  gb, static_cast<double>(want[first]), wb, differ, got.size(), static_cast<long long>(row / 64),
                  static_cast<long long>((row % 64) / 16), static_cast<int>(4 * (r16 % 8)));
  } else {
    std::snprintf(buf, sizeof buf,
                  "%s[head %lld][row %lld][col %lld]: %.9g (0x%08x) against %.9g (0x%08x); %zu of %zu values differ; "
                  "block %lld, warp %lld, lane %d (group %lld, thread %lld), fragment [%lld][%lld] (n-tile %lld, "
                  "C element %lld: row g%s, col 2t%s)",
                  tensor, static_cast<long long>(head), static_cast<long long>(row), static_cast<long long>(col),
                  static_cast<double>(got[first]), gb, static_cast<double>(want[first]), wb, differ, got.size(),
                  static_cast<long long>(row / 64), static_cast<long long>((row % 64) / 16), lane,
                  static_cast<long long>(r16 % 8), static_cast<long long>((col % 8) / 2), static_cast<long long>(col / 8),
                  static_cast<long long>(2 * (r16 / 8) + col % 2), static_cast<long long>(col / 8),
                  static_cast<long long>(2 * (r16 / 8) + col % 2), r16 >= 8 ? " + 8" : "", col % 2 ? " + 1" : "");
  }
  return buf;
}

}  // namespace fastudy::gpu_test
