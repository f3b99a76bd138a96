// The exponential of the kernels: vexp on a vector (a Cephes-style expf for float, about 1 ulp;
// std::exp lane by lane for double) and sexp on a scalar (the same values).
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

}  // namespace
}  // namespace fastudy
