// The attention check harness (see kernels/check.hpp): error metrics, the unit-roundoff bounds, the
// fp64 reference of a problem and the forward/backward runs of a kernel against it.
//
// B batch, H heads, N sequence, d head dim; tensors are [B, H, N, d].
#include "kernels/check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "base/error.hpp"

namespace fastudy {

template <class T>
ErrorMetrics error_metrics(const T* a, const double* ref, std::size_t n) {
  ErrorMetrics m;
  double sum = 0, sum_sq = 0, ref_sq = 0, signed_sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double signed_e = static_cast<double>(a[i]) - ref[i];
    const double e = std::fabs(signed_e);
    m.max_abs = std::max(m.max_abs, e);
    sum += e;
    signed_sum += signed_e;
    sum_sq += e * e;
    ref_sq += ref[i] * ref[i];
  }
  const double count = static_cast<double>(n);
  m.mean_abs = sum / count;
  m.std_abs = std::sqrt(std::max(0.0, sum_sq / count - m.mean_abs * m.mean_abs));
  m.rel_l2 = ref_sq > 0 ? std::sqrt(sum_sq / ref_sq) : std::sqrt(sum_sq);
  m.rmse = n > 0 ? std::sqrt(sum_sq / count) : 0.0;
  m.mean_signed = n > 0 ? signed_sum / count : 0.0;
  return m;
}

template <class T>
ErrorMetrics error_metrics(const std::vector<T>& a, const std::vector<double>& ref) {
  if (a.size() != ref.size()) {
    throw Error("error_metrics: " + std::to_string(a.size()) + " values against a reference of " +
                std::to_string(ref.size()));
  }
  return error_metrics(a.data(), ref.data(), a.size());
}

template <class T>
double max_abs(const T* x, std::size_t n) {
  double m = 0;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
  return m;
}

double step_u(Format step, Format buffer) { return std::max(unit_roundoff(step), unit_roundoff(buffer)); }

template <class T>
double score_magnitude(const AttentionShape& shape, const T* q, const T* k) {
  const std::int64_t n = shape.seq_len, d = shape.head_dim;
  const double scale = shape.scale != 0 ? shape.scale : 1.0 / std::sqrt(static_cast<double>(d));
  double m = 0;
  for (std::int64_t h = 0; h < shape.batch * shape.heads; ++h)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t t = 0; t < d; ++t)
          s += std::fabs(static_cast<double>(q[(h * n + i) * d + t]) * static_cast<double>(k[(h * n + j) * d + t]));
        m = std::max(m, s * scale);
      }
  return m;
}

// The softmax term shared by both bounds: 2 |dS| relative + 2 Smag (u_softmax + u_exp_arg) + u_softmax
// + u_p + (N + 1) u_stats + u_division + 4 u_buffer (see forward_bound in check.hpp), with the scale
// placement's extra rounding in |dS| and the FlashAttention kernels' exp2 argument.
namespace {
// max_offset beta moves the max subtracted from S to beta m or 0: the exp arguments S - m' reach
// (1 + beta) Smag <= 2 beta Smag, and m_old - m_new 2 beta Smag, so every Smag that bounds an exp
// argument is beta Smag (1 without the option).
double exp_arg_reach(const PrecisionPolicy& p) { return p.max_offset > 1 ? p.max_offset : 1.0; }

double softmax_term(const PrecisionPolicy& p, double n, double d, Format buffer, double smag) {
  const double exp_smag = exp_arg_reach(p) * smag;
  const double ua = step_u(p.accum, buffer), us = step_u(p.s, buffer), up = step_u(p.p, buffer);
  const double ust = step_u(p.stats, buffer), udiv = step_u(p.division, buffer);
  const double usm = step_u(p.softmax, buffer), uea = step_u(p.exp_arg, buffer);
  const double ut = step_u(buffer, buffer);
  const double placement = p.scale == ScalePlacement::after    ? us
                           : p.scale == ScalePlacement::before ? step_u(p.q, buffer)
                                                               : 0.0;
  const double ds = (d * ua + us + placement) * smag;
  const double kernel = p.kernel == FlashKernel::framework ? 0.0 : exp_smag * uea + 2 * exp_smag * ut + udiv;
  return 2 * ds + 2 * exp_smag * (usm + uea) + usm + up + (n + 1) * ust + udiv + 4 * ut + kernel;
}
// Rounding toward zero or stochastically errs by less than one ulp (2u), twice nearest's u.
double mode_factor(const PrecisionPolicy& p) { return p.rounding == Rounding::nearest ? 1.0 : 2.0; }
// The subnormals' error of a quantized step relative to its block's amax: spacing / (2 largest).
double quantum_eps(Format f) { return subnormal_spacing(f) / (2 * largest_finite(f)); }
}  // namespace

