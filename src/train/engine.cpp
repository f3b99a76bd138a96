// One variant's training step by step: forward/backward with emulated precision, gradient allreduce,
// fp16 dynamic loss scaling, clipping, AdamW, and the exact TrainState round trip (see engine.hpp).
#include "src/train/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <sched.h>
#include <unistd.h>

#include <c10/core/DeviceGuard.h>

#include "base/cpu.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "src/core/capabilities.hpp"
#include "src/train/dp_reduce.hpp"
#include "src/train/profile.hpp"
#include "src/train/rng.hpp"
#include "src/train/step_graph.hpp"

namespace fastudy {

int default_torch_threads(int allowed_cpus, int online_cpus, int local_ranks) {
  const int share = std::max(online_cpus, 1) / std::max(local_ranks, 1);
  return std::max(1, std::min(allowed_cpus, share));
}

namespace {

// Node-local rank count named by the launcher's environment, 1 when none is set.
int local_ranks_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end == '\0' && n >= 1) return static_cast<int>(std::min<long>(n, 1 << 20));
  }
  return 1;
}

}  // namespace

int default_rank_threads(int ranks_on_node) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int allowed = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : 1;
  return default_torch_threads(allowed, online > 0 ? static_cast<int>(online) : 1, ranks_on_node);
}

int configure_torch_threads() {
  int threads = torch_threads_from_env();
  if (threads == 0) threads = default_rank_threads(local_ranks_from_env());
  at::set_num_threads(threads);
  return threads;
}

}  // namespace fastudy

