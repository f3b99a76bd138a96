// The reduce's radix sort against the one of another commit, side by side in one process: both sort
// the same values, interleaved, and must give the same bits. bench/analysis/radix_sort_against.sh
// compiles this file three times: with SORT_SIDE=before (analysis/radix_sort.cpp of the other commit,
// its namespace renamed), with SORT_SIDE=after (this tree's), and as the driver (no SORT_SIDE).
#include <cstddef>
#include <cstdint>

#if defined(SORT_SIDE)
#include "analysis/radix_sort.hpp"

#define SORT_JOIN2(a, b) a##b
#define SORT_JOIN(a, b) SORT_JOIN2(a, b)

// One sort of in[0, n) into out, the scratch kept between calls as the reduce keeps it.
extern "C" void SORT_JOIN(sort_, SORT_SIDE)(const float* in, float* out, std::size_t n) {
  static fastudy::ValueBuffer<std::uint32_t> scratch;
  fastudy::radix_sort_into(in, out, n, scratch);
}
#else
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" void sort_before(const float* in, float* out, std::size_t n);
extern "C" void sort_after(const float* in, float* out, std::size_t n);

namespace {

double seconds(void (*sort)(const float*, float*, std::size_t), const std::vector<float>& in, std::vector<float>& out) {
  const auto t0 = std::chrono::steady_clock::now();
  sort(in.data(), out.data(), in.size());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// radix_sort_against N [RUN] [REPEATS]: N(0, 0.02) weights (sorted in runs of RUN values if given).
int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: radix_sort_against N [RUN] [REPEATS]\n");
    return 2;
  }
  const std::size_t n = std::strtoull(argv[1], nullptr, 10), run = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 0;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 9;
  std::mt19937_64 rng(20241201);
  std::normal_distribution<double> weights(0.0, 0.02);
  std::vector<float> in(n), a(n), b(n);
  for (auto& v : in) v = static_cast<float>(weights(rng));
  if (run > 0)
    for (std::size_t at = 0; at < n; at += run)
      std::sort(in.begin() + static_cast<std::ptrdiff_t>(at), in.begin() + static_cast<std::ptrdiff_t>(std::min(n, at + run)));
  seconds(sort_before, in, a);  // each side's scratch pages, once
  seconds(sort_after, in, b);
  if (std::memcmp(a.data(), b.data(), n * sizeof(float)) != 0) {
    std::fprintf(stderr, "radix_sort_against: the two sorts differ on %zu values\n", n);
    return 1;
  }
  std::vector<double> tb, ta;
  for (int r = 0; r < repeats; ++r) {
    tb.push_back(seconds(sort_before, in, a));
    ta.push_back(seconds(sort_after, in, b));
  }
  std::sort(tb.begin(), tb.end());
  std::sort(ta.begin(), ta.end());
  const double mb = tb[tb.size() / 2], ma = ta[ta.size() / 2];
  std::printf("%zu values%s: before %.2f ns, after %.2f ns per value (medians of %d, interleaved): after / before %.3f\n", n,
              run > 0 ? (" in sorted runs of " + std::to_string(run)).c_str() : "", 1e9 * mb / static_cast<double>(n),
              1e9 * ma / static_cast<double>(n), repeats, ma / mb);
  return 0;
}
#endif
