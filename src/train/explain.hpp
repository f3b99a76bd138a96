// What `fastudy replay` and `fastudy bisect` need from the trainer (free of LibTorch, like
// trainer.hpp): a variant's checkpoint made the resume state of a variant with other axes (a
// counterfactual replay), and one training step of two variants from the same weights on the same
// batch, compared op by op against the bound of their format (the first divergent op).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "src/core/config.hpp"
#include "src/core/train_state.hpp"

namespace fastudy {

// The state `s` of one variant as the resume state of variant `v` (the same variant with some axes set
// to other values): the master weights and AdamW moments in v's container (f64 for an fp64 variant,
// else f32; widening is exact, narrowing rounds to nearest), and when the precision changes into or
// out of fp16 the dynamic loss scale restarts (v's [train] loss_scale in fp16, 1 elsewhere). Step,
// data cursor, AdamW step count and loss history are kept: the replay reads the same batches.
TrainState replay_state(const Variant& v, TrainState s);

// Variant v's state `s` trained on to step `to_step` (v's own steps, bit for bit what its training
// did: a resume is exact). Throws UsageError when v diverges before it.
TrainState advance_state(const Variant& v, const TrainState& s, std::int64_t to_step);

// One op's output in the two runs of a bisection, a = variant A's, b = variant B's.
struct OpComparison {
  std::string op;            // an OpTrace name ("blocks.0.attn.out", "logits", ...) or "grad <parameter>"
  std::int64_t numel = 0;
  double max_abs = 0;        // max |a - b| (inf when one side is not finite where the other is)
  double ref_max = 0;        // max |a|
  double ulps = 0;           // max_abs / (u max|a|): the largest difference in roundings of the largest output
  bool identical = false;    // the same bits
  bool beyond = false;       // ulps > the bound
};

struct BisectResult {
  Format format = Format::fp32;  // the coarser of the two precisions: its unit roundoff is the bound's u
  double bound_ulps = 0;
  std::vector<OpComparison> ops;  // forward order, then the gradients in backward order
  int first_differs = -1;         // the first op whose bits differ (-1: none)
  // The first op beyond the bound: every op before it (its inputs among them) agrees within the bound,
  // so the difference enters there (-1: none).
  int first_beyond = -1;
};

// The bound, in roundings of an op's largest output, within which two runs of one op agree when they
// differ only in rounding: each run's output is within one storage rounding of the value its
// arithmetic computes (|d| <= u |x|) and that value within one more rounding of its accumulation
// (fp32 accumulators are exact to well below one bf16/fp16 rounding; for fp32 and fp64 variants the
// accumulation is in the format itself): 2 roundings per run, 4 between the two.
inline constexpr double kBisectBoundUlps = 4.0;

// One training step (Engine::trace_step: forward and backward of the whole global batch at the state's
// data cursor, as one shard, no update) of variant a and of variant b from the same state (a's
// checkpoint, made b's resume state by replay_state), every op's output compared. `plant_b` plants a
// change into b's run (OpTrace::factor; tests). Throws fastudy::Error when the two runs record
// different ops (models of another shape).
BisectResult bisect_step(const Variant& a, const Variant& b, const TrainState& state,
                         const std::function<double(const std::string&)>& plant_b = {});

}  // namespace fastudy
