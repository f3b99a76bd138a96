// Training throughput of two models at fp32 and bf16 with baseline and flash attention, beside the
// same model in plain LibTorch modules (no emulation, attention by matmul/softmax,
// torch::optim::AdamW), in one run on the same batches:
//   demo   configs/quick.toml's model: d_model 64, 4 heads, 2 layers, seq_len 64, batch 16, vocab 64,
//          16x16 tiles, mixed policy.
//   paper  configs/paper.toml's model and [attention] (d_model 256, 8 heads, 6 layers, seq_len 256,
//          64x64 tiles, kv_outer, mixed), read from the file, at a batch of 4 sequences (one rank's
//          share of a small step; the time per token hardly depends on the batch).
// Aims (paper model on the CPU): fp32 baseline >= 1.0x plain LibTorch; flash >= 1.2x baseline; bf16
// step time <= 1.3x fp32.
//
//   cmake --build build --target bench_train && build/bench/train/bench_train
//
// Counter tokens_per_s = global batch tokens per second of wall time, on FASTUDY_TORCH_THREADS threads
// (default: every CPU this process may use, see configure_torch_threads; counter `threads`).
// BM_train_threads runs the paper model's fp32 flash step on 1 thread and on the default count, side
// by side: the speed-up of using the cores, whose results are the same bits (fixed_order.hpp).
// BM_matmul/{torch,fixed}/M/K/N: one thread, LibTorch's mm against fixed::mm's tiles (the cost of
// thread-count independence on one thread) at the trainer's product shapes.
// Devices and arithmetic, each row on the CPU and, where LibTorch sees one, the GPU (GPU rows report
// "no CUDA device: ..." as a skip elsewhere), at bf16:
//   BM_device_step/<model>_<device>_<emulated|native>[_fa2][_graph]   fastudy's step (flash, mixed; _fa2:
//                                                        the fa2 reading; _graph: --cuda-graph)
//   BM_plain_device_step/<model>_<device>_<fp32|autocast> the plain LibTorch model, fp32 or under
//                                                        LibTorch's autocast to bf16
//   models: demo, paper, and gpt2 (GPT-2 small: 12 layers, d_model 768, 12 heads, seq_len 1024,
//   vocab 50257, batch 4, 128x128 tiles)
//   BM_gpu_attention/<fa2|eager|pure|sdpa_flash>        forward + backward of causal bf16 attention
//                                                        (B 4, H 16, N 4096, d 128, 64x64 tiles):
//                                                        fastudy's CUDA kernels in a reading against
//                                                        LibTorch's flash kernel; counters tflops, its
//                                                        share of the H100 SXM's dense bf16 peak
//                                                        (989 TFLOP/s) and tensor_cores (1 when the
//                                                        tensor-core kernels ran).
// The GPU rows' ratios as one table: bench/gpu-table.sh BUILD_DIR.
// Shapes: B batch, H heads, N sequence, d head dim, D = H*d.
#include <ATen/autocast_mode.h>
#include <benchmark/benchmark.h>
#include <torch/version.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

#include "src/core/config.hpp"
#include "src/train/engine.hpp"
#include "src/train/fixed_order.hpp"
#include "src/train/sdpa.hpp"

#ifdef FASTUDY_HAVE_CUDA_KERNELS
#include "kernels/cuda/attention_cuda.hpp"
#endif