double forward_bound(const PrecisionPolicy& p, const AttentionShape& shape, Format buffer, double smag, double vmax,
                     int block_kv, double qk_norm) {
  const double n = static_cast<double>(shape.seq_len), d = static_cast<double>(shape.head_dim);
  const double ua = step_u(p.accum, buffer), ur = step_u(p.rescale, buffer);
  const double uo = step_u(p.o, buffer), udiv = step_u(p.division, buffer), uor = step_u(p.o_running, buffer);
  const double usr = step_u(p.stats_running, buffer), uea = step_u(p.exp_arg, buffer);
  const double ut = step_u(buffer, buffer);
  const double tiles = std::ceil(n / std::min<double>(block_kv, n));
  const double softmax = softmax_term(p, n, d, buffer, smag);
  const double pv = n * ua;
  const double flash = tiles * (ur + 2 * exp_arg_reach(p) * smag * uea + 3 * uor + ua + udiv + 3 * usr);
  const bool fp8_p = p.p == Format::fp8_e4m3 || p.p == Format::fp8_e5m2;
  const double max_offset = p.kernel == FlashKernel::fa3 && fp8_p ? 256.0 : 1.0;
  // max_offset: the row's largest P is exp(m - m') >= exp(-max(beta - 1, 1) Smag), not 1.
  const double least_p = p.max_offset > 1 ? std::exp(-std::max(p.max_offset - 1, 1.0) * smag) : 1.0;
  const double underflow = n * subnormal_spacing(p.p) / 2 / max_offset / least_p;
  double quantized = 0;
  if (p.quantization != Quantization::none) {
    const double uq = step_u(p.q, buffer), uk = step_u(p.k, buffer), uv = step_u(p.v, buffer);
    const double s_error = (uq + uk) * smag + (quantum_eps(p.q) + quantum_eps(p.k)) * qk_norm;
    quantized = 2 * s_error + uv + quantum_eps(p.v);
  }
  if (p.incoherent) quantized += 2 * 2 * (std::log2(d) + 2) * ut * qk_norm;
  return mode_factor(p) * (softmax + pv + flash + uo + underflow + quantized) * vmax;
}

double lse_bound(double forward_bound, double vmax, double max_abs_lse_ref) {
  return forward_bound / vmax * (1 + max_abs_lse_ref);
}

double backward_bound(const PrecisionPolicy& p, const AttentionShape& shape, Format buffer, double smag) {
  const double n = static_cast<double>(shape.seq_len), d = static_cast<double>(shape.head_dim);
  const double ua = step_u(p.accum, buffer), ug = step_u(p.grad, buffer);
  const double usr = step_u(p.stats_running, buffer);
  const double softmax = softmax_term(p, n, d, buffer, smag);
  const double placement = p.scale == ScalePlacement::fused ? 0.0 : ug;
  return mode_factor(p) * 4 * ((d + n) * ua + 3 * ug + placement + usr + softmax);
}

AttentionReference make_reference(const AttentionShape& shape, std::vector<double> q, std::vector<double> k,
                                  std::vector<double> v, std::vector<double> dout) {
  const std::size_t size = static_cast<std::size_t>(shape.batch * shape.heads * shape.seq_len * shape.head_dim);
  if (q.size() != size || k.size() != size || v.size() != size || (!dout.empty() && dout.size() != size)) {
    throw Error("make_reference: inputs must hold B*H*N*d = " + std::to_string(size) + " values each");
  }
  AttentionReference r;
  r.shape = shape;
  r.q = std::move(q);
  r.k = std::move(k);
  r.v = std::move(v);
  r.dout = std::move(dout);
  r.o.resize(size);
  r.lse.resize(size / static_cast<std::size_t>(shape.head_dim));
  attention_forward_reference(shape, r.q.data(), r.k.data(), r.v.data(), r.o.data(), r.lse.data());
  if (!r.dout.empty()) {
    r.grad.resize(3 * size);
    attention_backward_reference(shape, r.q.data(), r.k.data(), r.v.data(), r.dout.data(), r.grad.data(),
                                 r.grad.data() + size, r.grad.data() + 2 * size);
  }
  r.smag = score_magnitude(shape, r.q, r.k);
  r.vmax = max_abs(r.v);
  const std::int64_t d = shape.head_dim, rows = static_cast<std::int64_t>(size) / d;
  double q_norm = 0, k_norm = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    double qs = 0, ks = 0;
    for (std::int64_t t = 0; t < d; ++t) {
      qs += r.q[i * d + t] * r.q[i * d + t];
      ks += r.k[i * d + t] * r.k[i * d + t];
    }
    q_norm = std::max(q_norm, std::sqrt(qs));
    k_norm = std::max(k_norm, std::sqrt(ks));
  }
  const double scale = shape.scale != 0 ? shape.scale : 1.0 / std::sqrt(static_cast<double>(d));
  r.qk_norm = static_cast<double>(d) * scale * q_norm * k_norm;
  return r;
}

AttentionReference make_reference(const AttentionShape& shape, const PrecisionPolicy& storage, std::vector<double> q,
                                  std::vector<double> k, std::vector<double> v, std::vector<double> dout) {
  round_inplace(input_format(storage, storage.q), q.data(), q.size());
  round_inplace(input_format(storage, storage.k), k.data(), k.size());
  round_inplace(input_format(storage, storage.v), v.data(), v.size());
  round_inplace(storage.grad, dout.data(), dout.size());
  return make_reference(shape, std::move(q), std::move(k), std::move(v), std::move(dout));
}

