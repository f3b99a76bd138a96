// The host twin of the CUDA attention kernels (see tile_reference.hpp): the loops of
// attention_cuda.cu run sequentially over the same tile math. Each device thread's work (one query
// row, one key) is one iteration of an outer loop here, with the same tiles and the same order.
//
// B batch, H heads, N sequence, d head dim, Br/Bc block sizes.
#include "kernels/cuda/tile_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/tile_dispatch.hpp"
#include "kernels/cuda/tile_math.hpp"

namespace fastudy::cuda_tile {
namespace {

template <class R, class Step>
std::vector<float> rounded(const float* x, std::int64_t n, Step step) {
  std::vector<float> r(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) r[i] = step(x[i]);
  return r;
}

// Q rounded as the framework kinds hold it: q(Q), and for the `before` placement q(q(Q) * scale).
template <class R>
std::vector<float> framework_q(const TileHead& h, const float* q) {
  std::vector<float> qr = rounded<R>(q, h.n * h.d, R::q);
  if (h.placement == ScalePlacement::before)
    for (float& x : qr) x = R::q(x * h.scale);
  return qr;
}

template <class R>
void flash_forward_head(const TileHead& h, LoopOrder order, const float* q, const float* k, const float* v,
                        float* o, float* lse) {
  const std::int64_t nd = h.n * h.d;
  const auto qr = framework_q<R>(h, q), kr = rounded<R>(k, nd, R::k), vr = rounded<R>(v, nd, R::v);
  std::vector<float> s(h.bc), orow(h.d);
  const float scale_log2 = scale_log2_of(h.scale);
  for (std::int64_t i0 = 0; i0 < h.n; i0 += h.br) {
    const std::int64_t i_end = std::min<std::int64_t>(h.n, i0 + h.br);
    const std::int64_t j_end = h.causal ? i_end : h.n;
    const std::int64_t blocks = (j_end + h.bc - 1) / h.bc;
    for (std::int64_t i = i0; i < i_end; ++i) {  // one device thread
      std::fill(orow.begin(), orow.end(), 0.0f);
      if (h.kernel != FlashKernel::framework) {
        // fa2 / fa3: KV blocks from the last to the first.
        KernelRowState st{neg_inf(), {0.0f, 0.0f, 0.0f, 0.0f}};
        for (std::int64_t jb = blocks - 1; jb >= 0; --jb) {
          const std::int64_t j0 = jb * h.bc;
          const int bc = static_cast<int>(std::min<std::int64_t>(h.bc, h.n - j0));
          score_row<R>(qr.data() + i * h.d, kr.data() + j0 * h.d, h.d, bc, h.d, h.scale, h.causal, i, j0, s.data(),
                       TileScore::raw);
          flash_kernel_tile<R>(s.data(), bc, vr.data() + j0 * h.d, h.d, h.d, jb == blocks - 1, scale_log2, st,
                               orow.data(), h);
        }
        const float l = flash_kernel_finish<R>(h.kernel, st, h.scale, scale_log2, orow.data(), h.d, o + i * h.d);
        if (lse) lse[i] = l;
        continue;
      }
      RowState st{neg_inf(), 0.0f};
      for (std::int64_t j0 = 0; j0 < j_end; j0 += h.bc) {
        const int bc = static_cast<int>(std::min<std::int64_t>(h.bc, h.n - j0));
        score_row<R>(qr.data() + i * h.d, kr.data() + j0 * h.d, h.d, bc, h.d, h.scale, h.causal, i, j0, s.data(),
                     tile_score_of(h));
        if (order == LoopOrder::q_outer) {
          flash_q_outer_tile<R>(s.data(), bc, vr.data() + j0 * h.d, h.d, h.d, j0 > 0, st, orow.data(), h);
        } else {
          flash_kv_outer_tile<R>(s.data(), bc, vr.data() + j0 * h.d, h.d, h.d, st, orow.data(), h);
        }
      }
      const float l = order == LoopOrder::q_outer ? flash_q_outer_finish<R>(st, orow.data(), h.d, o + i * h.d)
                                                  : flash_kv_outer_finish<R>(st, orow.data(), h.d, o + i * h.d);
      if (lse) lse[i] = l;
    }
  }
}

template <class R>
void baseline_forward_head(const TileHead& h, const float* q, const float* k, const float* v, float* o, float* lse) {
  const std::int64_t nd = h.n * h.d;
  const auto qr = framework_q<R>(h, q), kr = rounded<R>(k, nd, R::k), vr = rounded<R>(v, nd, R::v);
  std::vector<float> s(h.n), acc(h.d);
  const int n = static_cast<int>(h.n);
  for (std::int64_t i = 0; i < h.n; ++i) {
    score_row<R>(qr.data() + i * h.d, kr.data(), h.d, n, h.d, h.scale, h.causal, i, 0, s.data(), tile_score_of(h));
    const float l = baseline_softmax_row<R>(s.data(), h.n, h);
    std::fill(acc.begin(), acc.end(), 0.0f);
    pv_row<R>(s.data(), vr.data(), h.d, n, h.d, acc.data());
    for (int t = 0; t < h.d; ++t) o[i * h.d + t] = R::o(acc[t]);
    if (lse) lse[i] = l;
  }
}

template <class R>
void store_gradients(const TileHead& h, const std::vector<float>& dqa, const std::vector<float>& dka,
                     const std::vector<float>& dva, float* dq, float* dk, float* dv) {
  for (std::int64_t x = 0; x < h.n * h.d; ++x)
    store_gradient_triple<R>(h.grad_placement, h.scale, dqa[x], dka[x], dva[x], dq[x], dk[x], dv[x]);
}

template <class R>
void flash_backward_head(const TileHead& h, const float* q, const float* k, const float* v, const float* o,
                         const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  const std::int64_t nd = h.n * h.d;
  const auto qr = framework_q<R>(h, q), kr = rounded<R>(k, nd, R::k), vr = rounded<R>(v, nd, R::v);
  const auto dor = rounded<R>(dout, nd, R::grad), orr = rounded<R>(o, nd, R::o);
  std::vector<float> dd(h.n), dqa(nd, 0.0f), dka(nd, 0.0f), dva(nd, 0.0f), tk(h.d), tv(h.d);
  for (std::int64_t i = 0; i < h.n; ++i) dd[i] = flash_delta<R>(dor.data() + i * h.d, orr.data() + i * h.d, h.d, h.ops);
  for (std::int64_t j = 0; j < h.n; ++j)  // one device thread of the dK/dV kernel
    flash_dkdv_key<R>(h, qr.data(), kr.data(), vr.data(), dor.data(), lse, dd.data(), j, dka.data() + j * h.d,
                      dva.data() + j * h.d, tk.data(), tv.data());
  for (std::int64_t i = 0; i < h.n; ++i)  // one device thread of the dQ kernel
    flash_dq_row<R>(h, qr.data(), kr.data(), vr.data(), dor.data(), lse, dd.data(), i, dqa.data() + i * h.d, tk.data());
  store_gradients<R>(h, dqa, dka, dva, dq, dk, dv);
}

// fa2 / fa3: D from dot_do_o, P from exp2 of the saved lse, dS from the unrounded P. A key's thread
// (dK, dV) visits the row blocks from the last to the first (fa2) or the first to the last (fa3), the
// rows of a block in order; a row's thread (dQ) adds one part per KV block, each summed from zero
// (kernel_dkdv_key, kernel_dq_row).
template <class R>
void kernel_backward_head(const TileHead& h, const float* q, const float* k, const float* v, const float* o,
                          const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  const std::int64_t nd = h.n * h.d;
  const auto qr = rounded<R>(q, nd, R::q), kr = rounded<R>(k, nd, R::k), vr = rounded<R>(v, nd, R::v);
  const auto dor = rounded<R>(dout, nd, R::grad), orr = rounded<R>(o, nd, R::o);
  std::vector<float> dd(h.n), lse2(h.n), dqa(nd, 0.0f), dka(nd, 0.0f), dva(nd, 0.0f), part(h.d);
  for (std::int64_t i = 0; i < h.n; ++i) {
    dd[i] = R::stats_running(dot_do_o<R>(h.kernel, dor.data() + i * h.d, orr.data() + i * h.d, h.d));
    lse2[i] = kernel_lse_log2<R>(h.kernel, lse[i]);
  }
  for (std::int64_t j = 0; j < h.n; ++j)  // one device thread of the dK/dV kernel
    kernel_dkdv_key<R>(h, qr.data(), kr.data(), vr.data(), dor.data(), lse2.data(), dd.data(), j, dka.data() + j * h.d,
                       dva.data() + j * h.d);
  for (std::int64_t i = 0; i < h.n; ++i)  // one device thread of the dQ kernel
    kernel_dq_row<R>(h, qr.data(), kr.data(), vr.data(), dor.data(), lse2.data(), dd.data(), i, dqa.data() + i * h.d,
                     part.data());
  store_gradients<R>(h, dqa, dka, dva, dq, dk, dv);
}

template <class R>
void baseline_backward_head(const TileHead& h, const float* q, const float* k, const float* v, const float* dout,
                            float* dq, float* dk, float* dv) {
  const std::int64_t nd = h.n * h.d;
  const auto qr = framework_q<R>(h, q), kr = rounded<R>(k, nd, R::k), vr = rounded<R>(v, nd, R::v);
  const auto dor = rounded<R>(dout, nd, R::grad);
  std::vector<float> p(h.n * h.n, 0.0f), ds(h.n * h.n, 0.0f), dqa(nd, 0.0f), dka(nd, 0.0f), dva(nd, 0.0f);
  for (std::int64_t i = 0; i < h.n; ++i) {  // one device thread of the softmax-backward kernel
    const std::int64_t j_end = h.causal ? i + 1 : h.n;
    float* pi = p.data() + i * h.n;
    float* dsi = ds.data() + i * h.n;
    for (std::int64_t j = 0; j < j_end; ++j) {
      pi[j] = dot<R>(qr.data() + i * h.d, kr.data() + j * h.d, 1, h.d);
      dsi[j] = dot<R>(dor.data() + i * h.d, vr.data() + j * h.d, 1, h.d);
    }
    baseline_backward_row<R>(pi, dsi, j_end, h);
  }
  for (std::int64_t j = 0; j < h.n; ++j)  // one device thread of the dK/dV kernel
    baseline_dkdv_key<R>(h, qr.data(), dor.data(), p.data(), ds.data(), j, dka.data() + j * h.d, dva.data() + j * h.d);
  for (std::int64_t i = 0; i < h.n; ++i)  // one device thread of the dQ kernel
    baseline_dq_row<R>(h, kr.data(), ds.data() + i * h.n, i, dqa.data() + i * h.d);
  store_gradients<R>(h, dqa, dka, dva, dq, dk, dv);
}

}  // namespace

AttentionStats attention_forward_host(const AttentionShape& shape, const AttentionParams& params, const float* q,
                                      const float* k, const float* v, float* o, float* lse) {
  const TileHead h = make_tile_head(shape, params);
  const std::int64_t heads = shape.batch * shape.heads, nd = h.n * h.d;
  dispatch_tile_rounding(params.policy, [&](auto rd) {
    using R = decltype(rd);
    for (std::int64_t b = 0; b < heads; ++b) {
      float* lse_b = lse ? lse + b * h.n : nullptr;
      if (params.attention == AttentionKind::baseline) {
        baseline_forward_head<R>(h, q + b * nd, k + b * nd, v + b * nd, o + b * nd, lse_b);
      } else {
        flash_forward_head<R>(h, params.order, q + b * nd, k + b * nd, v + b * nd, o + b * nd, lse_b);
      }
    }
  });
  return tile_stats(shape, params);
}

void attention_backward_host(const AttentionShape& shape, const AttentionParams& params, const float* q,
                             const float* k, const float* v, const float* o, const float* lse, const float* dout,
                             float* dq, float* dk, float* dv) {
  const TileHead h = make_tile_head(shape, params);
  const std::int64_t heads = shape.batch * shape.heads, nd = h.n * h.d;
  dispatch_tile_rounding(params.policy, [&](auto rd) {
    using R = decltype(rd);
    for (std::int64_t b = 0; b < heads; ++b) {
      if (params.attention == AttentionKind::baseline) {
        baseline_backward_head<R>(h, q + b * nd, k + b * nd, v + b * nd, dout + b * nd, dq + b * nd, dk + b * nd,
                                  dv + b * nd);
      } else if (h.kernel != FlashKernel::framework) {
        kernel_backward_head<R>(h, q + b * nd, k + b * nd, v + b * nd, o + b * nd, lse + b * h.n, dout + b * nd,
                                dq + b * nd, dk + b * nd, dv + b * nd);
      } else {
        flash_backward_head<R>(h, q + b * nd, k + b * nd, v + b * nd, o + b * nd, lse + b * h.n, dout + b * nd,
                               dq + b * nd, dk + b * nd, dv + b * nd);
      }
    }
  });
}

}  // namespace fastudy::cuda_tile
