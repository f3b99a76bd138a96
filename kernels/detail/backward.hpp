// The backward kernels of one head: flash_backward (the framework loops), flash_backward_kernel (the
// FlashAttention-2 and -3 kernels) and baseline_backward, with their workspace, the rounded copies of
// the inputs and the store of the gradients (op decomposition in kernels/detail/attention_impl.hpp).
//
// Flash: FA-2 order (outer KV tiles, inner Q blocks), on tiles with the forward's register-blocked
// products: S^T and dP^T by score_tile, P = p(exp(S - lse)) from the saved lse, D_i = dO_i . O_i,
// dS = grad(P (dP - D)), then dV_j += P^T dO_i, dK_j += dS^T Q_i, dQ_i += dS K_j by pv_tile. Every
// gradient element accumulates the same products in the same order as a row-by-row loop over queries
// i (dV, dK: i ascending; dQ: keys j ascending), masked entries adding P = 0 exactly.
// Baseline: row by row over the queries i, vectorised over the keys j (with K and V transposed) and
// over the head dim t; P recomputed in full from q and k as in the forward pass, materialised
// [N, N], D_i = sum_j P_ij dP_ij (the textbook softmax backward); the scale's ops differentiated as
// autograd does (ScalePlacement): fused dQ = grad(dS K * scale); after dS' = grad(dS * scale),
// dQ = grad(dS' K), dK = grad(dS'^T Q); before dQ = grad(grad(dS K) * scale), dK = grad(dS^T Q') with
// Q' = q(Q * scale) the scaled Q the forward multiplied.
#pragma once

#include "kernels/detail/exp.hpp"
#include "kernels/detail/head.hpp"
#include "kernels/detail/rounding.hpp"
#include "kernels/detail/tiles.hpp"