namespace fastudy::train {
namespace {

constexpr const char* kTrainerFormat = "1";  // TrainState layout version written into attrs

NamedArray to_array(const std::string& name, const torch::Tensor& t) {
  const torch::Tensor c = t.detach().contiguous();
  NamedArray a;
  a.name = name;
  a.shape = c.sizes().vec();
  a.dtype = c.scalar_type() == torch::kDouble ? DType::f64 : DType::f32;
  a.data.resize(static_cast<std::size_t>(c.numel()) * dtype_size(a.dtype));
  std::memcpy(a.data.data(), c.data_ptr(), a.data.size());
  return a;
}

// Copy `a` into `t` exactly, after checking name, shape and dtype.
void from_array(const NamedArray& a, const std::string& name, torch::Tensor& t) {
  const DType want = t.scalar_type() == torch::kDouble ? DType::f64 : DType::f32;
  if (a.name != name || a.shape != t.sizes().vec() || a.dtype != want ||
      a.data.size() != static_cast<std::size_t>(t.numel()) * dtype_size(want)) {
    std::ostringstream msg;
    msg << "resume state does not fit this variant: expected " << name << " (" << to_string(want) << ", "
        << t.numel() << " values), found " << a.name << " (" << to_string(a.dtype) << ", " << a.numel()
        << " values)";
    throw Error(msg.str(), "resume only from a checkpoint written for the same variant and model configuration");
  }
  torch::NoGradGuard no_grad;
  t.copy_(torch::from_blob(const_cast<std::byte*>(a.data.data()), t.sizes(), t.scalar_type()));
}

std::string format_double(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

}  // namespace

double learning_rate(const TrainConfig& t, std::int64_t step) {
  if (t.warmup > 0 && step <= t.warmup) return t.lr * static_cast<double>(step) / static_cast<double>(t.warmup);
  if (t.schedule == Schedule::constant) return t.lr;
  const double span = static_cast<double>(std::max<std::int64_t>(1, t.steps - t.warmup));
  const double progress = std::clamp(static_cast<double>(step - t.warmup) / span, 0.0, 1.0);
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(3.141592653589793 * progress));
}

AttentionParams attention_params_of(const Variant& v, int threads) {
  AttentionParams p;
  p.attention = v.attention;
  p.policy = resolve_policy(v.attention_cfg, v.attention_cfg.policy, v.precision, v.attention);
  p.block_q = v.attention_cfg.block_q;
  p.block_kv = v.attention_cfg.block_kv;
  p.order = v.attention_cfg.loop_order;
  p.threads = threads;
  return p;
}

Engine::Engine(const Variant& v, const TrainHooks& hooks, const TrainState* resume)
    : v_(v),
      hooks_(hooks),
      emu_(Emulation::of(v.precision, v.numerics, v.train.arithmetic)),
      device_(hooks.cuda_device >= 0 ? torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(hooks.cuda_device))
                                     : torch::Device(torch::kCPU)),
      data_(v.data, v.model),
      model_(v.model, emu_.dtype, device_) {
  if (const std::string problem = device_problem(v, device_.is_cuda() ? Device::cuda : Device::cpu); !problem.empty()) {
    throw Error(v.id + ": " + problem);
  }
  if (device_.is_cuda()) {
    // fp32 matmuls are fp32 (cuBLAS's TF32 off) except where a native tf32 variant asks for TF32.
    at::globalContext().setAllowTF32CuBLAS(emu_.native && v.precision == Format::tf32);
  }
  const int threads = configure_torch_threads();
  const TrainConfig& t = v.train;
  if (hooks.world < 1 || hooks.rank < 0 || hooks.rank >= hooks.world) {
    throw Error("trainer hooks: rank " + std::to_string(hooks.rank) + " of " + std::to_string(hooks.world) +
                " is not a position in a group");
  }
  if (hooks.world > 1 && (!hooks.allreduce_mean_f32 || !hooks.allreduce_mean_f64)) {
    throw Error("trainer hooks: a group of " + std::to_string(hooks.world) + " ranks needs allreduce functions");
  }
  if (t.batch < 1 || t.batch % hooks.world != 0) {
    throw Error("[train] batch = " + std::to_string(t.batch) + " cannot be split evenly over " +
                    std::to_string(hooks.world) + " ranks of a variant",
                "make [train] batch a multiple of [train] ranks_per_variant");
  }
  // The training-loop axes (load_study checks them with the file's positions; a Variant built in code
  // gets the same checks here).
  const int width = t.dp_width > 0 ? t.dp_width : hooks.world;
  if (t.dp_width < 0 || t.batch % width != 0 || width % hooks.world != 0) {
    throw Error("[train] dp_width = " + std::to_string(t.dp_width) + " does not fit batch = " + std::to_string(t.batch) +
                    " on " + std::to_string(hooks.world) + " rank(s)",
                "dp_width must divide batch and be a multiple of ranks_per_variant");
  }
  if (t.grad_accum < 1 || (t.batch / width) % t.grad_accum != 0) {
    throw Error("[train] grad_accum = " + std::to_string(t.grad_accum) + " does not divide the per-shard batch " +
                    std::to_string(t.batch / width),
                "choose a grad_accum that divides batch / dp_width");
  }
  if (t.dp_width > 0 && hooks.world > 1 && (!hooks.allgather_f32 || !hooks.allgather_f64)) {
    throw Error("trainer hooks: dp_width on a group of " + std::to_string(hooks.world) + " ranks needs allgather functions");
  }
  model_.init(v.init, v.seed);
  attention_.params = attention_params_of(v, threads);
  attention_.sdpa = v.sdpa;
  attention_.shadow = t.shadow_attention;
  attention_.shadow_sink = &shadow_;
  for (const auto& [name, p] : model_.params()) {
    exp_avg_.push_back(torch::zeros_like(p).set_requires_grad(false));
    exp_avg_sq_.push_back(torch::zeros_like(p).set_requires_grad(false));
    decay_.push_back(p.dim() >= 2);
  }
  loss_scale_ = v.precision == Format::fp16 ? t.loss_scale : 1.0;
  if (hooks.profile) {
    profile_ = std::make_unique<StepProfile>(device_.is_cuda());
    emu_.profile = profile_.get();
    attention_.profile = profile_.get();
  }
  if (hooks.cuda_graph) {
    // The pass a graph captures must be the same every step: one rank's shard (the modelled data-parallel
    // sum runs on the host), no shadow attention (host copies).
    std::string why;
    if (!device_.is_cuda()) why = "it trains on the CPU";
    else if (!StepGraph::available()) why = "this build's LibTorch has no CUDA graphs";
    else if (t.dp_width > 0) why = "[train] dp_width sums the shards on the host";
    else if (t.shadow_attention) why = "shadow attention copies to the host on every call";
    if (why.empty()) {
      graph_ = std::make_unique<StepGraph>();
      emu_.profile = nullptr;  // nothing inside a captured pass records events
      attention_.profile = nullptr;
    } else {
      log::warn(v.id + ": --cuda-graph ignored: " + why + "; the steps run op by op");
    }
  }
  if (resume == nullptr) return;

  const auto& params = model_.params();
  if (resume->params.size() != params.size() || resume->optimizer.size() != 2 * params.size()) {
    throw Error("resume state has " + std::to_string(resume->params.size()) + " parameters and " +
                    std::to_string(resume->optimizer.size()) + " optimizer arrays; variant " + v.id + " needs " +
                    std::to_string(params.size()) + " and " + std::to_string(2 * params.size()),
                "resume only from a checkpoint written for the same variant and model configuration");
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    torch::Tensor p = params[i].second;
    from_array(resume->params[i], params[i].first, p);
    from_array(resume->optimizer[2 * i], params[i].first + ".exp_avg", exp_avg_[i]);
    from_array(resume->optimizer[2 * i + 1], params[i].first + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  bool have_adam_step = false;
  for (const NamedArray& a : resume->extra) {
    if (a.name == "adamw.step" && a.dtype == DType::i64 && a.numel() == 1) {
      adam_step_ = *a.as<std::int64_t>();
      have_adam_step = true;
    }
  }
  if (!have_adam_step) {
    throw Error("resume state of variant " + v.id + " has no 'adamw.step' entry",
                "resume only from a state that train_variant saved");
  }
  step_ = resume->step;
  cursor_ = resume->data_cursor;
  loss_scale_ = resume->loss_scale;
  good_steps_ = resume->good_steps;
  loss_history_ = resume->loss_history;
}

namespace {

// The L2 norm of a contiguous float or double tensor, summed in double in index order on the calling
// thread: LibTorch's norm() splits the sum over its threads, so its last bits (and through gradient
// clipping the weights) would depend on the thread count.
double sequential_norm(const torch::Tensor& flat) {
  double sum = 0.0;
  if (flat.scalar_type() == torch::kDouble) {
    const double* x = flat.data_ptr<double>();
    for (std::int64_t i = 0; i < flat.numel(); ++i) sum += x[i] * x[i];
  } else {
    const float* x = flat.data_ptr<float>();
    for (std::int64_t i = 0; i < flat.numel(); ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  }
  return std::sqrt(sum);
}

}  // namespace

CapturedAttention Engine::capture(int layer, std::int64_t cursor) {
  if (layer < 0 || layer >= v_.model.layers) {
    throw Error("captured_layer = " + std::to_string(layer) + " is not a layer of the model ([model] layers = " +
                    std::to_string(v_.model.layers) + ")",
                "use a block index from 0 to " + std::to_string(v_.model.layers - 1));
  }
  const TrainConfig& t = v_.train;
  std::vector<std::int64_t> batch = data_.batch(cursor, t.batch, 0, 1);
  const torch::Tensor tokens = torch::from_blob(batch.data(), {t.batch, v_.model.seq_len + 1}, torch::kLong).to(device_);
  CapturedAttention cap;
  AttentionSetup setup = attention_;
  setup.shadow = false;
  setup.capture = &cap;
  setup.capture_layer = layer;
  torch::NoGradGuard no_grad;
  model_.loss(tokens, emu_, setup);
  if (cap.q.empty()) throw Error("attention layer " + std::to_string(layer) + " was not reached by the forward pass");
  return cap;
}

std::vector<std::pair<std::string, torch::Tensor>> Engine::trace_step(
    const std::function<double(const std::string&)>& factor) {
  c10::OptionalDeviceGuard on_device;
  if (!device_.is_cpu()) on_device.reset_device(device_);
  const TrainConfig& t = v_.train;
  auto& params = model_.params();
  for (auto& [name, p] : params) p.mutable_grad() = torch::Tensor();
  OpTrace trace;
  trace.factor = factor;
  AttentionSetup setup = attention_;
  setup.shadow = false;
  setup.trace = &trace;
  setup.params.rounding_seed =
      Rng(v_.seed ^ fnv1a64("attention.rounding"), static_cast<std::uint64_t>(step_ + 1)).next();
  setup.params.head_offset = 0;
  std::vector<std::int64_t> rows = data_.rows(cursor_, t.batch, 0, t.batch);
  const torch::Tensor tokens = torch::from_blob(rows.data(), {t.batch, v_.model.seq_len + 1}, torch::kLong).to(device_);
  const torch::Tensor loss = model_.loss(tokens, emu_, setup);
  (loss_scale_ == 1.0 ? loss : loss * loss_scale_).backward();
  std::vector<std::pair<std::string, torch::Tensor>> out = std::move(trace.outputs);
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const torch::Tensor& g = it->second.grad();
    torch::Tensor grad = g.defined() ? g.detach().clone() : torch::zeros_like(it->second);
    if (loss_scale_ != 1.0) grad.div_(loss_scale_);
    out.emplace_back("grad " + it->first, grad);
  }
  for (auto& [name, p] : params) p.mutable_grad() = torch::Tensor();
  return out;
}

Engine::~Engine() = default;

TrainProfile Engine::profile() const { return profile_ ? profile_->result(graph_ != nullptr) : TrainProfile{}; }

std::vector<torch::Tensor> Engine::shard_tokens(std::int64_t shard) {
  const StepProfile::Scope timed(profile_.get(), Phase::data);
  const TrainConfig& t = v_.train;
  const int width = t.dp_width > 0 ? t.dp_width : hooks_.world;
  const std::int64_t micro_rows = t.batch / width / t.grad_accum;
  std::vector<torch::Tensor> out;
  for (int j = 0; j < t.grad_accum; ++j) {
    const std::int64_t first = shard * (t.batch / width) + j * micro_rows;
    std::vector<std::int64_t> rows = data_.rows(cursor_, t.batch, first, micro_rows);
    const torch::Tensor host = torch::from_blob(rows.data(), {micro_rows, v_.model.seq_len + 1}, torch::kLong);
    if (device_.is_cpu()) {
      out.push_back(host.clone());
    } else {
      // Pinned memory copied without waiting (LibTorch's host allocator keeps it until the copy ran).
      out.push_back(host.pin_memory().to(device_, /*non_blocking=*/true));
    }
  }
  return out;
}

void Engine::forward_backward(const std::vector<torch::Tensor>& tokens, std::int64_t shard, double scale,
                              torch::Tensor& out, StepProfile* profile) {
  const TrainConfig& t = v_.train;
  auto& params = model_.params();
  const int width = t.dp_width > 0 ? t.dp_width : hooks_.world;
  const int accum = t.grad_accum;
  const std::int64_t micro_rows = t.batch / width / accum;
  for (auto& [name, p] : params) p.mutable_grad() = torch::Tensor();
  loss_sum_.zero_();
  for (int j = 0; j < accum; ++j) {
    attention_.params.head_offset = (shard * (t.batch / width) + j * micro_rows) * v_.model.heads;
    torch::Tensor loss;
    {
      const StepProfile::Scope timed(profile, Phase::forward);
      loss = model_.loss(tokens[static_cast<std::size_t>(j)], emu_, attention_);
    }
    const torch::Tensor objective = accum > 1 ? loss / static_cast<double>(accum) : loss;
    {
      const StepProfile::Scope timed(profile, Phase::backward);
      (scale == 1.0 ? objective : objective * scale).backward();
    }
    loss_sum_.add_(loss.detach().to(torch::kDouble));  // the shard's losses summed in double, in order
  }
  // One flat gradient buffer: bucketed for the allreduce, clipped and unscaled as a whole.
  const StepProfile::Scope timed(profile, Phase::gradients);
  std::vector<torch::Tensor> parts;
  parts.reserve(params.size());
  for (auto& [name, p] : params) {
    parts.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  }
  torch::cat_out(out, parts);
}

void Engine::adamw_update(const torch::Tensor& flat, double lr) {
  // AdamW as torch::optim::AdamW computes it (decoupled weight decay, bias-corrected moments).
  const TrainConfig& t = v_.train;
  auto& params = model_.params();
  ++adam_step_;
  const double bias1 = 1.0 - std::pow(t.beta1, static_cast<double>(adam_step_));
  const double bias2 = 1.0 - std::pow(t.beta2, static_cast<double>(adam_step_));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> ps, grads, decayed;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    torch::Tensor& p = params[i].second;
    grads.push_back(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
    ps.push_back(p);
    if (decay_[i]) decayed.push_back(p);
  }
  if (device_.is_cuda()) {
    // On a GPU the same update as LibTorch's multi-tensor (foreach) ops: a few launches for all parameters.
    if (!decayed.empty()) at::_foreach_mul_(decayed, 1.0 - lr * t.weight_decay);
    at::_foreach_mul_(exp_avg_, t.beta1);
    at::_foreach_add_(exp_avg_, grads, 1.0 - t.beta1);
    at::_foreach_mul_(exp_avg_sq_, t.beta2);
    at::_foreach_addcmul_(exp_avg_sq_, grads, grads, 1.0 - t.beta2);
    std::vector<torch::Tensor> denom = at::_foreach_sqrt(exp_avg_sq_);
    at::_foreach_div_(denom, std::sqrt(bias2));
    at::_foreach_add_(denom, t.eps);
    at::_foreach_addcdiv_(ps, exp_avg_, denom, -lr / bias1);
    return;
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    torch::Tensor& p = ps[i];
    const torch::Tensor& g = grads[i];
    if (decay_[i]) p.mul_(1.0 - lr * t.weight_decay);
    exp_avg_[i].mul_(t.beta1).add_(g, 1.0 - t.beta1);
    exp_avg_sq_[i].mul_(t.beta2).addcmul_(g, g, 1.0 - t.beta2);
    const torch::Tensor denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bias2)).add_(t.eps);
    p.addcdiv_(exp_avg_[i], denom, -lr / bias1);
  }
}

