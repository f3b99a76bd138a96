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
  const std::int64_t brp_max = round_up(h.br, L);
  ws.st.resize(h.bc * brp_max);
  ws.o.resize(h.br * h.dp);
  ws.m.resize(brp_max);
  ws.l.resize(brp_max);
  ws.alpha.resize(brp_max);
  ws.pv.resize(h.br * h.dp);
  for (std::int64_t i0 = 0; i0 < h.n; i0 += h.br) {
    const std::int64_t br = std::min(h.br, h.n - i0), brp = round_up(br, L);
    std::fill(ws.m.begin(), ws.m.end(), kNegInf<T>);
    std::fill(ws.l.begin(), ws.l.end(), T(0));
    std::fill(ws.o.begin(), ws.o.end(), T(0));
    const std::int64_t j_end = h.causal ? std::min(h.n, i0 + br) : h.n;
    for (std::int64_t j0 = 0; j0 < j_end; j0 += h.bc) {
      const std::int64_t bc = std::min(h.bc, h.n - j0);
      T* st = ws.st.data();
      score_tile(rd, ws.k.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.np, bc, brp, h.scale, st, brp);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(st, brp, bc, brp, j0, i0);
      for (std::int64_t r = 0; r < brp; r += L) {
        V mt = splat(kNegInf<T>);
        for (std::int64_t c = 0; c < bc; ++c) mt = vmax(mt, vload(st + c * brp + r));
        const V m_old = vload(ws.m.data() + r);
        const V m_new = round_running_max(rd, vmax(m_old, mt));
        // Lanes with no score yet (m_new = -inf) subtract 0 instead, to keep exp(-inf) = 0, not NaN.
        const V m_safe = m_new == kNegInf<T> ? V{} : m_new;
        const V alpha = rd.rescale(vexp(round_exp_arg(rd, m_old - m_safe)));
        V lsum;
        if (rd.exact_running_sum) {
          // The running sum in registers (GPU kernels): the tile's P added straight into it.
          lsum = rd.stats(alpha * vload(ws.l.data() + r));
          for (std::int64_t c = 0; c < bc; ++c) {
            const V p = rd.p(vexp(round_exp_arg(rd, vload(st + c * brp + r) - m_safe)));
            vstore(st + c * brp + r, p);
            lsum = rd.stats(lsum + p);
          }
        } else {
          // The running sum stored between tiles: the tile's row sum is an op of its own.
          V lt{};
          for (std::int64_t c = 0; c < bc; ++c) {
            const V p = rd.p(vexp(round_exp_arg(rd, vload(st + c * brp + r) - m_safe)));
            vstore(st + c * brp + r, p);
            lt = rd.stats(lt + p);
          }
          lsum = rd.stats_running(rd.stats_running(alpha * vload(ws.l.data() + r)) + rd.stats_running(lt));
        }
        vstore(ws.l.data() + r, lsum);
        vstore(ws.m.data() + r, m_new);
        vstore(ws.alpha.data() + r, alpha);
      }
      if (j0 > 0) {
        for (std::int64_t r = 0; r < br; ++r) {
          const V a = splat(ws.alpha[r]);
          T* orow = ws.o.data() + r * h.dp;
          for (std::int64_t t = 0; t < h.dp; t += L) vstore(orow + t, rd.o_running(a * vload(orow + t)));
        }
      }
      if (rd.exact_running_o) {
        // The running O in registers (GPU kernels): P.V accumulated straight into it.
        pv_tile(rd, st, brp, ws.v.data() + j0 * h.dp, h.dp, bc, br, ws.o.data(), h.dp);
      } else {
        // The running O stored between tiles: P.V is a matmul of its own, then added.
        std::fill(ws.pv.begin(), ws.pv.begin() + br * h.dp, T(0));
        pv_tile(rd, st, brp, ws.v.data() + j0 * h.dp, h.dp, bc, br, ws.pv.data(), h.dp);
        for (std::int64_t i = 0; i < br * h.dp; i += L)
          vstore(ws.o.data() + i, rd.o_running(vload(ws.o.data() + i) + rd.o_running(vload(ws.pv.data() + i))));
      }
    }
    for (std::int64_t r = 0; r < br; ++r) {
      store_row<StepId::stats_running>(rd, ws.o.data() + r * h.dp, h.d, ws.l[r], true, ws.m[r], o + (i0 + r) * h.d,
                                       lse ? lse + i0 + r : nullptr);
    }
  }
}

