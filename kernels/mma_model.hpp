// The arithmetic of one Hopper (sm_90) tensor-core dot product, bit for bit: the k = 16 dot product with
// fp32 accumulator that every output element of
//   mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32     (and .f32.bf16.bf16.f32)
// computes, D = A(16) . B(16) + C, as MMA-Sim models it (Xie, Wang, Yang, Yang, "MMA-Sim: Bit-Accurate
// Reference Model of Tensor Cores and Matrix Cores", arXiv 2511.10909; microsoft/MMA-Sim,
// mmasim/simulator/nv_ptx.py class mma and mmasim/simulator/arithmetic.py nv_fused_dot_add, fused_sum,
// extract_significand_exponent). Plain C++, FASTUDY_HD: the CPU readings and the CUDA host twins call
// the same functions (no AVX, no LibTorch).
//
// The model, step by step (MMA-Sim's rules; each is followed here, including its edge cases):
//   1. NaN and inf first: if the sum of the 16 products and C, in fp64, is NaN (a NaN operand, inf * 0,
//      inf - inf) the result is the canonical NaN 0x7FFFFFFF; if it is +-inf (an inf operand; finite
//      fp16/bf16 products cannot overflow fp64) the result is that inf.
//   2. Every operand is split into a significand and an exponent e: |x| = sig * 2^e with 1 <= sig < 2
//      for normal values; a subnormal keeps its format's smallest normal exponent (fp16 -14, bf16 and the
//      fp32 accumulator -126) with sig < 1; zero has sig 0 and e = -126 (in every format).
//   3. The 16 products are exact: sig_a * sig_b (1 <= . < 4, not renormalised) with exponent
//      e_a + e_b. The accumulator C is the 17th term, with its own exponent e_c.
//   4. All 17 terms are aligned to the largest exponent e_max = max(e_c, e_a + e_b over the 16 products;
//      zero products and a zero C take part with their exponent as defined in 2) and each term is
//      truncated toward zero (on its magnitude) to a multiple of 2^(e_max - 25): Hopper keeps 25
//      fraction bits after alignment (Volta 23, Turing/Ampere/Ada 24, Hopper/Blackwell 25).
//   5. The truncated terms are summed exactly.
//   6. The sum is rounded to fp32 toward zero (normal range: 24 significant bits; below 2^-126 to a
//      multiple of 2^-149); a zero sum gives +0 whatever the signs; a magnitude at or above 2^128 gives
//      +-inf (MMA-Sim converts the truncated value to float32 by a plain cast).
//   On Hopper the k = 16 dot product is one group of 16 products (MMA-Sim's is_split_k is set only for
//   Ampere and Ada Lovelace, which do two groups of 8 with a rounding between them).
//
// Why an exact integer sum suffices: after alignment each product term is below 4 * 2^25 units of
// 2^(e_max - 25) and C below 2 * 2^25, so the 17 terms sum to less than 2^32 units: int64 holds it.
// Operands are given as float values already in the 16-bit format (round_to_format first); C is any float.
#pragma once

#include <cstdint>

#include "base/host_device.hpp"
#include "kernels/format.hpp"
#include "kernels/round.hpp"

