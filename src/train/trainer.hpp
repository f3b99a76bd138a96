// The single-variant trainer: a small GPT-style decoder trained with one attention kind, one emulated
// training precision and one init seed, everything else bit-identical across variants.
//
// This is the interface the jobs and the distributed runner call; it stays free of LibTorch (the model
// lives in model.hpp/model.cpp, included only by src/train, its tests and its benchmark).
//
// Model: token + position embeddings, `layers` pre-norm blocks (LayerNorm, causal multi-head attention
// with a fused qkv Linear and an output projection, LayerNorm, MLP d -> mlp_ratio*d -> d with GELU),
// final LayerNorm, an untied LM head (no bias). Parameter names are module paths:
// tok_emb.weight, pos_emb.weight, blocks.<i>.{ln1,attn.qkv,attn.proj,ln2,mlp.fc,mlp.proj}.{weight,bias},
// ln_f.{weight,bias}, lm_head.weight.
//
// Randomness: init from the variant's seed (one stream per parameter name), data from [data] seed; no
// other randomness (no dropout). Threads: LibTorch runs with FASTUDY_TORCH_THREADS threads (default:
// this rank's share of the CPUs, see configure_torch_threads below; set with at::set_num_threads when
// training starts); results are the same bits on every thread count (fixed_order.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/core/config.hpp"
#include "src/core/train_state.hpp"

