// One head: its sizes and the policy's structural choices (Head, which the backward shares), the
// forward's workspace, the rounded per-head copies of Q, K and V the tiles read (load_inputs, through
// transpose; with the quantization and incoherent processing of FlashAttention-3's FP8 path and the
// baseline's `before` scaling of Q), and the store of a finished output row with its lse (store_row).
#pragma once

#include "kernels/detail/rounding.hpp"
#include "kernels/detail/vec.hpp"

namespace fastudy {
namespace {

template <class T>
struct Head {
  std::int64_t n, d;
  std::int64_t d_padded;   // d rounded up to the lanes: the row length of V and O in the workspaces
  std::int64_t qt_stride;  // the row length of Q^T: N and Br each rounded up to the lanes, so that a
                           // Q block starting anywhere reads whole vectors
  T scale;
  bool causal;
  std::int64_t br, bc;  // block sizes clipped to N
  FlashKernel kernel;          // the flash kind's kernel (params.policy.kernel); framework for baseline
  ScalePlacement placement;    // baseline, framework flash: where the scale is applied; fa2/fa3: fused
  Quantization quantization;   // how Q, K, V enter their formats
  bool incoherent;             // Hadamard transform with random signs on Q and K first
  bool dequantize;             // quantized inputs held as x_q * c (the framework kinds) or x_q (fa2/fa3)
  bool libtorch1_cpu;          // FrameworkOps::libtorch1_cpu or _cpublas (framework kinds): scale rounded
                               // to the format above, the softmax backward's row dot rounded to grad
  bool gemm_in_format;         // FrameworkOps::libtorch1_cpublas (framework kinds): the matmuls that are
                               // ops of their own and not Q K^T-shaped add each product into their
                               // output's format (op_pv_tile, the baseline backward's axpy)
  T max_offset;                // the policy's max_offset beta (0: off); see offset_tile_max
  T tie_tolerance;             // max_offset's tie test on the stored scaled scores (framework kernels and
                               // baseline): kRepeatedMaxTolerance; fa2/fa3 convert it to their raw tile
};

template <class T>
struct Workspace {
  std::vector<T> qt, k, v;     // the rounded inputs: Q^T [d, qt_stride], K [N, d], V [N, d_padded]
  std::vector<T> st;           // the tile S^T [Bc, Br padded] (baseline: [N, N padded]), then P^T
  std::vector<T> o, m, l;      // O [rows, d_padded], row max and row sum (flash: the running ones)
  std::vector<T> alpha;        // q_outer: the rescale factors of the current tile
  std::vector<T> pv;           // a tile's P.V [Br, d_padded] where it is an op of its own
  std::vector<T> q_rows;       // load_inputs: a buffer of rounded Q rows
  std::vector<T> rows;         // load_inputs: one input of the head, prepared (transformed, quantized)
  std::vector<T> q_scale, k_scale, v_scale;  // quantization: each row's factor c (empty without)
  std::vector<T> beta, alpha_l, l_new, m_tile;  // kv_outer only: per-row factors of the current tile
};

template <class T>
Head<T> make_head(const AttentionShape& shape, const AttentionParams& params) {
  Head<T> h;
  h.n = shape.seq_len;
  h.d = shape.head_dim;
  h.d_padded = round_up(h.d, kLanes<T>);
  h.br = std::min<std::int64_t>(params.block_q, h.n);
  h.bc = std::min<std::int64_t>(params.block_kv, h.n);
  h.qt_stride = round_up(h.n, kLanes<T>) + round_up(h.br, kLanes<T>);
  const double scale = shape.scale != 0.0 ? shape.scale : 1.0 / std::sqrt(static_cast<double>(h.d));
  h.scale = static_cast<T>(scale);
  h.causal = shape.causal;
  const PrecisionPolicy& p = params.policy;
  const bool flash = params.attention == AttentionKind::flash;
  h.kernel = flash ? p.kernel : FlashKernel::framework;
  h.placement = h.kernel == FlashKernel::framework ? p.scale : ScalePlacement::fused;
  // LibTorch 1.x's CPU mul converts the scalar to the dtype of the tensor it multiplies (FrameworkOps).
  h.libtorch1_cpu = h.kernel == FlashKernel::framework && p.framework_ops != FrameworkOps::opmath;
  h.gemm_in_format = h.kernel == FlashKernel::framework && p.framework_ops == FrameworkOps::libtorch1_cpublas;
  if (h.libtorch1_cpu) h.scale = round_to(h.placement == ScalePlacement::before ? p.q : p.s, h.scale);
  h.quantization = p.quantization;
  h.incoherent = p.incoherent;
  h.dequantize = h.kernel == FlashKernel::framework;
  h.max_offset = static_cast<T>(p.max_offset);
  h.tie_tolerance = static_cast<T>(kRepeatedMaxTolerance);
  return h;
}

// Qiu & Yao's fix (PrecisionPolicy::max_offset = beta), on the max m of one tile (the baseline: of the
// whole row) before it enters the running max, as the reference code does per KV block
// (github ucker/why-low-precision-training-fails, attention.py, the FA-2 forward with STABLE=1):
//   close = S_tile >= block_max - 1e-3; repeated = close.sum(-1) > 1
//   block_max = where(repeated & (block_max > 0), beta * block_max, block_max)
//   block_max = where(repeated & (block_max < 0), 0, block_max)
// score(c) gives the tile's scores c < cols (a scalar or a vector of rows), `tolerance` is 1e-3 in the
// units of those scores. A row with no key in the tile (m = -inf) keeps m: the reference, whose masked
// scores are -finfo.max, would count them as ties and set 0, which only shifts the running max of a row
// that has seen nothing.
// m = 0 is kept (neither branch of the reference applies). Works on scalars and vectors alike.
template <class V, class Score>
FASTUDY_INLINE V offset_tile_max(V m, std::int64_t cols, V beta, V tolerance, V neg_inf, Score score) {
  const V zero{}, one = zero + 1;
  const V floor = m - tolerance;
  V close = zero;
  for (std::int64_t c = 0; c < cols; ++c) close += score(c) >= floor ? one : zero;
  const V adjusted = m > zero ? beta * m : (m < zero ? zero : m);
  return ((close > one) & (m != neg_inf)) ? adjusted : m;
}

// The random signs of incoherent processing: sign t of the d-vector D (+1 or -1), the same for Q and
// K, every head and every call, from a fixed SplitMix64 stream.
inline constexpr std::uint64_t kIncoherentSignSeed = 0xF1A5A77E17C0FFEEull;
template <class T>
T incoherent_sign(std::int64_t t) {
  return (splitmix64(kIncoherentSignSeed + static_cast<std::uint64_t>(t)) >> 63) ? T(-1) : T(1);
}

// x <- H D x / sqrt(d) for each of `rows` rows of d values (d a power of two): the random signs D,
// then the fast Walsh-Hadamard transform (log2 d butterfly stages x_j, x_j+len <- x_j + x_j+len,
// x_j - x_j+len, len = 1, 2, ..., d/2, in the buffer's precision), then the normalisation by
// 1/sqrt(d) (exact when d is a power of 4). H D / sqrt(d) is orthogonal, so applied to both Q and K it
// leaves every score q.k unchanged and spreads an outlier over all d components (FA3 §3.3).
template <class T>
void incoherent_transform(T* x, std::int64_t rows, std::int64_t d) {
  const T norm = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  for (std::int64_t i = 0; i < rows; ++i) {
    T* row = x + i * d;
    for (std::int64_t t = 0; t < d; ++t) row[t] *= incoherent_sign<T>(t);
    for (std::int64_t len = 1; len < d; len *= 2)
      for (std::int64_t j0 = 0; j0 < d; j0 += 2 * len)
        for (std::int64_t j = j0; j < j0 + len; ++j) {
          const T a = row[j], b = row[j + len];
          row[j] = a + b;
          row[j + len] = a - b;
        }
    for (std::int64_t t = 0; t < d; ++t) row[t] *= norm;
  }
}

// Quantization of one input of a head (Quantization, kernels/attention.hpp): x [rows, d] in place,
// each group of `block` rows (all rows: per head) divided by its factor c = amax / largest_finite,
// rounded by step Step, and multiplied back by c when h.dequantize; each row's c into `scale`.
template <StepId Step, class T, class R>
void quantize_rows(const R& rd, const Head<T>& h, T* x, std::int64_t rows, std::int64_t block,
                   std::vector<T>& scale) {
  const double largest = largest_finite(rd.template format_of<Step>());
  scale.resize(rows);
  for (std::int64_t r0 = 0; r0 < rows; r0 += block) {
    const std::int64_t r1 = std::min(rows, r0 + block);
    T amax = 0;
    for (std::int64_t i = r0 * h.d; i < r1 * h.d; ++i) amax = std::max(amax, std::fabs(x[i]));
    const T c = amax > 0 ? static_cast<T>(amax / largest) : T(1);
    for (std::int64_t i = r0 * h.d; i < r1 * h.d; ++i) x[i] /= c;
    round_run<Step>(rd, x + r0 * h.d, x + r0 * h.d, (r1 - r0) * h.d);
    if (h.dequantize)
      for (std::int64_t i = r0 * h.d; i < r1 * h.d; ++i) x[i] *= c;
    std::fill(scale.begin() + r0, scale.begin() + r1, c);
  }
}

// One input of a head prepared in ws.rows [N, d]: incoherent processing (Q and K), then the
// quantization with its factors into `scale`, or the plain rounding of step Step.
template <StepId Step, class T, class R>
void prepare_input(const R& rd, const Head<T>& h, const T* x, bool incoherent, std::int64_t block,
                   std::vector<T>& rows, std::vector<T>& scale) {
  rows.assign(x, x + h.n * h.d);
  if (incoherent) incoherent_transform(rows.data(), h.n, h.d);
  if (h.quantization == Quantization::none) {
    round_run<Step>(rd, rows.data(), rows.data(), h.n * h.d);
    scale.clear();
    return;
  }
  quantize_rows<Step>(rd, h, rows.data(), h.n, h.quantization == Quantization::head ? h.n : block, scale);
}

// dst[t * ldd + i] = src[i * lds + t] for i < rows, t < cols: a transpose in blocks of 8 x 8.
template <class T>
void transpose(const T* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, T* dst, std::int64_t ldd) {
  constexpr std::int64_t kBlock = 8;
  for (std::int64_t i0 = 0; i0 < rows; i0 += kBlock) {
    const std::int64_t i1 = std::min(rows, i0 + kBlock);
    for (std::int64_t t0 = 0; t0 < cols; t0 += kBlock) {
      const std::int64_t t1 = std::min(cols, t0 + kBlock);
      for (std::int64_t t = t0; t < t1; ++t)
        for (std::int64_t i = i0; i < i1; ++i) dst[t * ldd + i] = src[i * lds + t];
    }
  }
}

// Rounded per-head copies: Qt = q(Q)^T [d, qt_stride] (zero padded), K = k(K) [N, d], V = v(V) [N, d_padded];
// Q, K and V are rounded in this order, each in its memory order (Q through a buffer of 64 rows).
// With quantization, incoherent processing or the baseline's `before` scaling, each input is first
// prepared whole (prepare_input; `before`: Q = q(q(Q) * scale)), in the same order.
template <class T, class R>
void load_inputs(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, Workspace<T>& ws) {
  ws.qt.assign(h.d * h.qt_stride, T(0));
  ws.k.resize(h.n * h.d);
  ws.v.resize(h.n * h.d_padded);
  if (h.quantization != Quantization::none || h.incoherent || h.placement == ScalePlacement::before) {
    prepare_input<StepId::q>(rd, h, q, h.incoherent, h.br, ws.rows, ws.q_scale);
    if (h.placement == ScalePlacement::before) {
      for (T& x : ws.rows) x *= h.scale;
      round_run<StepId::q>(rd, ws.rows.data(), ws.rows.data(), h.n * h.d);
    }
    transpose(ws.rows.data(), h.d, h.n, h.d, ws.qt.data(), h.qt_stride);
    prepare_input<StepId::k>(rd, h, k, h.incoherent, h.bc, ws.k, ws.k_scale);
    prepare_input<StepId::v>(rd, h, v, false, h.bc, ws.rows, ws.v_scale);
    for (std::int64_t i = 0; i < h.n; ++i) {
      std::copy(ws.rows.data() + i * h.d, ws.rows.data() + (i + 1) * h.d, ws.v.data() + i * h.d_padded);
      std::fill(ws.v.data() + i * h.d_padded + h.d, ws.v.data() + (i + 1) * h.d_padded, T(0));
    }
    return;
  }
  constexpr std::int64_t kRows = 64;
  ws.q_rows.resize(std::min(h.n, kRows) * h.d);
  for (std::int64_t i0 = 0; i0 < h.n; i0 += kRows) {
    const std::int64_t rows = std::min(kRows, h.n - i0);
    round_run<StepId::q>(rd, q + i0 * h.d, ws.q_rows.data(), rows * h.d);
    transpose(ws.q_rows.data(), h.d, rows, h.d, ws.qt.data() + i0, h.qt_stride);
  }
  round_run<StepId::k>(rd, k, ws.k.data(), h.n * h.d);
  for (std::int64_t i = 0; i < h.n; ++i) {
    round_run<StepId::v>(rd, v + i * h.d, ws.v.data() + i * h.d_padded, h.d);
    std::fill(ws.v.data() + i * h.d_padded + h.d, ws.v.data() + (i + 1) * h.d_padded, T(0));
  }
  ws.q_scale.clear();
  ws.k_scale.clear();
  ws.v_scale.clear();
}

// out[t] = o(division(acc[t] / l)) for t < d, then the row's lse = rounded lse_step(m + log l) when
// lse is not null: the results and draws of that scalar loop (lanes take the draws of both steps,
// interleaved as the scalar calls take them).
template <StepId LseStep, class T, class R>
FASTUDY_INLINE void store_row(const R& rd, const T* acc, std::int64_t d, T l, bool divide, T m, T* out, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::uint32_t division_draw = divide && rd.template draws<StepId::division>() ? 1 : 0;
  const std::uint32_t stride = division_draw + (rd.template draws<StepId::o>() ? 1 : 0);
  const V l_vec = splat(l);
  std::int64_t t = 0;
  for (; t + L <= d; t += L) {
    V x = vload(acc + t);
    if (divide) x = rd.template lanes<StepId::division>(x / l_vec, 0, stride);
    vstore(out + t, rd.template lanes<StepId::o>(x, division_draw, stride));
    rd.rng.skip(stride * L);
  }
  for (; t < d; ++t) out[t] = divide ? rd.o(rd.division(acc[t] / l)) : rd.o(acc[t]);
  // lse = m + log(l) as the framework writes it: log(l) an op of its own, each result in LseStep's format
  // (FA-2 as ops: `m + torch.log(l)`; exact where the step is as wide as T).
  if (lse) *lse = rd.template step<LseStep>(m + rd.template step<LseStep>(static_cast<T>(std::log(l))));
}

}  // namespace
}  // namespace fastudy
