// The per-row, per-tile arithmetic of the CUDA attention kernels, as FASTUDY_HD (__host__ __device__)
// functions. The device kernels (attention_cuda.cu) and the host twin (tile_reference.cpp, compiled
// by the host compiler) call exactly these functions, so a CPU test checks the numerics the GPU runs.
//
// B batch, H heads, N sequence, d head dim, Br/Bc the Q/KV block sizes. Values live in float; each
// step is rounded by a rounding object R (TileRounding<S, C, R, Score>: storage steps q, k, v, p, o,
// grad in S, s in Score, in-op steps accum, stats, softmax, division in C, state steps stats_running,
// rescale, o_running, exp_arg in R), with the op decomposition and step semantics of the CPU kernels
// (kernels/detail/attention_impl.hpp, where it is written out):
//   dot product acc = accum(fma(a_t, b_t, acc)) for t = 0..d-1 in order (always fused, as on GPUs).
//   scores      s = s(acc * scale) (the baseline's scale placement: s(s(acc) * scale) after, s(acc)
//               before with Q scaled on load), causally masked entries -inf.
//   P           framework flash p(exp(exp_arg(s - m))); baseline's fused softmax
//               softmax(exp(softmax(s - m))); exp is exp_f32 below (the CPU kernels' Cephes expf, fused).
//   O           flash keeps the running O in o_running; final O/l rounded to division, then to o.
//   backward    P recomputed from lse, dS = grad(P (dP - D)), dQ/dK/dV accumulated in accum.
//   fa2, fa3    the FlashAttention kernels (FlashKernel): S unscaled and unrounded, KV blocks last to
//               first, P = exp2(fma(S, scale_log2, -m scale_log2)) (exp2_f32), four lane sums of the
//               unrounded P all-reduced at the end, O times 1/l; backward with P from exp2 of the
//               saved lse, dS from the unrounded P, D over the threads of dot_do_o, dQ added per KV
//               block (kernels/detail/forward.hpp and backward.hpp list each step's source).
// Round to nearest only (the CPU kernels also round toward zero and stochastically).
// Only explicit fmaf() calls fuse: the CUDA code is compiled with --fmad=false and the host twin with
// -ffp-contract=off, so host and device perform the same operations. logf (for lse) is the one
// library call whose last bit may differ between host and device.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/attention.hpp"
#include "kernels/format.hpp"
#include "kernels/round.hpp"

