// The backward kernels of one head: flash_backward and baseline_backward, with their workspace, the
// rounded copies of the inputs and the store of the gradients (op decomposition in
// kernels/detail/attention_impl.hpp).
//
// Flash: FA-2 order (outer KV tiles, inner Q blocks), on tiles with the forward's register-blocked
// products: S^T and dP^T by score_tile, P = p(exp(S - lse)) from the saved lse, D_i = dO_i . O_i,
// dS = grad(P (dP - D)), then dV_j += P^T dO_i, dK_j += dS^T Q_i, dQ_i += dS K_j by pv_tile. Every
// gradient element accumulates the same products in the same order as a row-by-row loop over queries
// i (dV, dK: i ascending; dQ: keys j ascending), masked entries adding P = 0 exactly.
// Baseline: row by row over the queries i, vectorised over the keys j (with K and V transposed) and
// over the head dim t; P recomputed in full from q and k as in the forward pass, materialised
// [N, N], D_i = sum_j P_ij dP_ij (the textbook softmax backward).
#pragma once

#include "kernels/detail/exp.hpp"
#include "kernels/detail/head.hpp"
#include "kernels/detail/rounding.hpp"
#include "kernels/detail/tiles.hpp"

namespace fastudy {
namespace {

template <class T>
struct BackwardWorkspace {
  std::vector<T> q, k, dout, kt, vt, dq, dk, dv, dd, lse, p, ds, row;
  std::vector<T> qt, dot, kr, vr;  // flash: Q^T, dO^T [d, np]; K, V [N, d]
};

// Leading dimension of K^T and V^T in the backward pass: a KV tile starting anywhere reads whole
// vectors, up to round_up(Bc) keys past its start.
template <class T>
std::int64_t backward_ld(const Head<T>& h) {
  return round_up(h.n, kLanes<T>) + round_up(h.bc, kLanes<T>);
}

template <class T, class R>
void load_backward_inputs(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, const T* dout,
                          BackwardWorkspace<T>& ws) {
  const std::int64_t np = backward_ld(h);
  ws.q.assign(h.n * h.dp, T(0));
  ws.k.assign(h.n * h.dp, T(0));
  ws.dout.assign(h.n * h.dp, T(0));
  ws.kt.assign(h.d * np, T(0));
  ws.vt.assign(h.d * np, T(0));
  // Element by element, q, k, v then grad (the scalar order of the draws): whole vectors of a row
  // lane by lane, each step's lanes taking its draws of the interleaved sequence.
  constexpr int L = kLanes<T>;
  const std::uint32_t o_k = rd.template draws<StepId::q>() ? 1 : 0;
  const std::uint32_t o_v = o_k + (rd.template draws<StepId::k>() ? 1 : 0);
  const std::uint32_t o_g = o_v + (rd.template draws<StepId::v>() ? 1 : 0);
  const std::uint32_t stride = o_g + (rd.template draws<StepId::grad>() ? 1 : 0);
  ws.row.resize(h.n * h.dp);  // V rounded, [N, dp]
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t a = i * h.d, b = i * h.dp;
    std::int64_t t = 0;
    for (; t + L <= h.d; t += L) {
      vstore(ws.q.data() + b + t, rd.template lanes<StepId::q>(vload(q + a + t), 0, stride));
      vstore(ws.k.data() + b + t, rd.template lanes<StepId::k>(vload(k + a + t), o_k, stride));
      vstore(ws.row.data() + b + t, rd.template lanes<StepId::v>(vload(v + a + t), o_v, stride));
      vstore(ws.dout.data() + b + t, rd.template lanes<StepId::grad>(vload(dout + a + t), o_g, stride));
      rd.rng.skip(stride * L);
    }
    for (; t < h.d; ++t) {
      ws.q[b + t] = rd.q(q[a + t]);
      ws.k[b + t] = rd.k(k[a + t]);
      ws.row[b + t] = rd.v(v[a + t]);
      ws.dout[b + t] = rd.grad(dout[a + t]);
    }
  }
  transpose(ws.k.data(), h.dp, h.n, h.d, ws.kt.data(), np);
  transpose(ws.row.data(), h.dp, h.n, h.d, ws.vt.data(), np);
  ws.dq.assign(h.n * h.dp, T(0));
  ws.dk.assign(h.n * h.dp, T(0));
  ws.dv.assign(h.n * h.dp, T(0));
}

// row[j] = accum-sequence over t of a[t] * bt[t * ld + j0 + j], for j < bcp (lanes).
template <class T, class R>
FASTUDY_INLINE void row_dot(const R& rd, const T* a, const T* bt, std::int64_t ld, std::int64_t d,
                            std::int64_t j0, std::int64_t bcp, T* row) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  for (std::int64_t j = 0; j < bcp; j += L) {
    V acc{};
    for (std::int64_t t = 0; t < d; ++t) acc = rd.accum(madd(splat(a[t]), vload(bt + t * ld + j0 + j), acc));
    vstore(row + j, acc);
  }
}

