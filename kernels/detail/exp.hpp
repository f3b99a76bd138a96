// The exponentials of the kernels: vexp on a vector (a Cephes-style expf for float, about 1 ulp;
// std::exp lane by lane for double) and sexp on a scalar (the same values); vexp2 / sexp2 likewise
// for 2^x (the FlashAttention kernels' exp2f).
#pragma once

#include "kernels/detail/vec.hpp"

namespace fastudy {
namespace {

// float: Cephes expf (range reduction by ln 2 in two parts, degree-6 polynomial in Horner form with
// fused multiply-adds where the CPU has them), about 1 ulp; exp(x) = 0 below -87.3 (the fp32
// subnormal range is flushed; masked scores are -inf and give exactly 0), inf above 88.7, NaN stays.
FASTUDY_INLINE vec_t<float> vexp(vec_t<float> x) {
  using V = vec_t<float>;
  using IV = vec_t<std::int32_t>;
  const V xc = x < 88.3762626647949f ? x : (V{} + 88.3762626647949f);
  const V magic = V{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (ties to even)
  const V t = madd(xc, V{} + 1.44269504088896341f, magic);
  const V n = t - magic;
  V r = madd(n, V{} - 0.693359375f, xc);
  r = madd(n, V{} + 2.12194440e-4f, r);
  V p = madd(V{} + 1.9875691500e-4f, r, V{} + 1.3981999507e-3f);
  p = madd(p, r, V{} + 8.3334519073e-3f);
  p = madd(p, r, V{} + 4.1665795894e-2f);
  p = madd(p, r, V{} + 1.6666665459e-1f);
  p = madd(p, r, V{} + 5.0000001201e-1f);
  const V y = madd(p, r * r, r + 1.0f);
  const IV e = ((IV)t - (IV)magic + 127) << 23;  // 2^n as a float bit pattern
  V res = y * (V)e;
  res = x < -87.3365447505531f ? V{} : res;
  res = x > 88.7228391116729f ? (V{} + __builtin_inff()) : res;
  return x != x ? x : res;
}
FASTUDY_INLINE vec_t<double> vexp(vec_t<double> x) {
  for (int i = 0; i < kLanes<double>; ++i) x[i] = std::exp(x[i]);
  return x;
}
FASTUDY_INLINE float sexp(float x) { return vexp(splat(x))[0]; }
FASTUDY_INLINE double sexp(double x) { return std::exp(x); }

// float: Cephes exp2f (x = n + f, n the nearest integer (ties to even), |f| <= 1/2; 2^f = 1 + f P(f)
// with P of degree 5 in Horner form, fused multiply-adds where the CPU has them), about 1 ulp. As the
// GPU's ex2.approx.ftz.f32 (FlashAttention compiles with --use_fast_math), results below 2^-126 are
// flushed to 0, so exp2(-inf) = 0 for masked scores; 2^x = inf from x >= 128, NaN stays NaN. The
// GPU's instruction is within 2 ulp of 2^x; its bits are not these. kernels/cuda/tile_math.hpp's
// exp2_f32 is the same function for the host twin and the device.
FASTUDY_INLINE vec_t<float> vexp2(vec_t<float> x) {
  using V = vec_t<float>;
  using IV = vec_t<std::int32_t>;
  const V xc = x < 128.0f ? (x > -127.0f ? x : (V{} - 127.0f)) : (V{} + 128.0f);
  const V magic = V{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (ties to even)
  const V t = xc + magic;
  const V n = t - magic;
  const V f = xc - n;
  V p = madd(V{} + 1.535336188319500e-4f, f, V{} + 1.339887440266574e-3f);
  p = madd(p, f, V{} + 9.618437357674640e-3f);
  p = madd(p, f, V{} + 5.550332471162809e-2f);
  p = madd(p, f, V{} + 2.402264791363012e-1f);
  p = madd(p, f, V{} + 6.931472028550421e-1f);
  const V y = madd(p, f, V{} + 1.0f);
  // 2^n as a float bit pattern; n = 128 (x in [127.5, 128)) as 2^127 times 2, exactly.
  const IV ni = (IV)t - (IV)magic;
  const IV top = ni > 127;
  const IV e = (ni + 127 + top) << 23;
  V res = y * (V)e;
  res = top ? res * 2.0f : res;
  res = x < -126.0f ? V{} : res;
  res = x >= 128.0f ? (V{} + __builtin_inff()) : res;
  return x != x ? x : res;
}
FASTUDY_INLINE vec_t<double> vexp2(vec_t<double> x) {
  for (int i = 0; i < kLanes<double>; ++i) x[i] = std::exp2(x[i]);
  return x;
}
FASTUDY_INLINE float sexp2(float x) { return vexp2(splat(x))[0]; }
FASTUDY_INLINE double sexp2(double x) { return std::exp2(x); }

}  // namespace
}  // namespace fastudy
