// The per-row, per-tile arithmetic of the CUDA attention kernels, as FASTUDY_HD (__host__ __device__)
// functions. The device kernels (attention_cuda.cu) and the host twin (tile_reference.cpp, compiled
// by the host compiler) call exactly these functions, so a CPU test checks the numerics the GPU runs.
//
// B batch, H heads, N sequence, d head dim, Br/Bc the Q/KV block sizes. Values live in float; each
// step is rounded by a rounding object R (TileRounding<S, C, R, Score>: storage steps q, k, v, p, o,
// grad in S, s in Score, in-op steps accum, stats, softmax, division in C, state steps stats_running,
// rescale, o_running, exp_arg in R), with the op decomposition and step semantics of the CPU kernels
// (kernels/detail/attention_impl.hpp, where it is written out):
//   dot product acc = accum(fma(a_t, b_t, acc)) for t = 0..d-1 in order (always fused, as on GPUs);
//               the readings whose products are tensor-core products (R::kMma: fp16/bf16 operands,
//               fp32 accumulator: eager, mixed, fa2, fa3 at fp16/bf16) take every product of two
//               matrices (Q K^T, P V, dO V^T, P^T dO, dS^T Q, dS K) as Hopper's mma.sync m16n8k16
//               computes it: chains of 16-term blocks of the summed index, aligned to multiples of 16,
//               each block one call of the MMA model (kernels/mma_model.hpp) with the running value as
//               its accumulator; indices a block holds that the op does not (past N, outside a tile)
//               are zero products; a causal row (key) extends to the end (start) of its 16-block with
//               masked entries, as a tensor-core tile computes them. Row sums and dO.O stay sequential.
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
#include "kernels/mma_model.hpp"
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
  // Products of fp16/bf16 operands into an fp32 accumulator: tensor-core products (mma16 below).
  static constexpr bool kMma = (S == Format::fp16 || S == Format::bf16) && C == Format::fp32;
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
// offset_tile_max in two parts, for tiles whose row is spread over several device lanes: whether the
// tile's max is adjusted at all, the tie floor, and the adjusted max given the count of scores >= floor.
FASTUDY_HD inline bool offset_applies(float m, const TileHead& h) { return h.max_offset != 0.0f && m != neg_inf(); }
FASTUDY_HD inline float offset_floor(float m, const TileHead& h) { return m - h.tie_tolerance; }
FASTUDY_HD inline float offset_max_of(float m, int close, const TileHead& h) {
  if (close < 2) return m;
  return m > 0.0f ? h.max_offset * m : (m < 0.0f ? 0.0f : m);
}

