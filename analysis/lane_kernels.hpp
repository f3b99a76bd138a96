// The lane kernels of the pairwise distances (internal to analysis/): kLanes independent fp64
// partial sums in a fixed lane order, folded in a fixed tree, no FMA contraction, so every ISA variant
// (lane_kernels.cpp, chosen by base's cpu_isa()) and the scalar versions below round identically.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace fastudy::lanes {

constexpr int kLanes = 8;

// Fold the lanes in a fixed tree order.
inline double fold(const double* s) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// sum |a-b| (and sum (a-b)^2 if q != nullptr) over n finite values.
void sorted_kernel(const float* a, const float* b, std::size_t n, double* s, double* q);
void sorted_kernel(const double* a, const double* b, std::size_t n, double* s, double* q);
// sum |a-b|, sum (a-b)^2, max |a-b| over n finite values.
void elementwise_kernel(const float* a, const float* b, std::size_t n, double* s, double* q, double* m);
void elementwise_kernel(const double* a, const double* b, std::size_t n, double* s, double* q, double* m);
// sum x^2 over n finite values.
double squares_kernel(const float* x, std::size_t n);
double squares_kernel(const double* x, std::size_t n);
// Whether all n values are finite.
bool all_finite(const float* x, std::size_t n);
bool all_finite(const double* x, std::size_t n);

// Scalar versions for blocks that hold a non-finite value: skip those indices, count them. They use
// the same lane assignment as the kernels, so a block without non-finite values gives the same sums.
template <class T>
void sorted_slow(const T* a, const T* b, std::size_t len, double* abs_out, double* sq_out,
                 std::uint64_t* skipped) {
  double sa[kLanes] = {}, sq[kLanes] = {};
  for (std::size_t i = 0; i < len; ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    if (!std::isfinite(d * d)) {  // a non-finite value, or |a-b| > 1.3e154 (fp64 inputs only)
      ++*skipped;
      continue;
    }
    sa[i % kLanes] += std::fabs(d);
    sq[i % kLanes] += d * d;
  }
  *abs_out = fold(sa);
  if (sq_out) *sq_out = fold(sq);
}

template <class T>
void elementwise_slow(const T* a, const T* b, std::size_t len, double* abs_out, double* sq_out,
                      double* max_out, std::uint64_t* skipped) {
  double sa[kLanes] = {}, sq[kLanes] = {};
  double m = 0;
  for (std::size_t i = 0; i < len; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!std::isfinite(d * d)) {  // a non-finite value, or |a-b| > 1.3e154 (fp64 inputs only)
      ++*skipped;
      continue;
    }
    sa[i % kLanes] += d;
    sq[i % kLanes] += d * d;
    m = m > d ? m : d;
  }
  *abs_out = fold(sa);
  *sq_out = fold(sq);
  *max_out = m;
}

template <class T>
double squares_slow(const T* x, std::size_t len) {
  double s[kLanes] = {};
  for (std::size_t i = 0; i < len; ++i)
    if (std::isfinite(static_cast<double>(x[i]) * static_cast<double>(x[i])))
      s[i % kLanes] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return fold(s);
}

}  // namespace fastudy::lanes
