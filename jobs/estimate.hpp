// Resource estimates of a variant, shared by `plan` and `slurm`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "src/core/config.hpp"

namespace fastudy {

struct VariantEstimate {
  std::int64_t params = 0;        // trainable parameters of the model
  double checkpoint_bytes = 0;    // one checkpoint: weights and AdamW moments
  std::int64_t checkpoints = 0;   // checkpoints written over the run
  double memory_per_rank = 0;     // training memory of one rank (estimate)
  double matmul_work = 1;         // training matmul work relative to the default [numerics]
};

// Values kept for the backward pass per token (per sequence position of the local batch), following
// src/train/model.cpp: per layer about (10 + 2 mlp_ratio) d_model activations, and the logits with
// their softmax and gradient (3 vocab). [numerics] changes it:
//  - recompute = on keeps only each block's input (d_model per layer), plus one block's activations
//    while that block is recomputed in the backward pass;
//  - matmul = bf16x3 also keeps the low parts of every linear layer's input ((3 + mlp_ratio) d_model
//    per layer: qkv, attention projection, MLP up and down, kept only where activations are kept).
inline double activation_values_per_token(const ModelConfig& m, const NumericsConfig& n) {
  const double block = (10.0 + 2.0 * m.mlp_ratio) * m.d_model;
  const double split_low = n.matmul == MatmulArithmetic::bf16x3 ? (3.0 + m.mlp_ratio) * m.d_model : 0.0;
  const double kept = n.recompute ? m.layers * static_cast<double>(m.d_model) + block + split_low
                                  : m.layers * (block + split_low);
  return kept + 3.0 * m.vocab;
}

// Copies of the parameters a training step holds: weights, gradients, two AdamW moments, and the
// linear layers' rounded weights (tf32, bf16: one copy; bf16x3: the high and the low part).
inline double parameter_copies(const NumericsConfig& n) {
  switch (n.matmul) {
    case MatmulArithmetic::fp32: return 4.0;
    case MatmulArithmetic::tf32:
    case MatmulArithmetic::bf16: return 5.0;
    case MatmulArithmetic::bf16x3: return 6.0;
  }
  return 4.0;
}

// Matmul work of a training step relative to the default [numerics]: bf16x3 runs three products
// for each; recompute runs every block's forward twice (forward + backward = 3 forward units, one
// more is 4/3). split_k runs the same products (its k - 1 additions of outputs are not counted),
// tf32 and bf16 the same products on rounded inputs.
inline double matmul_work_factor(const NumericsConfig& n) {
  return (n.matmul == MatmulArithmetic::bf16x3 ? 3.0 : 1.0) * (n.recompute ? 4.0 / 3.0 : 1.0);
}

// The model's parameters as the trainer makes them (src/train/model_params.cpp, Gpt's constructor):
// name and element count, in module-path order. parameter_count is their sum.
std::vector<std::pair<std::string, std::int64_t>> model_tensor_sizes(const ModelConfig& m);
std::int64_t parameter_count(const ModelConfig& m);
// The variant's kind for time estimates: its values of the axes that are not replicates (seed-like
// axes change no step's cost), "attention=flash precision=bf16"; "every variant" when there are none.
std::string variant_kind(const Variant& v);
// The number of checkpoints a variant writes: the steps of checkpoint_schedule (src/io/checkpoint.hpp).
std::int64_t checkpoint_count(const TrainConfig& t);
VariantEstimate estimate_variant(const Variant& v);
std::string human_bytes(double bytes);

}  // namespace fastudy