// ---- flash forward, KV-outer (FlashAttention-1): O re-normalised after every tile --------------
// Per tile and row: m~ = rowmax(S), P~ = p(exp(S - m~)), l~ = rowsum(P~), m_new = max(m, m~),
// a = exp(m - m_new), b = exp(m~ - m_new), l_new = a l + b l~,
// O = (a l O + b P~V) / l_new  (FA-1 Algorithm 1, line 12).
template <class T, class R>
void flash_forward_kv_outer(const R& rd, const Head<T>& h, Workspace<T>& ws, T* o, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::int64_t brp_max = round_up(h.br, L);
  ws.st.resize(h.bc * brp_max);
  ws.o.assign(h.n * h.dp, T(0));
  ws.m.assign(h.n, kNegInf<T>);
  ws.l.assign(h.n, T(0));
  ws.pv.resize(h.br * h.dp);
  ws.b.resize(brp_max);     // b = exp(m~ - m_new)
  ws.al.resize(brp_max);    // a * l, rounded to stats
  ws.lnew.resize(brp_max);  // l_new
  ws.mt.resize(brp_max);    // m~ (-inf: the row sees no key of this tile)
  std::vector<T> m_blk(brp_max), l_blk(brp_max);
  for (std::int64_t j0 = 0; j0 < h.n; j0 += h.bc) {
    const std::int64_t bc = std::min(h.bc, h.n - j0);
    for (std::int64_t i0 = 0; i0 < h.n; i0 += h.br) {
      const std::int64_t br = std::min(h.br, h.n - i0), brp = round_up(br, L);
      if (h.causal && i0 + br - 1 < j0) continue;  // every row of the block precedes every key
      T* st = ws.st.data();
      score_tile(rd, ws.k.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.np, bc, brp, h.scale, st, brp);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(st, brp, bc, brp, j0, i0);
      std::fill(m_blk.begin(), m_blk.end(), kNegInf<T>);
      std::fill(l_blk.begin(), l_blk.end(), T(0));
      std::copy(ws.m.begin() + i0, ws.m.begin() + i0 + br, m_blk.begin());
      std::copy(ws.l.begin() + i0, ws.l.begin() + i0 + br, l_blk.begin());
      for (std::int64_t r = 0; r < brp; r += L) {
        V mt = splat(kNegInf<T>);
        for (std::int64_t c = 0; c < bc; ++c) mt = vmax(mt, vload(st + c * brp + r));
        mt = round_running_max(rd, mt);
        const V mt_safe = mt == kNegInf<T> ? V{} : mt;
        V lt{};
        for (std::int64_t c = 0; c < bc; ++c) {
          const V p = rd.p(vexp(round_exp_arg(rd, vload(st + c * brp + r) - mt_safe)));
          vstore(st + c * brp + r, p);
          lt = rd.stats(lt + p);
        }
        const V m_old = vload(m_blk.data() + r), l_old = vload(l_blk.data() + r);
        const V m_new = round_running_max(rd, vmax(m_old, mt));
        const V m_new_safe = m_new == kNegInf<T> ? V{} : m_new;
        const V a = rd.rescale(vexp(round_exp_arg(rd, m_old - m_new_safe)));
        const V b = rd.rescale(vexp(round_exp_arg(rd, mt - m_new_safe)));
        const V al = rd.stats_running(a * l_old);
        const V l_new = rd.stats_running(al + rd.stats_running(b * rd.stats_running(lt)));
        vstore(ws.b.data() + r, b);
        vstore(ws.al.data() + r, al);
        vstore(ws.lnew.data() + r, l_new);
        vstore(ws.mt.data() + r, mt);
        vstore(m_blk.data() + r, m_new);
      }
      std::fill(ws.pv.begin(), ws.pv.end(), T(0));
      pv_tile(rd, st, brp, ws.v.data() + j0 * h.dp, h.dp, bc, br, ws.pv.data(), h.dp);
      for (std::int64_t r = 0; r < br; ++r) {
        if (ws.mt[r] == kNegInf<T>) continue;  // the row sees no key of this tile: nothing to update
        const V al = splat(ws.al[r]), b = splat(ws.b[r]), ln = splat(ws.lnew[r]);
        T* orow = ws.o.data() + (i0 + r) * h.dp;
        const T* pvrow = ws.pv.data() + r * h.dp;
        for (std::int64_t t = 0; t < h.dp; t += L) {
          const V num =
              rd.o_running(rd.o_running(al * vload(orow + t)) + rd.o_running(b * rd.o_running(vload(pvrow + t))));
          vstore(orow + t, rd.o_running(rd.division(num / ln)));
        }
        ws.m[i0 + r] = m_blk[r];
        ws.l[i0 + r] = ws.lnew[r];
      }
    }
  }
  for (std::int64_t i = 0; i < h.n; ++i) {
    store_row<StepId::stats_running>(rd, ws.o.data() + i * h.dp, h.d, ws.l[i], false, ws.m[i], o + i * h.d,
                                     lse ? lse + i : nullptr);
  }
}

// ---- baseline forward: S materialised [N, N], softmax (P normalised, rounded to p), then P.V -----
template <class T, class R>
void baseline_forward(const R& rd, const Head<T>& h, Workspace<T>& ws, T* o, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::int64_t np = round_up(h.n, L);
  ws.st.resize(h.n * np);
  T* st = ws.st.data();  // St[j][i]: S transposed, so each softmax row is a lane across j
  score_tile(rd, ws.k.data(), h.d, ws.qt.data(), h.np, h.n, np, h.scale, st, np);
  if (h.causal) mask_tile(st, np, h.n, np, std::int64_t(0), std::int64_t(0));
  ws.m.resize(np);
  ws.l.resize(np);
  for (std::int64_t r = 0; r < np; r += L) {
    V m = splat(kNegInf<T>);
    for (std::int64_t c = 0; c < h.n; ++c) m = vmax(m, vload(st + c * np + r));
    m = round_max(rd, m);
    V l{};
    for (std::int64_t c = 0; c < h.n; ++c) {
      const V x = vload(st + c * np + r) - m;
      const V e = rd.softmax(vexp(keep_neg_inf(x, rd.softmax(x))));
      vstore(st + c * np + r, e);
      l = rd.stats(l + e);
    }
    for (std::int64_t c = 0; c < h.n; ++c) vstore(st + c * np + r, rd.p(rd.division(vload(st + c * np + r) / l)));
    vstore(ws.m.data() + r, m);
    vstore(ws.l.data() + r, l);
  }
  ws.o.assign(h.n * h.dp, T(0));
  pv_tile(rd, st, np, ws.v.data(), h.dp, h.n, h.n, ws.o.data(), h.dp);
  for (std::int64_t i = 0; i < h.n; ++i) {
    store_row<StepId::stats>(rd, ws.o.data() + i * h.dp, h.d, ws.l[i], false, ws.m[i], o + i * h.d,
                             lse ? lse + i : nullptr);
  }
}

}  // namespace
}  // namespace fastudy
