// Resource estimates of a variant, shared by `plan` and `slurm`.
#pragma once

#include <cstdint>
#include <string>

#include "src/core/config.hpp"

namespace fastudy {

struct VariantEstimate {
  std::int64_t params = 0;        // trainable parameters of the model
  double checkpoint_bytes = 0;    // one checkpoint: weights and AdamW moments
  std::int64_t checkpoints = 0;   // checkpoints written over the run
  double memory_per_rank = 0;     // training memory of one rank (estimate)
};

std::int64_t parameter_count(const ModelConfig& m);
std::int64_t checkpoint_count(const TrainConfig& t);
VariantEstimate estimate_variant(const Variant& v);
std::string human_bytes(double bytes);

}  // namespace fastudy