namespace fastudy {
namespace {

template <class T>
struct BackwardWorkspace {
  std::vector<T> q, k, dout;  // the rounded inputs, [N, d_padded]
  std::vector<T> kt, vt;      // K^T and V^T, [d, kt_stride]
  std::vector<T> dq, dk, dv;  // the gradients' accumulators, [N, d_padded]
  std::vector<T> delta, lse;  // flash: D_i = dO_i . O_i and the saved lse of each row, [qt_stride]
  std::vector<T> p, ds;       // P and dS: flash's tiles [Bc, Br padded], baseline's rows [N, N padded]
  std::vector<T> scratch;     // V rounded [N, d_padded] while loading, then flash's rounded O row
  std::vector<T> qt, dout_t, k_packed, v_packed;  // flash: Q^T, dO^T [d, qt_stride]; K, V [N, d]
  std::vector<T> dq_tile;     // fa2/fa3, framework ops: one KV tile's part of dQ for a row block [Br, d_padded]
  std::vector<T> dkv_tile;    // framework ops: one row block's part of dK or dV for a KV tile [Bc, d_padded]
};

// The row length of K^T and V^T in the backward pass: a KV tile starting anywhere reads whole
// vectors, up to round_up(Bc) keys past its start.
template <class T>
std::int64_t backward_kt_stride(const Head<T>& h) {
  return round_up(h.n, kLanes<T>) + round_up(h.bc, kLanes<T>);
}

template <class T, class R>
void load_backward_inputs(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, const T* dout,
                          BackwardWorkspace<T>& ws) {
  const std::int64_t kt_stride = backward_kt_stride(h);
  ws.q.assign(h.n * h.d_padded, T(0));
  ws.k.assign(h.n * h.d_padded, T(0));
  ws.dout.assign(h.n * h.d_padded, T(0));
  ws.kt.assign(h.d * kt_stride, T(0));
  ws.vt.assign(h.d * kt_stride, T(0));
  // Element by element, q, k, v then grad (the scalar order of the draws): whole vectors of a row
  // lane by lane, each step's lanes taking its draws of the interleaved sequence.
  constexpr int L = kLanes<T>;
  const std::uint32_t k_offset = rd.template draws<StepId::q>() ? 1 : 0;
  const std::uint32_t v_offset = k_offset + (rd.template draws<StepId::k>() ? 1 : 0);
  const std::uint32_t grad_offset = v_offset + (rd.template draws<StepId::v>() ? 1 : 0);
  const std::uint32_t stride = grad_offset + (rd.template draws<StepId::grad>() ? 1 : 0);
  ws.scratch.resize(h.n * h.d_padded);
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t packed = i * h.d, padded = i * h.d_padded;  // row i in [N, d] and [N, d_padded]
    std::int64_t t = 0;
    for (; t + L <= h.d; t += L) {
      vstore(ws.q.data() + padded + t, rd.template lanes<StepId::q>(vload(q + packed + t), 0, stride));
      vstore(ws.k.data() + padded + t, rd.template lanes<StepId::k>(vload(k + packed + t), k_offset, stride));
      vstore(ws.scratch.data() + padded + t,
             rd.template lanes<StepId::v>(vload(v + packed + t), v_offset, stride));
      vstore(ws.dout.data() + padded + t,
             rd.template lanes<StepId::grad>(vload(dout + packed + t), grad_offset, stride));
      rd.rng.skip(stride * L);
    }
    for (; t < h.d; ++t) {
      ws.q[padded + t] = rd.q(q[packed + t]);
      ws.k[padded + t] = rd.k(k[packed + t]);
      ws.scratch[padded + t] = rd.v(v[packed + t]);
      ws.dout[padded + t] = rd.grad(dout[packed + t]);
    }
  }
  if (h.placement == ScalePlacement::before) {
    // (Q * scale) as the op stores it: Q' = q(q(Q) * scale), what the forward multiplied by K^T.
    for (std::int64_t i = 0; i < h.n * h.d_padded; ++i) ws.q[i] *= h.scale;
    round_run<StepId::q>(rd, ws.q.data(), ws.q.data(), h.n * h.d_padded);
  }
  transpose(ws.k.data(), h.d_padded, h.n, h.d, ws.kt.data(), kt_stride);
  transpose(ws.scratch.data(), h.d_padded, h.n, h.d, ws.vt.data(), kt_stride);
  ws.dq.assign(h.n * h.d_padded, T(0));
  ws.dk.assign(h.n * h.d_padded, T(0));
  ws.dv.assign(h.n * h.d_padded, T(0));
}

// row[j] = accum-sequence over t of a[t] * bt[t * ldb + j0 + j], for j < cols (a multiple of the lanes).
template <class T, class R>
FASTUDY_INLINE void row_dot(const R& rd, const T* a, const T* bt, std::int64_t ldb, std::int64_t d,
                            std::int64_t j0, std::int64_t cols, T* row) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  for (std::int64_t j = 0; j < cols; j += L) {
    V acc{};
    for (std::int64_t t = 0; t < d; ++t) acc = rd.accum(madd(splat(a[t]), vload(bt + t * ldb + j0 + j), acc));
    vstore(row + j, acc);
  }
}

// y[t] += a * x[t] for t < d_padded, added as GemmAccum says (tiles.hpp): y a gradient's accumulator,
// stored in grad.
template <GemmAccum Accum, class T, class R>
FASTUDY_INLINE void axpy(const R& rd, T a, const T* x, T* y, std::int64_t d_padded) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const V a_vec = splat(a);
  for (std::int64_t t = 0; t < d_padded; t += L)
    vstore(y + t, gemm_add<Accum, StepId::grad>(rd, a_vec, vload(x + t), vload(y + t)));
}

// The baseline's three gradient matmuls, row i of P and dS: dV += P_i^T dO_i, dK += dS_i^T Q_i,
// dQ_i += dS_i K, each a sum over its index ascending (dV, dK: queries i; dQ: keys j).
template <GemmAccum Accum, class T, class R>
void baseline_gradient_rows(const R& rd, const Head<T>& h, std::int64_t n_padded, BackwardWorkspace<T>& ws) {
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t j_end = h.causal ? i + 1 : h.n;
    const T* p = ws.p.data() + i * n_padded;
    const T* ds = ws.ds.data() + i * n_padded;
    for (std::int64_t j = 0; j < j_end; ++j) {
      axpy<Accum>(rd, p[j], ws.dout.data() + i * h.d_padded, ws.dv.data() + j * h.d_padded, h.d_padded);
      axpy<Accum>(rd, ds[j], ws.q.data() + i * h.d_padded, ws.dk.data() + j * h.d_padded, h.d_padded);
      axpy<Accum>(rd, ds[j], ws.k.data() + j * h.d_padded, ws.dq.data() + i * h.d_padded, h.d_padded);
    }
  }
}