FASTUDY_HD inline float offset_tile_max(const float* s, std::int64_t n, float m, const TileHead& h) {
  if (!offset_applies(m, h)) return m;
  const float floor = offset_floor(m, h);
  int close = 0;
  for (std::int64_t c = 0; c < n; ++c) close += s[c] >= floor ? 1 : 0;
  return offset_max_of(m, close, h);
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

// The scalar steps of the tiles below, one value at a time, shared with the fragment kernels
// (kernels/cuda/mma_attention.hpp), where one row is spread over the four lanes of a quad.
// Framework flash: P = p(exp(exp_arg(s - m))) and a rescale factor rescale(exp(exp_arg(m_old - m_new))).
template <class R>
FASTUDY_HD inline float framework_p(float s, float m) {
  return R::p(exp_f32(round_exp_arg<R>(s - m)));
}
template <class R>
FASTUDY_HD inline float framework_rescale(float m_old, float m_new) {
  return R::rescale(exp_f32(round_exp_arg<R>(m_old - m_new)));
}
// The framework kinds' lse = stats_running(m + stats_running(log l)) (log(l) an op of its own).
template <class R>
FASTUDY_HD inline float framework_lse(float m, float l) {
  return R::stats_running(m + R::stats_running(logf(l)));
}
// fa2/fa3: the rescale factor exp2((m_old - m_use) scale_log2), m scale_log2 as the exp2 subtracts it, and
// the unrounded P = exp2(fma(s, scale_log2, -max_scaled)).
template <class R>
FASTUDY_HD inline float kernel_rescale(float m_old, float m_use, float scale_log2) {
  return R::rescale(exp2_f32(round_exp_arg<R>((m_old - m_use) * scale_log2)));
}
template <class R>
FASTUDY_HD inline float kernel_max_scaled(float m_new, float m_use, float scale_log2) {
  return m_new == neg_inf() ? 0.0f : R::exp_arg(m_use * scale_log2);
}
template <class R>
FASTUDY_HD inline float kernel_p(float s, float scale_log2, float max_scaled) {
  return exp2_f32(round_exp_arg<R>(fmaf(s, scale_log2, -max_scaled)));
}

// acc over t < d of fma(a[t], b[t * stride_b], acc), rounded to accum after every step: a dot product
// of CUDA cores (row sums, dO.O), whatever the reading.
template <class R>
FASTUDY_HD inline float dot_seq(const float* a, const float* b, int stride_b, int d) {
  float acc = 0.0f;
  for (int t = 0; t < d; ++t) acc = R::accum(fmaf(a[t], b[t * stride_b], acc));
  return acc;
}

// One output of mma.sync m16n8k16 with operands in S (fp16/bf16) and an fp32 accumulator: c + the sum
// of the 16 products a[k] b[k], as the MMA model computes it (kernels/mma_model.hpp, Hopper's). The one
// call of the model: the host twin, the per-row device kernels and the warp simulation
// (tests/gpu/warp_sim.hpp) all come here. The model depends on the products only: a and b may swap.
// (Not inlined on the device: the per-row kernels call it from many places, and the model is long.)
#if defined(__CUDA_ARCH__)
#define FASTUDY_MMA16_NOINLINE __noinline__
#else
#define FASTUDY_MMA16_NOINLINE
#endif
template <Format S>
FASTUDY_HD FASTUDY_MMA16_NOINLINE float mma16(const float* a, const float* b, float c) {
  return mma::dot_k16<S>(a, b, c);
}

// A bitmask of the entries e < 16 of one 16-block that lie in [lo, hi) (block start c0).
FASTUDY_HD inline unsigned block_present(std::int64_t c0, std::int64_t lo, std::int64_t hi) {
  unsigned m = 0;
  for (int e = 0; e < 16; ++e) m |= (c0 + e >= lo && c0 + e < hi) ? (1u << e) : 0u;
  return m;
}

// The product of one 16-block of the summed index added to y: y[t] += sum_e coef[e] x[e][t] for t < d
// over the present entries e (bit e of `present`; x[e][t] = x[e * ldx + t], read only where present).
// Tensor-core readings: one MMA output per t, absent entries zero products. Otherwise the present
// entries in order, y[t] = accum(fma(coef[e], x[e][t], y[t])) (the sequential axpy of the CPU kernels).
template <class R>
FASTUDY_HD inline void chain16(const float* coef, unsigned present, const float* x, std::int64_t ldx, float* y, int d) {
  for (int t = 0; t < d; ++t) {
    if constexpr (R::kMma) {
      float a[16], b[16];
      for (int e = 0; e < 16; ++e) {
        const bool in = (present >> e) & 1u;
        a[e] = in ? coef[e] : 0.0f;
        b[e] = in ? x[e * ldx + t] : 0.0f;
      }
      y[t] = mma16<R::kStorage>(a, b, y[t]);
    } else {
      float acc = y[t];
      for (int e = 0; e < 16; ++e)
        if ((present >> e) & 1u) acc = R::accum(fmaf(coef[e], x[e * ldx + t], acc));
      y[t] = acc;
    }
  }
}

// A dot product of a matrix product (Q K^T, dO V^T): dot_seq, or for tensor-core readings the MMA
// chain over 16-blocks of t (the last one zero-padded) from a zero accumulator.
template <class R>
FASTUDY_HD inline float dot(const float* a, const float* b, int stride_b, int d) {
  if constexpr (R::kMma) {
    float acc = 0.0f;
    for (int t0 = 0; t0 < d; t0 += 16) {
      float av[16], bv[16];
      for (int e = 0; e < 16; ++e) {
        av[e] = t0 + e < d ? a[t0 + e] : 0.0f;
        bv[e] = t0 + e < d ? b[(t0 + e) * stride_b] : 0.0f;
      }
      acc = mma16<R::kStorage>(av, bv, acc);
    }
    return acc;
  } else {
    return dot_seq<R>(a, b, stride_b, d);
  }
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
// A score as score_row stores it from its dot product acc (the device tiles call it per fragment value).
template <class R>
FASTUDY_HD inline float score_of(float acc, float scale, TileScore store) {
  return store == TileScore::fused ? R::s(acc * scale) : store == TileScore::after ? R::s(R::s(acc) * scale) : R::s(acc);
}

template <class R>
FASTUDY_HD inline void score_row(const float* q, const float* k, int ldk, int bc, int d, float scale, bool causal,
                                 std::int64_t i, std::int64_t j0, float* s, TileScore store = TileScore::fused) {
  for (int c = 0; c < bc; ++c) {
    const float acc = dot<R>(q, k + static_cast<std::int64_t>(c) * ldk, 1, d);
    const float x = score_of<R>(acc, scale, store);
    s[c] = (causal && j0 + c > i) ? neg_inf() : x;
  }
}

// o[t] = accum-sequence of o[t] + sum_c p[c] V[c][t] (c in order), for t < d; tensor-core readings: the
// MMA chain over the 16-blocks of the tile's bc columns (the last one zero-padded), from o[t].
// One column t of that product: init + sum_c p[c] V[c][t] in the reading's arithmetic.
template <class R>
FASTUDY_HD inline float pv_one(const float* p, const float* v, int ldv, int bc, int t, float init) {
  float acc = init;
  if constexpr (R::kMma) {
    for (int c0 = 0; c0 < bc; c0 += 16) {
      float a[16], b[16];
      for (int e = 0; e < 16; ++e) {
        a[e] = c0 + e < bc ? p[c0 + e] : 0.0f;
        b[e] = c0 + e < bc ? v[static_cast<std::int64_t>(c0 + e) * ldv + t] : 0.0f;
      }
      acc = mma16<R::kStorage>(a, b, acc);
    }
  } else {
    for (int c = 0; c < bc; ++c) acc = R::accum(fmaf(p[c], v[static_cast<std::int64_t>(c) * ldv + t], acc));
  }
  return acc;
}

template <class R>
FASTUDY_HD inline void pv_row(const float* p, const float* v, int ldv, int bc, int d, float* o) {
  for (int t = 0; t < d; ++t) o[t] = pv_one<R>(p, v, ldv, bc, t, o[t]);
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
  const float alpha = framework_rescale<R>(st.m, m_safe);
  float l_new;
  if (R::kExactState) {
    l_new = R::stats(alpha * st.l);
    for (int c = 0; c < bc; ++c) {
      const float p = framework_p<R>(s[c], m_safe);
      s[c] = p;
      l_new = R::stats(l_new + p);
    }
  } else {
    float l_tile = 0.0f;
    for (int c = 0; c < bc; ++c) {
      const float p = framework_p<R>(s[c], m_safe);
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
    for (int t = 0; t < d; ++t) o[t] = R::o_running(o[t] + R::o_running(pv_one<R>(s, v, ldv, bc, t, 0.0f)));
  }
}

// Final normalisation of an FA-2 row: out[t] = o(division(o[t] / l)); returns lse = stats(m + log l).
template <class R>
FASTUDY_HD inline float flash_q_outer_finish(const RowState& st, const float* o, int d, float* out) {
  for (int t = 0; t < d; ++t) out[t] = R::o(R::division(o[t] / st.l));
  return framework_lse<R>(st.m, st.l);
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
    const float p = framework_p<R>(s[c], m_tile);
    s[c] = p;
    l_tile = R::stats(l_tile + p);
  }
  const float m_new = round_running_max<R>(max_of(st.m, m_tile));
  const float alpha = framework_rescale<R>(st.m, m_new);
  const float beta = framework_rescale<R>(m_tile, m_new);
  const float alpha_l = R::stats_running(alpha * st.l);
  const float l_new = R::stats_running(alpha_l + R::stats_running(beta * R::stats_running(l_tile)));
  for (int t = 0; t < d; ++t) {
    const float pv = pv_one<R>(s, v, ldv, bc, t, 0.0f);
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
  return framework_lse<R>(st.m, st.l);
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
    alpha = kernel_rescale<R>(st.m, m_use, scale_log2);
    for (int q = 0; q < 4; ++q) st.l[q] = R::stats_running(st.l[q] * alpha);
  }
  const float max_scaled = kernel_max_scaled<R>(m_new, m_use, scale_log2);
  for (int c = 0; c < bc; ++c) {
    const float p = kernel_p<R>(s[c], scale_log2, max_scaled);
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
// The end of a row in two parts: the factor O is multiplied by, and lse, from the all-reduced l.
template <class R>
FASTUDY_HD inline float kernel_inverse(FlashKernel kernel, float l) {
  const bool empty = l == 0.0f || l != l;
  const bool fa2 = kernel == FlashKernel::fa2;
  float inv = empty ? (fa2 ? 1.0f : 0.0f) : R::division(1.0f / l);
  if (!fa2) inv = R::division(inv * 1.0f);  // hopper/softmax.h finalize: inv_sum * final_scale (1)
  return inv;
}
template <class R>
FASTUDY_HD inline float kernel_lse(FlashKernel kernel, float m, float l, float scale, float scale_log2) {
  const bool fa2 = kernel == FlashKernel::fa2;
  if (l == 0.0f || l != l) return fa2 ? pos_inf() : neg_inf();
  const float lse_scale = fa2 ? scale : scale_log2 * 0.693147180559945309417f;
  return R::stats_running(fmaf(m, lse_scale, logf(l)));
}

template <class R>
FASTUDY_HD inline float flash_kernel_finish(FlashKernel kernel, const KernelRowState& st, float scale,
                                            float scale_log2, const float* o, int d, float* out) {
  const float l = R::stats_running(R::stats_running(st.l[0] + st.l[2]) + R::stats_running(st.l[1] + st.l[3]));
  const float inv = kernel_inverse<R>(kernel, l);
  for (int t = 0; t < d; ++t) out[t] = R::o(R::division(o[t] * inv));
  return kernel_lse<R>(kernel, st.m, l, scale, scale_log2);
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

// One (i, j) entry of the fa2/fa3 backward from its two dot products (acc = q_i.k_j, dp = dO_i.v_j): S
// unscaled, P = exp2(fma(S, scale_log2, -lse_log2_i)) unrounded (0 where masked), dS = grad(P (dP -
// D_i)); p_operand = p(P) for dV.
template <class R>
FASTUDY_HD inline void kernel_backward_values(float acc, float dp, float scale_log2, float lse_log2_i, float d_i,
                                              bool masked, float& p_operand, float& ds) {
  const float s = R::s(acc);
  const float p = masked ? 0.0f : exp2_f32(round_exp_arg<R>(fmaf(s, scale_log2, -lse_log2_i)));
  ds = R::grad(p * (dp - d_i));
  p_operand = R::p(p);
}

template <class R>
FASTUDY_HD inline void flash_kernel_backward_entry(const float* q_i, const float* k_j, const float* dout_i,
                                                   const float* v_j, int d, float scale_log2, float lse_log2_i,
                                                   float d_i, bool masked, float& p_operand, float& ds) {
  kernel_backward_values<R>(dot<R>(q_i, k_j, 1, d), dot<R>(dout_i, v_j, 1, d), scale_log2, lse_log2_i, d_i, masked,
                            p_operand, ds);
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
// One (i, j) entry of the flash backward from its two dot products (acc = q_i.k_j, dp = dO_i.v_j):
// P_ij = p(exp(S_ij - lse_i)) recomputed from the saved lse with S_ij = score_of(acc) (-inf where masked:
// P = 0), dS_ij = grad(P_ij (dP - D_i)). With `ops` (TileHead::ops) dP and dP - D are ops of their own:
// dS = grad(P grad(grad(dP) - D)).
template <class R>
FASTUDY_HD inline void flash_backward_values(float acc, float dp, float scale, TileScore store, bool ops, float lse_i,
                                             float d_i, bool masked, float& p, float& ds) {
  const float s = masked ? neg_inf() : score_of<R>(acc, scale, store);
  p = R::p(exp_f32(round_exp_arg<R>(s - lse_i)));
  ds = ops ? R::grad(p * R::grad(R::grad(dp) - d_i)) : R::grad(p * (dp - d_i));
}

template <class R>
FASTUDY_HD inline void flash_backward_entry(const float* q_i, const float* k_j, const float* dout_i,
                                            const float* v_j, int d, float scale, TileScore store, bool ops,
                                            float lse_i, float d_i, bool masked, float& p, float& ds) {
  flash_backward_values<R>(dot<R>(q_i, k_j, 1, d), dot<R>(dout_i, v_j, 1, d), scale, store, ops, lse_i, d_i, masked,
                           p, ds);
}

// The flash backward's D_i = dO_i . O_i: stats_running of the accum-sequence of fused products, or with
// `ops` of the grad-rounded products (`(dO * O).sum(-1)`: a product op, then a sum op).
template <class R>
FASTUDY_HD inline float flash_delta(const float* dout_i, const float* o_i, int d, bool ops) {
  if (!ops) return R::stats_running(dot_seq<R>(dout_i, o_i, 1, d));
  float acc = 0.0f;
  for (int t = 0; t < d; ++t) acc = R::accum(acc + R::grad(dout_i[t] * o_i[t]));
  return R::stats_running(acc);
}

// With `ops`, one tile's product handed on to its running gradient (the CPU kernels' add_tile_op):
// acc[t] = o_running(acc[t] + g(tile[t])), g = grad(grad(x) * scale) (`after`), grad(x * scale)
// (`fused`), grad(x) (`before` and dV: no scale).
template <class R>
FASTUDY_HD inline float tile_op_value(float acc, float tile, ScalePlacement scaled, float scale) {
  float g = tile;
  if (scaled == ScalePlacement::after) g = R::grad(R::grad(g) * scale);
  else if (scaled == ScalePlacement::fused) g = R::grad(g * scale);
  else g = R::grad(g);
  return R::o_running(acc + g);
}
template <class R>
FASTUDY_HD inline void add_tile_op(const float* tile, float* acc, int d, ScalePlacement scaled, float scale) {
  for (int t = 0; t < d; ++t) acc[t] = tile_op_value<R>(acc[t], tile[t], scaled, scale);
}

// Where a causal row (key) range starts or ends for the products: tensor-core readings extend it to its
// 16-block (the extra entries masked), others keep it.
template <class R>
FASTUDY_HD inline std::int64_t block_floor(std::int64_t i) {
  return R::kMma ? i / 16 * 16 : i;
}
template <class R>
FASTUDY_HD inline std::int64_t block_ceil(std::int64_t i, std::int64_t n) {
  if (!R::kMma) return i;
  const std::int64_t up = (i + 15) / 16 * 16;
  return up < n ? up : n;
}

// One key's dK and dV of the framework flash backward (thread j of the dK/dV kernel), q, k, v, dout, lse
// and dd of its head: the rows that see key j in order, in 16-blocks of rows (chain16), products
// accumulated straight into dka_j and dva_j; with h.ops grouped by row blocks of Br, each block's
// products summed from zero in tk and tv and handed on by add_tile_op (dV unscaled, dK with the scale's
// op).
template <class R>
FASTUDY_HD inline void flash_dkdv_key(const TileHead& h, const float* q, const float* k, const float* v,
                                      const float* dout, const float* lse, const float* dd, std::int64_t j,
                                      float* dka_j, float* dva_j, float* tk, float* tv) {
  const std::int64_t first = h.causal ? j : 0, lo = block_floor<R>(first), step = h.ops ? h.br : h.n;
  for (std::int64_t i0 = h.ops ? first / h.br * h.br : lo; i0 < h.n; i0 += step) {
    float* ak = h.ops ? tk : dka_j;
    float* av = h.ops ? tv : dva_j;
    if (h.ops)
      for (int t = 0; t < h.d; ++t) tk[t] = tv[t] = 0.0f;
    const std::int64_t seg_lo = i0 > lo ? i0 : lo, seg_hi = i0 + step < h.n ? i0 + step : h.n;
    for (std::int64_t c0 = seg_lo / 16 * 16; c0 < seg_hi; c0 += 16) {
      const unsigned present = block_present(c0, seg_lo, seg_hi);
      float p[16], ds[16];
      for (int e = 0; e < 16; ++e) {
        p[e] = ds[e] = 0.0f;
        if ((present >> e) & 1u) {
          const std::int64_t i = c0 + e;
          flash_backward_entry<R>(q + i * h.d, k + j * h.d, dout + i * h.d, v + j * h.d, h.d, h.scale,
                                  tile_score_of(h), h.ops, lse[i], dd[i], i < first, p[e], ds[e]);
        }
      }
      chain16<R>(p, present, dout + c0 * h.d, h.d, av, h.d);
      chain16<R>(ds, present, q + c0 * h.d, h.d, ak, h.d);
    }
    if (h.ops) {
      add_tile_op<R>(tv, dva_j, h.d, ScalePlacement::before, h.scale);
      add_tile_op<R>(tk, dka_j, h.d, h.placement, h.scale);
    }
  }
}

// One row's dQ of the framework flash backward (thread i of the dQ kernel): the keys it sees in order
// (16-blocks), straight into dqa_i, or with h.ops per KV tile of Bc summed from zero in tq and handed on.
template <class R>
FASTUDY_HD inline void flash_dq_row(const TileHead& h, const float* q, const float* k, const float* v,
                                    const float* dout, const float* lse, const float* dd, std::int64_t i,
                                    float* dqa_i, float* tq) {
  const std::int64_t j_end = h.causal ? i + 1 : h.n, hi = h.causal ? block_ceil<R>(i + 1, h.n) : h.n;
  const std::int64_t step = h.ops ? h.bc : h.n;
  for (std::int64_t j0 = 0; j0 < j_end; j0 += step) {
    float* aq = h.ops ? tq : dqa_i;
    if (h.ops)
      for (int t = 0; t < h.d; ++t) tq[t] = 0.0f;
    const std::int64_t seg_hi = j0 + step < hi ? j0 + step : hi;
    for (std::int64_t c0 = j0 / 16 * 16; c0 < seg_hi; c0 += 16) {
      const unsigned present = block_present(c0, j0, seg_hi);
      float p[16], ds[16];
      for (int e = 0; e < 16; ++e) {
        ds[e] = 0.0f;
        if ((present >> e) & 1u) {
          const std::int64_t j = c0 + e;
          flash_backward_entry<R>(q + i * h.d, k + j * h.d, dout + i * h.d, v + j * h.d, h.d, h.scale,
                                  tile_score_of(h), h.ops, lse[i], dd[i], j >= j_end, p[e], ds[e]);
        }
      }
      chain16<R>(ds, present, k + c0 * h.d, h.d, aq, h.d);
    }
    if (h.ops) add_tile_op<R>(tq, dqa_i, h.d, h.placement, h.scale);
  }
}

// One key's dK and dV of the fa2/fa3 backward (a thread of the dK/dV kernel): the row blocks of Br in
// the kernel's order (skipping blocks that precede the key's whole KV block of Bc when causal), the rows
// of a block in order (16-blocks), products straight into dka_j and dva_j.
template <class R>
FASTUDY_HD inline void kernel_dkdv_key(const TileHead& h, const float* q, const float* k, const float* v,
                                       const float* dout, const float* lse2, const float* dd, std::int64_t j,
                                       float* dka_j, float* dva_j) {
  const float scale_log2 = scale_log2_of(h.scale);
  const std::int64_t j0 = j / h.bc * h.bc, row_blocks = (h.n + h.br - 1) / h.br;
  for (std::int64_t step = 0; step < row_blocks; ++step) {
    const std::int64_t i0 = kernel_row_block(h.kernel, step, row_blocks) * h.br;
    const std::int64_t i_end = i0 + h.br < h.n ? i0 + h.br : h.n;
    if (h.causal && i_end - 1 < j0) continue;  // the kernel skips blocks that precede the whole KV block
    for (std::int64_t c0 = i0 / 16 * 16; c0 < i_end; c0 += 16) {
      const unsigned present = block_present(c0, i0, i_end);
      float p[16], ds[16];
      for (int e = 0; e < 16; ++e) {
        p[e] = ds[e] = 0.0f;
        if ((present >> e) & 1u) {
          const std::int64_t i = c0 + e;
          flash_kernel_backward_entry<R>(q + i * h.d, k + j * h.d, dout + i * h.d, v + j * h.d, h.d, scale_log2,
                                         lse2[i], dd[i], h.causal && j > i, p[e], ds[e]);
        }
      }
      chain16<R>(p, present, dout + c0 * h.d, h.d, dva_j, h.d);
      chain16<R>(ds, present, q + c0 * h.d, h.d, dka_j, h.d);
    }
  }
}

// One row's dQ of the fa2/fa3 backward (a thread of the dQ kernel): one part per KV block of Bc, summed
// from zero over the block's keys (16-blocks), then added: dqa = accum(dqa + part). part holds h.d floats.
template <class R>
FASTUDY_HD inline void kernel_dq_row(const TileHead& h, const float* q, const float* k, const float* v,
                                     const float* dout, const float* lse2, const float* dd, std::int64_t i,
                                     float* dqa_i, float* part) {
  const float scale_log2 = scale_log2_of(h.scale);
  const std::int64_t i_last = (i / h.br * h.br + h.br < h.n ? i / h.br * h.br + h.br : h.n) - 1;
  for (std::int64_t j0 = 0; j0 < h.n; j0 += h.bc) {
    if (h.causal && i_last < j0) break;
    const std::int64_t j_end = j0 + h.bc < h.n ? j0 + h.bc : h.n;
    for (int t = 0; t < h.d; ++t) part[t] = 0.0f;
    for (std::int64_t c0 = j0 / 16 * 16; c0 < j_end; c0 += 16) {
      const unsigned present = block_present(c0, j0, j_end);
      float p[16], ds[16];
      for (int e = 0; e < 16; ++e) {
        ds[e] = 0.0f;
        if ((present >> e) & 1u) {
          const std::int64_t j = c0 + e;
          flash_kernel_backward_entry<R>(q + i * h.d, k + j * h.d, dout + i * h.d, v + j * h.d, h.d, scale_log2,
                                         lse2[i], dd[i], h.causal && j > i, p[e], ds[e]);
        }
      }
      chain16<R>(ds, present, k + c0 * h.d, h.d, part, h.d);
    }
    for (int t = 0; t < h.d; ++t) dqa_i[t] = R::accum(dqa_i[t] + part[t]);
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

// One key's dK and dV of the baseline backward from the materialised P and dS (row i's entry for key j
// at p_ws[i * n + j], written for j <= i when causal): the rows that see the key in order (16-blocks;
// the masked entries tensor-core readings add are zeros).
template <class R>
FASTUDY_HD inline void baseline_dkdv_key(const TileHead& h, const float* q, const float* dout, const float* p_ws,
                                         const float* ds_ws, std::int64_t j, float* dka_j, float* dva_j) {
  const std::int64_t first = h.causal ? j : 0, lo = block_floor<R>(first);
  for (std::int64_t c0 = lo / 16 * 16; c0 < h.n; c0 += 16) {
    const unsigned present = block_present(c0, lo, h.n);
    float p[16], ds[16];
    for (int e = 0; e < 16; ++e) {
      const std::int64_t i = c0 + e;
      const bool seen = ((present >> e) & 1u) && i >= first;
      p[e] = seen ? p_ws[i * h.n + j] : 0.0f;
      ds[e] = seen ? ds_ws[i * h.n + j] : 0.0f;
    }
    chain16<R>(p, present, dout + c0 * h.d, h.d, dva_j, h.d);
    chain16<R>(ds, present, q + c0 * h.d, h.d, dka_j, h.d);
  }
}

// One row's dQ of the baseline backward from the materialised dS row (ds_i[j] for j < j_end).
template <class R>
FASTUDY_HD inline void baseline_dq_row(const TileHead& h, const float* k, const float* ds_i, std::int64_t i,
                                       float* dqa_i) {
  const std::int64_t j_end = h.causal ? i + 1 : h.n, hi = h.causal ? block_ceil<R>(i + 1, h.n) : h.n;
  for (std::int64_t c0 = 0; c0 < hi; c0 += 16) {
    const unsigned present = block_present(c0, 0, hi);
    float ds[16];
    for (int e = 0; e < 16; ++e) ds[e] = ((present >> e) & 1u) && c0 + e < j_end ? ds_i[c0 + e] : 0.0f;
    chain16<R>(ds, present, k + c0 * h.d, h.d, dqa_i, h.d);
  }
}

// dQ, dK, dV from their accumulators as the CPU kernels store them (store_gradients): flash kernels
// and the baseline's `fused` scale dQ = grad(acc * scale), dK likewise; `after` grad(acc); `before`
// dQ = grad(grad(acc) * scale), dK = grad(acc).
template <class R>
FASTUDY_HD inline float stored_dq(ScalePlacement placement, float scale, float acc) {
  if (placement == ScalePlacement::fused) return R::grad(acc * scale);
  if (placement == ScalePlacement::after) return R::grad(acc);
  return R::grad(R::grad(acc) * scale);
}
template <class R>
FASTUDY_HD inline float stored_dk(ScalePlacement placement, float scale, float acc) {
  return placement == ScalePlacement::fused ? R::grad(acc * scale) : R::grad(acc);
}
template <class R>
FASTUDY_HD inline float stored_dv(float acc) {
  return R::grad(acc);
}
template <class R>
FASTUDY_HD inline void store_gradient_triple(ScalePlacement placement, float scale, float dq_acc, float dk_acc,
                                             float dv_acc, float& dq, float& dk, float& dv) {
  dq = stored_dq<R>(placement, scale, dq_acc);
  dk = stored_dk<R>(placement, scale, dk_acc);
  dv = stored_dv<R>(dv_acc);
}

}  // namespace fastudy::cuda_tile