namespace fastudy::mma {

// Fraction bits a term keeps below the largest exponent after alignment (Hopper, sm_90).
inline constexpr int kAlignBits = 25;
// Exponent MMA-Sim gives a zero operand or accumulator, in every format (step 2).
inline constexpr int kZeroExponent = -126;

// x = sign * m * 2^(e - p), m an integer below 2^(p + 1), p the format's fraction bits: step 2's
// significand as an integer with its sign folded in (m_signed), and its exponent e.
struct Split {
  std::int32_t m_signed;
  std::int32_t e;
};

// The bit length of v (0 for 0): the position of its highest set bit plus one.
FASTUDY_HD inline int bit_length(std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  return 64 - __clzll(static_cast<long long>(v));
#else
  return v == 0 ? 0 : 64 - __builtin_clzll(v);
#endif
}

// Step 2 for a finite float whose value is representable in format F (fp16, bf16; fp32 for C).
template <Format F>
FASTUDY_HD inline Split split(float x) {
  using Tr = FormatTraits<F>;
  const std::uint32_t u = detail::bits_as<std::uint32_t>(x);
  const std::uint32_t field = (u >> 23) & 0xFFu;
  const std::uint32_t frac = u & 0x7FFFFFu;
  if (field == 0 && frac == 0) return Split{0, kZeroExponent};
  // fp32 normal: sig24 = 1.frac, true exponent field - 127; fp32 subnormal: 0.frac at exponent -126.
  const std::int32_t e_true = field == 0 ? -126 : static_cast<std::int32_t>(field) - 127;
  const std::uint32_t sig24 = field == 0 ? frac : (frac | 0x800000u);
  const std::int32_t e = e_true > Tr::emin ? e_true : Tr::emin;
  // sig24 has 23 fraction bits at e_true; m has p at e: drop 23 - p + (e - e_true) bits (all zero for
  // a value of F, so the shift is exact).
  const int drop = 23 - Tr::p + (e - e_true);
  const std::uint32_t m = drop >= 32 ? 0u : (sig24 >> drop);
  const std::int32_t mag = static_cast<std::int32_t>(m);
  return Split{(u >> 31) != 0 ? -mag : mag, e};
}

// A term with significand m (frac_bits fraction bits) and exponent e, aligned to e_max and truncated
// toward zero to a multiple of 2^(e_max - kAlignBits): the term in those units (step 4).
FASTUDY_HD inline std::int64_t align_truncate(std::int64_t m_signed, int frac_bits, int e, int e_max) {
  const int shift = (e_max - e) + frac_bits - kAlignBits;
  const std::uint64_t mag = static_cast<std::uint64_t>(m_signed < 0 ? -m_signed : m_signed);
  std::uint64_t t;
  if (shift <= 0) t = mag << -shift;  // at most 11 (bf16 products): below 2^27, see the header
  else t = shift >= 64 ? 0u : (mag >> shift);
  const std::int64_t ts = static_cast<std::int64_t>(t);
  return m_signed < 0 ? -ts : ts;
}

// Step 6: sum (in units of 2^(e_max - kAlignBits)) rounded to fp32 toward zero.
FASTUDY_HD inline float round_sum_toward_zero(std::int64_t sum, int e_max) {
  if (sum == 0) return 0.0f;
  const std::uint32_t sign = sum < 0 ? 0x80000000u : 0u;
  const std::uint64_t mag = static_cast<std::uint64_t>(sum < 0 ? -sum : sum);
  const int len = bit_length(mag);
  const int unit = e_max - kAlignBits;  // the value is mag * 2^unit
  const int e_r = len - 1 + unit;       // its exponent: 2^e_r <= value < 2^(e_r + 1)
  if (e_r > 127) return detail::bits_as<float>(sign | 0x7F800000u);
  if (e_r >= -126) {  // normal: keep the top 24 bits
    const std::uint64_t sig = len > 24 ? (mag >> (len - 24)) : (mag << (24 - len));
    const std::uint32_t bits = (static_cast<std::uint32_t>(e_r + 127) << 23) | (static_cast<std::uint32_t>(sig) & 0x7FFFFFu);
    return detail::bits_as<float>(sign | bits);
  }
  // subnormal: the number of 2^-149 quanta, floored (mag * 2^(unit + 149), unit + 149 < 0 here)
  const int shift = -(unit + 149);
  const std::uint64_t q = shift >= 64 ? 0u : (mag >> shift);
  return detail::bits_as<float>(sign | static_cast<std::uint32_t>(q));
}

// Step 1: NaN or inf in the fp64 sum of the products and c; returns true and sets *out if so.
FASTUDY_HD inline bool special_result(const float* a, const float* b, float c, float* out) {
  const std::uint32_t kExp = 0x7F800000u;
  bool nan = false, pos_inf = false, neg_inf = false;
  auto note = [&](std::uint32_t ua, std::uint32_t ub, bool product) {
    const bool a_nan = (ua & 0x7FFFFFFFu) > kExp, b_nan = product && (ub & 0x7FFFFFFFu) > kExp;
    const bool a_inf = (ua & 0x7FFFFFFFu) == kExp, b_inf = product && (ub & 0x7FFFFFFFu) == kExp;
    if (a_nan || b_nan) { nan = true; return; }
    if (!a_inf && !b_inf) return;
    if (product && ((a_inf && (ub & 0x7FFFFFFFu) == 0) || (b_inf && (ua & 0x7FFFFFFFu) == 0))) { nan = true; return; }
    const bool negative = product ? (((ua ^ ub) >> 31) != 0) : ((ua >> 31) != 0);
    (negative ? neg_inf : pos_inf) = true;
  };
  for (int i = 0; i < 16; ++i) note(detail::bits_as<std::uint32_t>(a[i]), detail::bits_as<std::uint32_t>(b[i]), true);
  note(detail::bits_as<std::uint32_t>(c), 0u, false);
  if (nan || (pos_inf && neg_inf)) {
    *out = detail::bits_as<float>(0x7FFFFFFFu);
    return true;
  }
  if (pos_inf || neg_inf) {
    *out = detail::bits_as<float>(neg_inf ? 0xFF800000u : kExp);
    return true;
  }
  return false;
}

// D = a . b + c for one output element of mma.sync m16n8k16 .f32.F.F.f32 on sm_90: a and b are the 16
// values of a row of A and a column of B, each already in F (fp16 or bf16), c the fp32 accumulator.
template <Format F>
FASTUDY_HD inline float dot_k16(const float* a, const float* b, float c) {
  static_assert(F == Format::fp16 || F == Format::bf16, "mma.sync m16n8k16 takes fp16 or bf16 operands");
  float special;
  if (special_result(a, b, c, &special)) return special;
  constexpr int kP = FormatTraits<F>::p;
  std::int32_t m[16];
  int e[16];
  const Split sc = split<Format::fp32>(c);
  int e_max = sc.e;
  for (int i = 0; i < 16; ++i) {
    const Split sa = split<F>(a[i]);
    const Split sb = split<F>(b[i]);
    m[i] = sa.m_signed * sb.m_signed;  // exact: below 2^(2p + 2) <= 2^22
    e[i] = sa.e + sb.e;
    e_max = e[i] > e_max ? e[i] : e_max;
  }
  std::int64_t sum = align_truncate(sc.m_signed, 23, sc.e, e_max);
  for (int i = 0; i < 16; ++i) sum += align_truncate(m[i], 2 * kP, e[i], e_max);
  return round_sum_toward_zero(sum, e_max);
}

}  // namespace fastudy::mma