// dQ, dK, dV from their accumulators, the scale as `placement` says: `fused` (every flash kernel, the
// framework flash loops' `after`, the baseline's `fused`) multiplies dQ and dK by the scale once
// (dQ = grad(acc * scale)); the baseline's `after` scaled dS already (grad(acc)); `before` stores
// dQ' = grad(acc), then dQ = grad(dQ' * scale), and dK = grad(acc).
template <class T, class R>
void store_gradients(const R& rd, const Head<T>& h, ScalePlacement placement, BackwardWorkspace<T>& ws, T* dq, T* dk,
                     T* dv) {
  // Element by element dQ (one rounding, two for `before`), dK then dV (the scalar order of the
  // draws), whole vectors lane by lane.
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const bool dq_twice = placement == ScalePlacement::before;
  const bool dq_scaled = placement != ScalePlacement::after, dk_scaled = placement == ScalePlacement::fused;
  const std::uint32_t draw = rd.template draws<StepId::grad>() ? 1 : 0;
  const std::uint32_t dk_offset = draw * (dq_twice ? 2 : 1), dv_offset = dk_offset + draw;
  const std::uint32_t stride = dv_offset + draw;
  const V scale = splat(h.scale), one = splat(T(1));
  const V dq_factor = dq_scaled && !dq_twice ? scale : one, dk_factor = dk_scaled ? scale : one;
  const T dq_factor_s = dq_scaled && !dq_twice ? h.scale : T(1), dk_factor_s = dk_scaled ? h.scale : T(1);
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t packed = i * h.d, padded = i * h.d_padded;  // row i in [N, d] and [N, d_padded]
    std::int64_t t = 0;
    for (; t + L <= h.d; t += L) {
      V x = rd.template lanes<StepId::grad>(vload(ws.dq.data() + padded + t) * dq_factor, 0, stride);
      if (dq_twice) x = rd.template lanes<StepId::grad>(x * scale, draw, stride);
      vstore(dq + packed + t, x);
      vstore(dk + packed + t,
             rd.template lanes<StepId::grad>(vload(ws.dk.data() + padded + t) * dk_factor, dk_offset, stride));
      vstore(dv + packed + t, rd.template lanes<StepId::grad>(vload(ws.dv.data() + padded + t), dv_offset, stride));
      rd.rng.skip(stride * L);
    }
    for (; t < h.d; ++t) {
      T x = rd.grad(ws.dq[padded + t] * dq_factor_s);
      if (dq_twice) x = rd.grad(x * h.scale);
      dq[packed + t] = x;
      dk[packed + t] = rd.grad(ws.dk[padded + t] * dk_factor_s);
      dv[packed + t] = rd.grad(ws.dv[padded + t]);
    }
  }
}

// The framework loop as ops (`ops` in flash_backward): acc[x] = o_running(acc[x] + g(tile[x])) for x < n,
// g the op that hands the tile's product on: grad(grad(tile) * scale) (`after`: a matmul, then the
// scaling op), grad(tile * scale) (`fused`), grad(tile) (no scale: dV, and `before`, whose Q holds it).
template <class T, class R>
void add_tile_op(const R& rd, const T* tile, T* acc, std::int64_t n, ScalePlacement scaled, T scale) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const V s = splat(scale);
  for (std::int64_t x = 0; x < n; x += L) {
    V g = vload(tile + x);
    if (scaled == ScalePlacement::after) g = rd.grad(rd.grad(g) * s);
    else if (scaled == ScalePlacement::fused) g = rd.grad(g * s);
    else g = rd.grad(g);
    vstore(acc + x, rd.o_running(vload(acc + x) + g));
  }
}

