// Training on a GPU (label "gpu"): the trainer's device path against its CPU path. Compiled in every
// build (the code is device-agnostic LibTorch); every test skips with "no CUDA device: <reason>" where
// LibTorch has no CUDA or sees no device (Debian's LibTorch: always).
//   - the roundings on the device (LibTorch's CUDA conversions) give round_inplace's bits;
//   - one emulated step on the GPU and on the CPU: the same loss within the fp32 bound (the matmuls
//     of cuBLAS and OpenBLAS add in other orders, so bits may differ), for fp32 and bf16 (mixed flash
//     on the CUDA kernels), and the native bf16 step within the bf16 bound of the emulated one;
//   - a GPU run is reproducible: 4 steps twice, and 2 + resume + 2, give the same bits;
//   - a checkpoint written on the GPU resumes on the CPU and back: the restored state is the same bytes;
//   - --cuda-graph: steps replayed from a CUDA graph give the bits of the steps run op by op (emulated
//     and native, fa2 on the tensor cores and mixed, with gradient accumulation and an fp16 loss scale
//     that changes); --profile times the phases on the device too.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fastudy/version.hpp"
#include "kernels/format.hpp"
#include "src/train/engine.hpp"
#include "src/train/model.hpp"
#include "src/train/profile.hpp"
#include "tests/train/tiny.hpp"

