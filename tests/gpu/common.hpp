// Helpers of the tests/gpu tests: seeded inputs, the fp64 reference on rounded inputs, error
// measures and the forward/backward error bounds on float buffers (the same step-by-step derivation
// from unit roundoffs as tests/kernels/test_attention.cpp, repeated here with its reasoning).
//
// B batch, H heads, N sequence, d head dim; tensors [B, H, N, d] row-major.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/format.hpp"

namespace fastudy::gpu_test {

inline std::vector<float> random_normal(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

inline std::vector<float> rounded(const std::vector<float>& x, Format f) {
  std::vector<float> r(x);
  round_inplace(f, r.data(), r.size());
  return r;
}

inline std::vector<double> widen(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

inline double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

inline double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, std::fabs(static_cast<double>(v)));
  return m;
}

inline double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

// u of a step on float buffers: a float holds at most fp32 precision.
inline double step_u(Format f) { return std::max(unit_roundoff(f), unit_roundoff(Format::fp32)); }

// Largest scaled |score| magnitude Smag = max_ij sum_t |q_it k_jt| * scale.
inline double score_magnitude(const AttentionShape& shape, const std::vector<float>& q, const std::vector<float>& k) {
  const std::int64_t n = shape.seq_len, d = shape.head_dim;
  const double scale = shape.scale != 0 ? shape.scale : 1.0 / std::sqrt(static_cast<double>(d));
  double m = 0;
  for (std::int64_t h = 0; h < shape.batch * shape.heads; ++h)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t t = 0; t < d; ++t) s += std::fabs(double(q[(h * n + i) * d + t]) * k[(h * n + j) * d + t]);
        m = std::max(m, s * scale);
      }
  return m;
}

// Forward bound |O - O_ref| <= bound elementwise (first order; the reference sees the same rounded
// Q, K, V):
//   scores  a length-d dot product rounded to accum after every add, then to s: (d u_accum + u_s) Smag.
//   softmax P moves by at most 2 |dS| relative (numerator and normalising sum), plus u_p, N + 1
//           stats roundings (max and N sum adds), u_division, and 4 u_fp32 for the ~1 ulp expf.
//   P.V     a length-N sum in accum: N u_accum relative to sum_j P_ij |v_j| <= max|v|.
//   flash   each of the ceil(N/Bc) tiles rescales O once more: u_rescale + u_o_running + u_accum +
//           u_division + u_stats per tile.
//   output  u_o. Everything relative to max|v|, which bounds |O|.
inline double forward_bound(const PrecisionPolicy& p, const AttentionShape& shape, double smag, double vmax,
                            int block_kv) {
  const double n = static_cast<double>(shape.seq_len), d = static_cast<double>(shape.head_dim);
  const double ua = step_u(p.accum), us = step_u(p.s), up = step_u(p.p), ust = step_u(p.stats);
  const double ur = step_u(p.rescale), uo = step_u(p.o), udiv = step_u(p.division), uor = step_u(p.o_running);
  const double ut = unit_roundoff(Format::fp32);
  const double tiles = std::ceil(n / std::min<double>(block_kv, n));
  const double softmax = 2 * (d * ua + us) * smag + up + (n + 1) * ust + udiv + 4 * ut;
  return (softmax + n * ua + tiles * (ur + uor + ua + udiv + ust) + uo) * vmax;
}

// Backward bound in relative L2: each gradient is two chained dot products ((d + N) u_accum), dS and
// the stored gradients add u_grad each (3 u_grad), P carries the forward's softmax error; the
// subtraction dP - D can amplify relative errors by max|dP| / |dP - D|, allowed as 4 on these random
// normal inputs (the same factor as the CPU kernels' tests).
inline double backward_bound(const PrecisionPolicy& p, const AttentionShape& shape, double smag) {
  const double n = static_cast<double>(shape.seq_len), d = static_cast<double>(shape.head_dim);
  const double ua = step_u(p.accum), us = step_u(p.s), up = step_u(p.p), ust = step_u(p.stats);
  const double ug = step_u(p.grad), udiv = step_u(p.division);
  const double ut = unit_roundoff(Format::fp32);
  const double softmax = 2 * (d * ua + us) * smag + up + (n + 1) * ust + udiv + 4 * ut;
  return 4 * ((d + n) * ua + 3 * ug + softmax);
}

// The variants the CUDA kernels implement.
struct Variant {
  const char* name;
  AttentionKind kind;
  LoopOrder order;
};
inline constexpr Variant kVariants[] = {{"baseline", AttentionKind::baseline, LoopOrder::q_outer},
                                        {"flash_q_outer", AttentionKind::flash, LoopOrder::q_outer},
                                        {"flash_kv_outer", AttentionKind::flash, LoopOrder::kv_outer}};
inline constexpr Format kCudaFormats[] = {Format::fp32, Format::fp16, Format::bf16};

}  // namespace fastudy::gpu_test