// The flash loops' layouts of the rounded inputs (after load_backward_inputs): Q^T and dO^T
// [d, qt_stride] (zero padded), K and V [N, d] (V from its transpose). Copies only: no rounding.
template <class T>
void pack_flash_tiles(const Head<T>& h, BackwardWorkspace<T>& ws) {
  const std::int64_t kt_stride = backward_kt_stride(h);
  ws.qt.assign(h.d * h.qt_stride, T(0));
  ws.dout_t.assign(h.d * h.qt_stride, T(0));
  ws.k_packed.resize(h.n * h.d);
  ws.v_packed.resize(h.n * h.d);
  for (std::int64_t i = 0; i < h.n; ++i) {
    for (std::int64_t t = 0; t < h.d; ++t) {
      ws.qt[t * h.qt_stride + i] = ws.q[i * h.d_padded + t];
      ws.dout_t[t * h.qt_stride + i] = ws.dout[i * h.d_padded + t];
      ws.k_packed[i * h.d + t] = ws.k[i * h.d_padded + t];
      ws.v_packed[i * h.d + t] = ws.vt[t * kt_stride + i];
    }
  }
}

template <class T, class R>
void flash_backward(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, const T* o, const T* lse,
                    const T* dout, BackwardWorkspace<T>& ws, T* dq, T* dk, T* dv) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  load_backward_inputs(rd, h, q, k, v, dout, ws);
  pack_flash_tiles(h, ws);
  // lse and D per row, zero padded so a block's padding lanes read in bounds (their results are
  // never summed).
  ws.delta.assign(h.qt_stride, T(0));
  ws.lse.assign(h.qt_stride, T(0));
  // `ops`: the running gradients are stored between tiles (o_running narrower than the kernel's type):
  // the loop is FA-2's Algorithm 2 written as framework ops (the `torch_flash` row's code), each op's
  // output a tensor of grad: D = stats_running(sum_t grad(dO_t O_t)), dP = grad(dO V^T),
  // dS = grad(P grad(dP - D)), and per (KV tile, row block) dV_j = o_running(dV_j + grad(P^T dO_i)),
  // dK_j = o_running(dK_j + g(dS^T Q_i)), dQ_i = o_running(dQ_i + g(dS K_j)) with g the scale's op
  // (add_tile_op). Otherwise (running state in registers) the products accumulate straight into dQ, dK
  // and dV.
  const bool ops = !rd.exact_running_o;
  // A row's o roundings first (as whole vectors) where the accumulation takes no draws between them.
  const bool o_first = !rd.template draws<StepId::accum>();
  T* o_row = ws.scratch.data();  // free after load_backward_inputs
  for (std::int64_t i = 0; i < h.n; ++i) {
    T acc = 0;
    if (ops) {
      round_run<StepId::o>(rd, o + i * h.d, o_row, h.d);
      for (std::int64_t t = 0; t < h.d; ++t) acc = rd.accum(acc + rd.grad(ws.dout[i * h.d_padded + t] * o_row[t]));
    } else if (o_first) {
      round_run<StepId::o>(rd, o + i * h.d, o_row, h.d);
      for (std::int64_t t = 0; t < h.d; ++t) acc = rd.accum(madd(ws.dout[i * h.d_padded + t], o_row[t], acc));
    } else {
      for (std::int64_t t = 0; t < h.d; ++t)
        acc = rd.accum(madd(ws.dout[i * h.d_padded + t], rd.o(o[i * h.d + t]), acc));
    }
    ws.delta[i] = rd.stats_running(acc);
    ws.lse[i] = lse[i];
  }
  const std::int64_t br_padded_max = round_up(h.br, L);
  ws.p.resize(h.bc * br_padded_max);
  ws.ds.resize(h.bc * br_padded_max);
  if (ops) {
    ws.dq_tile.resize(h.br * h.d_padded);
    ws.dkv_tile.resize(h.bc * h.d_padded);
  }
  for (std::int64_t j0 = 0; j0 < h.n; j0 += h.bc) {
    const std::int64_t bc = std::min(h.bc, h.n - j0);
    for (std::int64_t i0 = 0; i0 < h.n; i0 += h.br) {
      const std::int64_t br = std::min(h.br, h.n - i0), br_padded = round_up(br, L);
      if (h.causal && i0 + br - 1 < j0) continue;  // every row of the block precedes every key
      T* p = ws.p.data();
      T* ds = ws.ds.data();
      placed_score_tile(h.placement, rd, ws.k_packed.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.qt_stride, bc,
                        br_padded, h.scale, p, br_padded);
      score_tile<ScoreStore::dot>(rd, ws.v_packed.data() + j0 * h.d, h.d, ws.dout_t.data() + i0, h.qt_stride, bc,
                                  br_padded, T(1), ds, br_padded);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(p, br_padded, bc, br_padded, j0, i0);
      for (std::int64_t c = 0; c < bc; ++c) {
        for (std::int64_t r = 0; r < br_padded; r += L) {
          const V p_vec = rd.p(vexp(round_exp_arg(rd, vload(p + c * br_padded + r) - vload(ws.lse.data() + i0 + r))));
          vstore(p + c * br_padded + r, p_vec);
          const V dp = vload(ds + c * br_padded + r), d_i = vload(ws.delta.data() + i0 + r);
          vstore(ds + c * br_padded + r, ops ? rd.grad(p_vec * rd.grad(rd.grad(dp) - d_i)) : rd.grad(p_vec * (dp - d_i)));
        }
      }
      if (ops) {
        // Each product a matmul of its own, handed on by add_tile_op; the tiles [key][query] read as rows.
        const std::int64_t kv_elems = bc * h.d_padded, q_elems = br * h.d_padded;
        std::fill(ws.dkv_tile.begin(), ws.dkv_tile.begin() + kv_elems, T(0));
        op_pv_tile<StepId::grad, true>(h.gemm_in_format, rd, p, br_padded, ws.dout.data() + i0 * h.d_padded, h.d_padded,
                                       br, bc, ws.dkv_tile.data(), h.d_padded);
        add_tile_op(rd, ws.dkv_tile.data(), ws.dv.data() + j0 * h.d_padded, kv_elems, ScalePlacement::before, h.scale);
        std::fill(ws.dkv_tile.begin(), ws.dkv_tile.begin() + kv_elems, T(0));
        op_pv_tile<StepId::grad, true>(h.gemm_in_format, rd, ds, br_padded, ws.q.data() + i0 * h.d_padded, h.d_padded,
                                       br, bc, ws.dkv_tile.data(), h.d_padded);
        add_tile_op(rd, ws.dkv_tile.data(), ws.dk.data() + j0 * h.d_padded, kv_elems, h.placement, h.scale);
        std::fill(ws.dq_tile.begin(), ws.dq_tile.begin() + q_elems, T(0));
        op_pv_tile<StepId::grad>(h.gemm_in_format, rd, ds, br_padded, ws.k.data() + j0 * h.d_padded, h.d_padded, bc, br,
                                 ws.dq_tile.data(), h.d_padded);
        add_tile_op(rd, ws.dq_tile.data(), ws.dq.data() + i0 * h.d_padded, q_elems, h.placement, h.scale);
        continue;
      }
      // dV_j += P^T dO_i and dK_j += dS^T Q_i read the tiles [key][query] as rows of P and dS.
      pv_tile<true>(rd, p, br_padded, ws.dout.data() + i0 * h.d_padded, h.d_padded, br, bc,
                    ws.dv.data() + j0 * h.d_padded, h.d_padded);
      pv_tile<true>(rd, ds, br_padded, ws.q.data() + i0 * h.d_padded, h.d_padded, br, bc,
                    ws.dk.data() + j0 * h.d_padded, h.d_padded);
      pv_tile(rd, ds, br_padded, ws.k.data() + j0 * h.d_padded, h.d_padded, bc, br, ws.dq.data() + i0 * h.d_padded,
              h.d_padded);
    }
  }
  // As ops, dQ and dK hold the scale already (but `before`'s dQ = grad(dQ' * scale), the autograd of
  // Q * scale); otherwise the framework loop's S = s(s(Q K^T) * scale) differentiates to dS * scale, as
  // `fused`.
  const ScalePlacement store = ops ? (h.placement == ScalePlacement::before ? ScalePlacement::before : ScalePlacement::after)
                                   : (h.placement == ScalePlacement::after ? ScalePlacement::fused : h.placement);
  store_gradients(rd, h, store, ws, dq, dk, dv);
}