namespace fastudy {

struct StepLog {
  std::int64_t step;    // steps completed (1 after the first update)
  double loss;          // mean training loss of the global batch at this step (before the update)
  double grad_norm;     // global gradient norm (unscaled, before clipping; inf/nan on fp16 overflow)
  double loss_scale;    // fp16 dynamic loss scale used for this step (1 otherwise)
  double tokens_per_s;  // global batch tokens / wall time of this step
  double lr;
  bool skipped;         // fp16 overflow: the update was skipped and the loss scale halved
  bool spike;           // loss > spike_threshold x mean of the previous spike_window losses
};

// --profile: where a variant's steps spend their time, in ms per step: the host's wall time and, on a
// GPU, the device's time between CUDA events recorded at the same points of the step (-1: not timed
// there). Averaged over the steps after the first (which allocates and initialises) when there are more.
struct PhaseTime {
  std::string phase;  // step, data, forward, attention, roundings, backward, ..., checkpoint, log
  int depth = 0;      // 0: the step or outside it; 1: a phase of the step; 2: inside the phase above
  double host_ms = 0, device_ms = -1;
};
struct TrainProfile {
  std::int64_t steps = 0;        // steps averaged
  bool warmup_excluded = false;  // the first step left out
  bool device = false;           // device times present
  bool cuda_graph = false;       // forward and backward replayed from a CUDA graph
  std::vector<PhaseTime> phases;
};
// The profile as a table, one line per phase (header naming the variant, the steps and the devices).
std::string format_profile(const std::string& variant, const TrainProfile& profile);

struct TrainHooks {
  int rank = 0, world = 1;  // position inside the variant's group of ranks: the global batch is sharded over `world`
  // The CUDA device this rank trains on (the job resolves [train] device and selects it), -1: the CPU.
  // On a GPU the buffers the allreduce functions get are device buffers (the NCCL reducer's).
  int cuda_device = -1;
  bool profile = false;  // time the phases of every step (TrainResult::profile)
  // On a GPU: capture the forward and backward pass of a step in a CUDA graph and replay it on the
  // following steps (the same bits as running them op by op); where the step cannot be captured
  // (shadow attention, dp_width, a CPU) the steps run op by op.
  bool cuda_graph = false;
  std::function<void(float*, std::size_t)> allreduce_mean_f32;   // average a flat buffer over the group (empty: single rank)
  std::function<void(double*, std::size_t)> allreduce_mean_f64;
  // [train] dp_width set, group of 2+: every rank's n values in rank order (out: world * n values).
  std::function<void(const float*, std::size_t, float*)> allgather_f32;
  std::function<void(const double*, std::size_t, double*)> allgather_f64;
  std::function<void(const TrainState&)> save_checkpoint;        // called at checkpoint_every steps and at the end (all ranks of the group call it; the state is identical on all)
  std::function<bool()> stop_requested;                          // polled every step: if true, save a checkpoint and return `stopped` (must agree on all ranks of the group)
  std::function<void(const StepLog&)> on_step;                   // progress (called every step)
};

enum class TrainOutcome { done, diverged, stopped };

struct TrainResult {
  TrainOutcome outcome;
  std::int64_t step;       // steps completed
  double final_loss;       // loss of the last step (nan when there was none)
  std::string reason;      // why it diverged or stopped ("" when done)
  std::vector<std::pair<std::int64_t, std::string>> events;  // (step, what): spikes, skipped steps, divergence
  TrainProfile profile;    // with hooks.profile
};

// Initial weights of a variant (what step 0 looks like), without training.
TrainState initial_state(const Variant& v);

// Train (or resume from `resume`, which must be a state this function saved) until train.steps.
// Writes <variant_dir>/train_log.csv (rank 0 of the group), and shadow.csv when shadow_attention.
// A NaN/Inf loss (or non-finite gradients outside fp16 loss scaling) ends the variant as `diverged`
// with the reason; configuration and data errors throw fastudy::Error.
//
// TrainState layout: params are the master weights (f32; f64 for an fp64 variant) in module-path
// order; optimizer holds "<param>.exp_avg" and "<param>.exp_avg_sq"; extra holds "adamw.step" (i64,
// updates applied: fp16 skipped steps do not count); data_cursor == step; attrs carry variant,
// config_hash, precision, attention, init, seed and trainer_format.
TrainResult train_variant(const Variant& v, const std::string& variant_dir, const TrainHooks& hooks,
                          const TrainState* resume);

std::string_view to_string(TrainOutcome o);

// LibTorch threads. Results do not depend on them (fixed_order.hpp; the attention kernels split
// over heads): they change speed only.
// The default of one rank: the CPUs it may run on (its affinity mask: the launcher's binding, a Slurm
// allocation), but no more than its share of the node's online CPUs when `local_ranks` ranks run
// there; at least 1.
int default_torch_threads(int allowed_cpus, int online_cpus, int local_ranks);
// default_torch_threads of this process (its affinity mask, this machine's online CPUs) for each of
// `ranks_on_node` ranks.
int default_rank_threads(int ranks_on_node);
// Sets this process's LibTorch threads from FASTUDY_TORCH_THREADS, or when it is unset
// default_rank_threads of the node-local rank count the launcher names (OMPI_COMM_WORLD_LOCAL_SIZE,
// MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE; 1 without one); returns the count. The trainer calls it for
// each variant. Throws fastudy::UsageError for a bad value.
int configure_torch_threads();

// Wall seconds per optimizer step of variant v on this machine, on one rank with `threads` LibTorch
// threads: `warmup` untimed steps (allocations, first touch), then the mean of `timed` steps of the
// whole global batch. Writes nothing; leaves LibTorch on `threads` threads. For `fastudy plan`'s time
// estimate. Throws fastudy::Error like train_variant for a bad configuration or data source.
double measure_step_seconds(const Variant& v, int warmup, int timed, int threads);

// What attention layer `layer` (0-based block index) of variant v's model sees on global batch
// `batch` of the variant's data (data cursor `batch`) with the weights of `state` (read from one of
// its checkpoints): Q, K, V as the attention kernels receive them (in the variant's precision), each
// [B, H, N, d] with B = [train] batch, widened to double. The forward pass runs as in training.
// Throws fastudy::Error for a layer out of range.
struct CapturedAttention {
  std::int64_t batch = 0, heads = 0, seq_len = 0, head_dim = 0;
  std::vector<double> q, k, v;
};
CapturedAttention capture_attention_inputs(const Variant& v, const TrainState& state, int layer, std::int64_t batch);

}  // namespace fastudy