namespace fastudy::train {
namespace {

enum class Model { demo, paper, gpt2 };

Variant bench_variant(Model model, AttentionKind kind, Format precision) {
  Variant v;  // the defaults of ModelConfig and TrainConfig are the demo model
  if (model == Model::paper) {
    const Study paper = load_study(std::string(FASTUDY_CONFIGS) + "/paper.toml");
    v.model = paper.model;
    v.attention_cfg = paper.attention;
    v.train.batch = 4;
  } else if (model == Model::gpt2) {
    v.model = ModelConfig{50257, 768, 12, 12, 1024, 4};  // vocab, d_model, heads, layers, seq_len, mlp_ratio
    v.attention_cfg.block_q = 128;  // FlashAttention-2's tiles at head dim 64
    v.attention_cfg.block_kv = 128;
    v.train.batch = 4;
  } else {
    v.attention_cfg.block_q = 16;  // configs/quick.toml's [attention]
    v.attention_cfg.block_kv = 16;
  }
  v.id = std::string(to_string(kind)) + "-" + std::string(to_string(precision));
  v.attention = kind;
  v.precision = precision;
  v.seed = 1;
  v.train.steps = 1'000'000'000;  // never reached: the schedule stays in its first part
  v.train.checkpoint_every = 0;
  return v;
}

void BM_train_step(benchmark::State& state, Model model, AttentionKind kind, Format precision) {
  const Variant v = bench_variant(model, kind, precision);
  const TrainHooks hooks;
  Engine engine(v, hooks, nullptr);
  engine.step();  // warm-up: allocations, first-touch
  for (auto _ : state) {
    const Engine::Step s = engine.step();
    benchmark::DoNotOptimize(s.log.loss);
  }
  const double tokens = static_cast<double>(v.train.batch) * v.model.seq_len;
  state.counters["tokens_per_s"] = benchmark::Counter(tokens * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["threads"] = at::get_num_threads();
}

// The paper model's fp32 flash step on state.range(0) threads (0: the default count).
void BM_train_threads(benchmark::State& state) {
  const char* saved = std::getenv("FASTUDY_TORCH_THREADS");
  const std::string restore = saved != nullptr ? saved : "";
  if (state.range(0) > 0) {
    ::setenv("FASTUDY_TORCH_THREADS", std::to_string(state.range(0)).c_str(), 1);
  } else {
    ::unsetenv("FASTUDY_TORCH_THREADS");
  }
  BM_train_step(state, Model::paper, AttentionKind::flash, Format::fp32);
  if (saved != nullptr) {
    ::setenv("FASTUDY_TORCH_THREADS", restore.c_str(), 1);
  } else {
    ::unsetenv("FASTUDY_TORCH_THREADS");
  }
}

// [M, K] x [K, N] on one thread: LibTorch's mm (fixed = false) or fixed::mm's tiles (fixed = true).
void BM_matmul(benchmark::State& state, bool fixed_order) {
  const int saved = at::get_num_threads();
  at::set_num_threads(1);
  torch::manual_seed(1);
  const torch::Tensor a = torch::randn({state.range(0), state.range(1)}), b = torch::randn({state.range(1), state.range(2)});
  for (auto _ : state) benchmark::DoNotOptimize(fixed_order ? fixed::mm(a, b) : torch::mm(a, b));
  at::set_num_threads(saved);
}

// The reference: the same architecture written with plain LibTorch modules.
struct PlainBlockImpl : torch::nn::Module {
  PlainBlockImpl(std::int64_t D, std::int64_t heads, std::int64_t mlp_ratio)
      : heads(heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({D})))),
        qkv(register_module("qkv", torch::nn::Linear(D, 3 * D))),
        proj(register_module("proj", torch::nn::Linear(D, D))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({D})))),
        fc(register_module("fc", torch::nn::Linear(D, mlp_ratio * D))),
        mlp_proj(register_module("mlp_proj", torch::nn::Linear(mlp_ratio * D, D))) {}

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask) {
    const std::int64_t B = x.size(0), N = x.size(1), D = x.size(2), d = D / heads;
    const auto split = qkv(ln1(x)).view({B, N, 3, heads, d}).permute({2, 0, 3, 1, 4});  // [3, B, H, N, d]
    torch::Tensor s = torch::matmul(split[0], split[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
    const torch::Tensor o = torch::matmul(torch::softmax(s.masked_fill(mask, -INFINITY), -1), split[2]);
    x = x + proj(o.permute({0, 2, 1, 3}).reshape({B, N, D}));
    return x + mlp_proj(torch::gelu(fc(ln2(x))));
  }

  std::int64_t heads;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc, mlp_proj;
};
TORCH_MODULE(PlainBlock);

struct PlainGptImpl : torch::nn::Module {
  explicit PlainGptImpl(const ModelConfig& m)
      : tok(register_module("tok", torch::nn::Embedding(m.vocab, m.d_model))),
        pos(register_module("pos", torch::nn::Embedding(m.seq_len, m.d_model))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({m.d_model})))),
        head(register_module("head", torch::nn::Linear(torch::nn::LinearOptions(m.d_model, m.vocab).bias(false)))),
        mask(register_buffer("mask", torch::ones({m.seq_len, m.seq_len}, torch::kBool).triu(1))) {
    for (int i = 0; i < m.layers; ++i) {
      blocks.push_back(register_module("blocks_" + std::to_string(i), PlainBlock(m.d_model, m.heads, m.mlp_ratio)));
    }
  }

  torch::Tensor loss(const torch::Tensor& tokens) {
    const std::int64_t N = tokens.size(1) - 1;
    torch::Tensor x = tok(tokens.narrow(1, 0, N)) + pos->weight;
    for (auto& b : blocks) x = b->forward(x, mask);
    const torch::Tensor logits = head(ln_f(x));
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                tokens.narrow(1, 1, N).reshape({-1}));
  }

  torch::nn::Embedding tok, pos;
  std::vector<PlainBlock> blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
  torch::Tensor mask;
};
TORCH_MODULE(PlainGpt);

