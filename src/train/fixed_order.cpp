// Thread-count-independent LibTorch ops: fixed pieces, one thread each (see fixed_order.hpp).
#include "src/train/fixed_order.hpp"

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "src/train/libtorch.hpp"

namespace fastudy::train::fixed {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

std::atomic<unsigned long long> seen_mask{0};

std::int64_t count(std::int64_t n, std::int64_t block) { return (n + block - 1) / block; }

}  // namespace

void for_each_piece(std::int64_t pieces, const std::function<void(std::int64_t)>& piece) {
  if (pieces <= 0) return;
  // LibTorch's own parallel_for (its OpenMP runtime, whatever LibTorch was built with): inside its
  // region LibTorch's kernels run inline and the BLAS (OpenMP OpenBLAS, or MKL) on one thread. With
  // one piece and several threads, a second, empty iteration still opens the region, so the piece's
  // own calls stay single-threaded; on one thread everything runs inline anyway.
  const std::int64_t iterations = std::max<std::int64_t>(pieces, 2);
  at::parallel_for(0, iterations, 1, [&](std::int64_t begin, std::int64_t end) {
    torch::NoGradGuard no_grad;  // out= calls on autograd inputs (the guard is thread-local)
    seen_mask.fetch_or(1ull << (static_cast<unsigned>(at::get_thread_num()) % 64), std::memory_order_relaxed);
    for (std::int64_t i = begin; i < std::min(end, pieces); ++i) piece(i);
  });
}

std::int64_t tile_rows(std::int64_t M) { return std::clamp<std::int64_t>((count(M, 4) + 63) / 64 * 64, 64, 256); }

torch::Tensor addmm(const torch::Tensor& bias, const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.is_cpu()) return bias.defined() ? at::addmm(bias, a, b) : at::mm(a, b);  // one device GEMM (see header)
  const std::int64_t M = a.size(0), N = b.size(1), tile_m = tile_rows(M);
  torch::Tensor out = torch::empty({M, N}, a.options().requires_grad(false));
  const std::int64_t row_tiles = count(M, tile_m), col_tiles = count(N, kTileCols);
  for_each_piece(row_tiles * col_tiles, [&](std::int64_t t) {
    const std::int64_t r0 = (t / col_tiles) * tile_m, c0 = (t % col_tiles) * kTileCols;
    const std::int64_t rows = std::min(tile_m, M - r0), cols = std::min(kTileCols, N - c0);
    torch::Tensor tile = out.narrow(0, r0, rows).narrow(1, c0, cols);
    const torch::Tensor a_rows = a.narrow(0, r0, rows), b_cols = b.narrow(1, c0, cols);
    if (bias.defined()) {
      at::addmm_out(tile, bias.narrow(0, c0, cols), a_rows, b_cols);
    } else {
      at::mm_out(tile, a_rows, b_cols);
    }
  });
  return out;
}

torch::Tensor mm(const torch::Tensor& a, const torch::Tensor& b) { return fixed::addmm(torch::Tensor(), a, b); }

torch::Tensor column_sums(const torch::Tensor& g) {
  if (!g.is_cpu()) return g.sum(0);
  const std::int64_t N = g.size(1);
  torch::Tensor out = torch::empty({N}, g.options().requires_grad(false));
  for_each_piece(count(N, kTileCols), [&](std::int64_t t) {
    const std::int64_t c0 = t * kTileCols, cols = std::min(kTileCols, N - c0);
    torch::Tensor slice = out.narrow(0, c0, cols);
    at::sum_out(slice, g.narrow(1, c0, cols), {0});
  });
  return out;
}

namespace {

struct LayerNormFn : public torch::autograd::Function<LayerNormFn> {
  // x [R, D] -> [R, D]; LibTorch's forward (each row on its own: thread-count independent).
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) {
    const torch::Tensor xc = x.contiguous();
    auto [y, mean, rstd] = at::native_layer_norm(xc, {xc.size(1)}, w, b, eps);
    ctx->save_for_backward({xc, w, b, mean, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const torch::Tensor& x = s[0];
    const torch::Tensor dy = grads[0].contiguous();
    const std::int64_t R = x.size(0), D = x.size(1), blocks = count(R, kLayerNormRows);
    torch::Tensor dx = torch::empty_like(x);
    std::vector<torch::Tensor> dw(static_cast<std::size_t>(blocks)), db(dw.size());
    for_each_piece(blocks, [&](std::int64_t k) {
      const std::int64_t r0 = k * kLayerNormRows, rows = std::min(kLayerNormRows, R - r0);
      auto [dxk, dwk, dbk] =
          at::native_layer_norm_backward(dy.narrow(0, r0, rows), x.narrow(0, r0, rows), {D}, s[3].narrow(0, r0, rows),
                                         s[4].narrow(0, r0, rows), s[1], s[2], {true, true, true});
      dx.narrow(0, r0, rows).copy_(dxk);
      dw[static_cast<std::size_t>(k)] = dwk;
      db[static_cast<std::size_t>(k)] = dbk;
    });
    for (std::size_t k = 1; k < dw.size(); ++k) {  // the blocks' partial sums, in block order
      dw[0].add_(dw[k]);
      db[0].add_(db[k]);
    }
    return {dx, dw[0], db[0], torch::Tensor()};
  }
};

// Elementwise LibTorch op on blocks of kElementBlock of contiguous tensors.
template <class Op>
torch::Tensor blockwise(const torch::Tensor& like, Op op) {
  torch::Tensor out = torch::empty_like(like, torch::MemoryFormat::Contiguous).requires_grad_(false);
  const std::int64_t n = like.numel();
  for_each_piece(count(n, kElementBlock), [&](std::int64_t k) {
    const std::int64_t e0 = k * kElementBlock, len = std::min(kElementBlock, n - e0);
    torch::Tensor o = out.view({-1}).narrow(0, e0, len);
    op(o, e0, len);
  });
  return out;
}

struct GeluFn : public torch::autograd::Function<GeluFn> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, std::string approximate) {
    const torch::Tensor xc = x.contiguous();
    const torch::Tensor flat = xc.view({-1});
    torch::Tensor y = blockwise(xc, [&](torch::Tensor& o, std::int64_t e0, std::int64_t len) {
      at::gelu_out(o, flat.narrow(0, e0, len), approximate);
    });
    ctx->save_for_backward({xc});
    ctx->saved_data["approximate"] = approximate;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    const torch::Tensor fx = x.view({-1}), fdy = grads[0].contiguous().view({-1});
    torch::Tensor dx = blockwise(x, [&](torch::Tensor& o, std::int64_t e0, std::int64_t len) {
      at::gelu_backward_out(o, fdy.narrow(0, e0, len), fx.narrow(0, e0, len), approximate);
    });
    return {dx, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, double eps) {
  const std::int64_t d = x.size(-1);
  if (!x.is_cpu()) return torch::layer_norm(x, {d}, w, b, eps);
  return LayerNormFn::apply(x.reshape({-1, d}), w, b, eps).view(x.sizes());
}

torch::Tensor gelu(const torch::Tensor& x, const char* approximate) {
  if (!x.is_cpu()) return torch::gelu(x, approximate);
  return GeluFn::apply(x, std::string(approximate));
}

int threads_seen() { return __builtin_popcountll(seen_mask.load()); }
void reset_threads_seen() { seen_mask.store(0); }

}  // namespace fastudy::train::fixed
