// The tensor-core kernels on the CPU (see mma_sim.hpp): prepare, delta, and every block simulated.
#include "tests/gpu/mma_sim.hpp"

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/cuda/mma_attention.hpp"
#include "kernels/cuda/tile_dispatch.hpp"
#include "tests/gpu/warp_sim.hpp"

namespace fastudy::gpu_test {
namespace {

using cuda_mma::HostWarp;
using cuda_tile::TileHead;

template <class R>
std::vector<std::uint16_t> prepare(const float* x, std::int64_t n, float scale) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[i] = cuda_mma::prepared_bits<R::kStorage>(x[i], scale);
  return out;
}

// The kernels sized as the launchers size them (mma_launch.cuh).
template <class R, class F>
void with_traits(const TileHead& h, F&& f) {
  if (cuda_mma::mma_d_max(h.d) == 64) f(cuda_mma::MmaTraits<64, 128>{});
  else f(cuda_mma::MmaTraits<128, 64>{});
}

template <class F>
void with_rounding(const AttentionParams& params, F&& f) {
  cuda_tile::dispatch_tile_rounding(params.policy, [&](auto rd) {
    using R = decltype(rd);
    if constexpr (R::kMma) f(rd);
    else throw std::logic_error("mma simulation: the policy has no tensor-core products");
  });
}

template <class R>
float q_scale(const TileHead& h) {
  return cuda_mma::kFramework<R> && h.placement == ScalePlacement::before ? h.scale : 0.0f;
}

}  // namespace

bool mma_runs(const AttentionShape& shape, const AttentionParams& params) {
  if (params.attention != AttentionKind::flash) return false;
  const TileHead h = cuda_tile::make_tile_head(shape, params);
  bool mma = false;
  cuda_tile::dispatch_tile_rounding(params.policy, [&](auto rd) { mma = decltype(rd)::kMma; });
  return mma && cuda_mma::mma_supported(h);
}

void mma_forward_sim(const AttentionShape& shape, const AttentionParams& params, const float* q, const float* k,
                     const float* v, float* o, float* lse) {
  if (!mma_runs(shape, params)) throw std::logic_error("mma_forward_sim: not a tensor-core call");
  const TileHead h = cuda_tile::make_tile_head(shape, params);
  const std::int64_t heads = shape.batch * shape.heads, total = heads * h.n * h.d;
  with_rounding(params, [&](auto rd) {
    using R = decltype(rd);
    const auto qb = prepare<R>(q, total, q_scale<R>(h)), kb = prepare<R>(k, total, 0.0f), vb = prepare<R>(v, total, 0.0f);
    cuda_mma::ForwardArgs a;
    a.h = h;
    a.order = params.order;
    a.q = qb.data();
    a.k = kb.data();
    a.v = vb.data();
    a.o = o;
    a.o_float = true;
    a.lse = lse;
    with_traits<R>(h, [&](auto traits) {
      using T = decltype(traits);
      const std::size_t bytes = cuda_mma::forward_smem_bytes(h.d, h.bc, cuda_mma::kFramework<R>);
      for (std::int64_t head = 0; head < heads; ++head)
        for (std::int64_t bx = 0; bx < (h.n + 63) / 64; ++bx)
          cuda_mma::simulate_block(T::kThreads, bytes, [&](HostWarp& cx, unsigned char* smem) {
            cuda_mma::mma_forward_block<R, T>(cx, a, static_cast<int>(bx), static_cast<int>(head), smem);
          });
    });
  });
}

void mma_backward_sim(const AttentionShape& shape, const AttentionParams& params, const float* q, const float* k,
                      const float* v, const float* o, const float* lse, const float* dout, float* dq, float* dk,
                      float* dv) {
  if (!mma_runs(shape, params)) throw std::logic_error("mma_backward_sim: not a tensor-core call");
  const TileHead h = cuda_tile::make_tile_head(shape, params);
  const std::int64_t heads = shape.batch * shape.heads, total = heads * h.n * h.d, rows = heads * h.n;
  with_rounding(params, [&](auto rd) {
    using R = decltype(rd);
    constexpr Format S = R::kStorage;
    const auto qb = prepare<R>(q, total, q_scale<R>(h)), kb = prepare<R>(k, total, 0.0f), vb = prepare<R>(v, total, 0.0f);
    const auto gb = prepare<R>(dout, total, 0.0f), ob = prepare<R>(o, total, 0.0f);
    std::vector<float> dd(static_cast<std::size_t>(rows)), lse2(static_cast<std::size_t>(rows));
    std::vector<float> g(static_cast<std::size_t>(h.d)), y(static_cast<std::size_t>(h.d));
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int t = 0; t < h.d; ++t) {
        g[t] = cuda_mma::storage_value<S>(gb[r * h.d + t]);
        y[t] = cuda_mma::storage_value<S>(ob[r * h.d + t]);
      }
      cuda_mma::row_delta<R>(h, g.data(), y.data(), lse[r], dd[r], lse2[r]);
    }
    cuda_mma::BackwardArgs a;
    a.h = h;
    a.q = qb.data();
    a.k = kb.data();
    a.v = vb.data();
    a.dout = gb.data();
    a.lse = lse2.data();
    a.dd = dd.data();
    a.dq = dq;
    a.dk = dk;
    a.dv = dv;
    a.grad_float = true;
    with_traits<R>(h, [&](auto traits) {
      using T = decltype(traits);
      const std::size_t dkdv_bytes = cuda_mma::dkdv_smem_bytes(h.d, cuda_mma::kFramework<R> && h.ops);
      const std::size_t dq_bytes = cuda_mma::dq_smem_bytes(h.d);
      for (std::int64_t head = 0; head < heads; ++head)
        for (std::int64_t bx = 0; bx < (h.n + 63) / 64; ++bx) {
          cuda_mma::simulate_block(T::kThreads, dkdv_bytes, [&](HostWarp& cx, unsigned char* smem) {
            cuda_mma::mma_dkdv_block<R, T>(cx, a, static_cast<int>(bx), static_cast<int>(head), smem);
          });
          cuda_mma::simulate_block(T::kThreads, dq_bytes, [&](HostWarp& cx, unsigned char* smem) {
            cuda_mma::mma_dq_block<R, T>(cx, a, static_cast<int>(bx), static_cast<int>(head), smem);
          });
        }
    });
  });
}

}  // namespace fastudy::gpu_test