void BM_plain_libtorch_step(benchmark::State& state, Model which) {
  configure_torch_threads();
  const Variant v = bench_variant(which, AttentionKind::baseline, Format::fp32);
  const TrainConfig& t = v.train;
  const DataStream data(v.data, v.model);
  torch::manual_seed(1);  // the reference model's own init; only its speed matters here
  PlainGpt model(v.model);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(t.lr)
                                                   .betas({t.beta1, t.beta2})
                                                   .eps(t.eps)
                                                   .weight_decay(t.weight_decay));
  std::int64_t cursor = 0;
  auto step = [&] {
    std::vector<std::int64_t> batch = data.batch(cursor++, t.batch, 0, 1);
    const torch::Tensor tokens = torch::from_blob(batch.data(), {t.batch, v.model.seq_len + 1}, torch::kLong);
    opt.zero_grad();
    const torch::Tensor loss = model->loss(tokens);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), t.grad_clip);
    opt.step();
    return loss.item<double>();
  };
  step();
  for (auto _ : state) benchmark::DoNotOptimize(step());
  const double tokens = static_cast<double>(t.batch) * v.model.seq_len;
  state.counters["tokens_per_s"] = benchmark::Counter(tokens * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["threads"] = at::get_num_threads();
}

// ---- devices and arithmetic --------------------------------------------------------------------
// Skips the benchmark (returns true) when `device` is CUDA and LibTorch sees none.
bool skip_without(benchmark::State& state, torch::DeviceType device) {
  if (device != torch::kCUDA || torch::cuda::is_available()) return false;
  state.SkipWithError("no CUDA device: LibTorch sees none (or has no CUDA)");
  return true;
}

// LibTorch's autocast to `dtype` on `device` while alive (the API changed in LibTorch 2.4).
class Autocast {
 public:
  Autocast(torch::DeviceType device, torch::Dtype dtype) : device_(device) { set(true, dtype); }
  ~Autocast() {
    set(false, torch::kBFloat16);
    at::autocast::clear_cache();
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  void set(bool on, torch::Dtype dtype) const {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_dtype(device_, dtype);
    at::autocast::set_autocast_enabled(device_, on);
#else
    if (device_ == torch::kCUDA) {
      at::autocast::set_autocast_gpu_dtype(dtype);
      at::autocast::set_enabled(on);
    } else {
      at::autocast::set_autocast_cpu_dtype(dtype);
      at::autocast::set_cpu_enabled(on);
    }
#endif
  }
  torch::DeviceType device_;
};

// policy: the attention reading ("" keeps the model's); graph: --cuda-graph.
void BM_device_step(benchmark::State& state, Model model, torch::DeviceType device, Arithmetic arithmetic,
                    const char* policy, bool graph) {
  if (skip_without(state, device)) return;
  Variant v = bench_variant(model, AttentionKind::flash, Format::bf16);
  v.train.arithmetic = arithmetic;
  if (*policy != '\0') v.attention_cfg.policy = policy;
  TrainHooks hooks;
  hooks.cuda_device = device == torch::kCUDA ? 0 : -1;
  hooks.cuda_graph = graph;
  Engine engine(v, hooks, nullptr);
  if (graph && !engine.uses_cuda_graph()) {
    state.SkipWithError("the step cannot be captured in a CUDA graph here");
    return;
  }
  engine.step();  // warm-up (and the graph's capture); every step ends in one host copy: it waits for the device
  for (auto _ : state) benchmark::DoNotOptimize(engine.step().log.loss);
  const double tokens = static_cast<double>(v.train.batch) * v.model.seq_len;
  state.counters["tokens_per_s"] = benchmark::Counter(tokens * state.iterations(), benchmark::Counter::kIsRate);
}

void BM_plain_device_step(benchmark::State& state, Model which, torch::DeviceType device, bool autocast) {
  if (skip_without(state, device)) return;
  configure_torch_threads();
  const Variant v = bench_variant(which, AttentionKind::baseline, Format::fp32);
  const TrainConfig& t = v.train;
  const DataStream data(v.data, v.model);
  torch::manual_seed(1);
  PlainGpt model(v.model);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).eps(t.eps));
  std::int64_t cursor = 0;
  auto step = [&] {
    std::vector<std::int64_t> batch = data.batch(cursor++, t.batch, 0, 1);
    const torch::Tensor tokens =
        torch::from_blob(batch.data(), {t.batch, v.model.seq_len + 1}, torch::kLong).to(device);
    opt.zero_grad();
    torch::Tensor loss;
    {
      std::optional<Autocast> cast;
      if (autocast) cast.emplace(device, torch::kBFloat16);
      loss = model->loss(tokens);
    }
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), t.grad_clip);
    opt.step();
    return loss.item<double>();
  };
  step();
  for (auto _ : state) benchmark::DoNotOptimize(step());
  const double tokens = static_cast<double>(t.batch) * v.model.seq_len;
  state.counters["tokens_per_s"] = benchmark::Counter(tokens * state.iterations(), benchmark::Counter::kIsRate);
}

