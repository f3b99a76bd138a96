// One head: its sizes (Head, which the backward shares), the forward's workspace, the rounded per-head
// copies of Q, K and V the tiles read (load_inputs, through transpose), and the store of a finished
// output row with its lse (store_row).
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
};

template <class T>
struct Workspace {
  std::vector<T> qt, k, v;     // the rounded inputs: Q^T [d, qt_stride], K [N, d], V [N, d_padded]
  std::vector<T> st;           // the tile S^T [Bc, Br padded] (baseline: [N, N padded]), then P^T
  std::vector<T> o, m, l;      // O [rows, d_padded], row max and row sum (flash: the running ones)
  std::vector<T> alpha;        // q_outer: the rescale factors of the current tile
  std::vector<T> pv;           // a tile's P.V [Br, d_padded] where it is an op of its own
  std::vector<T> q_rows;       // load_inputs: a buffer of rounded Q rows
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
  return h;
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
template <class T, class R>
void load_inputs(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, Workspace<T>& ws) {
  constexpr std::int64_t kRows = 64;
  ws.q_rows.resize(std::min(h.n, kRows) * h.d);
  ws.qt.assign(h.d * h.qt_stride, T(0));
  for (std::int64_t i0 = 0; i0 < h.n; i0 += kRows) {
    const std::int64_t rows = std::min(kRows, h.n - i0);
    round_run<StepId::q>(rd, q + i0 * h.d, ws.q_rows.data(), rows * h.d);
    transpose(ws.q_rows.data(), h.d, rows, h.d, ws.qt.data() + i0, h.qt_stride);
  }
  ws.k.resize(h.n * h.d);
  round_run<StepId::k>(rd, k, ws.k.data(), h.n * h.d);
  ws.v.resize(h.n * h.d_padded);
  for (std::int64_t i = 0; i < h.n; ++i) {
    round_run<StepId::v>(rd, v + i * h.d, ws.v.data() + i * h.d_padded, h.d);
    std::fill(ws.v.data() + i * h.d_padded + h.d, ws.v.data() + (i + 1) * h.d_padded, T(0));
  }
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
  if (lse) *lse = rd.template step<LseStep>(m + std::log(l));
}

}  // namespace
}  // namespace fastudy