namespace fastudy::train {
namespace {

using train_test::expect_identical;
using train_test::tiny_variant;

constexpr double kU32 = 0x1p-24;   // fp32 unit roundoff
constexpr double kUBf16 = 0x1p-8;  // bf16 unit roundoff

// Skips the test unless LibTorch can use a CUDA device.
#define REQUIRE_CUDA()                                                                                   \
  do {                                                                                                   \
    if (!torch::cuda::is_available()) {                                                                  \
      GTEST_SKIP() << "no CUDA device: " << (FASTUDY_TORCH_CUDA ? "LibTorch sees none (nvidia-smi?)"     \
                                                                : "this build links LibTorch " FASTUDY_TORCH_VERSION \
                                                                  " without CUDA");                      \
    }                                                                                                    \
  } while (0)

TrainHooks on_gpu() {
  TrainHooks h;
  h.cuda_device = 0;
  return h;
}

TEST(TrainCuda, DeviceRoundingGivesRoundInplacesBits) {
  REQUIRE_CUDA();
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({1 << 16}) * torch::pow(2.0, torch::randint(-20, 20, {1 << 16}));
  for (Format f : {Format::bf16, Format::fp16, Format::tf32}) {
    torch::Tensor device = x.to(torch::kCUDA).contiguous();
    round_with_conversions(device, f);
    std::vector<float> expect(x.data_ptr<float>(), x.data_ptr<float>() + x.numel());
    round_inplace(f, expect.data(), expect.size());
    const torch::Tensor got = device.to(torch::kCPU);
    EXPECT_EQ(std::memcmp(got.data_ptr<float>(), expect.data(), expect.size() * sizeof(float)), 0) << to_string(f);
  }
}

TEST(TrainCuda, OneStepMatchesTheCpuWithinTheFormatsBound) {
  REQUIRE_CUDA();
  for (Format f : {Format::fp32, Format::bf16}) {
    const Variant v = tiny_variant(AttentionKind::flash, f);
    Engine cpu(v, TrainHooks{}, nullptr), gpu(v, on_gpu(), nullptr);
    const double lc = cpu.step().log.loss, lg = gpu.step().log.loss;
    // The forward's sums have at most 64 terms (gamma_64 = 64u) through 5 linear layers; bf16 rounds
    // each layer's inputs and output (10u): differences beyond that are a bug, not reordering.
    const double bound = f == Format::fp32 ? 5 * 64 * kU32 : 50 * kUBf16;
    EXPECT_LE(std::abs(lc - lg), bound * lc) << to_string(f) << ": cpu " << lc << ", gpu " << lg;
    std::cout << to_string(f) << " step 1 loss: cpu " << lc << ", gpu " << lg << "\n";
  }
  Variant native = tiny_variant(AttentionKind::flash, Format::bf16);
  native.train.arithmetic = Arithmetic::native;
  Engine n(native, on_gpu(), nullptr), e(tiny_variant(AttentionKind::flash, Format::bf16), on_gpu(), nullptr);
  const double ln = n.step().log.loss, le = e.step().log.loss;
  EXPECT_LE(std::abs(ln - le), 50 * kUBf16 * le) << "native " << ln << ", emulated " << le;
}

TEST(TrainCuda, GpuRunsAreReproducibleAndResumeBitIdentically) {
  REQUIRE_CUDA();
  const Variant v = tiny_variant(AttentionKind::flash, Format::bf16);
  Engine a(v, on_gpu(), nullptr), b(v, on_gpu(), nullptr);
  for (int i = 0; i < 4; ++i) a.step(), b.step();
  expect_identical(a.state(), b.state());
  Engine first(v, on_gpu(), nullptr);
  first.step();
  first.step();
  const TrainState half = first.state();
  Engine second(v, on_gpu(), &half);
  second.step();
  second.step();
  expect_identical(a.state(), second.state());
  EXPECT_EQ(a.state().attrs.at("device"), "cuda:0");
}

TEST(TrainCuda, CheckpointsMoveBetweenGpuAndCpu) {
  REQUIRE_CUDA();
  const Variant v = tiny_variant(AttentionKind::flash, Format::fp32);
  Engine gpu(v, on_gpu(), nullptr);
  gpu.step();
  gpu.step();
  const TrainState from_gpu = gpu.state();
  Engine on_cpu(v, TrainHooks{}, &from_gpu);  // GPU -> CPU
  expect_identical(from_gpu, on_cpu.state());
  on_cpu.step();
  const TrainState from_cpu = on_cpu.state();
  Engine back(v, on_gpu(), &from_cpu);  // and back
  expect_identical(from_cpu, back.state());
  EXPECT_TRUE(std::isfinite(back.step().log.loss));
}

// Steps from a CUDA graph against the same steps op by op: the same weights, moments and logs, bit for
// bit; the graph was really used (uses_cuda_graph) and the fp16 loss scale's changes re-capture it.
TEST(TrainCuda, CudaGraphStepsGiveTheBitsOfStepsOpByOp) {
  REQUIRE_CUDA();
  struct Case {
    const char* policy;
    Format precision;
    Arithmetic arithmetic;
    int grad_accum;
  };
  for (const Case& c : {Case{"fa2", Format::bf16, Arithmetic::emulated, 1}, Case{"fa2", Format::bf16, Arithmetic::native, 1},
                        Case{"mixed", Format::bf16, Arithmetic::emulated, 2}, Case{"eager", Format::fp16, Arithmetic::emulated, 1},
                        Case{"mixed", Format::fp32, Arithmetic::emulated, 1}}) {
    Variant v = tiny_variant(AttentionKind::flash, c.precision);
    v.attention_cfg.policy = c.policy;
    v.model.heads = 1;  // head dim 16 and 16 x 16 tiles: the tensor-core kernels (fp16/bf16 readings)
    v.attention_cfg.block_q = v.attention_cfg.block_kv = 16;
    v.train.arithmetic = c.arithmetic;
    v.train.grad_accum = c.grad_accum;
    v.train.loss_scale_window = 2;  // fp16: the scale doubles every two steps (a new capture)
    TrainHooks graph_hooks = on_gpu();
    graph_hooks.cuda_graph = true;
    Engine eager(v, on_gpu(), nullptr), graph(v, graph_hooks, nullptr);
    ASSERT_TRUE(graph.uses_cuda_graph()) << c.policy;
    EXPECT_FALSE(eager.uses_cuda_graph());
    for (int i = 0; i < 5; ++i) {
      const StepLog a = eager.step().log, b = graph.step().log;
      EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof a.loss), 0) << c.policy << " step " << i + 1 << ": " << a.loss << " vs " << b.loss;
      EXPECT_EQ(std::memcmp(&a.grad_norm, &b.grad_norm, sizeof a.grad_norm), 0) << c.policy << " step " << i + 1;
      EXPECT_EQ(a.loss_scale, b.loss_scale) << c.policy;
    }
    expect_identical(eager.state(), graph.state());
  }
}

TEST(TrainCuda, ProfileTimesThePhasesOnTheDevice) {
  REQUIRE_CUDA();
  TrainHooks hooks = on_gpu();
  hooks.profile = true;
  Variant v = tiny_variant(AttentionKind::flash, Format::bf16);
  Engine e(v, hooks, nullptr);
  for (int i = 0; i < 3; ++i) e.step();
  const TrainProfile p = e.profile();
  EXPECT_EQ(p.steps, 2);
  EXPECT_TRUE(p.device);
  double step_device = -1, attention_device = -1;
  for (const PhaseTime& ph : p.phases) {
    if (ph.phase == "step") step_device = ph.device_ms;
    if (ph.phase == "attention" && attention_device < 0) attention_device = ph.device_ms;
  }
  EXPECT_GT(step_device, 0.0);
  EXPECT_GT(attention_device, 0.0);
  EXPECT_LT(attention_device, step_device);
  std::cout << format_profile(v.id, p);
}

}  // namespace
}  // namespace fastudy::train