// y[t] = accum(y[t] + a * x[t]) for t < dp.
template <class T, class R>
FASTUDY_INLINE void axpy(const R& rd, T a, const T* x, T* y, std::int64_t dp) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const V av = splat(a);
  for (std::int64_t t = 0; t < dp; t += L) vstore(y + t, rd.accum(madd(av, vload(x + t), vload(y + t))));
}

template <class T, class R>
void store_gradients(const R& rd, const Head<T>& h, BackwardWorkspace<T>& ws, T* dq, T* dk, T* dv) {
  // Element by element dQ, dK then dV (the scalar order of the draws), whole vectors lane by lane.
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::uint32_t stride = rd.template draws<StepId::grad>() ? 3 : 0, one = stride / 3;
  const V scale = splat(h.scale);
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t a = i * h.d, b = i * h.dp;
    std::int64_t t = 0;
    for (; t + L <= h.d; t += L) {
      vstore(dq + a + t, rd.template lanes<StepId::grad>(vload(ws.dq.data() + b + t) * scale, 0, stride));
      vstore(dk + a + t, rd.template lanes<StepId::grad>(vload(ws.dk.data() + b + t) * scale, one, stride));
      vstore(dv + a + t, rd.template lanes<StepId::grad>(vload(ws.dv.data() + b + t), 2 * one, stride));
      rd.rng.skip(stride * L);
    }
    for (; t < h.d; ++t) {
      dq[a + t] = rd.grad(ws.dq[b + t] * h.scale);
      dk[a + t] = rd.grad(ws.dk[b + t] * h.scale);
      dv[a + t] = rd.grad(ws.dv[b + t]);
    }
  }
}

template <class T, class R>
void flash_backward(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, const T* o, const T* lse,
                    const T* dout, BackwardWorkspace<T>& ws, T* dq, T* dk, T* dv) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  load_backward_inputs(rd, h, q, k, v, dout, ws);
  const std::int64_t ld = backward_ld(h);
  // The tiles' layouts of the rounded inputs: Q^T and dO^T [d, np] (zero padded), K and V [N, d].
  ws.qt.assign(h.d * h.np, T(0));
  ws.dot.assign(h.d * h.np, T(0));
  ws.kr.resize(h.n * h.d);
  ws.vr.resize(h.n * h.d);
  for (std::int64_t i = 0; i < h.n; ++i) {
    for (std::int64_t t = 0; t < h.d; ++t) {
      ws.qt[t * h.np + i] = ws.q[i * h.dp + t];
      ws.dot[t * h.np + i] = ws.dout[i * h.dp + t];
      ws.kr[i * h.d + t] = ws.k[i * h.dp + t];
      ws.vr[i * h.d + t] = ws.vt[t * ld + i];
    }
  }
  // lse and D per row, zero padded so a block's padding lanes read in bounds (their results are
  // never summed).
  ws.dd.assign(h.np, T(0));
  ws.lse.assign(h.np, T(0));
  // A row's o roundings first (as whole vectors) where the accumulation takes no draws between them.
  const bool o_first = !rd.template draws<StepId::accum>();
  T* orow = ws.row.data();  // free after load_backward_inputs
  for (std::int64_t i = 0; i < h.n; ++i) {
    T acc = 0;
    if (o_first) {
      round_run<StepId::o>(rd, o + i * h.d, orow, h.d);
      for (std::int64_t t = 0; t < h.d; ++t) acc = rd.accum(madd(ws.dout[i * h.dp + t], orow[t], acc));
    } else {
      for (std::int64_t t = 0; t < h.d; ++t) acc = rd.accum(madd(ws.dout[i * h.dp + t], rd.o(o[i * h.d + t]), acc));
    }
    ws.dd[i] = rd.stats_running(acc);
    ws.lse[i] = lse[i];
  }
  const std::int64_t brp_max = round_up(h.br, L);
  ws.p.resize(h.bc * brp_max);
  ws.ds.resize(h.bc * brp_max);
  for (std::int64_t j0 = 0; j0 < h.n; j0 += h.bc) {
    const std::int64_t bc = std::min(h.bc, h.n - j0);
    for (std::int64_t i0 = 0; i0 < h.n; i0 += h.br) {
      const std::int64_t br = std::min(h.br, h.n - i0), brp = round_up(br, L);
      if (h.causal && i0 + br - 1 < j0) continue;  // every row of the block precedes every key
      T* p = ws.p.data();
      T* ds = ws.ds.data();
      score_tile(rd, ws.kr.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.np, bc, brp, h.scale, p, brp);
      score_tile<false>(rd, ws.vr.data() + j0 * h.d, h.d, ws.dot.data() + i0, h.np, bc, brp, T(1), ds, brp);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(p, brp, bc, brp, j0, i0);
      for (std::int64_t c = 0; c < bc; ++c) {
        for (std::int64_t r = 0; r < brp; r += L) {
          const V pv = rd.p(vexp(round_exp_arg(rd, vload(p + c * brp + r) - vload(ws.lse.data() + i0 + r))));
          vstore(p + c * brp + r, pv);
          vstore(ds + c * brp + r, rd.grad(pv * (vload(ds + c * brp + r) - vload(ws.dd.data() + i0 + r))));
        }
      }
      // dV_j += P^T dO_i and dK_j += dS^T Q_i read the tiles [key][query] as rows of P and dS.
      pv_tile<true>(rd, p, brp, ws.dout.data() + i0 * h.dp, h.dp, br, bc, ws.dv.data() + j0 * h.dp, h.dp);
      pv_tile<true>(rd, ds, brp, ws.q.data() + i0 * h.dp, h.dp, br, bc, ws.dk.data() + j0 * h.dp, h.dp);
      pv_tile(rd, ds, brp, ws.k.data() + j0 * h.dp, h.dp, bc, br, ws.dq.data() + i0 * h.dp, h.dp);
    }
  }
  store_gradients(rd, h, ws, dq, dk, dv);
}