Engine::Step Engine::step() {
  Step out;
  {
    const StepProfile::Scope timed(profile_.get(), Phase::step);
    out = run_step();
  }
  if (profile_) profile_->end_step();
  return out;
}

Engine::Step Engine::run_step() {
  c10::OptionalDeviceGuard on_device;  // the CUDA kernels use the current device
  if (!device_.is_cpu()) on_device.reset_device(device_);
  const auto start = std::chrono::steady_clock::now();
  const TrainConfig& t = v_.train;
  const std::int64_t next = step_ + 1;
  const double lr = learning_rate(t, next);
  auto& params = model_.params();
  shadow_.clear();
  // Stochastic rounding in the attention kernels: one stream per (step, layer, global sample, head),
  // so the bits do not depend on how the batch is split over the variant's ranks.
  attention_.params.rounding_seed = Rng(v_.seed ^ fnv1a64("attention.rounding"), static_cast<std::uint64_t>(next)).next();
  const double scale = loss_scale_;

  // The data-parallel shards (docs/configuration.md "Training-loop axes"): [train] dp_width = W shards of the global
  // batch, W / world of them on this rank; unset, one shard per rank of the group. Each shard's gradient
  // is accumulated over grad_accum = k micro-batches of its rows, in order, each backward on loss / k
  // (PyTorch's usual recipe), so that the shard gradient is the gradient of the shard's mean loss.
  const bool modelled = t.dp_width > 0;
  const int width = modelled ? t.dp_width : hooks_.world;
  const int mine = width / hooks_.world;
  const int accum = t.grad_accum;
  std::int64_t numel = 0;
  for (const auto& [name, p] : params) numel += p.numel();
  const torch::TensorOptions opts = params.front().second.options().requires_grad(false);
  if (!loss_sum_.defined()) loss_sum_ = torch::zeros({}, opts.dtype(torch::kDouble));

  torch::Tensor flat;
  double loss_value = 0.0, grad_norm = 0.0;
  if (!modelled) {
    // Each rank of the group is one shard; the group's backend averages them (in its own order).
    if (!flat_.defined()) flat_ = torch::empty({numel}, opts);
    std::vector<torch::Tensor> tokens = shard_tokens(hooks_.rank);
    if (graph_) {
      // The captured pass reads the tokens from buffers that stay in place; a new loss scale (fp16) is a
      // new pass.
      if (graph_tokens_.empty())
        for (const torch::Tensor& x : tokens) graph_tokens_.push_back(torch::empty_like(x));
      for (std::size_t j = 0; j < tokens.size(); ++j) graph_tokens_[j].copy_(tokens[j], /*non_blocking=*/true);
      const StepProfile::Scope timed(profile_.get(), Phase::graph_replay);
      if (!graph_->captured() || graph_scale_ != scale) {
        // Nothing inside a captured pass records profile events (they would become graph nodes).
        graph_->capture([&] { forward_backward(graph_tokens_, hooks_.rank, scale, flat_, nullptr); });
        graph_scale_ = scale;
      } else {
        graph_->replay();
      }
    } else {
      forward_backward(tokens, hooks_.rank, scale, flat_, profile_.get());
    }
    flat = flat_;
    if (hooks_.world > 1) {
      const StepProfile::Scope timed(profile_.get(), Phase::reducer);
      if (flat.scalar_type() == torch::kDouble) {
        hooks_.allreduce_mean_f64(flat.data_ptr<double>(), static_cast<std::size_t>(flat.numel()));
      } else {
        hooks_.allreduce_mean_f32(flat.data_ptr<float>(), static_cast<std::size_t>(flat.numel()));
      }
    }
    if (scale != 1.0) flat.div_(scale);
    {
      // The one wait of the step: the loss and the gradient norm together.
      const StepProfile::Scope timed(profile_.get(), Phase::host_sync);
      if (flat.is_cpu()) {
        loss_value = loss_sum_.item<double>();
        grad_norm = sequential_norm(flat);
      } else {
        // Summed on the device in double (LibTorch's reduction: the same bits on every run of one device).
        const torch::Tensor wide = flat.to(torch::kDouble);
        const torch::Tensor both = torch::stack({loss_sum_, (wide * wide).sum()}).cpu();
        loss_value = both[0].item<double>();
        grad_norm = std::sqrt(both[1].item<double>());
      }
    }
    if (accum > 1) loss_value /= accum;
    if (hooks_.world > 1) {
      const StepProfile::Scope timed(profile_.get(), Phase::reducer);
      hooks_.allreduce_mean_f64(&loss_value, 1);
    }
  } else {
    // This rank's shards, then every shard's gradient on every rank (allgather: rank order is shard
    // order), summed in the declared order: the same bits whatever the group size.
    torch::Tensor local = torch::empty({mine, numel}, opts);
    std::vector<double> losses(static_cast<std::size_t>(width));
    for (int s = 0; s < mine; ++s) {
      torch::Tensor row = local[s];
      const std::int64_t shard = static_cast<std::int64_t>(hooks_.rank) * mine + s;
      forward_backward(shard_tokens(shard), shard, scale, row, profile_.get());
      const StepProfile::Scope timed(profile_.get(), Phase::host_sync);
      double shard_loss = loss_sum_.item<double>();
      if (accum > 1) shard_loss /= accum;
      losses[static_cast<std::size_t>(shard)] = shard_loss;
    }
    const StepProfile::Scope timed(profile_.get(), Phase::reducer);
    // The declared-order sum runs on the host (reduce_shards): device shards are staged there once.
    const torch::TensorOptions host = opts.device(torch::kCPU);
    if (!local.is_cpu()) local = local.to(torch::kCPU);
    torch::Tensor all = local;
    if (hooks_.world > 1) {
      all = torch::empty({width, numel}, host);
      if (local.scalar_type() == torch::kDouble) {
        hooks_.allgather_f64(local.data_ptr<double>(), static_cast<std::size_t>(local.numel()), all.data_ptr<double>());
      } else {
        hooks_.allgather_f32(local.data_ptr<float>(), static_cast<std::size_t>(local.numel()), all.data_ptr<float>());
      }
      const std::vector<double> own(losses.begin() + hooks_.rank * mine, losses.begin() + (hooks_.rank + 1) * mine);
      hooks_.allgather_f64(own.data(), own.size(), losses.data());
    }
    flat = torch::empty({numel}, host);
    const ReduceOrder order = t.allreduce;
    if (all.scalar_type() == torch::kDouble) {
      reduce_shards(order, all.data_ptr<double>(), width, static_cast<std::size_t>(numel), flat.data_ptr<double>());
    } else {
      reduce_shards(order, all.data_ptr<float>(), width, static_cast<std::size_t>(numel), flat.data_ptr<float>());
    }
    // The logged loss: the shards' mean losses summed in shard order, over W (the gradient's order is
    // the axis; the loss is only logged).
    for (double l : losses) loss_value += l;
    if (width > 1) loss_value /= width;
    if (scale != 1.0) flat.div_(scale);
    grad_norm = sequential_norm(flat);
    flat = flat.to(device_);
  }
  last_gradient_ = flat;

  Step out;
  out.log = StepLog{next, loss_value, grad_norm, scale, 0.0, lr, false, false};
  if (!std::isfinite(loss_value)) {
    out.diverged = true;
    out.event = "diverged: training loss is " + format_double(loss_value) + " at step " + std::to_string(next) +
                " (precision " + std::string(to_string(v_.precision)) + ", lr " + format_double(lr) + ")";
    return out;
  }
  double mean = 0.0;
  const auto window = static_cast<std::size_t>(std::max(0, t.spike_window));
  if (window > 0 && loss_history_.size() >= window) {
    for (std::size_t i = loss_history_.size() - window; i < loss_history_.size(); ++i) mean += loss_history_[i];
    mean /= static_cast<double>(window);
    out.log.spike = loss_value > t.spike_threshold * mean;
  }
  if (out.log.spike) {
    out.event = "loss spike: " + format_double(loss_value) + " > " + format_double(t.spike_threshold) +
                " x running mean " + format_double(mean) + " of the last " + std::to_string(window) + " steps";
  }

  if (!std::isfinite(grad_norm)) {
    if (v_.precision != Format::fp16 || loss_scale_ <= 1.0) {
      out.diverged = true;
      out.event = "diverged: gradient norm is " + format_double(grad_norm) + " at step " + std::to_string(next) +
                  (v_.precision == Format::fp16 ? " even with fp16 loss scale 1" : "") + " (precision " +
                  std::string(to_string(v_.precision)) + ")";
      return out;
    }
    out.log.skipped = true;
    loss_scale_ /= 2.0;
    good_steps_ = 0;
    out.event = (out.event.empty() ? "" : out.event + "; ") + "fp16 gradient overflow: step skipped, loss scale " +
                format_double(scale) + " -> " + format_double(loss_scale_);
  } else {
    const StepProfile::Scope timed(profile_.get(), Phase::optimizer);
    if (t.grad_clip > 0.0 && grad_norm > t.grad_clip) flat.mul_(t.grad_clip / (grad_norm + 1e-6));
    adamw_update(flat, lr);
    if (v_.precision == Format::fp16 && ++good_steps_ >= t.loss_scale_window) {
      loss_scale_ *= 2.0;
      good_steps_ = 0;
    }
  }
  step_ = next;
  ++cursor_;
  loss_history_.push_back(loss_value);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.log.tokens_per_s = static_cast<double>(t.batch) * v_.model.seq_len / std::max(seconds, 1e-9);
  return out;
}

