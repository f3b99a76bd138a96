// How PyTorch launches its copy of FlashAttention-2 (aten/src/ATen/native/transformers/cuda/flash_attn/)
// for a shape on a Hopper GPU (H100 SXM, H200: sm_90, 132 SMs, 227 KiB of shared memory per block):
// the tiles, the KV split of the forward and the dQ accumulation of the backward, as the `fa2` reading's
// `launch = "pytorch"` runs them (kernels/detail/fa2_pytorch.hpp). Each rule cites its source line.
//
// B batch, H heads, N sequence (N_q = N_k here), d head dim.
#pragma once

#include <cstdint>

#include "kernels/attention.hpp"

namespace fastudy {

// The SMs of an H100 SXM and of an H200 (the GPUs the recorded outputs came from): the default sm_count.
inline constexpr int kHopperSmCount = 132;

// The largest head dim PyTorch's FlashAttention-2 runs ("FlashAttention forward only supports head
// dimension at most 256", flash_api.cpp mha_fwd); it pads d to a multiple of 8 (SDPA) and instantiates
// kernels for d rounded up to 32, 64, 96, 128, 160, 192, 224 or 256 (HEADDIM_SWITCH, static_switch.h).
inline constexpr int kFa2MaxHeadDim = 256;
int fa2_head_dim_instance(std::int64_t head_dim);

// flash_api.cpp num_splits_heuristic: the number of KV splits that brings the waves of thread blocks
// closest to whole (the smallest count within 85% of the best efficiency), 1 once the blocks almost
// fill the SMs (batch_nheads_mblocks >= 0.8 num_sms). Counts that leave the blocks per split unchanged
// are skipped.
int fa2_num_splits_heuristic(std::int64_t batch_nheads_mblocks, int num_sms, int num_n_blocks, int max_splits);

// The forward launch (run_mha_fwd, flash_api.cpp):
//   num_splits  set_params_splitkv: num_splits_heuristic(B H ceil(N/64), 2 sm_count, ceil(N/block_n), 128)
//               with block_n 256 (d <= 64), 128 (d <= 128), 64 ("We multiply number of SMs by 2 to
//               hard-code the fact that we're using 128 threads per block"); num_splits > 1 runs
//               run_mha_fwd_splitkv_dispatch, 64 x block_n tiles, then the combine kernel.
//   block_m x block_n  otherwise run_mha_fwd_hdim<d> (flash_fwd_launch_template.h) for sm_90 (not sm8x):
//               d 32, 64: 128 x 128; 96, 128: 128 x 64; 160: 128 x 32; 192, 224: 128 x 64 (8 warps);
//               256: 64 x 64 (H100: max_smem_per_sm 228 KiB >= 4 * 256 * (64 + 2 * 64)).
//   blocks_per_split  compute_attn_1rowblock_splitkv: ceil(ceil(N / block_n) / num_splits).
struct Fa2ForwardLaunch {
  int block_m = 128, block_n = 128;
  int num_splits = 1;
  int blocks_per_split = 0;  // split path only
  int head_dim_instance = 64;
};
Fa2ForwardLaunch fa2_forward_launch(const AttentionShape& shape, int sm_count);

// The backward launch (run_mha_bwd_hdim<d>, flash_bwd_launch_template.h, for 227 KiB of shared memory per
// block): d 32, 64: 128 x 128; 96, 128: 64 x 128; 160 and above: 64 x 64 (block_m query rows, block_n keys;
// one thread block per KV block, row blocks from the last to the first). dQ is accumulated with atomicAdd;
// with torch.use_deterministic_algorithms(True) (flash_api.cpp mha_bwd: nsplits = ceil(num_sms / (B H)),
// run_flash_bwd_seqk_parallel: gridDimx the same) thread block x handles KV blocks x, x + nsplits, ... in
// that order into dq_accum split x, and convert_dQ sums the splits 0, 1, ... in order: the order the
// reading models (dq_splits below). dot_do_o_threads: kGmemThreadsPerRow = kBlockKSmem / 8 threads per
// row of D = rowsum(dO * O) (kBlockKSmem 64 when the instantiated d is a multiple of 64, else 32).
struct Fa2BackwardLaunch {
  int block_m = 128, block_n = 128;
  int dq_splits = 1;
  int dot_do_o_threads = 8;
  int head_dim_instance = 64;
};
Fa2BackwardLaunch fa2_backward_launch(const AttentionShape& shape, int sm_count);

}  // namespace fastudy
