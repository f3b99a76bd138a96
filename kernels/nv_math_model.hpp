// The CUDA math the FlashAttention-2 kernels call, as PyTorch builds them (nvcc without --use_fast_math:
// libdevice's accurate expf and logf, exp2f and __logf on the special function unit): scalar models in
// plain C++, bit for bit.
//
//   ex2_approx(x)  exp2f(x) = libdevice __nv_exp2f = ex2.approx.f32 (no ftz). The special function unit's
//                  MUFU.EX2 (mufu_ex2) takes x as a fixed-point number, 7 integer and 23 fraction bits
//                  (the magnitude truncated; RRO.EX2 did this step before Volta), and evaluates 2^f on [0, 1)
//                  by quadratic interpolation in 64 segments: A + B r + C r^2 from a table per segment, the
//                  square from a truncated squarer, the sum truncated to 24 bits. A negative input takes
//                  2^-(i + f) = 2^-(i + 1) 2^(1 - f) with 1 - f formed as the one's complement of f (2^-23 low).
//                  The unit flushes a subnormal input to 0 and a subnormal result to 0; for x < -126 the
//                  compiler's expansion of the non-ftz instruction squares MUFU.EX2(x / 2) instead.
//   lg2_approx(x)  lg2.approx.f32 (no ftz): MUFU.LG2 evaluates log2 of the significand the same way (36
//                  fraction bits), adds the exponent, and truncates the fixed-point result to 24 significant
//                  bits (a negative result as the one's complement of the magnitude). A subnormal x is
//                  scaled by 2^24 first and 24 subtracted after, the compiler's expansion.
//   fast_logf(x)   __logf = libdevice __nv_fast_logf: lg2.approx.f32(x) * 0x3F317218 (ln 2 as fp32).
//   expf_accurate  expf = libdevice __nv_expf: j = round-down(saturate(fma(a, log2e/252, 0.5)) * 252 +
//                  (1.5 2^23 + 1)), r = fma(a, lo(log2 e), fma(a, log2 e, -(j - (1.5 2^23 + 127)))),
//                  ex2.approx.ftz(r) (MUFU.EX2 itself) times 2^(j's low bits) (libdevice.10.bc, llvm-dis).
//   logf_accurate  logf = libdevice __nv_logf: the mantissa reduced to [0.667, 1.333), a degree-9
//                  polynomial in fma steps, plus the exponent times ln 2 (libdevice.10.bc, llvm-dis): no
//                  SFU instruction, so this model is that code exactly.
// Each step is one fp32 operation rounded to nearest unless it says otherwise (fma: one rounding).
//
// The unit's algorithm and tables are those that envytools (nvhw/sfu.c, nvhw/sfu_tab.c; Marcin
// Koscielnicki, MIT licence; hwtest/g80_sfu.cc checks them on the hardware) recovered from NVIDIA's Tesla
// GPUs; envytools rounds the 7.23 fixed-point input of ex2 to nearest, the H200 truncates it. Measured
// against the H200 (scripts/gpu_sfu_probe.cu, its output in tests/data/sfu_probe/h200.txt): on every fp32
// input of the probe's ranges the model's results fall the same number of times on each ulp offset from
// 2^x or log2 x rounded toward zero, and in each sixteenth of the ulp, as the hardware's did (ex2 on the
// kernel's [-20, -1/64], 86 million inputs; lg2 on [2, 4); on lg2's [1, 256) all but 2 of 67 million;
// docs/readings.md); tests/kernels/test_fa2_pytorch.cpp (NvMathModel.CountsOfTheH200) keeps two ranges.
#pragma once

#include <cmath>
#include <cstdint>

#include "base/host_device.hpp"
#include "kernels/round.hpp"

