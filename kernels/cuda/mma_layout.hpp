// Where each value of a warp's tensor-core operands lives: the lane and register maps of mma.sync
// m16n8k16 (fp16/bf16 A and B, fp32 C/D) and of ldmatrix m8n8.x4, the padded shared-memory rows the
// tiles use, and the packing of two fp16/bf16 values into one 32-bit register. Every map is a
// FASTUDY_HD function: the device kernels (kernels/cuda/mma_attention.hpp) index with them, and the host
// warp simulation (tests/gpu/warp_sim.hpp) moves data with the same functions, so a CPU test checks
// the layouts the GPU uses.
//
// Source: PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" and "ldmatrix"
// (groupID = lane / 4, threadID_in_group = lane % 4; in a 32-bit register the lower-indexed element
// is the low half):
//   A (16 x 16, row): element a_i (i < 8, register i / 2) at row g + 8 ((i / 2) % 2), column
//                     2t + (i % 2) + 8 (i / 4);
//   B (16 x 8, col):  b_i (i < 4, register i / 2) at row (k) 2t + (i % 2) + 8 (i / 2), column (n) g;
//   C, D (16 x 8):    c_i (i < 4) at row g + 8 (i / 2), column 2t + (i % 2);
//   ldmatrix .x4:     lane l gives the address of row l % 8 of matrix l / 8; register j of lane l gets
//                     row l / 4, columns 2 (l % 4), +1 of matrix j (.trans: rows 2 (l % 4), +1 of
//                     column l / 4).
#pragma once

#include <cstdint>
#include <cstring>

#include "base/host_device.hpp"
#include "kernels/format.hpp"

