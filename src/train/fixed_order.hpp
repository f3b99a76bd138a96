// LibTorch ops of the training step whose bits do not depend on the number of threads (internal to
// src/train, its tests and its benchmark; includes LibTorch).
//
// LibTorch's CPU kernels split their work by thread count, and several of them change their result
// with the split: the BLAS GEMM behind mm/addmm (OpenBLAS partitions the output by thread and picks
// kernels by partition shape), LayerNorm's weight and bias gradients (one partial sum per thread,
// added at the end), and elementwise ops whose vectorised and scalar paths round differently (GELU
// tanh: the scalar tail moves with the thread boundaries). The ops here cut the work into pieces
// fixed by the shapes alone, never by the thread count, and run every piece on one thread (inside
// LibTorch's parallel region neither LibTorch nor its BLAS split further); pieces that meet in one
// output are added in piece order. So every thread count gives the bits of one thread:
//   - mm / addmm: output tiles of tile_rows(M) x kTileCols, each one BLAS call over the whole
//     reduction (the bias is the GEMM's C, as torch::addmm does);
//   - column_sums (a bias gradient, sum over rows): tiles of kTileCols columns;
//   - layer_norm (LibTorch's kernel): forward rows as LibTorch computes them (row by row, unchanged);
//     backward on blocks of kLayerNormRows rows, dw and db the blocks' partial sums added in order;
//   - gelu: LibTorch's kernel forward and backward on blocks of kElementBlock elements (a multiple of
//     every vector width, so the scalar path only ever runs on the tensor's own tail).
// Tensors on another device than the CPU go to LibTorch's op whole: a GPU kernel's split does not
// follow a CPU thread count (its own determinism is the device backend's).
// The attention kernels split over heads, each head on one thread (thread-count independent
// already); embedding, cross-entropy, elementwise arithmetic and AdamW are LibTorch's and do not
// depend on the thread count (asserted by tests/train/test_threads.cpp at 1 to 4 threads).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace fastudy::train::fixed {

constexpr std::int64_t kTileCols = 256;

// Rows of an output tile of an M-row product: M/4 rounded up to a multiple of 64, within [64, 256]
// (at least four row tiles where M allows, and tiles large enough for the BLAS to run at speed: on
// one thread the tiles cost 2-12% over one whole call at the trainer's shapes).
std::int64_t tile_rows(std::int64_t M);
constexpr std::int64_t kLayerNormRows = 256;
constexpr std::int64_t kElementBlock = 65536;

// Runs piece(i) for i in [0, pieces) on LibTorch's threads (at::parallel_for, at::get_num_threads()),
// each piece on one thread with LibTorch and BLAS calls inside it single-threaded, without autograd.
// Rethrows the first exception.
void for_each_piece(std::int64_t pieces, const std::function<void(std::int64_t)>& piece);

// a [M, K] times b [K, N] (float or double, any strides), and bias [N] + a b.
at::Tensor mm(const at::Tensor& a, const at::Tensor& b);
at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b);

// Sum over the rows of g [M, N] -> [N].
at::Tensor column_sums(const at::Tensor& g);

// LayerNorm over the last dimension with LibTorch's kernel (eps), differentiable.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps);

// LibTorch's GELU ("none" = erf, or "tanh"), differentiable.
at::Tensor gelu(const at::Tensor& x, const char* approximate);

// The number of threads that touched a piece since the last reset (tests: proof that the pieces
// really ran in parallel).
int threads_seen();
void reset_threads_seen();

}  // namespace fastudy::train::fixed