namespace fastudy::nv {

FASTUDY_HD inline float f32(std::uint32_t bits) { return detail::bits_as<float>(bits); }
FASTUDY_HD inline std::uint32_t bits(float x) { return detail::bits_as<std::uint32_t>(x); }

// One segment of the unit's quadratic interpolation: f(x0 + r) ~ value + slope r + curvature r^2 in the
// unit's fixed-point scales (the values are not the function's: they were chosen against the unit's own
// roundings, see envytools' notes).
struct SfuSegment {
  std::int32_t value, slope, curvature;
};

// MUFU.EX2: 2^x on [0, 1) in 64 segments of 2^-6: 2^x0 in units of 2^-25, the slope in 2^-15 (ln 2 at 0), the
// curvature in 2^-11 (ln^2 2 / 2 at 0).
inline constexpr SfuSegment kSfuEx2[64] = {
    {0x2000000, 0x58b9, 494}, {0x2059347, 0x59b0, 501}, {0x20b361b, 0x5aaa, 506}, {0x210e8a2, 0x5ba7, 511},
    {0x216ab0f, 0x5ca6, 518}, {0x21c7d86, 0x5da9, 521}, {0x2226039, 0x5eae, 527}, {0x2285356, 0x5fb6, 532},
    {0x22e5709, 0x60c0, 541}, {0x2346b7e, 0x61ce, 546}, {0x23a90e5, 0x62df, 551}, {0x240c772, 0x63f2, 559},
    {0x2470f4e, 0x6509, 564}, {0x24d68ad, 0x6623, 568}, {0x253d3c0, 0x673f, 577}, {0x25a50b6, 0x685f, 583},
    {0x260dfc2, 0x6982, 589}, {0x2678117, 0x6aa8, 596}, {0x26e34e6, 0x6bd2, 600}, {0x274fb67, 0x6cfe, 609},
    {0x27bd4c9, 0x6e2e, 615}, {0x282c145, 0x6f61, 622}, {0x289c10b, 0x7098, 627}, {0x290d456, 0x71d2, 633},
    {0x297fb5a, 0x730f, 641}, {0x29f364e, 0x7450, 647}, {0x2a6856a, 0x7594, 655}, {0x2ade8e7, 0x76dc, 661},
    {0x2b560fb, 0x7827, 670}, {0x2bcede2, 0x7976, 677}, {0x2c48fd7, 0x7ac8, 686}, {0x2cc4710, 0x7c1f, 691},
    {0x2d413cc, 0x7d79, 699}, {0x2dbf648, 0x7ed7, 705}, {0x2e3eebe, 0x8038, 715}, {0x2ebfd6a, 0x819e, 721},
    {0x2f4228e, 0x8307, 730}, {0x2fc5e67, 0x8474, 739}, {0x304b134, 0x85e5, 748}, {0x30d1b33, 0x875b, 753},
    {0x3159ca8, 0x88d4, 763}, {0x31e35d3, 0x8a51, 773}, {0x326e6f7, 0x8bd3, 779}, {0x32fb054, 0x8d59, 787},
    {0x3389230, 0x8ee3, 796}, {0x3418ccf, 0x9071, 806}, {0x34aa076, 0x9204, 813}, {0x353cd6a, 0x939b, 822},
    {0x35d13f4, 0x9536, 833}, {0x3667457, 0x96d6, 842}, {0x36feede, 0x987b, 849}, {0x37983d3, 0x9a24, 858},
    {0x383337d, 0x9bd1, 870}, {0x38cfe27, 0x9d84, 877}, {0x396e41c, 0x9f3b, 887}, {0x3a0e5aa, 0xa0f7, 896},
    {0x3ab031d, 0xa2b7, 909}, {0x3b53cc1, 0xa47d, 917}, {0x3bf92e7, 0xa648, 925}, {0x3ca05dd, 0xa817, 938},
    {0x3d495f5, 0xa9ec, 946}, {0x3df437f, 0xabc5, 959}, {0x3ea0ecc, 0xada4, 969}, {0x3f4f831, 0xaf88, 980},
};

// MUFU.LG2: log2 x on [1, 2) in 64 segments of 2^-6: log2 x0 in units of 2^-26, the slope in 2^-15 (log2 e at
// 1), the curvature in 2^-10 (-log2 e / 2 at 1).
inline constexpr SfuSegment kSfuLg2[64] = {
    {0x4, 0xb8a8, -727}, {0x16e797, 0xb5d1, -705}, {0x2d75ad, 0xb310, -685}, {0x43ace7, 0xb064, -665},
    {0x598fe2, 0xadcc, -646}, {0x6f210f, 0xab47, -627}, {0x8462c9, 0xa8d5, -610}, {0x995750, 0xa674, -592},
    {0xae00d8, 0xa424, -576}, {0xc26162, 0xa1e4, -559}, {0xd67af5, 0x9fb4, -544}, {0xea4f76, 0x9d93, -530},
    {0xfde0b9, 0x9b81, -518}, {0x111307c, 0x997c, -504}, {0x124407c, 0x9784, -491}, {0x1371251, 0x9599, -479},
    {0x149a786, 0x93ba, -466}, {0x15c01a8, 0x91e7, -455}, {0x16e2222, 0x9020, -445}, {0x1800a59, 0x8e63, -433},
    {0x191bbac, 0x8cb2, -425}, {0x1a33760, 0x8b0a, -414}, {0x1b47ebe, 0x896c, -404}, {0x1c592fb, 0x87d8, -396},
    {0x1d6753f, 0x864c, -385}, {0x1e726aa, 0x84ca, -377}, {0x1f7a857, 0x8350, -368}, {0x207fb52, 0x81df, -361},
    {0x218209f, 0x8076, -354}, {0x2281942, 0x7f14, -346}, {0x237e627, 0x7dba, -339}, {0x247883b, 0x7c67, -331},
    {0x257006a, 0x7b1c, -326}, {0x2664f8d, 0x79d7, -319}, {0x2757682, 0x7898, -311}, {0x2847614, 0x7761, -307},
    {0x2934f0d, 0x762f, -300}, {0x2a20233, 0x7503, -293}, {0x2b0904a, 0x73de, -289}, {0x2befa00, 0x72be, -283},
    {0x2cd4011, 0x71a3, -276}, {0x2db632e, 0x708e, -271}, {0x2e963fd, 0x6f7e, -266}, {0x2f7431d, 0x6e74, -262},
    {0x305013a, 0x6d6e, -257}, {0x3129eee, 0x6c6d, -253}, {0x3201cc6, 0x6b71, -249}, {0x32d7b5d, 0x6a79, -244},
    {0x33abb41, 0x6985, -238}, {0x347dd00, 0x6896, -234}, {0x354e121, 0x67ac, -232}, {0x361c823, 0x66c5, -227},
    {0x36e9293, 0x65e2, -223}, {0x37b40e4, 0x6503, -219}, {0x387d398, 0x6428, -216}, {0x3944b1e, 0x6350, -211},
    {0x3a0a7ec, 0x627d, -209}, {0x3acea7a, 0x61ac, -204}, {0x3b91337, 0x60df, -201}, {0x3c52285, 0x6016, -199},
    {0x3d118da, 0x5f4f, -195}, {0x3dcf690, 0x5e8c, -192}, {0x3e8bc12, 0x5dcc, -189}, {0x3f469c1, 0x5d0f, -186},
};

// The unit's squarer for the 17-bit remainder r: the partial products r_i 2^i r truncated as the unit
// sums them (bit i of r adds r >> (18 - i); bits 0 and 1 add nothing since r < 2^17), halved: about
// r^2 / 2^19.
inline std::uint32_t sfu_square(std::uint32_t r) {
  std::uint32_t acc = 0;
  for (int i = 2; i < 17; ++i)
    if ((r >> i) & 1u) acc += r >> (18 - i);
  return acc >> 1;
}

// 2^(f / 2^23) for a 23-bit fraction f, as the unit's 24-bit significand in [2^23, 2^24] (2^24 only where
// the interpolation reaches 2): f's top 6 bits pick the segment, the low 17 are r; the sum is in units of
// 2^-38 (every term an integer), truncated to 2^-23.
inline std::uint32_t sfu_ex2_fraction(std::uint32_t f) {
  const SfuSegment s = kSfuEx2[f >> 17];
  const std::uint32_t r = f & 0x1FFFFu;
  const std::int64_t acc = (static_cast<std::int64_t>(s.value) << 13) + static_cast<std::int64_t>(s.slope) * r +
                           static_cast<std::int64_t>(s.curvature) * sfu_square(r) + 0x77E2;
  return static_cast<std::uint32_t>(acc >> 15);
}

// MUFU.EX2 on an fp32 input (ex2.approx.ftz.f32): NaN gives the canonical NaN, |x| >= 128 (and +-inf)
// +inf or 0 by the sign, a subnormal x counts as 0, a result below 2^-126 is 0.
inline float mufu_ex2(float x) {
  const std::uint32_t u = bits(x);
  const bool negative = (u >> 31) != 0;
  const int field = static_cast<int>((u >> 23) & 0xFFu);
  if (field == 0xFF && (u & 0x7FFFFFu) != 0) return f32(0x7FFFFFFFu);
  const int e = field - 127;
  if (e >= 7) return negative ? 0.0f : f32(0x7F800000u);
  // The 7.23 fixed-point magnitude, truncated.
  const std::uint32_t sig = (u & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t fixed = field == 0 ? 0u : (e >= 0 ? sig << e : (-e >= 32 ? 0u : sig >> -e));
  int ipart = static_cast<int>(fixed >> 23);
  std::uint32_t f = fixed & 0x7FFFFFu;
  if (negative) {
    if (f != 0) {
      ipart = -ipart - 1;
      f = ~f & 0x7FFFFFu;
    } else {
      ipart = -ipart;
    }
  }
  std::uint32_t sig_out = sfu_ex2_fraction(f);
  int biased = ipart + 127;
  if (sig_out == (1u << 24)) {
    sig_out >>= 1;
    ++biased;
  }
  if (biased <= 0) return 0.0f;
  if (biased >= 0xFF) return f32(0x7F800000u);
  return f32((static_cast<std::uint32_t>(biased) << 23) | (sig_out - 0x800000u));
}

// ex2.approx.f32 (exp2f): below -126 the compiler halves x, and squares MUFU.EX2's result (rounded to
// nearest, subnormal results kept).
inline float ex2_approx(float x) {
  if (x < -126.0f) {
    const float h = mufu_ex2(x * 0.5f);
    return h * h;
  }
  return mufu_ex2(x);
}

// The ftz flavour libdevice's expf uses inside: MUFU.EX2 itself.
inline float ex2_approx_ftz(float x) { return mufu_ex2(x); }

// MUFU.LG2 on an fp32 input (lg2.approx.ftz.f32): NaN and negative x give the canonical NaN, 0 and
// subnormal x -inf, +inf +inf.
inline float mufu_lg2(float x) {
  const std::uint32_t u = bits(x);
  const int field = static_cast<int>((u >> 23) & 0xFFu);
  const std::uint32_t frac = u & 0x7FFFFFu;
  if (field == 0xFF && frac != 0) return f32(0x7FFFFFFFu);
  if (field == 0) return f32(0xFF800000u);
  if ((u >> 31) != 0) return f32(0x7FFFFFFFu);
  if (field == 0xFF) return x;
  // log2 of the significand in units of 2^-36 (exactly 0 at 1).
  std::int64_t v = 0;
  if (u != 0x3F800000u) {
    const SfuSegment s = kSfuLg2[frac >> 17];
    const std::uint32_t r = frac & 0x1FFFFu;
    const std::int64_t acc = (static_cast<std::int64_t>(s.value) << 12) + static_cast<std::int64_t>(s.slope) * r +
                             static_cast<std::int64_t>(s.curvature) * sfu_square(r) * 2 + 0x3345;
    v = acc >> 2;
  }
  v += static_cast<std::int64_t>(field - 127) * (std::int64_t{1} << 36);
  const bool negative = v < 0;
  if (negative) v = ~v;  // the magnitude as the unit forms it: one's complement
  if (v == 0) return negative ? -0.0f : 0.0f;
  // Truncated to 24 significant bits.
  const int top = 63 - __builtin_clzll(static_cast<std::uint64_t>(v));  // v < 2^43
  const std::uint32_t sig = static_cast<std::uint32_t>(top >= 23 ? v >> (top - 23) : v << (23 - top));
  const std::uint32_t biased = static_cast<std::uint32_t>(top - 36 + 127);
  return f32((negative ? 0x80000000u : 0u) | (biased << 23) | (sig - 0x800000u));
}

// lg2.approx.f32 (no ftz): a subnormal x is scaled into the normal range first (the compiler's expansion).
inline float lg2_approx(float x) {
  if (x > 0.0f && x < 0x1p-126f) return mufu_lg2(x * 0x1p24f) - 24.0f;
  return mufu_lg2(x);
}

inline constexpr float kLn2f = 0.693147182464599609375f;  // 0x3F317218, libdevice's ln 2 as fp32

inline float fast_logf(float x) { return lg2_approx(x) * kLn2f; }

inline float expf_accurate(float a) {
  const float log2e = f32(0x3FB8AA3Bu);        // 1.44269502
  const float log2e_lo = f32(0x32A57060u);     // 1.925963e-8: log2 e - log2e
  const float magic = f32(0x4B400000u);        // 1.5 * 2^23
  const float c = log2e / 252.0f;
  float t = std::fma(a, c, 0.5f);
  t = t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t);  // saturate (NaN gives 0)
  if (t != t) t = 0.0f;
  const float bias = (-126.0f + magic) + 127.0f;  // 1.5 * 2^23 + 1
  // fma.rm: t * 252 + bias rounded toward -inf; both terms are exact in fp64, so is their sum.
  const double jd = static_cast<double>(t) * 252.0 + static_cast<double>(bias);
  float j = static_cast<float>(jd);
  if (static_cast<double>(j) > jd) j = std::nextafter(j, -INFINITY);
  const float k = j - (magic + 127.0f);
  float r = std::fma(a, log2e, -k);
  r = std::fma(a, log2e_lo, r);
  const float scale = f32(bits(j) << 23);
  return ex2_approx_ftz(r) * scale;
}

inline float logf_accurate(float a) {
  float x = a, i = 0.0f;
  if (a < 0x1p-126f) {  // also true for negative a, as in libdevice
    x = a * 8388608.0f;
    i = -23.0f;
  }
  const std::int32_t xi = static_cast<std::int32_t>(bits(x));
  const std::int32_t e = static_cast<std::int32_t>(static_cast<std::uint32_t>(xi - 1059760811) & 0xFF800000u);
  const float m = f32(static_cast<std::uint32_t>(xi - e));
  const float j = std::fma(static_cast<float>(e), 0x1p-23f, i);
  const float f = m - 1.0f;
  float r = std::fma(-0x1.0aa04ep-3f, f, 0x1.2073ecp-3f);
  r = std::fma(r, f, -0x1.f19b98p-4f);
  r = std::fma(r, f, 0x1.1e52aap-3f);
  r = std::fma(r, f, -0x1.55b172p-3f);
  r = std::fma(r, f, 0x1.99da16p-3f);
  r = std::fma(r, f, -0x1.fffe44p-3f);
  r = std::fma(r, f, 0x1.5554fp-2f);
  r = std::fma(r, f, -0.5f);
  r = r * f;
  r = std::fma(r, f, f);
  float res = std::fma(j, kLn2f, r);
  if (bits(x) >= 0x7F800000u) res = std::fma(x, f32(0x7F800000u), f32(0x7F800000u));  // inf, NaN, negative
  if (x == 0.0f) res = f32(0xFF800000u);
  return res;
}

}  // namespace fastudy::nv
