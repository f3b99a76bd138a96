// Resource estimates of a variant (see estimate.hpp): shared by plan, slurm and preflight.
#include "jobs/estimate.hpp"

#include <cstdio>

#include "src/io/checkpoint.hpp"

namespace fastudy {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

std::vector<std::pair<std::string, std::int64_t>> model_tensor_sizes(const ModelConfig& m) {
  const std::int64_t D = m.d_model, F = static_cast<std::int64_t>(m.mlp_ratio) * m.d_model;
  std::vector<std::pair<std::string, std::int64_t>> t{{"tok_emb.weight", m.vocab * D}, {"pos_emb.weight", m.seq_len * D}};
  for (int i = 0; i < m.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    t.insert(t.end(), {{b + "ln1.weight", D},          {b + "ln1.bias", D},
                       {b + "attn.qkv.weight", 3 * D * D}, {b + "attn.qkv.bias", 3 * D},
                       {b + "attn.proj.weight", D * D},    {b + "attn.proj.bias", D},
                       {b + "ln2.weight", D},              {b + "ln2.bias", D},
                       {b + "mlp.fc.weight", F * D},       {b + "mlp.fc.bias", F},
                       {b + "mlp.proj.weight", D * F},     {b + "mlp.proj.bias", D}});
  }
  t.insert(t.end(), {{"ln_f.weight", D}, {"ln_f.bias", D}, {"lm_head.weight", m.vocab * D}});
  return t;
}

std::int64_t parameter_count(const ModelConfig& m) {
  std::int64_t n = 0;
  for (const auto& [name, size] : model_tensor_sizes(m)) n += size;
  return n;
}

std::string variant_kind(const Variant& v) {
  std::string kind;
  for (const auto& [axis, value] : v.axes) {
    const GridAxisInfo* info = find_grid_axis(axis);
    if (info && info->replicate) continue;
    kind += (kind.empty() ? "" : " ") + axis + "=" + value;
  }
  return kind.empty() ? "every variant" : kind;
}

std::int64_t checkpoint_count(const TrainConfig& t) {
  return static_cast<std::int64_t>(checkpoint_schedule(t.checkpoint_every, t.steps).size());
}

VariantEstimate estimate_variant(const Variant& v) {
  VariantEstimate e;
  e.params = parameter_count(v.model);
  const double elt = v.precision == Format::fp64 ? 8.0 : 4.0;  // master weights: fp64 or fp32
  e.checkpoint_bytes = 3.0 * elt * static_cast<double>(e.params);  // weights + two AdamW moments
  e.checkpoints = checkpoint_count(v.train);
  const int ranks = v.train.ranks_per_variant;
  // Activations are kept for one micro-batch at a time: a shard of the global batch (dp_width shards,
  // or one per rank when dp_width is unset) over grad_accum.
  const int width = v.train.dp_width > 0 ? v.train.dp_width : ranks;
  const double local_batch = static_cast<double>(v.train.batch) / width / v.train.grad_accum;
  // Weights, gradients, two moments and rounded weights (parameter_copies), plus the activations kept
  // for backward (activation_values_per_token).
  const double act = local_batch * v.model.seq_len * activation_values_per_token(v.model, v.numerics);
  e.memory_per_rank = parameter_copies(v.numerics) * elt * static_cast<double>(e.params) + elt * act;
  e.matmul_work = matmul_work_factor(v.numerics);
  // dp_width: this rank's dp_width / ranks flat shard gradients, and all dp_width of them once gathered.
  if (v.train.dp_width > 0)
    e.memory_per_rank += elt * static_cast<double>(e.params) * (width / ranks + (ranks > 1 ? width : 0));
  return e;
}

}  // namespace fastudy