namespace fastudy::cuda_tile {

// The sizes of one head as the tiles see them (block sizes clipped to N), shared by the device
// kernels and the host twin.
struct TileHead {
  std::int64_t n;
  int d, br, bc;
  float scale;
  bool causal;
  FlashKernel kernel;        // the flash kind's kernel; framework for the baseline
  ScalePlacement placement;       // the framework kinds' scale placement (baseline, framework flash); fused for fa2/fa3
  ScalePlacement grad_placement;  // how dQ, dK take the scale at the end (store_gradient_triple)
  bool ops;  // framework flash backward with its running gradients stored (o_running narrower than fp32):
             // FA-2's Algorithm 2 as framework ops (the CPU kernels' `ops`, kernels/detail/backward.hpp)
  float max_offset;          // the policy's max_offset beta (0: off), see offset_tile_max
  float tie_tolerance;       // its tie test in the units of the scores the tiles hold (the CPU kernels' own)
};

// scale_log2 = float(softmax_scale * M_LOG2E), in double (flash_api.cpp, mainloop_fwd_sm90).
FASTUDY_HD inline float scale_log2_of(float scale) {
  return static_cast<float>(static_cast<double>(scale) * 1.44269504088896340736);
}

inline TileHead make_tile_head(const AttentionShape& shape, const AttentionParams& params) {
  TileHead h;
  h.n = shape.seq_len;
  h.d = static_cast<int>(shape.head_dim);
  h.br = static_cast<int>(std::min<std::int64_t>(params.block_q, h.n));
  h.bc = static_cast<int>(std::min<std::int64_t>(params.block_kv, h.n));
  h.scale = static_cast<float>(shape.scale != 0.0 ? shape.scale : 1.0 / std::sqrt(static_cast<double>(h.d)));
  h.causal = shape.causal;
  const bool flash = params.attention == AttentionKind::flash;
  h.kernel = flash ? params.policy.kernel : FlashKernel::framework;
  h.placement = h.kernel == FlashKernel::framework ? params.policy.scale : ScalePlacement::fused;
  h.ops = flash && h.kernel == FlashKernel::framework && params.policy.o_running != Format::fp32;
  // As ops dQ and dK hold the scale already (`before`: dQ = grad(dQ' * scale) still); otherwise the
  // framework flash loops' `after` differentiates as `fused`.
  if (h.ops) h.grad_placement = h.placement == ScalePlacement::before ? ScalePlacement::before : ScalePlacement::after;
  else h.grad_placement = flash && h.placement == ScalePlacement::after ? ScalePlacement::fused : h.placement;
  h.max_offset = static_cast<float>(params.policy.max_offset);
  // The framework kernels and the baseline hold scaled scores: 1e-3 as the reference tests them; fa2 and
  // fa3 hold S unscaled, whose scaled logit is S * scale_log2 / log2 e (forward.hpp's tie_raw).
  h.tie_tolerance = h.kernel == FlashKernel::framework
                        ? static_cast<float>(kRepeatedMaxTolerance)
                        : static_cast<float>(kRepeatedMaxTolerance * 1.44269504088896340736 /
                                             static_cast<double>(scale_log2_of(h.scale)));
  return h;
}

// Storage steps in S (s in Score), in-op steps in C, state steps in R: the pure <S, S, S>, eager and
// framework baseline <S, fp32, S>, mixed <S, fp32, fp32> and fa2/fa3 <S, fp32, fp32, fp32> presets.
template <Format S, Format C, Format R, Format Score = S>
struct TileRounding {
  static constexpr Format kStorage = S;
  static constexpr Format kCompute = C;
  static constexpr Format kState = R;
  static constexpr Format kScore = Score;
  // Running sum / O exact in float: accumulated straight into (see the CPU kernels).
  static constexpr bool kExactState = R == Format::fp32;
  FASTUDY_HD static float q(float x) { return round_to_format<S>(x); }
  FASTUDY_HD static float k(float x) { return round_to_format<S>(x); }
  FASTUDY_HD static float v(float x) { return round_to_format<S>(x); }
  FASTUDY_HD static float s(float x) { return round_to_format<Score>(x); }
  FASTUDY_HD static float p(float x) { return round_to_format<S>(x); }
  FASTUDY_HD static float o(float x) { return round_to_format<S>(x); }
  FASTUDY_HD static float grad(float x) { return round_to_format<S>(x); }
  FASTUDY_HD static float accum(float x) { return round_to_format<C>(x); }
  FASTUDY_HD static float stats(float x) { return round_to_format<C>(x); }
  FASTUDY_HD static float softmax(float x) { return round_to_format<C>(x); }
  FASTUDY_HD static float division(float x) { return round_to_format<C>(x); }
  FASTUDY_HD static float stats_running(float x) { return round_to_format<R>(x); }
  FASTUDY_HD static float rescale(float x) { return round_to_format<R>(x); }
  FASTUDY_HD static float o_running(float x) { return round_to_format<R>(x); }
  FASTUDY_HD static float exp_arg(float x) { return round_to_format<R>(x); }
};

FASTUDY_HD inline float neg_inf() { return detail::bits_as<float>(std::uint32_t{0xFF800000u}); }
FASTUDY_HD inline float pos_inf() { return detail::bits_as<float>(std::uint32_t{0x7F800000u}); }
FASTUDY_HD inline float max_of(float a, float b) { return a > b ? a : b; }  // the CPU kernels' vmax

// Cephes expf with the CPU kernels' constants and order of operations (about 1 ulp): exp(x) = 0 below
// -87.34 (masked scores are -inf and give exactly 0), inf above 88.72, NaN stays NaN.
FASTUDY_HD inline float exp_f32(float x) {
  const float xc = x < 88.3762626647949f ? x : 88.3762626647949f;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (ties to even)
  const float t = fmaf(xc, 1.44269504088896341f, magic);
  const float n = t - magic;
  float r = fmaf(n, -0.693359375f, xc);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  const float y = fmaf(p, r * r, r + 1.0f);
  const std::uint32_t e =
      (detail::bits_as<std::uint32_t>(t) - detail::bits_as<std::uint32_t>(magic) + 127u) << 23;
  float res = y * detail::bits_as<float>(e);
  if (x < -87.3365447505531f) res = 0.0f;
  if (x > 88.7228391116729f) res = pos_inf();
  return x != x ? x : res;
}

// Cephes exp2f with the CPU kernels' constants and order of operations (vexp2, kernels/detail/exp.hpp;
// about 1 ulp): x = n + f with n the nearest integer, 2^f = 1 + f P(f); results below 2^-126 flushed to
// 0 as the GPU's ex2.approx.ftz.f32 does (exp2(-inf) = 0), inf from x >= 128, NaN stays NaN.
FASTUDY_HD inline float exp2_f32(float x) {
  const float xc = x < 128.0f ? (x > -127.0f ? x : -127.0f) : 128.0f;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (ties to even)
  const float t = xc + magic;
  const float n = t - magic;
  const float f = xc - n;
  float p = fmaf(1.535336188319500e-4f, f, 1.339887440266574e-3f);
  p = fmaf(p, f, 9.618437357674640e-3f);
  p = fmaf(p, f, 5.550332471162809e-2f);
  p = fmaf(p, f, 2.402264791363012e-1f);
  p = fmaf(p, f, 6.931472028550421e-1f);
  const float y = fmaf(p, f, 1.0f);
  // 2^n as a float bit pattern; n = 128 (x in [127.5, 128)) as 2^127 times 2, exactly.
  const std::int32_t ni =
      static_cast<std::int32_t>(detail::bits_as<std::uint32_t>(t) - detail::bits_as<std::uint32_t>(magic));
  const bool top = ni > 127;
  const std::uint32_t e = static_cast<std::uint32_t>(ni + 127 - (top ? 1 : 0)) << 23;
  float res = y * detail::bits_as<float>(e);
  if (top) res = res * 2.0f;
  if (x < -126.0f) res = 0.0f;
  if (x >= 128.0f) res = pos_inf();
  return x != x ? x : res;
}

// Qiu & Yao's max_offset on the max m of one tile of one row (the baseline: the whole row), the CPU
// kernels' offset_tile_max (kernels/detail/head.hpp), from the reference code's FA-2 forward
// (github ucker/why-low-precision-training-fails, attention.py, STABLE=1): two or more scores within
// tolerance of m make m beta m (m > 0) or 0 (m < 0); m = 0, m = -inf (no key in the tile) and beta = 0
// (off) keep m.
FASTUDY_HD inline float offset_tile_max(const float* s, std::int64_t n, float m, const TileHead& h) {
  if (h.max_offset == 0.0f || m == neg_inf()) return m;
  const float floor = m - h.tie_tolerance;
  int close = 0;
  for (std::int64_t c = 0; c < n; ++c) close += s[c] >= floor ? 1 : 0;
  if (close < 2) return m;
  return m > 0.0f ? h.max_offset * m : (m < 0.0f ? 0.0f : m);
}

// A row max rounded to stats (in one op) or stats_running (flash's running max), an exp argument
// rounded to exp_arg, each except the -inf sentinel ("no key seen yet", a masked score).
template <class R>
FASTUDY_HD inline float round_max(float m) {
  return m == neg_inf() ? m : R::stats(m);
}
template <class R>
FASTUDY_HD inline float round_running_max(float m) {
  return m == neg_inf() ? m : R::stats_running(m);
}
template <class R>
FASTUDY_HD inline float round_exp_arg(float x) {
  return x == neg_inf() ? x : R::exp_arg(x);
}

// acc over t < d of fma(a[t], b[t * stride_b], acc), rounded to accum after every step.
template <class R>
FASTUDY_HD inline float dot(const float* a, const float* b, int stride_b, int d) {
  float acc = 0.0f;
  for (int t = 0; t < d; ++t) acc = R::accum(fmaf(a[t], b[t * stride_b], acc));
  return acc;
}

// What score_row stores of a dot product (the CPU kernels' ScoreStore): fused s(acc * scale); after
// s(s(acc) * scale); raw s(acc) (the baseline's `before`, whose Q holds the scale, and fa2/fa3).
enum class TileScore { fused, after, raw };
FASTUDY_HD inline TileScore tile_score_of(const TileHead& h) {
  if (h.kernel != FlashKernel::framework) return TileScore::raw;
  if (h.placement == ScalePlacement::after) return TileScore::after;
  return h.placement == ScalePlacement::before ? TileScore::raw : TileScore::fused;
}

// s[c] = s(scale * (q . K_{j0+c})) (or what `store` says) for c < bc, -inf where key j0 + c follows
// query i (causal). K is the tile [bc, ldk] (row c holds key j0 + c).
template <class R>
FASTUDY_HD inline void score_row(const float* q, const float* k, int ldk, int bc, int d, float scale, bool causal,
                                 std::int64_t i, std::int64_t j0, float* s, TileScore store = TileScore::fused) {
  for (int c = 0; c < bc; ++c) {
    const float acc = dot<R>(q, k + static_cast<std::int64_t>(c) * ldk, 1, d);
    float x = store == TileScore::fused ? R::s(acc * scale)
              : store == TileScore::after ? R::s(R::s(acc) * scale)
                                          : R::s(acc);
    s[c] = (causal && j0 + c > i) ? neg_inf() : x;
  }
}

// o[t] = accum-sequence of o[t] + sum_c p[c] V[c][t] (c in order), for t < d.
template <class R>
FASTUDY_HD inline void pv_row(const float* p, const float* v, int ldv, int bc, int d, float* o) {
  for (int t = 0; t < d; ++t) {
    float acc = o[t];
    for (int c = 0; c < bc; ++c) acc = R::accum(fmaf(p[c], v[static_cast<std::int64_t>(c) * ldv + t], acc));
    o[t] = acc;
  }
}

// Running state of one query row.
struct RowState {
  float m, l;
};

// ---- FA-2 (q_outer): one tile of one row; s holds the scores on entry and P on exit -----------------
template <class R>
FASTUDY_HD inline void flash_q_outer_tile(float* s, int bc, const float* v, int ldv, int d, bool rescale_o,
                                          RowState& st, float* o, const TileHead& h) {
  float m_tile = neg_inf();
  for (int c = 0; c < bc; ++c) m_tile = max_of(m_tile, s[c]);
  m_tile = offset_tile_max(s, bc, m_tile, h);  // max_offset: attention.py's block_max before new_max
  const float m_new = round_running_max<R>(max_of(st.m, m_tile));
  const float m_safe = m_new == neg_inf() ? 0.0f : m_new;  // keeps exp(-inf - m) = 0, never NaN
  const float alpha = R::rescale(exp_f32(round_exp_arg<R>(st.m - m_safe)));
  float l_new;
  if (R::kExactState) {
    l_new = R::stats(alpha * st.l);
    for (int c = 0; c < bc; ++c) {
      const float p = R::p(exp_f32(round_exp_arg<R>(s[c] - m_safe)));
      s[c] = p;
      l_new = R::stats(l_new + p);
    }
  } else {
    float l_tile = 0.0f;
    for (int c = 0; c < bc; ++c) {
      const float p = R::p(exp_f32(round_exp_arg<R>(s[c] - m_safe)));
      s[c] = p;
      l_tile = R::stats(l_tile + p);
    }
    l_new = R::stats_running(R::stats_running(alpha * st.l) + R::stats_running(l_tile));
  }
  st.l = l_new;
  st.m = m_new;
  if (rescale_o)
    for (int t = 0; t < d; ++t) o[t] = R::o_running(alpha * o[t]);
  if (R::kExactState) {
    pv_row<R>(s, v, ldv, bc, d, o);
  } else {
    for (int t = 0; t < d; ++t) {
      float pv = 0.0f;
      for (int c = 0; c < bc; ++c) pv = R::accum(fmaf(s[c], v[static_cast<std::int64_t>(c) * ldv + t], pv));
      o[t] = R::o_running(o[t] + R::o_running(pv));
    }
  }
}

// Final normalisation of an FA-2 row: out[t] = o(division(o[t] / l)); returns lse = stats(m + log l).
template <class R>
FASTUDY_HD inline float flash_q_outer_finish(const RowState& st, const float* o, int d, float* out) {
  for (int t = 0; t < d; ++t) out[t] = R::o(R::division(o[t] / st.l));
  return R::stats_running(st.m + R::stats_running(logf(st.l)));  // log(l) an op of its own
}

// ---- FA-1 (kv_outer): one tile of one row, O re-normalised (FA-1 Algorithm 1, line 12) -----------
// m~ = rowmax(S), P~ = p(exp(S - m~)), l~ = rowsum(P~), m_new = max(m, m~), alpha = exp(m - m_new),
// beta = exp(m~ - m_new), l_new = alpha l + beta l~, O = (alpha l O + beta P~V) / l_new. Returns whether the row saw a
// key of this tile (a rescale happened).
template <class R>
FASTUDY_HD inline bool flash_kv_outer_tile(float* s, int bc, const float* v, int ldv, int d, RowState& st,
                                           float* o, const TileHead& h) {
  float m_tile = neg_inf();
  for (int c = 0; c < bc; ++c) m_tile = max_of(m_tile, s[c]);
  m_tile = round_running_max<R>(offset_tile_max(s, bc, m_tile, h));  // max_offset: the tile's m~
  if (m_tile == neg_inf()) return false;  // the row sees no key of this tile: nothing to update
  float l_tile = 0.0f;
  for (int c = 0; c < bc; ++c) {
    const float p = R::p(exp_f32(round_exp_arg<R>(s[c] - m_tile)));
    s[c] = p;
    l_tile = R::stats(l_tile + p);
  }
  const float m_new = round_running_max<R>(max_of(st.m, m_tile));
  const float alpha = R::rescale(exp_f32(round_exp_arg<R>(st.m - m_new)));
  const float beta = R::rescale(exp_f32(round_exp_arg<R>(m_tile - m_new)));
  const float alpha_l = R::stats_running(alpha * st.l);
  const float l_new = R::stats_running(alpha_l + R::stats_running(beta * R::stats_running(l_tile)));
  for (int t = 0; t < d; ++t) {
    float pv = 0.0f;
    for (int c = 0; c < bc; ++c) pv = R::accum(fmaf(s[c], v[static_cast<std::int64_t>(c) * ldv + t], pv));
    const float num = R::o_running(R::o_running(alpha_l * o[t]) + R::o_running(beta * R::o_running(pv)));
    o[t] = R::o_running(R::division(num / l_new));
  }
  st.m = m_new;
  st.l = l_new;
  return true;
}

template <class R>
FASTUDY_HD inline float flash_kv_outer_finish(const RowState& st, const float* o, int d, float* out) {
  for (int t = 0; t < d; ++t) out[t] = R::o(o[t]);
  return R::stats_running(st.m + R::stats_running(logf(st.l)));  // log(l) an op of its own
}

// ---- fa2 / fa3 (FlashKernel): one KV block of one row, s holding the unscaled scores on entry and
// p(P) on exit; the lane sums l[q] hold the unrounded P of columns 8v + 2q, 8v + 2q + 1 ----------------
struct KernelRowState {
  float m, l[4];
};

template <class R>
FASTUDY_HD inline void flash_kernel_tile(float* s, int bc, const float* v, int ldv, int d, bool first,
                                         float scale_log2, KernelRowState& st, float* o, const TileHead& h) {
  float m_tile = neg_inf();
  for (int c = 0; c < bc; ++c) m_tile = max_of(m_tile, s[c]);
  m_tile = offset_tile_max(s, bc, m_tile, h);  // max_offset on the raw tile (h.tie_tolerance in its units)
  const float m_new = round_running_max<R>(max_of(st.m, m_tile));
  const float m_use = m_new == neg_inf() ? 0.0f : m_new;  // Check_inf
  float alpha = 1.0f;
  if (!first) {
    alpha = R::rescale(exp2_f32(round_exp_arg<R>((st.m - m_use) * scale_log2)));
    for (int q = 0; q < 4; ++q) st.l[q] = R::stats_running(st.l[q] * alpha);
  }
  const float max_scaled = m_new == neg_inf() ? 0.0f : R::exp_arg(m_use * scale_log2);
  for (int c = 0; c < bc; ++c) {
    const float p = exp2_f32(round_exp_arg<R>(fmaf(s[c], scale_log2, -max_scaled)));
    s[c] = R::p(p);
    st.l[(c % 8) / 2] = R::stats(st.l[(c % 8) / 2] + p);
  }
  st.m = m_new;
  if (!first)
    for (int t = 0; t < d; ++t) o[t] = R::o_running(alpha * o[t]);
  pv_row<R>(s, v, ldv, bc, d, o);
}

// The end of a row: l = (l0 + l2) + (l1 + l3), out[t] = o(o[t] * division(1 / l)) (a zero or NaN l:
// fa2 multiplies by 1, fa3 by 0); returns lse (fa2: m scale + log l, +inf for such l; fa3:
// m (scale_log2 ln 2) + log l, -inf).
template <class R>
FASTUDY_HD inline float flash_kernel_finish(FlashKernel kernel, const KernelRowState& st, float scale,
                                            float scale_log2, const float* o, int d, float* out) {
  const float l = R::stats_running(R::stats_running(st.l[0] + st.l[2]) + R::stats_running(st.l[1] + st.l[3]));
  const bool empty = l == 0.0f || l != l;
  const bool fa2 = kernel == FlashKernel::fa2;
  float inv = empty ? (fa2 ? 1.0f : 0.0f) : R::division(1.0f / l);
  if (!fa2) inv = R::division(inv * 1.0f);  // hopper/softmax.h finalize: inv_sum * final_scale (1)
  for (int t = 0; t < d; ++t) out[t] = R::o(R::division(o[t] * inv));
  if (empty) return fa2 ? pos_inf() : neg_inf();
  const float lse_scale = fa2 ? scale : scale_log2 * 0.693147180559945309417f;
  return R::stats_running(fmaf(st.m, lse_scale, logf(l)));
}

// D_i = dO_i . O_i as dot_do_o sums it (flash_bwd_preprocess_kernel.h): T threads of the row each sum
// their 8-column chunks (page width 8T) in order, product then FMAs, then Allreduce<T>; fa2 T =
// kBlockKSmem / 8 (64 or 32 columns), fa3 T = kBlockKGmem / 8 (128, 64 or 32), of the head dim rounded
// up to 32.
template <class R>
FASTUDY_HD inline float dot_do_o(FlashKernel kernel, const float* dout, const float* o, int d) {
  const int padded = (d + 31) / 32 * 32;
  const int threads = (kernel == FlashKernel::fa3 && padded % 128 == 0 ? 128 : (padded % 64 == 0 ? 64 : 32)) / 8;
  float part[16];
  for (int r = 0; r < threads; ++r) {
    part[r] = 0.0f;
    bool started = false;
    for (int p0 = 0; p0 < d; p0 += 8 * threads) {
      const int t_end = p0 + 8 * r + 8 < d ? p0 + 8 * r + 8 : d;
      for (int t = p0 + 8 * r; t < t_end; ++t) {
        part[r] = started ? R::accum(fmaf(dout[t], o[t], part[r])) : R::accum(dout[t] * o[t]);
        started = true;
      }
    }
  }
  for (int off = threads / 2; off >= 1; off /= 2)
    for (int r = 0; r < off; ++r) part[r] = R::accum(part[r] + part[r + off]);
  return part[0];
}

// lse * log2 e as the fa2/fa3 backward's exp2 subtracts it (flash_bwd_kernel.h scale_apply_exp2,
// hopper/flash_bwd_preprocess_kernel.h LSE_log2; fa3 turns -inf into 0), rounded to exp_arg.
template <class R>
FASTUDY_HD inline float kernel_lse_log2(FlashKernel kernel, float lse) {
  if (kernel == FlashKernel::fa3 && lse == neg_inf()) return 0.0f;
  return round_exp_arg<R>(lse * 1.44269504088896340736f);
}

// The row block a KV block's thread visits at `step` of `blocks`: fa2 from the last to the first
// (m_block = m_block_max - 1 down), fa3 from the first to the last.
FASTUDY_HD inline std::int64_t kernel_row_block(FlashKernel kernel, std::int64_t step, std::int64_t blocks) {
  return kernel == FlashKernel::fa2 ? blocks - 1 - step : step;
}

// One (i, j) entry of the fa2/fa3 backward: S unscaled, P = exp2(fma(S, scale_log2, -lse_log2_i))
// unrounded, dS = grad(P (dP - D_i)); p_operand = p(P) for dV.
template <class R>
FASTUDY_HD inline void flash_kernel_backward_entry(const float* q_i, const float* k_j, const float* dout_i,
                                                   const float* v_j, int d, float scale_log2, float lse_log2_i,
                                                   float d_i, bool masked, float& p_operand, float& ds) {
  const float s = R::s(dot<R>(q_i, k_j, 1, d));
  const float dp = dot<R>(dout_i, v_j, 1, d);
  const float p = masked ? 0.0f : exp2_f32(round_exp_arg<R>(fmaf(s, scale_log2, -lse_log2_i)));
  ds = R::grad(p * (dp - d_i));
  p_operand = R::p(p);
}

// ---- baseline: one whole row; s holds the N scores on entry and the normalised P on exit ----------
template <class R>
FASTUDY_HD inline float baseline_softmax_row(float* s, std::int64_t n, const TileHead& h) {
  float m = neg_inf();
  for (std::int64_t c = 0; c < n; ++c) m = max_of(m, s[c]);
  m = round_max<R>(offset_tile_max(s, n, m, h));  // max_offset: the whole row is the one tile
  float l = 0.0f;
  for (std::int64_t c = 0; c < n; ++c) {
    const float x = s[c] - m;
    s[c] = R::softmax(exp_f32(x == neg_inf() ? x : R::softmax(x)));
    l = R::stats(l + s[c]);
  }
  for (std::int64_t c = 0; c < n; ++c) s[c] = R::p(R::division(s[c] / l));
  return R::stats(m + R::stats(logf(l)));
}

// ---- backward ------------------------------------------------------------------------------------
// One (i, j) entry of the flash backward: P_ij = p(exp(S_ij - lse_i)) recomputed from the saved lse with
// S_ij = s(scale q_i.k_j) (or what `store` says, as score_row), dS_ij = grad(P_ij (dO_i.v_j - D_i)).
// With `ops` (TileHead::ops) dP and dP - D are ops of their own: dS = grad(P grad(grad(dP) - D)).
template <class R>
FASTUDY_HD inline void flash_backward_entry(const float* q_i, const float* k_j, const float* dout_i,
                                            const float* v_j, int d, float scale, TileScore store, bool ops,
                                            float lse_i, float d_i, float& p, float& ds) {
  const float acc = dot<R>(q_i, k_j, 1, d);
  const float dp = dot<R>(dout_i, v_j, 1, d);
  const float s = store == TileScore::fused ? R::s(acc * scale)
                  : store == TileScore::after ? R::s(R::s(acc) * scale)
                                              : R::s(acc);
  p = R::p(exp_f32(round_exp_arg<R>(s - lse_i)));
  ds = ops ? R::grad(p * R::grad(R::grad(dp) - d_i)) : R::grad(p * (dp - d_i));
}

// The flash backward's D_i = dO_i . O_i: stats_running of the accum-sequence of fused products, or with
// `ops` of the grad-rounded products (`(dO * O).sum(-1)`: a product op, then a sum op).
template <class R>
FASTUDY_HD inline float flash_delta(const float* dout_i, const float* o_i, int d, bool ops) {
  if (!ops) return R::stats_running(dot<R>(dout_i, o_i, 1, d));
  float acc = 0.0f;
  for (int t = 0; t < d; ++t) acc = R::accum(acc + R::grad(dout_i[t] * o_i[t]));
  return R::stats_running(acc);
}

// With `ops`, one tile's product handed on to its running gradient (the CPU kernels' add_tile_op):
// acc[t] = o_running(acc[t] + g(tile[t])), g = grad(grad(x) * scale) (`after`), grad(x * scale)
// (`fused`), grad(x) (`before` and dV: no scale).
template <class R>
FASTUDY_HD inline void add_tile_op(const float* tile, float* acc, int d, ScalePlacement scaled, float scale) {
  for (int t = 0; t < d; ++t) {
    float g = tile[t];
    if (scaled == ScalePlacement::after) g = R::grad(R::grad(g) * scale);
    else if (scaled == ScalePlacement::fused) g = R::grad(g * scale);
    else g = R::grad(g);
    acc[t] = R::o_running(acc[t] + g);
  }
}

// y[t] = accum(fma(a, x[t], y[t])) for t < d.
template <class R>
FASTUDY_HD inline void axpy(float a, const float* x, float* y, int d) {
  for (int t = 0; t < d; ++t) y[t] = R::accum(fmaf(a, x[t], y[t]));
}

// One key's dK and dV of the framework flash backward (thread j of the dK/dV kernel), q, k, v, dout, lse
// and dd of its head: the rows that see key j in order, products accumulated straight into dka_j and
// dva_j; with h.ops grouped by row blocks of Br, each block's products summed from zero in tk and tv
// and handed on by add_tile_op (dV unscaled, dK with the scale's op).
template <class R>
FASTUDY_HD inline void flash_dkdv_key(const TileHead& h, const float* q, const float* k, const float* v,
                                      const float* dout, const float* lse, const float* dd, std::int64_t j,
                                      float* dka_j, float* dva_j, float* tk, float* tv) {
  const std::int64_t first = h.causal ? j : 0, step = h.ops ? h.br : h.n;
  for (std::int64_t i0 = h.ops ? first / h.br * h.br : first; i0 < h.n; i0 += step) {
    float* ak = h.ops ? tk : dka_j;
    float* av = h.ops ? tv : dva_j;
    if (h.ops)
      for (int t = 0; t < h.d; ++t) tk[t] = tv[t] = 0.0f;
    const std::int64_t i_end = i0 + step < h.n ? i0 + step : h.n;
    for (std::int64_t i = i0 > first ? i0 : first; i < i_end; ++i) {
      float p, ds;
      flash_backward_entry<R>(q + i * h.d, k + j * h.d, dout + i * h.d, v + j * h.d, h.d, h.scale, tile_score_of(h),
                              h.ops, lse[i], dd[i], p, ds);
      axpy<R>(p, dout + i * h.d, av, h.d);
      axpy<R>(ds, q + i * h.d, ak, h.d);
    }
    if (h.ops) {
      add_tile_op<R>(tv, dva_j, h.d, ScalePlacement::before, h.scale);
      add_tile_op<R>(tk, dka_j, h.d, h.placement, h.scale);
    }
  }
}

// One row's dQ of the framework flash backward (thread i of the dQ kernel): the keys it sees in order,
// straight into dqa_i, or with h.ops per KV tile of Bc summed from zero in tq and handed on.
template <class R>
FASTUDY_HD inline void flash_dq_row(const TileHead& h, const float* q, const float* k, const float* v,
                                    const float* dout, const float* lse, const float* dd, std::int64_t i,
                                    float* dqa_i, float* tq) {
  const std::int64_t j_end = h.causal ? i + 1 : h.n, step = h.ops ? h.bc : h.n;
  for (std::int64_t j0 = 0; j0 < j_end; j0 += step) {
    float* aq = h.ops ? tq : dqa_i;
    if (h.ops)
      for (int t = 0; t < h.d; ++t) tq[t] = 0.0f;
    const std::int64_t j_stop = j0 + step < j_end ? j0 + step : j_end;
    for (std::int64_t j = j0; j < j_stop; ++j) {
      float p, ds;
      flash_backward_entry<R>(q + i * h.d, k + j * h.d, dout + i * h.d, v + j * h.d, h.d, h.scale, tile_score_of(h),
                              h.ops, lse[i], dd[i], p, ds);
      axpy<R>(ds, k + j * h.d, aq, h.d);
    }
    if (h.ops) add_tile_op<R>(tq, dqa_i, h.d, h.placement, h.scale);
  }
}

// One row of the baseline backward, as the CPU kernels do it: p holds the raw score dots q_i.k_j and dp
// the dots dO_i.v_j for j < j_end on entry; on exit p holds P_i (softmax recomputed from the scores,
// normalised) and dp holds dS_i = grad(P (dP - D_i)) with dP = grad(dot) and D_i = sum_j P_ij dP_ij
// (accum, j in order); the scale and its placement are the head's, and so is max_offset (the forward's
// adjusted row max).
template <class R>
FASTUDY_HD inline void baseline_backward_row(float* p, float* dp, std::int64_t j_end, const TileHead& h) {
  const float scale = h.scale;
  const TileScore store = tile_score_of(h);
  float m = neg_inf();
  for (std::int64_t j = 0; j < j_end; ++j) {
    p[j] = store == TileScore::fused ? R::s(p[j] * scale)
           : store == TileScore::after ? R::s(R::s(p[j]) * scale)
                                       : R::s(p[j]);
    m = m < p[j] ? p[j] : m;  // std::max
  }
  m = R::stats(offset_tile_max(p, j_end, m, h));
  float l = 0.0f;
  for (std::int64_t j = 0; j < j_end; ++j) {
    const float x = p[j] - m;
    p[j] = R::softmax(exp_f32(x == neg_inf() ? x : R::softmax(x)));
    l = R::stats(l + p[j]);
  }
  float d_i = 0.0f;
  for (std::int64_t j = 0; j < j_end; ++j) {
    p[j] = R::p(R::division(p[j] / l));
    dp[j] = R::grad(dp[j]);  // dP = grad(dO V^T), the matmul backward's output tensor
    d_i = R::accum(fmaf(p[j], dp[j], d_i));
  }
  for (std::int64_t j = 0; j < j_end; ++j) dp[j] = R::grad(p[j] * (dp[j] - d_i));
  if (store == TileScore::after)  // the scaling op's backward: dS' = grad(dS * scale)
    for (std::int64_t j = 0; j < j_end; ++j) dp[j] = R::grad(dp[j] * scale);
}

// dQ, dK, dV from their accumulators as the CPU kernels store them (store_gradients): flash kernels
// and the baseline's `fused` scale dQ = grad(acc * scale), dK likewise; `after` grad(acc); `before`
// dQ = grad(grad(acc) * scale), dK = grad(acc).
template <class R>
FASTUDY_HD inline void store_gradient_triple(ScalePlacement placement, float scale, float dq_acc, float dk_acc,
                                             float dv_acc, float& dq, float& dk, float& dv) {
  if (placement == ScalePlacement::fused) {
    dq = R::grad(dq_acc * scale);
    dk = R::grad(dk_acc * scale);
  } else if (placement == ScalePlacement::after) {
    dq = R::grad(dq_acc);
    dk = R::grad(dk_acc);
  } else {
    dq = R::grad(R::grad(dq_acc) * scale);
    dk = R::grad(dk_acc);
  }
  dv = R::grad(dv_acc);
}

}  // namespace fastudy::cuda_tile
