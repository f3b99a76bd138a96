// The host twin of the CUDA attention kernels: the same tile math (kernels/cuda/tile_math.hpp), the
// same tiles and the same per-row order, run sequentially on the CPU in float. It exists so that the
// numerics of the GPU path are tested on machines without a GPU (tests/gpu), and it is the reference
// the GPU tests compare the device results with. Compiled by the host compiler, free of CUDA headers.
//
// B batch, H heads, N sequence, d head dim; tensors are contiguous row-major [B, H, N, d] in float
// (values are rounded to the policy's storage format on entry), lse is [B, H, N].
#pragma once

#include "kernels/attention.hpp"

namespace fastudy::cuda_tile {

// Baseline or flash (params.attention, params.order or the policy's kernel, block sizes) in a policy of
// the readings the tiles run (those kReadings marks .cuda, of fp32/fp16/bf16);
// throws UsageError for other policies. lse may be null.
AttentionStats attention_forward_host(const AttentionShape& shape, const AttentionParams& params, const float* q,
                                      const float* k, const float* v, float* o, float* lse);
// Flash recomputes P from lse (which must come from a flash forward in the same policy); baseline
// recomputes the softmax from q and k (o and lse unused).
void attention_backward_host(const AttentionShape& shape, const AttentionParams& params, const float* q,
                             const float* k, const float* v, const float* o, const float* lse, const float* dout,
                             float* dq, float* dk, float* dv);

}  // namespace fastudy::cuda_tile
