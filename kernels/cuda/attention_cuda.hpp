// CUDA attention kernels: baseline (S materialised, softmax, P.V) and flash (tiled online softmax,
// FA-2 q_outer and FA-1 kv_outer loop orders), forward and backward (flash recomputes P from lse),
// and the FlashAttention-2/-3 kernels' arithmetic (the fa2, fa3 readings), with storage fp32, fp16
// (__half) or bf16 (__nv_bfloat16) and the readings kReadings marks .cuda (cuda_reading_names()).
// The per-tile arithmetic is kernels/cuda/tile_math.hpp, shared with the host twin
// (kernels/cuda/tile_reference.hpp) that tests/gpu checks on the CPU. Torch-free.
//
// B batch, H heads, N sequence, d head dim. Every tensor is a contiguous row-major [B, H, N, d] device
// array of the storage type; lse is a [B, H, N] float device array.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/attention.hpp"

namespace fastudy::cuda {

// Number of visible CUDA devices; 0 when there is none or no driver (why, if given, gets
// cudaGetErrorString of the failure, or "no CUDA device" when the count is 0).
int device_count(std::string* why = nullptr);
bool device_available(std::string* why = nullptr);

// The shared memory (bytes) the flash forward needs for tiles of br query rows and bc keys (both
// already clipped to N) at head dim d on the current device; UsageError when it exceeds the device's
// opt-in limit or br exceeds 1024 threads (the launch checks the same, so callers may check first).
std::size_t check_flash_tiles(std::int64_t br, std::int64_t bc, std::int64_t d);

// storage: the element type of q, k, v, o (fp32 -> float, fp16 -> __half, bf16 -> __nv_bfloat16).
// params.policy must be a policy the tiles run (cuda_tile::tile_storage_format: a reading kReadings marks
// .cuda, of fp32/fp16/bf16);
// with fp16/bf16 storage it must be that format's policy, with fp32 storage any of them (values are
// rounded on load). B*H at most 65535, d at most 1024. lse may be null. params.threads is ignored.
// The flash kind of the readings whose products are tensor-core products (eager, mixed, fa2, fa3 at
// fp16/bf16) runs on the tensor cores where the shape allows (kernels/cuda/mma_attention.hpp: d a
// multiple of 16 up to 128, block sizes multiples of 16, block_kv up to 128), the rest on the per-row
// kernels; both compute the same values (the twin's, kernels/cuda/tile_math.hpp).
// workspace: device memory of at least attention_workspace_bytes() for the call, which then allocates
// nothing, never synchronises and runs asynchronously on `stream` (a CUDA graph can capture it); null:
// the call allocates its workspace and waits for the stream before freeing it.
AttentionStats attention_forward_cuda(const AttentionShape& shape, const AttentionParams& params, Format storage,
                                      const void* q, const void* k, const void* v, void* o, float* lse,
                                      cudaStream_t stream = nullptr, void* workspace = nullptr);
// Flash needs o and lse of the flash forward in the same policy; baseline ignores them.
void attention_backward_cuda(const AttentionShape& shape, const AttentionParams& params, Format storage,
                             const void* q, const void* k, const void* v, const void* o, const float* lse,
                             const void* dout, void* dq, void* dk, void* dv, cudaStream_t stream = nullptr,
                             void* workspace = nullptr);

// The workspace bytes of one forward (backward = false) or backward call; throws UsageError for what the
// calls refuse (shape, storage, policy).
std::size_t attention_workspace_bytes(const AttentionShape& shape, const AttentionParams& params, Format storage,
                                      bool backward);

// Which kernels a call runs: "tensor cores" or "CUDA cores" (for the benchmarks' labels).
const char* attention_cuda_path(const AttentionShape& shape, const AttentionParams& params);

}  // namespace fastudy::cuda
