// The tensor-core attention kernels (kernels/cuda/mma_attention.hpp) run on the CPU: every thread block
// of the grid simulated by tests/gpu/warp_sim.hpp, on the operands prepared as the device's prepare
// kernel prepares them (mma_attention.hpp prepared_bits) and D from row_delta, as the device's delta
// kernel computes it. The same code and the same data movement as on the GPU, the MMA model for the
// products: its outputs must equal the host twin's (kernels/cuda/tile_reference.hpp) bit for bit.
//
// B batch, H heads, N sequence, d head dim; float tensors [B, H, N, d] row-major, lse [B, H, N].
#pragma once

#include "kernels/attention.hpp"

namespace fastudy::gpu_test {

// Whether the tensor-core kernels run this call (the flash kind of a reading with tensor-core products,
// a shape mma_supported takes).
bool mma_runs(const AttentionShape& shape, const AttentionParams& params);

// The forward and backward of the tensor-core kernels, simulated; throws std::logic_error where
// mma_runs is false. lse may be null (forward).
void mma_forward_sim(const AttentionShape& shape, const AttentionParams& params, const float* q, const float* k,
                     const float* v, float* o, float* lse);
void mma_backward_sim(const AttentionShape& shape, const AttentionParams& params, const float* q, const float* k,
                      const float* v, const float* o, const float* lse, const float* dout, float* dq, float* dk,
                      float* dv);

}  // namespace fastudy::gpu_test
