// The CUDA math the FlashAttention-2 kernels call, as PyTorch builds them (nvcc without --use_fast_math:
// libdevice's accurate expf and logf, exp2f and __logf on the special function unit): scalar models in
// plain C++, FASTUDY_HD so a CUDA twin can call them too.
//
//   ex2_approx(x)  exp2f(x) = libdevice __nv_exp2f = ex2.approx.f32 (no ftz), the SFU's MUFU.EX2, within
//                  2 ulp of 2^x (PTX ISA). Its table and interpolation are not published; the model is 2^x
//                  rounded to fp32 toward zero, which is what the recorded outputs of the H200 favour (with
//                  it more of O and lse agree than with rounding to nearest, and the agreement peaks with no
//                  offset; see docs). Below 2^-126 the result is the fp32 subnormal toward zero, 0 at -inf.
//                  Measured against the H200's instruction on every x in [-20, -1/64] (scripts/gpu_sfu_probe.cu):
//                  equal 69%, one ulp below 12%, one ulp above 19% (rounding to nearest: equal 52%).
//   lg2_approx(x)  lg2.approx.f32 (MUFU.LG2), within 2^-22.6 absolute of log2 x on [0.5, 2): modelled as
//                  log2 x rounded to fp32 toward zero, as ex2_approx and for the same reason (H200, every x
//                  in [1, 256): equal 71%, to nearest 64%).
//   fast_logf(x)   __logf = libdevice __nv_fast_logf: lg2.approx.f32(x) * 0x3F317218 (ln 2 as fp32).
//   expf_accurate  expf = libdevice __nv_expf: j = round-down(saturate(fma(a, log2e/252, 0.5)) * 252 +
//                  (1.5 2^23 + 1)), r = fma(a, lo(log2 e), fma(a, log2 e, -(j - (1.5 2^23 + 127)))),
//                  ex2.approx.ftz(r) times 2^(j's low bits) (libdevice.10.bc, llvm-dis).
//   logf_accurate  logf = libdevice __nv_logf: the mantissa reduced to [0.667, 1.333), a degree-9
//                  polynomial in fma steps, plus the exponent times ln 2 (libdevice.10.bc, llvm-dis): no
//                  SFU instruction, so this model is that code exactly.
// Each step is one fp32 operation rounded to nearest unless it says otherwise (fma: one rounding).
#pragma once

#include <cmath>
#include <cstdint>

#include "base/host_device.hpp"
#include "kernels/round.hpp"

namespace fastudy::nv {

FASTUDY_HD inline float f32(std::uint32_t bits) { return detail::bits_as<float>(bits); }
FASTUDY_HD inline std::uint32_t bits(float x) { return detail::bits_as<std::uint32_t>(x); }

// v (exact in double) to fp32 toward zero: to nearest, then one step back toward zero if that went
// outward. Overflow gives the largest finite value, as rounding toward zero does.
FASTUDY_HD inline float double_to_float_toward_zero(double v) {
  if (v != v) return static_cast<float>(v);
  if (v >= 0x1.fffffep127) return 0x1.fffffep127f;
  if (v <= -0x1.fffffep127) return -0x1.fffffep127f;
  float f = static_cast<float>(v);
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
  return f;
}

// 2^x in fp64 for an fp32 x in [-151, 128): x = n + f with n = x rounded to the nearest integer, so |f| <=
// 1/2 and both exact; 2^f by its Taylor series in f ln 2 to degree 12 in Horner form (terms beyond are
// below 2^-48 relative), one multiply and one add per step, no fma; times 2^n exactly. Relative error
// below 2^-46: rounding the result toward zero to fp32 is that of 2^x but where 2^x lies within 2^-46
// relative of an fp32 value. The CPU kernels' vector twin (ex2_lanes, kernels/detail/fa2_pytorch.hpp)
// performs the same operations, so both give the same bits.
// The coefficients, once: a namespace-scope array is host-only in CUDA, so exp2_fp64 keeps a local copy.
#define FASTUDY_NV_EXP2_TAYLOR \
    1.0, \
    0.6931471805599453094, \
    0.2402265069591007123, \
    0.05550410866482157995, \
    0.009618129107628477162, \
    0.001333355814642844342, \
    1.540353039338160995e-4, \
    1.525273380405984028e-5, \
    1.321548679014430949e-6, \
    1.017808600923969973e-7, \
    7.054911620801123330e-9, \
    4.445538271870811498e-10, \
    2.567843599348820514e-11,
// ln^k 2 / k!, k = 0..12.
inline constexpr double kExp2Taylor[13] = {FASTUDY_NV_EXP2_TAYLOR};
FASTUDY_HD inline double exp2_fp64(float x) {
  const double xd = static_cast<double>(x);
  const double magic = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer (ties to even)
  const double n = (xd + magic) - magic;
  const double f = xd - n;
  constexpr double t[13] = {FASTUDY_NV_EXP2_TAYLOR};
  double p = t[12];
  for (int k = 11; k >= 0; --k) p = p * f + t[k];
  const std::int64_t e = static_cast<std::int64_t>(n) + 1023;  // n >= -151: a normal fp64 power of two
  return p * detail::bits_as<double>(static_cast<std::uint64_t>(e) << 52);
}

// ex2.approx.f32 as modelled: 2^x toward zero. NaN stays NaN, x < -150 (and -inf) gives 0, x >= 128 (and
// +inf) gives +inf (the instruction's overflow).
FASTUDY_HD inline float ex2_approx(float x) {
  if (x != x) return x;
  if (x >= 128.0f) return f32(0x7F800000u);
  if (x < -150.0f) return 0.0f;
  return double_to_float_toward_zero(exp2_fp64(x));
}

// lg2.approx.f32 as modelled: log2 x toward zero; log2 0 = -inf, negative x NaN, +inf +inf.
FASTUDY_HD inline float lg2_approx(float x) {
  if (x != x || x < 0.0f) return f32(0x7FFFFFFFu);
  if (x == 0.0f) return f32(0xFF800000u);
  if (bits(x) == 0x7F800000u) return x;
  return double_to_float_toward_zero(std::log2(static_cast<double>(x)));
}

inline constexpr float kLn2f = 0.693147182464599609375f;  // 0x3F317218, libdevice's ln 2 as fp32

FASTUDY_HD inline float fast_logf(float x) { return lg2_approx(x) * kLn2f; }

// The ftz flavour libdevice's expf uses inside: a subnormal input counts as 0, a subnormal result is 0.
FASTUDY_HD inline float ex2_approx_ftz(float x) {
  if (std::fabs(x) < 0x1p-126f) x = 0.0f;
  const float r = ex2_approx(x);
  return std::fabs(r) < 0x1p-126f ? 0.0f : r;
}

FASTUDY_HD inline float expf_accurate(float a) {
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

FASTUDY_HD inline float logf_accurate(float a) {
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