// Forward + backward of causal bf16 attention on the GPU: fastudy's CUDA flash kernels in the reading
// `reading` (fa2, eager, pure), or LibTorch's flash SDPA backend (reading ""), on the same inputs.
void BM_gpu_attention(benchmark::State& state, const char* reading) {
  const bool ours = *reading != '\0';
  if (skip_without(state, torch::kCUDA)) return;
  const std::int64_t B = 4, H = 16, N = 4096, d = 128;
  const auto opts = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  torch::manual_seed(2);
  const torch::Tensor q = torch::randn({B, H, N, d}, opts), k = torch::randn({B, H, N, d}, opts),
                      v = torch::randn({B, H, N, d}, opts), dout = torch::randn({B, H, N, d}, opts);
  std::function<void()> run;
#ifdef FASTUDY_HAVE_CUDA_KERNELS
  torch::Tensor o = torch::empty_like(q), dq = torch::empty_like(q), dk = torch::empty_like(q), dv = torch::empty_like(q);
  torch::Tensor lse = torch::empty({B, H, N}, opts.dtype(torch::kFloat));
  AttentionParams params;
  params.attention = AttentionKind::flash;
  params.order = LoopOrder::q_outer;
  params.block_q = params.block_kv = 64;
  const AttentionShape shape{B, H, N, d, /*causal=*/true, /*scale=*/0.0};
  torch::Tensor ws_forward, ws_backward;
  if (ours) {
    params.policy = make_policy(reading, Format::bf16, AttentionKind::flash);
    // The workspaces once, as the trainer's caching allocator gives them: the calls then neither allocate
    // nor wait; the loop waits once per iteration.
    ws_forward = torch::empty({static_cast<std::int64_t>(cuda::attention_workspace_bytes(shape, params, Format::bf16, false)) + 1},
                              opts.dtype(torch::kByte));
    ws_backward = torch::empty({static_cast<std::int64_t>(cuda::attention_workspace_bytes(shape, params, Format::bf16, true)) + 1},
                               opts.dtype(torch::kByte));
    state.counters["tensor_cores"] = std::string(cuda::attention_cuda_path(shape, params)) == "tensor cores" ? 1 : 0;
    run = [&] {
      cuda::attention_forward_cuda(shape, params, Format::bf16, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                   lse.data_ptr<float>(), nullptr, ws_forward.data_ptr());
      cuda::attention_backward_cuda(shape, params, Format::bf16, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                    lse.data_ptr<float>(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                    nullptr, ws_backward.data_ptr());
      torch::cuda::synchronize();
    };
  }
#else
  (void)reading;
#endif
  if (!ours) {
    run = [&] {
      const torch::Tensor qg = q.detach().requires_grad_(true), kg = k.detach().requires_grad_(true),
                          vg = v.detach().requires_grad_(true);
      sdpa_attention(qg, kg, vg, SdpaBackend::flash, /*causal=*/true).backward(dout);
      torch::cuda::synchronize();
    };
  }
  if (!run) {
    state.SkipWithError("this build has no CUDA kernels");
    return;
  }
  run();
  for (auto _ : state) run();
  // Causal: half of the 4 B H N^2 d forward flops; the backward does 2.5 times the forward's.
  const double flops = 3.5 * 2.0 * static_cast<double>(B * H) * static_cast<double>(N * N) * static_cast<double>(d);
  state.counters["tflops"] = benchmark::Counter(flops * 1e-12 * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["share_of_peak"] =
      benchmark::Counter(flops / 989e12 * state.iterations(), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_device_step, demo_cpu_emulated, Model::demo, torch::kCPU, Arithmetic::emulated, "", false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_device_step, demo_cpu_native, Model::demo, torch::kCPU, Arithmetic::native, "", false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_plain_device_step, demo_cpu_autocast, Model::demo, torch::kCPU, true)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_device_step, demo_cuda_emulated, Model::demo, torch::kCUDA, Arithmetic::emulated, "", false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_device_step, demo_cuda_native, Model::demo, torch::kCUDA, Arithmetic::native, "", false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_plain_device_step, demo_cuda_autocast, Model::demo, torch::kCUDA, true)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
// The paper model: mixed (configs/paper.toml's reading) and fa2, op by op and from a CUDA graph.
BENCHMARK_CAPTURE(BM_device_step, paper_cuda_emulated, Model::paper, torch::kCUDA, Arithmetic::emulated, "", false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_device_step, paper_cuda_native, Model::paper, torch::kCUDA, Arithmetic::native, "", false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_device_step, paper_cuda_emulated_fa2, Model::paper, torch::kCUDA, Arithmetic::emulated, "fa2", false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_device_step, paper_cuda_native_fa2, Model::paper, torch::kCUDA, Arithmetic::native, "fa2", false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_device_step, paper_cuda_emulated_fa2_graph, Model::paper, torch::kCUDA, Arithmetic::emulated, "fa2", true)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_device_step, paper_cuda_native_fa2_graph, Model::paper, torch::kCUDA, Arithmetic::native, "fa2", true)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_plain_device_step, paper_cuda_fp32, Model::paper, torch::kCUDA, false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_plain_device_step, paper_cuda_autocast, Model::paper, torch::kCUDA, true)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_device_step, gpt2_cuda_emulated_fa2, Model::gpt2, torch::kCUDA, Arithmetic::emulated, "fa2", false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_device_step, gpt2_cuda_native_fa2, Model::gpt2, torch::kCUDA, Arithmetic::native, "fa2", false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gpu_attention, fa2, "fa2")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gpu_attention, eager, "eager")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gpu_attention, pure, "pure")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gpu_attention, sdpa_flash, "")->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_CAPTURE(BM_plain_libtorch_step, demo, Model::demo)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_train_step, demo_fp32_baseline, Model::demo, AttentionKind::baseline, Format::fp32)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_train_step, demo_fp32_flash, Model::demo, AttentionKind::flash, Format::fp32)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_train_step, demo_bf16_baseline, Model::demo, AttentionKind::baseline, Format::bf16)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_train_step, demo_bf16_flash, Model::demo, AttentionKind::flash, Format::bf16)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_plain_libtorch_step, paper, Model::paper)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_train_step, paper_fp32_baseline, Model::paper, AttentionKind::baseline, Format::fp32)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_train_step, paper_fp32_flash, Model::paper, AttentionKind::flash, Format::fp32)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_train_step, paper_bf16_baseline, Model::paper, AttentionKind::baseline, Format::bf16)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_train_step, paper_bf16_flash, Model::paper, AttentionKind::flash, Format::bf16)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
// Demo model (tokens x features, features x tokens) and paper model (batch 4) products.
#define FASTUDY_MATMUL_SHAPES(b)                                                                          \
  b->Args({1024, 64, 192})->Args({1024, 256, 64})->Args({192, 1024, 64})->Args({1024, 256, 768})          \
      ->Args({768, 1024, 256})->Args({1024, 1024, 256})->Unit(benchmark::kMicrosecond)
FASTUDY_MATMUL_SHAPES(BENCHMARK_CAPTURE(BM_matmul, torch, false));
FASTUDY_MATMUL_SHAPES(BENCHMARK_CAPTURE(BM_matmul, fixed, true));
BENCHMARK(BM_train_threads)->ArgName("threads")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace fastudy::train

BENCHMARK_MAIN();
