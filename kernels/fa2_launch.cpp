// PyTorch's FlashAttention-2 launch for a shape (kernels/fa2_launch.hpp): each rule as the cited source
// line computes it.
#include "kernels/fa2_launch.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.hpp"

namespace fastudy {

std::string_view to_string(Launch l) { return l == Launch::pytorch ? "pytorch" : "blocks"; }

std::optional<Launch> parse_launch(std::string_view name) {
  for (Launch l : kAllLaunches)
    if (to_string(l) == name) return l;
  return std::nullopt;
}

int fa2_head_dim_instance(std::int64_t head_dim) {
  // static_switch.h HEADDIM_SWITCH (PyTorch's copy keeps the 160 and 224 instances).
  for (int instance : {32, 64, 96, 128, 160, 192, 224, 256})
    if (head_dim <= instance) return instance;
  throw Error("FlashAttention-2 as PyTorch launches it runs head dims up to " + std::to_string(kFa2MaxHeadDim) +
                  ", not " + std::to_string(head_dim),
              "use head_dim <= 256, or launch = \"blocks\"");
}

int fa2_num_splits_heuristic(std::int64_t batch_nheads_mblocks, int num_sms, int num_n_blocks, int max_splits) {
  // flash_api.cpp num_splits_heuristic, line by line (its float arithmetic included).
  if (static_cast<float>(batch_nheads_mblocks) >= 0.8f * static_cast<float>(num_sms)) return 1;
  max_splits = std::min({max_splits, num_sms, num_n_blocks});
  float max_efficiency = 0.f;
  std::vector<float> efficiency;
  efficiency.reserve(static_cast<std::size_t>(std::max(max_splits, 0)));
  auto ceildiv = [](int a, int b) { return (a + b - 1) / b; };
  auto is_split_eligible = [&](int num_splits) {
    return num_splits == 1 || ceildiv(num_n_blocks, num_splits) != ceildiv(num_n_blocks, num_splits - 1);
  };
  for (int num_splits = 1; num_splits <= max_splits; ++num_splits) {
    if (!is_split_eligible(num_splits)) {
      efficiency.push_back(0.f);
    } else {
      const float n_waves = static_cast<float>(batch_nheads_mblocks * num_splits) / static_cast<float>(num_sms);
      const float eff = n_waves / std::ceil(n_waves);
      if (eff > max_efficiency) max_efficiency = eff;
      efficiency.push_back(eff);
    }
  }
  for (int num_splits = 1; num_splits <= max_splits; ++num_splits) {
    if (!is_split_eligible(num_splits)) continue;
    if (efficiency[static_cast<std::size_t>(num_splits - 1)] >= 0.85 * max_efficiency) return num_splits;
  }
  return 1;
}

Fa2ForwardLaunch fa2_forward_launch(const AttentionShape& shape, int sm_count) {
  Fa2ForwardLaunch l;
  const int d = fa2_head_dim_instance(shape.head_dim);
  l.head_dim_instance = d;
  const std::int64_t n = shape.seq_len;
  // set_params_splitkv: "This needs to match with run_mha_fwd_splitkv_dispatch".
  const int block_n = d <= 64 ? 256 : (d <= 128 ? 128 : 64);
  const int num_n_blocks = static_cast<int>((n + block_n - 1) / block_n);
  const std::int64_t num_m_blocks = (n + 64 - 1) / 64;
  l.num_splits = fa2_num_splits_heuristic(shape.batch * shape.heads * num_m_blocks, 2 * sm_count, num_n_blocks, 128);
  if (l.num_splits > 1) {
    l.block_m = 64;  // run_mha_fwd_splitkv_dispatch: "kBlockM = 64; Fixed for all head dimensions"
    l.block_n = block_n;
    l.blocks_per_split = (num_n_blocks + l.num_splits - 1) / l.num_splits;
    return l;
  }
  switch (d) {  // run_mha_fwd_hdim<d>, !Is_dropout, not sm8x
    case 32:
    case 64: l.block_m = 128, l.block_n = 128; break;
    case 96:
    case 128: l.block_m = 128, l.block_n = 64; break;
    case 160: l.block_m = 128, l.block_n = 32; break;
    case 192:
    case 224: l.block_m = 128, l.block_n = 64; break;
    default: l.block_m = 64, l.block_n = 64; break;  // 256 on a GPU with 228 KiB of shared memory per SM
  }
  return l;
}

Fa2BackwardLaunch fa2_backward_launch(const AttentionShape& shape, int sm_count) {
  Fa2BackwardLaunch l;
  const int d = fa2_head_dim_instance(shape.head_dim);
  l.head_dim_instance = d;
  if (d <= 64) l.block_m = 128, l.block_n = 128;
  else if (d <= 128) l.block_m = 64, l.block_n = 128;
  else l.block_m = 64, l.block_n = 64;
  const std::int64_t bh = shape.batch * shape.heads;
  l.dq_splits = static_cast<int>((sm_count + bh - 1) / bh);
  l.dot_do_o_threads = (d % 64 == 0 ? 64 : 32) / 8;
  return l;
}

}  // namespace fastudy
