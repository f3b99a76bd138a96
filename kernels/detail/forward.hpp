// The forward kernels of one head: flash_forward_q_outer (FlashAttention-2 written as framework ops),
// flash_forward_kv_outer (FlashAttention-1, Algorithm 1, likewise), flash_forward_kernel (the
// FlashAttention-2 CUDA kernel and the FlashAttention-3 Hopper kernel) and baseline_forward (S
// materialised). Each follows the op decomposition written out in kernels/detail/attention_impl.hpp.
#pragma once

#include "kernels/detail/exp.hpp"
#include "kernels/detail/head.hpp"
#include "kernels/detail/rounding.hpp"
#include "kernels/detail/tiles.hpp"

namespace fastudy {
namespace {

// The max m of rows r..r+L-1 of a tile S^T [cols][ld] after max_offset (offset_tile_max, head.hpp):
// m itself when the policy has none, so that the kernels pay one untaken branch per row vector and
// tile. `tolerance` is the tie test's 1e-3 in the units of the tile's scores.
template <class T>
FASTUDY_INLINE vec_t<T> tile_max_offset(const Head<T>& h, const T* st, std::int64_t ld, std::int64_t cols,
                                        std::int64_t r, vec_t<T> m, T tolerance) {
  if (h.max_offset == T(0)) return m;
  return offset_tile_max(m, cols, splat(h.max_offset), splat(tolerance), splat(kNegInf<T>),
                         [&](std::int64_t c) { return vload(st + c * ld + r); });
}

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
      placed_score_tile(h.placement, rd, ws.k.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.qt_stride, bc, br_padded,
                        h.scale, st, br_padded);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(st, br_padded, bc, br_padded, j0, i0);
      for (std::int64_t r = 0; r < br_padded; r += L) {
        V m_tile = splat(kNegInf<T>);
        for (std::int64_t c = 0; c < bc; ++c) m_tile = vmax(m_tile, vload(st + c * br_padded + r));
        // max_offset: block_max adjusted before new_max = maximum(block_max, running_max) (attention.py).
        m_tile = tile_max_offset(h, st, br_padded, bc, r, m_tile, h.tie_tolerance);
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
        op_pv_tile<StepId::o_running>(h.gemm_in_format, rd, st, br_padded, ws.v.data() + j0 * h.d_padded, h.d_padded,
                                      bc, br, ws.pv.data(), h.d_padded);
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
      placed_score_tile(h.placement, rd, ws.k.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.qt_stride, bc, br_padded,
                        h.scale, st, br_padded);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(st, br_padded, bc, br_padded, j0, i0);
      std::fill(m_block.begin(), m_block.end(), kNegInf<T>);
      std::fill(l_block.begin(), l_block.end(), T(0));
      std::copy(ws.m.begin() + i0, ws.m.begin() + i0 + br, m_block.begin());
      std::copy(ws.l.begin() + i0, ws.l.begin() + i0 + br, l_block.begin());
      for (std::int64_t r = 0; r < br_padded; r += L) {
        V m_tile = splat(kNegInf<T>);
        for (std::int64_t c = 0; c < bc; ++c) m_tile = vmax(m_tile, vload(st + c * br_padded + r));
        // max_offset: the tile's m~ adjusted (attention.py's block_max), then P~ = exp(S - m~) with it.
        m_tile = round_running_max(rd, tile_max_offset(h, st, br_padded, bc, r, m_tile, h.tie_tolerance));
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
      op_pv_tile<StepId::o_running>(h.gemm_in_format, rd, st, br_padded, ws.v.data() + j0 * h.d_padded, h.d_padded, bc,
                                    br, ws.pv.data(), h.d_padded);
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

// ---- flash forward, the FlashAttention kernels (FlashKernel::fa2 and fa3) ------------------------
// fa2: csrc/flash_attn/src/flash_fwd_kernel.h compute_attn_1rowblock with softmax.h's Softmax;
// fa3: hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp mma() with hopper/softmax.h. One Q block of Br rows
// is one thread block (its rows are the lanes here); per KV block, from the last to the first
// ("We iterate over the blocks in reverse order", flash_fwd_kernel.h; n_block = n_block_max - 1 down
// to n_block_min, mainloop_fwd_sm90):
//   S = s(Q K_j^T)            acc_s: the MMA's fp32 accumulator, unscaled, never rounded (s = fp32)
//   fa3 FP8 block quantization: S = S * (c_q c_k) (the tile's factors; per head they are folded into
//                             scale_log2 instead, flash_fwd_kernel_sm90.h: softmax_scale_log2 *=
//                             q_descale * k_descale)
//   m = max(m_prev, rowmax S) reduce_max (exact; the quad all-reduce of the max is exact too)
//   alpha = exp2f((m_prev - m) * scale_log2)          softmax_rescale_o / max_get_scale (not the
//                             first block; Check_inf: m = -inf counts as 0)
//   lane sums l_q *= alpha    row_sum(mi) *= scores_scale: per MMA lane q = 0..3 of the quad, which
//                             holds columns 8v + 2q and 8v + 2q + 1 of the tile
//   P = exp2f(S * scale_log2 - m * scale_log2)        scale_apply_exp2: one FMA, m * scale_log2
//                             rounded first (fa3 FP8: minus Max_offset 8, P in [0, 256])
//   l_q += P                  reduce_sum of the unrounded fp32 P, no all-reduce yet
//   O = alpha O               acc_o_rowcol *= scores_scale (rescale_o)
//   O += p(P) V_j             convert_type<Element>(acc_s), then the P.V MMA accumulating in fp32
//                             (fa3 FP8 block quantization: the tile's product, times c_v, added)
// end (normalize_softmax_lse / finalize): l = (l_0 + l_2) + (l_1 + l_3) (Allreduce<4>: shfl_xor 2,
// then 1), inv = 1 / l (fa2: 1 when l is 0 or NaN; fa3: 0, times c_v per head),
// O = o(O * inv) (convert_type of acc_o), lse = fa2: m * scale + log(l); fa3: m * (scale_log2 * ln 2)
// + log(l * 2^-Max_offset) (fa2: +inf, fa3: -inf when l is 0 or NaN). The exps are vexp2 (exp.hpp).
inline constexpr int kMmaQuad = 4;  // the lanes of an MMA row quad, each with its own partial row sum

template <FlashKernel K, class T, class R>
void flash_forward_kernel(const R& rd, const Head<T>& h, Workspace<T>& ws, T* o, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::int64_t br_padded_max = round_up(h.br, L);
  ws.st.resize(h.bc * br_padded_max);
  ws.o.resize(h.br * h.d_padded);
  ws.m.resize(br_padded_max);
  ws.l.resize(kMmaQuad * br_padded_max);
  ws.alpha.resize(br_padded_max);
  ws.pv.resize(h.br * h.d_padded);
  // flash_api.cpp / mainloop_fwd_sm90: scale_softmax_log2 = float(softmax_scale * M_LOG2E), in double.
  T scale_log2 = static_cast<T>(static_cast<double>(h.scale) * 1.44269504088896340736);
  const bool fp8_p = rd.template format_of<StepId::p>() == Format::fp8_e4m3 ||
                     rd.template format_of<StepId::p>() == Format::fp8_e5m2;
  const T max_offset = K == FlashKernel::fa3 && fp8_p ? T(8) : T(0);  // hopper/softmax.h Max_offset
  const bool per_head = h.quantization == Quantization::head, per_block = h.quantization == Quantization::block;
  if (per_head) scale_log2 *= ws.q_scale[0] * ws.k_scale[0];
  const T v_scale_head = per_head ? ws.v_scale[0] : T(1);
  // max_offset's tie test: the tile holds S unscaled (times c_q c_k with block quantization), the
  // scaled logit the reference tests is S * scale_log2 / log2 e, so its 1e-3 is 1e-3 log2 e / scale_log2
  // on the tile (per-head quantization's factors are in scale_log2).
  const T tie_raw = static_cast<T>(kRepeatedMaxTolerance * 1.44269504088896340736 / static_cast<double>(scale_log2));
  for (std::int64_t i0 = 0; i0 < h.n; i0 += h.br) {
    const std::int64_t br = std::min(h.br, h.n - i0), br_padded = round_up(br, L);
    std::fill(ws.m.begin(), ws.m.end(), kNegInf<T>);
    std::fill(ws.l.begin(), ws.l.end(), T(0));
    std::fill(ws.o.begin(), ws.o.end(), T(0));
    const std::int64_t j_end = h.causal ? std::min(h.n, i0 + br) : h.n;
    const std::int64_t blocks = (j_end + h.bc - 1) / h.bc;
    for (std::int64_t jb = blocks - 1; jb >= 0; --jb) {
      const std::int64_t j0 = jb * h.bc, bc = std::min(h.bc, h.n - j0);
      const bool first = jb == blocks - 1;
      T* st = ws.st.data();
      score_tile<ScoreStore::raw>(rd, ws.k.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.qt_stride, bc, br_padded,
                                  T(1), st, br_padded);
      if (per_block) {
        const V c = splat(ws.q_scale[i0] * ws.k_scale[j0]);
        for (std::int64_t x = 0; x < bc * br_padded; x += L) vstore(st + x, vload(st + x) * c);
      }
      if (h.causal && j0 + bc - 1 > i0) mask_tile(st, br_padded, bc, br_padded, j0, i0);
      const V sl2 = splat(scale_log2);
      for (std::int64_t r = 0; r < br_padded; r += L) {
        V m_tile = splat(kNegInf<T>);
        for (std::int64_t c = 0; c < bc; ++c) m_tile = vmax(m_tile, vload(st + c * br_padded + r));
        // max_offset on the raw tile (attention.py's block_max): beta m_raw scales to beta m, and the
        // scaled logits' 1e-3 is tie_raw here.
        m_tile = tile_max_offset(h, st, br_padded, bc, r, m_tile, tie_raw);
        const V m_old = vload(ws.m.data() + r);
        const V m_new = round_running_max(rd, vmax(m_old, m_tile));
        const V m_use = m_new == kNegInf<T> ? V{} : m_new;  // Check_inf
        V l[kMmaQuad];
        for (int q = 0; q < kMmaQuad; ++q) l[q] = vload(ws.l.data() + q * br_padded_max + r);
        V alpha = splat(T(1));
        if (!first) {
          alpha = rd.rescale(vexp2(round_exp_arg(rd, (m_old - m_use) * sl2)));
          for (int q = 0; q < kMmaQuad; ++q) l[q] = rd.stats_running(l[q] * alpha);
        }
        // fa3: a row with no key yet subtracts 0, not 0 - Max_offset (hopper/softmax.h Check_inf).
        const V max_scaled = m_new == kNegInf<T> ? V{} : rd.exp_arg(m_use * sl2 - max_offset);
        for (std::int64_t c = 0; c < bc; ++c) {
          const V p = vexp2(round_exp_arg(rd, madd(vload(st + c * br_padded + r), sl2, -max_scaled)));
          vstore(st + c * br_padded + r, rd.p(p));
          const int q = static_cast<int>(c % 8) / 2;
          l[q] = rd.stats(l[q] + p);
        }
        for (int q = 0; q < kMmaQuad; ++q) vstore(ws.l.data() + q * br_padded_max + r, l[q]);
        vstore(ws.m.data() + r, m_new);
        vstore(ws.alpha.data() + r, alpha);
      }
      if (!first) {
        for (std::int64_t r = 0; r < br; ++r) {
          const V alpha = splat(ws.alpha[r]);
          T* o_row = ws.o.data() + r * h.d_padded;
          for (std::int64_t t = 0; t < h.d_padded; t += L) vstore(o_row + t, rd.o_running(alpha * vload(o_row + t)));
        }
      }
      if (per_block) {
        std::fill(ws.pv.begin(), ws.pv.begin() + br * h.d_padded, T(0));
        pv_tile(rd, st, br_padded, ws.v.data() + j0 * h.d_padded, h.d_padded, bc, br, ws.pv.data(), h.d_padded);
        const V cv = splat(ws.v_scale[j0]);
        for (std::int64_t x = 0; x < br * h.d_padded; x += L)
          vstore(ws.o.data() + x, rd.o_running(vload(ws.o.data() + x) + rd.o_running(cv * vload(ws.pv.data() + x))));
      } else {
        pv_tile(rd, st, br_padded, ws.v.data() + j0 * h.d_padded, h.d_padded, bc, br, ws.o.data(), h.d_padded);
      }
    }
    const T lse_scale = K == FlashKernel::fa2 ? h.scale : scale_log2 * static_cast<T>(0.693147180559945309417);
    for (std::int64_t r = 0; r < br; ++r) {
      const T* lr = ws.l.data() + r;
      const std::int64_t s = br_padded_max;
      const T l = rd.stats_running(rd.stats_running(lr[0] + lr[2 * s]) + rd.stats_running(lr[s] + lr[3 * s]));
      const bool empty = l == T(0) || l != l;
      T inv = empty ? (K == FlashKernel::fa2 ? T(1) : T(0)) : rd.division(T(1) / l);
      if (K == FlashKernel::fa3) inv = rd.division(inv * v_scale_head);
      const V inv_vec = splat(inv);
      const T* acc = ws.o.data() + r * h.d_padded;
      T* out = o + (i0 + r) * h.d;
      std::int64_t t = 0;
      for (; t + L <= h.d; t += L) vstore(out + t, rd.o(rd.division(vload(acc + t) * inv_vec)));
      for (; t < h.d; ++t) out[t] = rd.o(rd.division(acc[t] * inv));
      if (!lse) continue;
      const T m = ws.m[r];
      const T sum = l * std::exp2(-max_offset);
      if (empty) lse[i0 + r] = K == FlashKernel::fa2 ? std::numeric_limits<T>::infinity() : kNegInf<T>;
      else lse[i0 + r] = rd.stats_running(madd(m, lse_scale, static_cast<T>(std::log(sum))));
    }
  }
}

// ---- baseline forward: S materialised [N, N], softmax (P normalised, rounded to p), then P.V -----
// The framework baseline: torch.matmul, the scaling (ScalePlacement), torch.softmax and torch.matmul on
// tensors of the format, each op computing in fp32 inside (matmul accumulators, softmax's max, exp,
// sum and division) and rounding its output.
template <class T, class R>
void baseline_forward(const R& rd, const Head<T>& h, Workspace<T>& ws, T* o, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::int64_t n_padded = round_up(h.n, L);
  ws.st.resize(h.n * n_padded);
  T* st = ws.st.data();  // St[j][i]: S transposed, so each softmax row is a lane across j
  placed_score_tile(h.placement, rd, ws.k.data(), h.d, ws.qt.data(), h.qt_stride, h.n, n_padded, h.scale, st, n_padded);
  if (h.causal) mask_tile(st, n_padded, h.n, n_padded, std::int64_t(0), std::int64_t(0));
  ws.m.resize(n_padded);
  ws.l.resize(n_padded);
  for (std::int64_t r = 0; r < n_padded; r += L) {
    V m = splat(kNegInf<T>);
    for (std::int64_t c = 0; c < h.n; ++c) m = vmax(m, vload(st + c * n_padded + r));
    // max_offset with the whole row as the one tile (S holds the scaled logits in every placement).
    m = round_max(rd, tile_max_offset(h, st, n_padded, h.n, r, m, h.tie_tolerance));
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
  op_pv_tile<StepId::o>(h.gemm_in_format, rd, st, n_padded, ws.v.data(), h.d_padded, h.n, h.n, ws.o.data(), h.d_padded);
  for (std::int64_t i = 0; i < h.n; ++i) {
    store_row<StepId::stats>(rd, ws.o.data() + i * h.d_padded, h.d, ws.l[i], false, ws.m[i], o + i * h.d,
                             lse ? lse + i : nullptr);
  }
}

}  // namespace
}  // namespace fastudy
