// One variant's training, step by step (LibTorch; internal to src/train, its tests and benchmark).
//
// Engine owns the model, the AdamW state, the fp16 loss scaler and the data cursor, and turns them
// into a TrainState and back exactly. train_variant() (trainer.cpp) drives it and writes the logs;
// the benchmark times Engine::step() directly.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "src/train/data.hpp"
#include "src/train/model.hpp"
#include "src/train/trainer.hpp"

namespace fastudy::train {

// Learning rate at step s (1-based): linear warmup over `warmup` steps, then cosine to min_lr at
// `steps` (or constant lr).
double learning_rate(const TrainConfig& t, std::int64_t step);

// The attention kernel settings of a variant (kind, resolved policy, tiles, loop order) on `threads`
// threads; the per-step rounding seed and head offset are the engine's.
AttentionParams attention_params_of(const Variant& v, int threads);

// The state of a variant before its first step (no data source needed).
TrainState initial_train_state(const Variant& v);

class Engine {
 public:
  // Builds the model (initial weights from v.seed) and, with `resume`, restores it exactly.
  // Throws fastudy::Error for a bad configuration, data source or resume state.
  Engine(const Variant& v, const TrainHooks& hooks, const TrainState* resume);

  struct Step {
    StepLog log;
    bool diverged = false;
    std::string event;  // spike, skipped step or divergence: what happened ("" when nothing)
  };
  // One optimizer step on the next global batch.
  Step step();

  // One forward and backward pass of the whole global batch at the data cursor, as the next step
  // runs them (its attention rounding seed, its loss scale) but as one shard and without the update:
  // every op's output in forward order (OpTrace), then each parameter's gradient, unscaled, as
  // "grad <name>", the last parameter first (the order the backward pass reaches them). `factor`: a
  // planted change (OpTrace::factor; tests). For fastudy bisect.
  std::vector<std::pair<std::string, at::Tensor>> trace_step(const std::function<double(const std::string&)>& factor);

  TrainState state() const;
  // Q, K, V of attention layer `layer` on global batch `cursor` (see capture_attention_inputs).
  CapturedAttention capture(int layer, std::int64_t cursor);
  std::int64_t steps_done() const { return step_; }
  const std::vector<ShadowRecord>& shadow() const { return shadow_; }  // records of the last step
  const DataStream& data() const { return data_; }
  const Gpt& model() const { return model_; }
  at::Device device() const { return device_; }
  // The flat gradient (parameters in module-path order) of the last step, averaged over the
  // data-parallel shards and unscaled: what the update used, clipped in place when grad_clip applies.
  const at::Tensor& last_gradient() const { return last_gradient_; }

 private:
  Variant v_;
  TrainHooks hooks_;
  Emulation emu_;
  at::Device device_;  // where the model, its gradients and the optimizer state live
  DataStream data_;
  Gpt model_;
  AttentionSetup attention_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  std::vector<bool> decay_;  // weight decay on matrices and embeddings, not on biases and LayerNorm
  std::int64_t step_ = 0, cursor_ = 0, adam_step_ = 0, good_steps_ = 0;
  double loss_scale_ = 1.0;
  std::vector<double> loss_history_;
  std::vector<ShadowRecord> shadow_;
  at::Tensor last_gradient_;
};

}  // namespace fastudy::train
