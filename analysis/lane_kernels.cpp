// The lane kernels of the pairwise distances (analysis/lane_kernels.hpp), compiled once per ISA.
#include "analysis/lane_kernels.hpp"

#include <cmath>

#include "base/cpu.hpp"

namespace fastudy::lanes {

namespace {


// Each kernel is compiled once per ISA (FASTUDY_PER_ISA_KERNEL: NAME_avx512, NAME_avx2, NAME_generic)
// and called through a pointer chosen by base's cpu_isa(), the project's one ISA decision.
#if FASTUDY_PER_ISA
#define FASTUDY_PER_ISA_KERNEL(MACRO, NAME, T)                     \
  MACRO(NAME##_avx512, T, __attribute__((target("avx512f"))))     \
  MACRO(NAME##_avx2, T, __attribute__((target("avx2"))))          \
  MACRO(NAME##_generic, T, )
#define FASTUDY_PICK(NAME) \
  (cpu_isa() == Isa::avx512 ? NAME##_avx512 : cpu_isa() == Isa::avx2 ? NAME##_avx2 : NAME##_generic)
#else
#define FASTUDY_PER_ISA_KERNEL(MACRO, NAME, T) MACRO(NAME##_generic, T, )
#define FASTUDY_PICK(NAME) NAME##_generic
#endif


// sum |a-b| (and sum (a-b)^2 if sq != nullptr) over len values, all finite.
#define FASTUDY_SORTED_KERNEL(NAME, T, ATTR)                                                    \
  ATTR void NAME(const T* a, const T* b, std::size_t len, double* abs_out,      \
                           double* sq_out) {                                              \
    double sa[kLanes] = {}, sq[kLanes] = {};                                              \
    std::size_t i = 0;                                                                    \
    if (sq_out) {                                                                         \
      for (; i + kLanes <= len; i += kLanes)                                              \
        for (int l = 0; l < kLanes; ++l) {                                                \
          const double d = static_cast<double>(a[i + l]) - static_cast<double>(b[i + l]); \
          sa[l] += std::fabs(d);                                                          \
          sq[l] += d * d;                                                                 \
        }                                                                                 \
    } else {                                                                              \
      for (; i + kLanes <= len; i += kLanes)                                              \
        for (int l = 0; l < kLanes; ++l)                                                  \
          sa[l] += std::fabs(static_cast<double>(a[i + l]) - static_cast<double>(b[i + l])); \
    }                                                                                     \
    for (int l = 0; i < len; ++i, ++l) {                                                  \
      const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);             \
      sa[l] += std::fabs(d);                                                              \
      sq[l] += d * d;                                                                     \
    }                                                                                     \
    *abs_out = fold(sa);                                                                  \
    if (sq_out) *sq_out = fold(sq);                                                       \
  }

// sum |a-b|, sum (a-b)^2, max |a-b| over len values, all finite.
#define FASTUDY_ELEMENTWISE_KERNEL(NAME, T, ATTR)                                               \
  ATTR void NAME(const T* a, const T* b, std::size_t len, double* abs_out,      \
                           double* sq_out, double* max_out) {                             \
    double sa[kLanes] = {}, sq[kLanes] = {}, mx[kLanes] = {};                             \
    std::size_t i = 0;                                                                    \
    for (; i + kLanes <= len; i += kLanes)                                                \
      for (int l = 0; l < kLanes; ++l) {                                                  \
        const double d = std::fabs(static_cast<double>(a[i + l]) - static_cast<double>(b[i + l])); \
        sa[l] += d;                                                                       \
        sq[l] += d * d;                                                                   \
        mx[l] = mx[l] > d ? mx[l] : d;                                                    \
      }                                                                                   \
    for (int l = 0; i < len; ++i, ++l) {                                                  \
      const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));  \
      sa[l] += d;                                                                         \
      sq[l] += d * d;                                                                     \
      mx[l] = mx[l] > d ? mx[l] : d;                                                      \
    }                                                                                     \
    *abs_out = fold(sa);                                                                  \
    *sq_out = fold(sq);                                                                   \
    double m = 0;                                                                         \
    for (int l = 0; l < kLanes; ++l) m = m > mx[l] ? m : mx[l];                           \
    *max_out = m;                                                                         \
  }

// sum x^2 over len values, all finite.
#define FASTUDY_SQUARES_KERNEL(NAME, T, ATTR)                                                   \
  ATTR double NAME(const T* x, std::size_t len) {                               \
    double s[kLanes] = {};                                                                \
    std::size_t i = 0;                                                                    \
    for (; i + kLanes <= len; i += kLanes)                                                \
      for (int l = 0; l < kLanes; ++l) {                                                  \
        const double v = static_cast<double>(x[i + l]);                                   \
        s[l] += v * v;                                                                    \
      }                                                                                   \
    for (int l = 0; i < len; ++i, ++l) {                                                  \
      const double v = static_cast<double>(x[i]);                                         \
      s[l] += v * v;                                                                      \
    }                                                                                     \
    return fold(s);                                                                       \
  }

// True if all len values are finite (x - x is 0 for finite x, NaN otherwise).
#define FASTUDY_FINITE_KERNEL(NAME, T, ATTR)                                                    \
  ATTR bool NAME(const T* x, std::size_t len) {                                 \
    T s[kLanes] = {};                                                                     \
    std::size_t i = 0;                                                                    \
    for (; i + kLanes <= len; i += kLanes)                                                \
      for (int l = 0; l < kLanes; ++l) s[l] += x[i + l] - x[i + l];                       \
    for (int l = 0; i < len; ++i, ++l) s[l] += x[i] - x[i];                               \
    T t = 0;                                                                              \
    for (int l = 0; l < kLanes; ++l) t += s[l];                                           \
    return t == 0;                                                                        \
  }

FASTUDY_PER_ISA_KERNEL(FASTUDY_SORTED_KERNEL, sorted_kernel_f, float)
FASTUDY_PER_ISA_KERNEL(FASTUDY_SORTED_KERNEL, sorted_kernel_d, double)
FASTUDY_PER_ISA_KERNEL(FASTUDY_ELEMENTWISE_KERNEL, elementwise_kernel_f, float)
FASTUDY_PER_ISA_KERNEL(FASTUDY_ELEMENTWISE_KERNEL, elementwise_kernel_d, double)
FASTUDY_PER_ISA_KERNEL(FASTUDY_SQUARES_KERNEL, squares_kernel_f, float)
FASTUDY_PER_ISA_KERNEL(FASTUDY_SQUARES_KERNEL, squares_kernel_d, double)
FASTUDY_PER_ISA_KERNEL(FASTUDY_FINITE_KERNEL, finite_kernel_f, float)
FASTUDY_PER_ISA_KERNEL(FASTUDY_FINITE_KERNEL, finite_kernel_d, double)

}  // namespace

void sorted_kernel(const float* a, const float* b, std::size_t n, double* s, double* q) {
  static const auto fn = FASTUDY_PICK(sorted_kernel_f);
  fn(a, b, n, s, q);
}
void sorted_kernel(const double* a, const double* b, std::size_t n, double* s, double* q) {
  static const auto fn = FASTUDY_PICK(sorted_kernel_d);
  fn(a, b, n, s, q);
}
void elementwise_kernel(const float* a, const float* b, std::size_t n, double* s, double* q, double* m) {
  static const auto fn = FASTUDY_PICK(elementwise_kernel_f);
  fn(a, b, n, s, q, m);
}
void elementwise_kernel(const double* a, const double* b, std::size_t n, double* s, double* q,
                        double* m) {
  static const auto fn = FASTUDY_PICK(elementwise_kernel_d);
  fn(a, b, n, s, q, m);
}
double squares_kernel(const float* x, std::size_t n) {
  static const auto fn = FASTUDY_PICK(squares_kernel_f);
  return fn(x, n);
}
double squares_kernel(const double* x, std::size_t n) {
  static const auto fn = FASTUDY_PICK(squares_kernel_d);
  return fn(x, n);
}
bool all_finite(const float* x, std::size_t n) {
  static const auto fn = FASTUDY_PICK(finite_kernel_f);
  return fn(x, n);
}
bool all_finite(const double* x, std::size_t n) {
  static const auto fn = FASTUDY_PICK(finite_kernel_d);
  return fn(x, n);
}

}  // namespace fastudy::lanes
