// The model's parameters: their names and shapes in module-path order (Gpt's constructor) and their
// initial values from the init seed (Gpt::init, one branch per InitScheme). See model.hpp.
// Shapes: D = d_model, F = mlp_ratio * D, V vocab.
#include "src/train/model.hpp"

#include <algorithm>
#include <cmath>

#include "base/error.hpp"
#include "base/hash.hpp"
#include "src/train/libtorch.hpp"
#include "src/train/rng.hpp"

namespace fastudy::train {

Gpt::Gpt(const ModelConfig& c, torch::Dtype dtype, torch::Device device) : config_(c) {
  if (c.vocab < 2 || c.d_model < 1 || c.heads < 1 || c.layers < 1 || c.seq_len < 1 || c.mlp_ratio < 1 ||
      c.d_model % c.heads != 0) {
    throw Error("[model] vocab = " + std::to_string(c.vocab) + ", d_model = " + std::to_string(c.d_model) +
                    ", heads = " + std::to_string(c.heads) + ", layers = " + std::to_string(c.layers) +
                    ", seq_len = " + std::to_string(c.seq_len) + ", mlp_ratio = " + std::to_string(c.mlp_ratio) +
                    " does not describe a model",
                "all sizes must be positive and d_model a multiple of heads");
  }
  const std::int64_t D = c.d_model, F = static_cast<std::int64_t>(c.mlp_ratio) * D;
  const auto opts = torch::TensorOptions().dtype(dtype).device(device);
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
    params_.emplace_back(name, torch::zeros(shape, opts).set_requires_grad(true));
  };
  add("tok_emb.weight", {c.vocab, D});
  add("pos_emb.weight", {c.seq_len, D});
  for (int i = 0; i < c.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    add(b + "ln1.weight", {D});
    add(b + "ln1.bias", {D});
    add(b + "attn.qkv.weight", {3 * D, D});
    add(b + "attn.qkv.bias", {3 * D});
    add(b + "attn.proj.weight", {D, D});
    add(b + "attn.proj.bias", {D});
    add(b + "ln2.weight", {D});
    add(b + "ln2.bias", {D});
    add(b + "mlp.fc.weight", {F, D});
    add(b + "mlp.fc.bias", {F});
    add(b + "mlp.proj.weight", {D, F});
    add(b + "mlp.proj.bias", {D});
  }
  add("ln_f.weight", {D});
  add("ln_f.bias", {D});
  add("lm_head.weight", {c.vocab, D});
}

void Gpt::init(InitScheme scheme, std::uint64_t seed) {
  const double residual_scale = 1.0 / std::sqrt(2.0 * config_.layers);
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : params_) {
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    const std::int64_t n = tensor.numel();
    std::vector<float> values(static_cast<std::size_t>(n), 0.0f);
    Rng rng(seed, fnv1a64(name));
    const bool embedding = name == "tok_emb.weight" || name == "pos_emb.weight";
    if (ends_with(".bias")) {
      // zeros
    } else if (name.rfind("ln_f.", 0) == 0 || name.find(".ln") != std::string::npos) {
      std::fill(values.begin(), values.end(), 1.0f);  // LayerNorm gain
    } else if (embedding || scheme == InitScheme::normal || scheme == InitScheme::scaled) {
      double stddev = 0.02;
      if (scheme == InitScheme::scaled && (ends_with("attn.proj.weight") || ends_with("mlp.proj.weight"))) {
        stddev *= residual_scale;
      }
      for (auto& x : values) x = static_cast<float>(stddev * rng.normal());
    } else {
      const double fan_out = static_cast<double>(tensor.size(0)), fan_in = static_cast<double>(tensor.size(1));
      if (scheme == InitScheme::xavier_uniform) {
        const double a = std::sqrt(6.0 / (fan_in + fan_out));
        for (auto& x : values) x = static_cast<float>(a * (2.0 * rng.uniform() - 1.0));
      } else {  // kaiming_normal: fan_in mode, ReLU gain sqrt(2) (torch's default)
        const double stddev = std::sqrt(2.0 / fan_in);
        for (auto& x : values) x = static_cast<float>(stddev * rng.normal());
      }
    }
    tensor.copy_(torch::from_blob(values.data(), tensor.sizes(), torch::kFloat));
  }
}

}  // namespace fastudy::train