// ---- flash backward, the FlashAttention kernels (FlashKernel::fa2 and fa3) -------------------------
// fa2: csrc/flash_attn/src/flash_bwd_preprocess_kernel.h (dot_do_o) and flash_bwd_kernel.h
// (compute_dq_dk_dv_1colblock, the seqk-parallel kernel); fa3: hopper/flash_bwd_preprocess_kernel.h and
// mainloop_bwd_sm90_tma_gmma_ws.hpp. One KV block of Bc keys is one thread block (its dK, dV in fp32
// registers); its row blocks are visited from the last to the first (fa2: m_block = m_block_max - 1
// down) or from the first to the last (fa3: ++m_block):
//   D_i = sum_t dO_it O_it     dot_do_o: each of T threads of the row sums its 8-column chunks
//                              (8 fp16/bf16 per 128-bit load; page width 8T) in order, product then
//                              FMAs, then Allreduce<T> (shfl_xor T/2, ..., 1); fa2 T = kBlockKSmem / 8
//                              (64 or 32 columns), fa3 T = kBlockKGmem / 8 (128, 64 or 32)
//   S = s(Q_i K_j^T)           acc_s, unscaled fp32
//   P = exp2f(S * scale_log2 - lse_i * log2 e)   scale_apply_exp2<Scale_max=false> (fa3: LSE_log2
//                              precomputed the same way), one FMA; fp32, unrounded
//   dP = dO_i V_j^T            acc_dp, fp32
//   dS = P (dP - D_i)          pointwise_mult on the unrounded P, then convert_type<Element> (grad)
//   dV_j += p(P)^T dO_i        P converted for the MMA, accumulating in fp32 registers
//   dK_j += dS^T Q_i
//   dQ_i += dS K_j             a fresh fp32 accumulator per (KV block, row block), atomicAdd into
//                              dq_accum: tiles added in increasing j here (the GPU's order is that of
//                              the atomics; deterministic mode serialises it)
// end: dQ = grad(dQ * scale) (convert_dQ / the postprocess kernel), dK = grad(dK * scale), dV = grad(dV).
template <FlashKernel K>
std::int64_t dot_do_o_threads(std::int64_t d) {
  // The head dim as the kernel is instantiated (rounded up to 32: 32, 64, 96, 128, ...).
  const std::int64_t padded = round_up(d, 32);
  const std::int64_t columns =
      K == FlashKernel::fa3 && padded % 128 == 0 ? 128 : (padded % 64 == 0 ? 64 : 32);
  return columns / 8;
}