namespace fastudy::cuda_mma {

constexpr int kWarpSize = 32;

struct RowCol {
  int row, col;
};

FASTUDY_HD inline int group_of(int lane) { return lane >> 2; }
FASTUDY_HD inline int thread_in_group(int lane) { return lane & 3; }

// Element i (0..7) of lane's A fragment, i (0..3) of its B fragment, i (0..3) of its C/D fragment.
FASTUDY_HD inline RowCol a_element(int lane, int i) {
  return {group_of(lane) + 8 * ((i >> 1) & 1), 2 * thread_in_group(lane) + (i & 1) + 8 * (i >> 2)};
}
FASTUDY_HD inline RowCol b_element(int lane, int i) {
  return {2 * thread_in_group(lane) + (i & 1) + 8 * (i >> 1), group_of(lane)};
}
FASTUDY_HD inline RowCol c_element(int lane, int i) {
  return {group_of(lane) + 8 * (i >> 1), 2 * thread_in_group(lane) + (i & 1)};
}

// ldmatrix .x4: the (matrix, row) whose address lane gives, and the (row, col) within matrix j that half h
// (0 low, 1 high) of lane's register j receives.
FASTUDY_HD inline int ldsm_matrix_of(int lane) { return lane >> 3; }
FASTUDY_HD inline int ldsm_row_of(int lane) { return lane & 7; }
FASTUDY_HD inline RowCol ldsm_element(int lane, int half, bool trans) {
  return trans ? RowCol{2 * thread_in_group(lane) + half, group_of(lane)}
               : RowCol{group_of(lane), 2 * thread_in_group(lane) + half};
}

// The tile rows whose addresses lane gives to ldmatrix .x4 for the three operand loads of the kernels,
// as (tile row, tile column) of the element the address points at, for a 16 x 16 block starting at
// (r0, c0) of a row-major tile:
//   a_rows   the A fragment of rows r0.. (M) and columns c0.. (K): matrices (rows 0-7, k 0-7), (rows 8-15,
//            k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) = registers a0a1, a2a3, a4a5, a6a7.
//   b_nmajor the B fragments of two n-tiles, the tile holding B transposed (row = n, col = k; K in
//            S = Q K^T): matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) =
//            b0b1 and b2b3 of n-tile 0, then of n-tile 1 (non-transposing load).
//   b_kmajor the B fragments of two n-tiles, the tile holding B as is (row = k, col = n; V in O = P V):
//            matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15), transposing load.
FASTUDY_HD inline RowCol ldsm_a_address(int lane, int r0, int c0) {
  const int m = ldsm_matrix_of(lane);
  return {r0 + ldsm_row_of(lane) + 8 * (m & 1), c0 + 8 * (m >> 1)};
}
FASTUDY_HD inline RowCol ldsm_b_nmajor_address(int lane, int n0, int k0) {
  const int m = ldsm_matrix_of(lane);
  return {n0 + ldsm_row_of(lane) + 8 * (m >> 1), k0 + 8 * (m & 1)};
}
FASTUDY_HD inline RowCol ldsm_b_kmajor_address(int lane, int k0, int n0) {
  const int m = ldsm_matrix_of(lane);
  return {k0 + ldsm_row_of(lane) + 8 * (m & 1), n0 + 8 * (m >> 1)};
}

// A tile of `rows` rows of `cols` 16-bit elements in shared memory, each row padded by 8 elements
// (16 bytes): the 8 rows one ldmatrix matrix reads then start 16 bytes apart modulo 128 and fall on
// distinct banks for any cols that is a multiple of 8 (a multiple of 16 bytes keeps every row start
// 16-byte aligned, as ldmatrix and cp.async need).
FASTUDY_HD inline int padded_stride(int cols) { return cols + 8; }
FASTUDY_HD inline int tile_offset(int row, int col, int cols) { return row * padded_stride(cols) + col; }
FASTUDY_HD inline int tile_elements(int rows, int cols) { return rows * padded_stride(cols); }

// The bits of a float that holds an fp16 or bf16 value exactly (values the tiles rounded already), and
// back: bf16 is the float's upper half; fp16 is rebuilt from the exponent and fraction (subnormals
// included). Integer operations only, the same on host and device.
template <Format S>
FASTUDY_HD inline std::uint16_t storage_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if constexpr (S == Format::bf16) {
    return static_cast<std::uint16_t>(u >> 16);
  } else {
    static_assert(S == Format::fp16, "storage_bits: fp16 or bf16");
    const std::uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7C00u | (a > 0x7F800000u ? 0x200u : 0u));
    if (a < 0x38800000u) {  // below 2^-14: a multiple of 2^-24 (zero or an fp16 subnormal)
      float v;
      std::memcpy(&v, &a, 4);
      return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(v * 16777216.0f));
    }
    return static_cast<std::uint16_t>(sign | (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3FFu));
  }
}
template <Format S>
FASTUDY_HD inline float storage_value(std::uint16_t b) {
  std::uint32_t u;
  if constexpr (S == Format::bf16) {
    u = static_cast<std::uint32_t>(b) << 16;
  } else {
    static_assert(S == Format::fp16, "storage_value: fp16 or bf16");
    const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x8000u) << 16, e = (b >> 10) & 0x1Fu, f = b & 0x3FFu;
    if (e == 0x1Fu) {
      u = sign | 0x7F800000u | (f << 13);
    } else if (e == 0) {  // zero or subnormal: f * 2^-24, exact in float
      float v = static_cast<float>(f) * 5.9604644775390625e-8f;
      std::memcpy(&u, &v, 4);
      u |= sign;
    } else {
      u = sign | ((e + 112u) << 23) | (f << 13);
    }
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
template <Format S>
FASTUDY_HD inline std::uint32_t pack2(float lo, float hi) {
  return static_cast<std::uint32_t>(storage_bits<S>(lo)) | (static_cast<std::uint32_t>(storage_bits<S>(hi)) << 16);
}
template <Format S>
FASTUDY_HD inline float unpack_half(std::uint32_t r, int half) {
  return storage_value<S>(static_cast<std::uint16_t>(half ? r >> 16 : r & 0xFFFFu));
}

// A fragments of one 16 x 16 block of P from the C fragments of its two 8-column n-tiles (c0, c1 in
// each): the C layout of n-tile 2j and 2j+1 is the A layout of k-block j (FlashAttention-2's register
// reuse of P as the A operand of P V).
template <Format S>
FASTUDY_HD inline void c_pair_to_a(const float (&lo)[4], const float (&hi)[4], std::uint32_t (&a)[4]) {
  a[0] = pack2<S>(lo[0], lo[1]);
  a[1] = pack2<S>(lo[2], lo[3]);
  a[2] = pack2<S>(hi[0], hi[1]);
  a[3] = pack2<S>(hi[2], hi[3]);
}

}  // namespace fastudy::cuda_mma