template <class T, class R>
void baseline_backward(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, const T* dout,
                       BackwardWorkspace<T>& ws, T* dq, T* dk, T* dv) {
  constexpr int L = kLanes<T>;
  load_backward_inputs(rd, h, q, k, v, dout, ws);
  const std::int64_t ld = backward_ld(h), np = round_up(h.n, L);
  ws.p.assign(h.n * np, T(0));
  ws.ds.assign(h.n * np, T(0));
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t jn = h.causal ? i + 1 : h.n;
    T* p = ws.p.data() + i * np;
    T* ds = ws.ds.data() + i * np;
    row_dot(rd, ws.q.data() + i * h.dp, ws.kt.data(), ld, h.d, std::int64_t(0), np, p);
    row_dot(rd, ws.dout.data() + i * h.dp, ws.vt.data(), ld, h.d, std::int64_t(0), np, ds);
    T m = kNegInf<T>;
    for (std::int64_t j = 0; j < jn; ++j) {
      p[j] = rd.s(p[j] * h.scale);
      m = std::max(m, p[j]);
    }
    m = rd.stats(m);
    T l = 0;
    for (std::int64_t j = 0; j < jn; ++j) {
      const T x = p[j] - m;
      p[j] = rd.softmax(sexp(rd.softmax(x)));
      l = rd.stats(l + p[j]);
    }
    T di = 0;
    for (std::int64_t j = 0; j < jn; ++j) {
      p[j] = rd.p(rd.division(p[j] / l));
      di = rd.accum(madd(p[j], ds[j], di));
    }
    for (std::int64_t j = 0; j < np; ++j) ds[j] = j < jn ? rd.grad(p[j] * (ds[j] - di)) : T(0);
    for (std::int64_t j = jn; j < np; ++j) p[j] = 0;
  }
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t jn = h.causal ? i + 1 : h.n;
    const T* p = ws.p.data() + i * np;
    const T* ds = ws.ds.data() + i * np;
    for (std::int64_t j = 0; j < jn; ++j) {
      axpy(rd, p[j], ws.dout.data() + i * h.dp, ws.dv.data() + j * h.dp, h.dp);
      axpy(rd, ds[j], ws.q.data() + i * h.dp, ws.dk.data() + j * h.dp, h.dp);
      axpy(rd, ds[j], ws.k.data() + j * h.dp, ws.dq.data() + i * h.dp, h.dp);
    }
  }
  store_gradients(rd, h, ws, dq, dk, dv);
}

}  // namespace
}  // namespace fastudy