template <FlashKernel K, class T, class R>
T dot_do_o(const R& rd, const T* dout, const T* o, std::int64_t d, std::vector<T>& partial) {
  const std::int64_t threads = dot_do_o_threads<K>(d), page = 8 * threads;
  partial.assign(threads, T(0));
  for (std::int64_t r = 0; r < threads; ++r) {
    bool started = false;
    for (std::int64_t p0 = 0; p0 < d; p0 += page)
      for (std::int64_t t = p0 + 8 * r; t < std::min(d, p0 + 8 * r + 8); ++t) {
        partial[r] = started ? rd.accum(madd(dout[t], o[t], partial[r])) : rd.accum(dout[t] * o[t]);
        started = true;
      }
  }
  for (std::int64_t offset = threads / 2; offset >= 1; offset /= 2)
    for (std::int64_t r = 0; r < offset; ++r) partial[r] = rd.accum(partial[r] + partial[r + offset]);
  return partial[0];
}

template <FlashKernel K, class T, class R>
void flash_backward_kernel(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, const T* o,
                           const T* lse, const T* dout, BackwardWorkspace<T>& ws, T* dq, T* dk, T* dv) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  load_backward_inputs(rd, h, q, k, v, dout, ws);
  pack_flash_tiles(h, ws);
  const T scale_log2 = static_cast<T>(static_cast<double>(h.scale) * 1.44269504088896340736);
  const T log2e = static_cast<T>(1.44269504088896340736);
  ws.delta.assign(h.qt_stride, T(0));
  ws.lse.assign(h.qt_stride, T(0));  // here lse_i * log2 e, the exp2 argument's offset
  T* o_row = ws.scratch.data();      // free after load_backward_inputs
  std::vector<T> partial;
  for (std::int64_t i = 0; i < h.n; ++i) {
    round_run<StepId::o>(rd, o + i * h.d, o_row, h.d);
    ws.delta[i] = rd.stats_running(dot_do_o<K>(rd, ws.dout.data() + i * h.d_padded, o_row, h.d, partial));
    const T l = lse[i];
    ws.lse[i] = K == FlashKernel::fa3 && l == kNegInf<T> ? T(0) : round_exp_arg(rd, l * log2e);
  }
  const std::int64_t br_padded_max = round_up(h.br, L);
  ws.p.resize(h.bc * br_padded_max);
  ws.ds.resize(h.bc * br_padded_max);
  ws.dq_tile.resize(h.br * h.d_padded);
  const V sl2 = splat(scale_log2);
  const std::int64_t row_blocks = (h.n + h.br - 1) / h.br;
  for (std::int64_t j0 = 0; j0 < h.n; j0 += h.bc) {
    const std::int64_t bc = std::min(h.bc, h.n - j0);
    for (std::int64_t step = 0; step < row_blocks; ++step) {
      const std::int64_t ib = K == FlashKernel::fa2 ? row_blocks - 1 - step : step;
      const std::int64_t i0 = ib * h.br;
      const std::int64_t br = std::min(h.br, h.n - i0), br_padded = round_up(br, L);
      if (h.causal && i0 + br - 1 < j0) continue;  // every row of the block precedes every key
      T* p = ws.p.data();
      T* ds = ws.ds.data();
      score_tile<ScoreStore::raw>(rd, ws.k_packed.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.qt_stride, bc,
                                  br_padded, T(1), p, br_padded);
      score_tile<ScoreStore::dot>(rd, ws.v_packed.data() + j0 * h.d, h.d, ws.dout_t.data() + i0, h.qt_stride, bc,
                                  br_padded, T(1), ds, br_padded);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(p, br_padded, bc, br_padded, j0, i0);
      for (std::int64_t c = 0; c < bc; ++c) {
        for (std::int64_t r = 0; r < br_padded; r += L) {
          const V p_vec = vexp2(round_exp_arg(rd, madd(vload(p + c * br_padded + r), sl2,
                                                       -vload(ws.lse.data() + i0 + r))));
          vstore(ds + c * br_padded + r,
                 rd.grad(p_vec * (vload(ds + c * br_padded + r) - vload(ws.delta.data() + i0 + r))));
          vstore(p + c * br_padded + r, rd.p(p_vec));
        }
      }
      pv_tile<true>(rd, p, br_padded, ws.dout.data() + i0 * h.d_padded, h.d_padded, br, bc,
                    ws.dv.data() + j0 * h.d_padded, h.d_padded);
      pv_tile<true>(rd, ds, br_padded, ws.q.data() + i0 * h.d_padded, h.d_padded, br, bc,
                    ws.dk.data() + j0 * h.d_padded, h.d_padded);
      std::fill(ws.dq_tile.begin(), ws.dq_tile.begin() + br * h.d_padded, T(0));
      pv_tile(rd, ds, br_padded, ws.k.data() + j0 * h.d_padded, h.d_padded, bc, br, ws.dq_tile.data(), h.d_padded);
      T* dq_rows = ws.dq.data() + i0 * h.d_padded;
      for (std::int64_t x = 0; x < br * h.d_padded; x += L)
        vstore(dq_rows + x, rd.accum(vload(dq_rows + x) + vload(ws.dq_tile.data() + x)));
    }
  }
  store_gradients(rd, h, ScalePlacement::fused, ws, dq, dk, dv);
}

