// The vector type of one instruction-set build and its primitives: vec_t<T> (FASTUDY_VEC_BYTES wide,
// kLanes<T> lanes), vload / vstore / splat / vmax, madd (a * b + c, fused where the build has FMA),
// the -inf sentinel kNegInf and round_up. FASTUDY_INLINE (always_inline) is defined here for every
// piece of kernels/detail/attention_impl.hpp, the map of the kernels, which says how they are compiled.
#pragma once

#include "kernels/detail/attention_deps.hpp"

#ifndef FASTUDY_VEC_BYTES
#error "define FASTUDY_VEC_BYTES before including kernels/detail/attention_impl.hpp"
#endif

namespace fastudy {
namespace {

#define FASTUDY_INLINE inline __attribute__((always_inline))

constexpr int kVecBytes = FASTUDY_VEC_BYTES;

template <class T>
struct VecOf {
  typedef T type __attribute__((vector_size(kVecBytes)));
};
template <class T>
using vec_t = typename VecOf<T>::type;
template <class T>
constexpr int kLanes = kVecBytes / static_cast<int>(sizeof(T));

template <class T>
struct UintOf;
template <>
struct UintOf<float> {
  using type = std::uint32_t;
};
template <>
struct UintOf<double> {
  using type = std::uint64_t;
};
template <class T>
using uvec_t = vec_t<typename UintOf<T>::type>;

template <class T>
FASTUDY_INLINE vec_t<T> vload(const T* p) {
  vec_t<T> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
FASTUDY_INLINE void vstore(T* p, vec_t<T> v) {
  __builtin_memcpy(p, &v, sizeof v);
}
// x in every lane (x - 0 is x for every x, -0 and NaN included: one broadcast instruction).
template <class T>
FASTUDY_INLINE vec_t<T> splat(T x) {
  return x - vec_t<T>{};
}
template <class V>
FASTUDY_INLINE V vmax(V a, V b) {
  return a > b ? a : b;
}

template <class T>
struct IsVec : std::false_type {};
template <>
struct IsVec<vec_t<float>> : std::true_type {};
template <>
struct IsVec<vec_t<double>> : std::true_type {};

// a * b + c, fused where the instruction set has FMA.
FASTUDY_INLINE float madd(float a, float b, float c) {
#if FASTUDY_ISA_FMA
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
FASTUDY_INLINE double madd(double a, double b, double c) {
#if FASTUDY_ISA_FMA
  return __builtin_fma(a, b, c);
#else
  return a * b + c;
#endif
}
template <class V, std::enable_if_t<IsVec<V>::value, int> = 0>
FASTUDY_INLINE V madd(V a, V b, V c) {
#if FASTUDY_ISA_FMA && FASTUDY_VEC_BYTES == 32
  if constexpr (std::is_same_v<V, vec_t<float>>) {
    return (V)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
  } else {
    return (V)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
  }
#elif FASTUDY_ISA_FMA && FASTUDY_VEC_BYTES == 64
  if constexpr (std::is_same_v<V, vec_t<float>>) {
    return (V)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
  } else {
    return (V)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
  }
#else
  return a * b + c;
#endif
}

// The sentinel of a masked score and of the row max of a row that has seen no key yet.
template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// x rounded up to a multiple of m (rows and columns padded to whole vectors).
inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

}  // namespace
}  // namespace fastudy