namespace {

// The tensors on the host: unchanged when they all are; else every one flattened into one device
// buffer that comes over in a single copy (one transfer per checkpoint, not one per tensor), then
// cut back into views of their shapes. The tensors share one dtype (the container).
std::vector<torch::Tensor> on_host(const std::vector<torch::Tensor>& tensors) {
  if (std::all_of(tensors.begin(), tensors.end(), [](const torch::Tensor& t) { return t.is_cpu(); })) return tensors;
  std::vector<torch::Tensor> flat;
  flat.reserve(tensors.size());
  for (const torch::Tensor& t : tensors) flat.push_back(t.detach().reshape({-1}));
  const torch::Tensor host = torch::cat(flat).to(torch::kCPU);
  std::vector<torch::Tensor> out;
  std::int64_t offset = 0;
  for (const torch::Tensor& t : tensors) {
    out.push_back(host.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
  return out;
}

// The TrainState of a model, its AdamW moments and counters (see trainer.hpp for the layout).
struct Counters {
  std::int64_t step, cursor, adam_step, good_steps;
  double loss_scale;
};

TrainState pack_state(const Variant& v, const Gpt& model, const std::vector<torch::Tensor>& exp_avg,
                      const std::vector<torch::Tensor>& exp_avg_sq, const Counters& c,
                      const std::vector<double>& loss_history) {
  TrainState s;
  s.step = c.step;
  s.data_cursor = c.cursor;
  s.loss_scale = c.loss_scale;
  s.good_steps = c.good_steps;
  s.loss_history = loss_history;
  const auto& params = model.params();
  std::vector<torch::Tensor> tensors;
  for (std::size_t i = 0; i < params.size(); ++i) {
    tensors.insert(tensors.end(), {params[i].second, exp_avg[i], exp_avg_sq[i]});
  }
  tensors = on_host(tensors);
  for (std::size_t i = 0; i < params.size(); ++i) {
    s.params.push_back(to_array(params[i].first, tensors[3 * i]));
    s.optimizer.push_back(to_array(params[i].first + ".exp_avg", tensors[3 * i + 1]));
    s.optimizer.push_back(to_array(params[i].first + ".exp_avg_sq", tensors[3 * i + 2]));
  }
  NamedArray adam;
  adam.name = "adamw.step";
  adam.shape = {1};
  adam.dtype = DType::i64;
  adam.data.resize(sizeof(std::int64_t));
  std::memcpy(adam.data.data(), &c.adam_step, sizeof(std::int64_t));
  s.extra.push_back(std::move(adam));
  s.attrs["variant"] = v.id;
  s.attrs["config_hash"] = v.hash;
  s.attrs["precision"] = std::string(to_string(v.precision));
  s.attrs["attention"] = std::string(to_string(v.attention));
  s.attrs["init"] = to_string(v.init);
  s.attrs["seed"] = std::to_string(v.seed);
  s.attrs["trainer_format"] = kTrainerFormat;
  s.attrs["device"] = params.front().second.device().str();  // where it was trained (resumes on any device)
  for (const auto& [axis, value] : v.axes) s.attrs["axis." + axis] = value;
  return s;
}

}  // namespace

TrainState Engine::state() const {
  return pack_state(v_, model_, exp_avg_, exp_avg_sq_, {step_, cursor_, adam_step_, good_steps_, loss_scale_},
                    loss_history_);
}

TrainState initial_train_state(const Variant& v) {
  Gpt model(v.model, Emulation::of(v.precision).dtype);
  model.init(v.init, v.seed);
  std::vector<torch::Tensor> zeros;
  for (const auto& [name, p] : model.params()) zeros.push_back(torch::zeros_like(p).set_requires_grad(false));
  const double loss_scale = v.precision == Format::fp16 ? v.train.loss_scale : 1.0;
  return pack_state(v, model, zeros, zeros, {0, 0, 0, 0, loss_scale}, {});
}

}  // namespace fastudy::train
