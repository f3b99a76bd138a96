// The forward kernels of one head: flash_forward_q_outer (FlashAttention-2), flash_forward_kv_outer
// (FlashAttention-1, Algorithm 1) and baseline_forward (S materialised). Each follows the op
// decomposition written out in kernels/detail/attention_impl.hpp.
#pragma once

#include "kernels/detail/exp.hpp"
#include "kernels/detail/head.hpp"
#include "kernels/detail/rounding.hpp"
#include "kernels/detail/tiles.hpp"

namespace fastudy {
namespace {

// ---- flash forward, Q-outer (FlashAttention-2): one final normalisation -------------------------
template <class T, class R>
void flash_forward_q_outer(const R& rd, const Head<T>& h, Workspace<T>& ws, T* o, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::int64_t br_padded_max = round_up(h.br, L);
  ws.st.resize(h.bc * br_padded_max);
  ws.o.resize(h.br * h.d_padded);
  ws.m.resize(br_padded_max);
  ws.l.resize(br_padded_max);
  ws.alpha.resize(br_padded_max);
  ws.pv.resize(h.br * h.d_padded);
  for (std::int64_t i0 = 0; i0 < h.n; i0 += h.br) {
    const std::int64_t br = std::min(h.br, h.n - i0), br_padded = round_up(br, L);
    std::fill(ws.m.begin(), ws.m.end(), kNegInf<T>);
    std::fill(ws.l.begin(), ws.l.end(), T(0));
    std::fill(ws.o.begin(), ws.o.end(), T(0));
    const std::int64_t j_end = h.causal ? std::min(h.n, i0 + br) : h.n;
    for (std::int64_t j0 = 0; j0 < j_end; j0 += h.bc) {
      const std::int64_t bc = std::min(h.bc, h.n - j0);
      T* st = ws.st.data();
      score_tile(rd, ws.k.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.qt_stride, bc, br_padded, h.scale, st,
                 br_padded);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(st, br_padded, bc, br_padded, j0, i0);
      for (std::int64_t r = 0; r < br_padded; r += L) {
        V m_tile = splat(kNegInf<T>);
        for (std::int64_t c = 0; c < bc; ++c) m_tile = vmax(m_tile, vload(st + c * br_padded + r));
        const V m_old = vload(ws.m.data() + r);
        const V m_new = round_running_max(rd, vmax(m_old, m_tile));
        // Lanes with no score yet (m_new = -inf) subtract 0 instead, to keep exp(-inf) = 0, not NaN.
        const V m_safe = m_new == kNegInf<T> ? V{} : m_new;
        const V alpha = rd.rescale(vexp(round_exp_arg(rd, m_old - m_safe)));
        V l_new;
        if (rd.exact_running_sum) {
          // The running sum in registers (GPU kernels): the tile's P added straight into it.
          l_new = rd.stats(alpha * vload(ws.l.data() + r));
          for (std::int64_t c = 0; c < bc; ++c) {
            const V p = rd.p(vexp(round_exp_arg(rd, vload(st + c * br_padded + r) - m_safe)));
            vstore(st + c * br_padded + r, p);
            l_new = rd.stats(l_new + p);
          }
        } else {
          // The running sum stored between tiles: the tile's row sum is an op of its own.
          V l_tile{};
          for (std::int64_t c = 0; c < bc; ++c) {
            const V p = rd.p(vexp(round_exp_arg(rd, vload(st + c * br_padded + r) - m_safe)));
            vstore(st + c * br_padded + r, p);
            l_tile = rd.stats(l_tile + p);
          }
          l_new = rd.stats_running(rd.stats_running(alpha * vload(ws.l.data() + r)) + rd.stats_running(l_tile));
        }
        vstore(ws.l.data() + r, l_new);
        vstore(ws.m.data() + r, m_new);
        vstore(ws.alpha.data() + r, alpha);
      }
      if (j0 > 0) {
        for (std::int64_t r = 0; r < br; ++r) {
          const V alpha = splat(ws.alpha[r]);
          T* o_row = ws.o.data() + r * h.d_padded;
          for (std::int64_t t = 0; t < h.d_padded; t += L)
            vstore(o_row + t, rd.o_running(alpha * vload(o_row + t)));
        }
      }
      if (rd.exact_running_o) {
        // The running O in registers (GPU kernels): P.V accumulated straight into it.
        pv_tile(rd, st, br_padded, ws.v.data() + j0 * h.d_padded, h.d_padded, bc, br, ws.o.data(),
              h.d_padded);
      } else {
        // The running O stored between tiles: P.V is a matmul of its own, then added.
        std::fill(ws.pv.begin(), ws.pv.begin() + br * h.d_padded, T(0));
        pv_tile(rd, st, br_padded, ws.v.data() + j0 * h.d_padded, h.d_padded, bc, br, ws.pv.data(),
                h.d_padded);
        for (std::int64_t i = 0; i < br * h.d_padded; i += L)
          vstore(ws.o.data() + i, rd.o_running(vload(ws.o.data() + i) + rd.o_running(vload(ws.pv.data() + i))));
      }
    }
    for (std::int64_t r = 0; r < br; ++r) {
      store_row<StepId::stats_running>(rd, ws.o.data() + r * h.d_padded, h.d, ws.l[r], true, ws.m[r],
                                       o + (i0 + r) * h.d, lse ? lse + i0 + r : nullptr);
    }
  }
}

// ---- flash forward, KV-outer (FlashAttention-1): O re-normalised after every tile --------------
// Per tile and row: m~ = rowmax(S), P~ = p(exp(S - m~)), l~ = rowsum(P~), m_new = max(m, m~),
// alpha = exp(m - m_new), beta = exp(m~ - m_new), l_new = alpha l + beta l~,
// O = (alpha l O + beta P~V) / l_new  (FA-1 Algorithm 1, line 12). m~ and l~ are m_tile and l_tile.
template <class T, class R>
void flash_forward_kv_outer(const R& rd, const Head<T>& h, Workspace<T>& ws, T* o, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::int64_t br_padded_max = round_up(h.br, L);
  ws.st.resize(h.bc * br_padded_max);
  ws.o.assign(h.n * h.d_padded, T(0));
  ws.m.assign(h.n, kNegInf<T>);
  ws.l.assign(h.n, T(0));
  ws.pv.resize(h.br * h.d_padded);
  ws.beta.resize(br_padded_max);     // beta = exp(m~ - m_new)
  ws.alpha_l.resize(br_padded_max);  // alpha l, rounded to stats_running
  ws.l_new.resize(br_padded_max);    // l_new
  ws.m_tile.resize(br_padded_max);   // m~ (-inf: the row sees no key of this tile)
  std::vector<T> m_block(br_padded_max), l_block(br_padded_max);
  for (std::int64_t j0 = 0; j0 < h.n; j0 += h.bc) {
    const std::int64_t bc = std::min(h.bc, h.n - j0);
    for (std::int64_t i0 = 0; i0 < h.n; i0 += h.br) {
      const std::int64_t br = std::min(h.br, h.n - i0), br_padded = round_up(br, L);
      if (h.causal && i0 + br - 1 < j0) continue;  // every row of the block precedes every key
      T* st = ws.st.data();
      score_tile(rd, ws.k.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.qt_stride, bc, br_padded, h.scale, st,
                 br_padded);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(st, br_padded, bc, br_padded, j0, i0);
      std::fill(m_block.begin(), m_block.end(), kNegInf<T>);
      std::fill(l_block.begin(), l_block.end(), T(0));
      std::copy(ws.m.begin() + i0, ws.m.begin() + i0 + br, m_block.begin());
      std::copy(ws.l.begin() + i0, ws.l.begin() + i0 + br, l_block.begin());
      for (std::int64_t r = 0; r < br_padded; r += L) {
        V m_tile = splat(kNegInf<T>);
        for (std::int64_t c = 0; c < bc; ++c) m_tile = vmax(m_tile, vload(st + c * br_padded + r));
        m_tile = round_running_max(rd, m_tile);
        const V m_tile_safe = m_tile == kNegInf<T> ? V{} : m_tile;
        V l_tile{};
        for (std::int64_t c = 0; c < bc; ++c) {
          const V p = rd.p(vexp(round_exp_arg(rd, vload(st + c * br_padded + r) - m_tile_safe)));
          vstore(st + c * br_padded + r, p);
          l_tile = rd.stats(l_tile + p);
        }
        const V m_old = vload(m_block.data() + r), l_old = vload(l_block.data() + r);
        const V m_new = round_running_max(rd, vmax(m_old, m_tile));
        const V m_new_safe = m_new == kNegInf<T> ? V{} : m_new;
        const V alpha = rd.rescale(vexp(round_exp_arg(rd, m_old - m_new_safe)));
        const V beta = rd.rescale(vexp(round_exp_arg(rd, m_tile - m_new_safe)));
        const V alpha_l = rd.stats_running(alpha * l_old);
        const V l_new = rd.stats_running(alpha_l + rd.stats_running(beta * rd.stats_running(l_tile)));
        vstore(ws.beta.data() + r, beta);
        vstore(ws.alpha_l.data() + r, alpha_l);
        vstore(ws.l_new.data() + r, l_new);
        vstore(ws.m_tile.data() + r, m_tile);
        vstore(m_block.data() + r, m_new);
      }
      std::fill(ws.pv.begin(), ws.pv.end(), T(0));
      pv_tile(rd, st, br_padded, ws.v.data() + j0 * h.d_padded, h.d_padded, bc, br, ws.pv.data(), h.d_padded);
      for (std::int64_t r = 0; r < br; ++r) {
        if (ws.m_tile[r] == kNegInf<T>) continue;  // the row sees no key of this tile: nothing to update
        const V alpha_l = splat(ws.alpha_l[r]), beta = splat(ws.beta[r]), l_new = splat(ws.l_new[r]);
        T* o_row = ws.o.data() + (i0 + r) * h.d_padded;
        const T* pv_row = ws.pv.data() + r * h.d_padded;
        for (std::int64_t t = 0; t < h.d_padded; t += L) {
          const V num = rd.o_running(rd.o_running(alpha_l * vload(o_row + t)) +
                                     rd.o_running(beta * rd.o_running(vload(pv_row + t))));
          vstore(o_row + t, rd.o_running(rd.division(num / l_new)));
        }
        ws.m[i0 + r] = m_block[r];
        ws.l[i0 + r] = ws.l_new[r];
      }
    }
  }
  for (std::int64_t i = 0; i < h.n; ++i) {
    store_row<StepId::stats_running>(rd, ws.o.data() + i * h.d_padded, h.d, ws.l[i], false, ws.m[i],
                                     o + i * h.d, lse ? lse + i : nullptr);
  }
}

// ---- baseline forward: S materialised [N, N], softmax (P normalised, rounded to p), then P.V -----
template <class T, class R>
void baseline_forward(const R& rd, const Head<T>& h, Workspace<T>& ws, T* o, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::int64_t n_padded = round_up(h.n, L);
  ws.st.resize(h.n * n_padded);
  T* st = ws.st.data();  // St[j][i]: S transposed, so each softmax row is a lane across j
  score_tile(rd, ws.k.data(), h.d, ws.qt.data(), h.qt_stride, h.n, n_padded, h.scale, st, n_padded);
  if (h.causal) mask_tile(st, n_padded, h.n, n_padded, std::int64_t(0), std::int64_t(0));
  ws.m.resize(n_padded);
  ws.l.resize(n_padded);
  for (std::int64_t r = 0; r < n_padded; r += L) {
    V m = splat(kNegInf<T>);
    for (std::int64_t c = 0; c < h.n; ++c) m = vmax(m, vload(st + c * n_padded + r));
    m = round_max(rd, m);
    V l{};
    for (std::int64_t c = 0; c < h.n; ++c) {
      const V x = vload(st + c * n_padded + r) - m;
      const V e = rd.softmax(vexp(keep_neg_inf(x, rd.softmax(x))));
      vstore(st + c * n_padded + r, e);
      l = rd.stats(l + e);
    }
    for (std::int64_t c = 0; c < h.n; ++c)
      vstore(st + c * n_padded + r, rd.p(rd.division(vload(st + c * n_padded + r) / l)));
    vstore(ws.m.data() + r, m);
    vstore(ws.l.data() + r, l);
  }
  ws.o.assign(h.n * h.d_padded, T(0));
  pv_tile(rd, st, n_padded, ws.v.data(), h.d_padded, h.n, h.n, ws.o.data(), h.d_padded);
  for (std::int64_t i = 0; i < h.n; ++i) {
    store_row<StepId::stats>(rd, ws.o.data() + i * h.d_padded, h.d, ws.l[i], false, ws.m[i], o + i * h.d,
                             lse ? lse + i : nullptr);
  }
}

}  // namespace
}  // namespace fastudy
