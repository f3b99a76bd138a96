// One variant's training, step by step (LibTorch; internal to src/train, its tests and benchmark).
//
// Engine owns the model, the AdamW state, the fp16 loss scaler and the data cursor, and turns them
// into a TrainState and back exactly. train_variant() (trainer.cpp) drives it and writes the logs;
// the benchmark times Engine::step() directly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/train/data.hpp"
#include "src/train/model.hpp"
#include "src/train/trainer.hpp"

namespace fastudy::train {

class StepProfile;  // profile.hpp
class StepGraph;    // step_graph.hpp

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
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

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
  std::vector<std::pair<std::string, torch::Tensor>> trace_step(const std::function<double(const std::string&)>& factor);

  TrainState state() const;
  // Q, K, V of attention layer `layer` on global batch `cursor` (see capture_attention_inputs).
  CapturedAttention capture(int layer, std::int64_t cursor);
  std::int64_t steps_done() const { return step_; }
  const std::vector<ShadowRecord>& shadow() const { return shadow_; }  // records of the last step
  const DataStream& data() const { return data_; }
  const Gpt& model() const { return model_; }
  torch::Device device() const { return device_; }
  // The flat gradient (parameters in module-path order) of the last step, averaged over the
  // data-parallel shards and unscaled: what the update used, clipped in place when grad_clip applies.
  const torch::Tensor& last_gradient() const { return last_gradient_; }
  // With hooks.profile: the phases of the steps so far (null without), and where the trainer times the
  // work between steps (checkpoints, logs).
  StepProfile* profiler() const { return profile_.get(); }
  TrainProfile profile() const;
  // Whether the steps replay a CUDA graph of the forward and backward pass (hooks.cuda_graph, where the
  // step can be captured).
  bool uses_cuda_graph() const { return graph_ != nullptr; }

 private:
  Step run_step();
  // This rank's tokens of micro-batch j of shard `shard`, on the device ([micro_rows, N + 1]).
  std::vector<torch::Tensor> shard_tokens(std::int64_t shard);
  // The forward and backward pass of one shard: its flat gradient (scaled by `scale`, parameters in
  // module-path order) into `out`, the sum of its micro-batches' losses into loss_sum_, its phases timed
  // in `profile` (may be null). Only tensor operations that stay on the device: a CUDA graph can
  // capture it.
  void forward_backward(const std::vector<torch::Tensor>& tokens, std::int64_t shard, double scale, torch::Tensor& out,
                        StepProfile* profile);
  void adamw_update(const torch::Tensor& flat, double lr);

  Variant v_;
  TrainHooks hooks_;
  Emulation emu_;
  torch::Device device_;  // where the model, its gradients and the optimizer state live
  DataStream data_;
  Gpt model_;
  AttentionSetup attention_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  std::vector<bool> decay_;  // weight decay on matrices and embeddings, not on biases and LayerNorm
  std::int64_t step_ = 0, cursor_ = 0, adam_step_ = 0, good_steps_ = 0;
  double loss_scale_ = 1.0;
  std::vector<double> loss_history_;
  std::vector<ShadowRecord> shadow_;
  torch::Tensor last_gradient_;
  std::unique_ptr<StepProfile> profile_;
  std::unique_ptr<StepGraph> graph_;  // set when the steps replay a CUDA graph
  double graph_scale_ = 0.0;          // the loss scale the graph was captured with
  std::vector<torch::Tensor> graph_tokens_;  // the captured pass's inputs, refilled every step
  torch::Tensor flat_, loss_sum_;            // its outputs (and the eager pass's buffers)
};

}  // namespace fastudy::train