template <class T, class R>
void baseline_backward(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, const T* dout,
                       BackwardWorkspace<T>& ws, T* dq, T* dk, T* dv) {
  constexpr int L = kLanes<T>;
  load_backward_inputs(rd, h, q, k, v, dout, ws);
  const std::int64_t kt_stride = backward_kt_stride(h), n_padded = round_up(h.n, L);
  ws.p.assign(h.n * n_padded, T(0));
  ws.ds.assign(h.n * n_padded, T(0));
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t j_end = h.causal ? i + 1 : h.n;
    T* p = ws.p.data() + i * n_padded;
    T* ds = ws.ds.data() + i * n_padded;
    row_dot(rd, ws.q.data() + i * h.d_padded, ws.kt.data(), kt_stride, h.d, std::int64_t(0), n_padded, p);
    row_dot(rd, ws.dout.data() + i * h.d_padded, ws.vt.data(), kt_stride, h.d, std::int64_t(0), n_padded, ds);
    T m = kNegInf<T>;
    for (std::int64_t j = 0; j < j_end; ++j) {
      switch (h.placement) {
        case ScalePlacement::fused: p[j] = rd.s(p[j] * h.scale); break;
        case ScalePlacement::after: p[j] = rd.s(rd.s(p[j]) * h.scale); break;
        case ScalePlacement::before: p[j] = rd.s(p[j]); break;
      }
      m = std::max(m, p[j]);
    }
    // max_offset: the forward's adjusted row max recomputed (baseline_forward, offset_tile_max), so
    // that P is the forward's P.
    if (h.max_offset != T(0))
      m = offset_tile_max(m, j_end, h.max_offset, h.tie_tolerance, kNegInf<T>, [&](std::int64_t j) { return p[j]; });
    m = rd.stats(m);
    T l = 0;
    for (std::int64_t j = 0; j < j_end; ++j) {
      const T x = p[j] - m;
      p[j] = rd.softmax(sexp(rd.softmax(x)));
      l = rd.stats(l + p[j]);
    }
    // dP = grad(dO V^T): the output of the P.V matmul's backward, a tensor in grad; then the softmax
    // backward dS = grad(P (dP - D)), its row dot D rounded to grad under LibTorch 1.x's CPU kernel.
    T d_i = 0;
    for (std::int64_t j = 0; j < j_end; ++j) {
      p[j] = rd.p(rd.division(p[j] / l));
      ds[j] = rd.grad(ds[j]);
      d_i = rd.accum(madd(p[j], ds[j], d_i));
    }
    if (h.libtorch1_cpu) d_i = rd.grad(d_i);
    for (std::int64_t j = 0; j < n_padded; ++j) ds[j] = j < j_end ? rd.grad(p[j] * (ds[j] - d_i)) : T(0);
    if (h.placement == ScalePlacement::after)  // the scaling op's backward: dS' = grad(dS * scale)
      for (std::int64_t j = 0; j < j_end; ++j) ds[j] = rd.grad(ds[j] * h.scale);
    for (std::int64_t j = j_end; j < n_padded; ++j) p[j] = 0;
  }
  // The gradient matmuls: LibTorch 1.x's cpublas GEMM adds in grad (autograd's dV = P^T dO, dK^T = Q^T dS
  // and dQ = dS K are all gemm_notrans_-shaped; FrameworkOps::libtorch1_cpublas), else fused.
  if (h.gemm_in_format) baseline_gradient_rows<GemmAccum::in_format>(rd, h, n_padded, ws);
  else baseline_gradient_rows<GemmAccum::fused>(rd, h, n_padded, ws);
  store_gradients(rd, h, h.placement, ws, dq, dk, dv);
}

}  // namespace
}  // namespace fastudy
