// The entry points of the tensor-core attention kernels (kernels/cuda/mma_attention.hpp) for the host
// code of attention_cuda.cu: operands prepared (rounded to the storage format, Q scaled for `before`),
// D and lse * log2 e for the backward, then the kernels, all asynchronous on `stream`. Explicitly
// instantiated for the six rounding objects of the tensor-core readings (fa2/fa3, mixed, eager at fp16
// and bf16) in mma_attention_{forward,backward}_{fp16,bf16}.cu. Host code; needs the CUDA runtime headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/mma_attention.hpp"

namespace fastudy::cuda_mma {

// The operands of one call. `storage`: the tensors' element type (fp32 floats, or the policy's fp16/bf16
// bits); `prepared`, when set, holds room for the operands the kernels read (elements of 16 bits, 3 N d
// per head forward and 5 backward) and every input is rounded into it; null: the inputs are read as they
// are (fp16/bf16 tensors and no `before` scale).
struct MmaForwardCall {
  TileHead h;
  LoopOrder order;
  std::int64_t heads;
  Format storage;
  const void *q, *k, *v;
  void* o;
  float* lse;
  std::uint16_t* prepared;
};

struct MmaBackwardCall {
  TileHead h;
  std::int64_t heads;
  Format storage;
  const void *q, *k, *v, *o, *dout;
  const float* lse;
  void *dq, *dk, *dv;
  std::uint16_t* prepared;
  float* dd;    // heads N floats: D
  float* lse2;  // heads N floats: fa2/fa3's lse * log2 e (unused by the framework loops)
};

template <class R>
void mma_forward(const MmaForwardCall& call, cudaStream_t stream);
template <class R>
void mma_backward(const MmaBackwardCall& call, cudaStream_t stream);

// The rounding objects of the tensor-core readings (cuda_tile::dispatch_tile_rounding's): fa2/fa3
// (S in fp32), mixed (state in fp32), eager (state in the format).
template <Format S>
using KernelReading = cuda_tile::TileRounding<S, Format::fp32, Format::fp32, Format::fp32>;
template <Format S>
using MixedReading = cuda_tile::TileRounding<S, Format::fp32, Format::fp32>;
template <Format S>
using EagerReading = cuda_tile::TileRounding<S, Format::fp32, S>;
#define FASTUDY_MMA_ROUNDINGS(X, S) X(KernelReading<S>) X(MixedReading<S>) X(EagerReading<S>)
#define FASTUDY_MMA_EXTERN(R)                                                            \
  extern template void mma_forward<R>(const MmaForwardCall&, cudaStream_t);             \
  extern template void mma_backward<R>(const MmaBackwardCall&, cudaStream_t);
FASTUDY_MMA_ROUNDINGS(FASTUDY_MMA_EXTERN, Format::fp16)
FASTUDY_MMA_ROUNDINGS(FASTUDY_MMA_EXTERN, Format::bf16)
#undef FASTUDY_MMA_EXTERN

}  // namespace fastudy::cuda_mma