namespace {

std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", x);
  return buf;
}

std::string within(double err, double bound) { return sci(err) + (err <= bound ? " <= " : " EXCEEDS ") + sci(bound); }

}  // namespace

template <class T>
std::string ForwardCheck<T>::summary() const {
  return "max|dO| " + within(error.max_abs, bound) + ", max|d lse| " + within(lse_error.max_abs, lse_bound);
}

template <class T>
ForwardCheck<T> check_forward(const AttentionReference& ref, const AttentionParams& params,
                              const ForwardKernel<T>& kernel) {
  const std::vector<T> q(ref.q.begin(), ref.q.end()), k(ref.k.begin(), ref.k.end()), v(ref.v.begin(), ref.v.end());
  ForwardCheck<T> c;
  c.o.resize(ref.size());
  c.lse.resize(ref.lse.size());
  c.stats = kernel(ref.shape, params, q.data(), k.data(), v.data(), c.o.data(), c.lse.data());
  c.error = error_metrics(c.o, ref.o);
  c.lse_error = error_metrics(c.lse, ref.lse);
  c.bound =
      forward_bound(params.policy, ref.shape, buffer_format<T>, ref.smag, ref.vmax, params.block_kv, ref.qk_norm);
  c.lse_bound = lse_bound(c.bound, ref.vmax, max_abs(ref.lse));
  return c;
}

template <class T>
bool BackwardCheck<T>::ok() const {
  return error.rel_l2 <= bound && dq_error.rel_l2 <= bound && dk_error.rel_l2 <= bound && dv_error.rel_l2 <= bound;
}

template <class T>
std::string BackwardCheck<T>::summary() const {
  return "rel_l2 dQ|dK|dV " + within(error.rel_l2, bound) + " (dQ " + sci(dq_error.rel_l2) + ", dK " +
         sci(dk_error.rel_l2) + ", dV " + sci(dv_error.rel_l2) + ")";
}

template <class T>
BackwardCheck<T> check_backward(const AttentionReference& ref, const AttentionParams& params,
                                const ForwardKernel<T>& forward, const BackwardKernel<T>& backward) {
  if (ref.grad.empty()) throw Error("check_backward: the reference has no dout (make_reference without dout)");
  const std::size_t size = ref.size();
  const std::vector<T> q(ref.q.begin(), ref.q.end()), k(ref.k.begin(), ref.k.end()), v(ref.v.begin(), ref.v.end());
  const std::vector<T> dout(ref.dout.begin(), ref.dout.end());
  BackwardCheck<T> c;
  c.o.resize(size);
  c.lse.resize(ref.lse.size());
  c.grad.resize(3 * size);
  forward(ref.shape, params, q.data(), k.data(), v.data(), c.o.data(), c.lse.data());
  backward(ref.shape, params, q.data(), k.data(), v.data(), c.o.data(), c.lse.data(), dout.data(), c.grad.data(),
           c.grad.data() + size, c.grad.data() + 2 * size);
  c.error = error_metrics(c.grad, ref.grad);
  c.dq_error = error_metrics(c.grad.data(), ref.grad.data(), size);
  c.dk_error = error_metrics(c.grad.data() + size, ref.grad.data() + size, size);
  c.dv_error = error_metrics(c.grad.data() + 2 * size, ref.grad.data() + 2 * size, size);
  c.bound = backward_bound(params.policy, ref.shape, buffer_format<T>, ref.smag);
  return c;
}

std::string describe_kernel(const AttentionParams& params) {
  std::string s(to_string(params.attention));
  if (params.attention == AttentionKind::flash) s += " " + std::string(to_string(params.order));
  s += " " + params.policy.name + " " + std::string(to_string(params.policy.q));
  if (params.policy.rounding != Rounding::nearest) s += " " + std::string(to_string(params.policy.rounding));
  s += " (blocks " + std::to_string(params.block_q) + "x" + std::to_string(params.block_kv) + ")";
  return s;
}

#define FASTUDY_CHECK_INSTANTIATE(T)                                                                            \
  template ErrorMetrics error_metrics<T>(const T*, const double*, std::size_t);                                 \
  template ErrorMetrics error_metrics<T>(const std::vector<T>&, const std::vector<double>&);                    \
  template double max_abs<T>(const T*, std::size_t);                                                            \
  template double score_magnitude<T>(const AttentionShape&, const T*, const T*);                                \
  template struct ForwardCheck<T>;                                                                              \
  template struct BackwardCheck<T>;                                                                             \
  template ForwardCheck<T> check_forward<T>(const AttentionReference&, const AttentionParams&,                  \
                                            const ForwardKernel<T>&);                                           \
  template BackwardCheck<T> check_backward<T>(const AttentionReference&, const AttentionParams&,                \
                                              const ForwardKernel<T>&, const BackwardKernel<T>&);
FASTUDY_CHECK_INSTANTIATE(float)
FASTUDY_CHECK_INSTANTIATE(double)
#undef FASTUDY_CHECK_INSTANTIATE

}  // namespace fastudy
