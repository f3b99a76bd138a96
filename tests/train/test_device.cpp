// The device-independent half of training on a GPU, checked on the CPU: the roundings a GPU uses
// (LibTorch's conversions) against round_inplace, the native arithmetic (autocast's rules) on a CPU's
// bf16, and what each device refuses before work starts (device_problem). The GPU half runs in
// tests/gpu/test_train_cuda.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <vector>

#include "base/error.hpp"
#include "fastudy/version.hpp"  // FASTUDY_TORCH_CUDA
#include "kernels/format.hpp"
#include "src/core/capabilities.hpp"
#include "src/train/engine.hpp"
#include "src/train/libtorch.hpp"
#include "src/train/model.hpp"
#include "tests/train/tiny.hpp"

namespace fastudy::train {
namespace {

using train_test::expect_identical;
using train_test::tiny_variant;

constexpr double kU32 = 0x1p-24;   // fp32 unit roundoff
constexpr double kUBf16 = 0x1p-8;  // bf16 unit roundoff

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
float float_of(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// Random normal values over many binades, every tie pattern of the kept/dropped bits, subnormals,
// the largest finite values (which round to Inf in fp16 and up a binade in bf16/tf32), Inf and NaN.
std::vector<float> rounding_cases() {
  std::vector<float> x;
  const torch::Tensor r = torch::randn({20000}, torch::TensorOptions().dtype(torch::kDouble)) *
                          torch::pow(2.0, torch::randint(-30, 30, {20000}, torch::kDouble));
  for (std::int64_t i = 0; i < r.numel(); ++i) x.push_back(static_cast<float>(r[i].item<double>()));
  for (std::uint32_t exponent : {1u, 100u, 127u, 142u, 254u}) {
    for (std::uint32_t low : {0x0000u, 0x0FFFu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7FFFu, 0x8000u, 0x8001u,
                              0x18000u, 0x7FFFFFu, 0x7FF000u, 0x7FE000u}) {
      for (std::uint32_t sign : {0u, 0x80000000u}) x.push_back(float_of(sign | (exponent << 23) | low));
    }
  }
  for (std::uint32_t sub : {1u, 0x1000u, 0x3000u, 0x7FFFFFu, 0x400000u}) x.push_back(float_of(sub));
  x.insert(x.end(), {65504.0f, 65520.0f, 65519.99f, 1e-8f, 6e-8f, 3e-8f, std::numeric_limits<float>::max(),
                     -std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                     -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f});
  return x;
}

TEST(DeviceRounding, LibTorchsConversionsGiveRoundInplacesBits) {
  torch::manual_seed(11);
  const std::vector<float> cases = rounding_cases();
  for (Format f : {Format::bf16, Format::fp16, Format::tf32}) {
    std::vector<float> expect = cases;
    round_inplace(f, expect.data(), expect.size());
    torch::Tensor t = torch::from_blob(const_cast<float*>(cases.data()), {static_cast<std::int64_t>(cases.size())},
                                       torch::kFloat)
                          .clone();
    round_with_conversions(t, f);
    const float* got = t.data_ptr<float>();
    int mismatches = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const bool same = std::isnan(expect[i]) ? std::isnan(got[i]) : bits_of(expect[i]) == bits_of(got[i]);
      if (!same && ++mismatches <= 5) {
        ADD_FAILURE() << to_string(f) << ": " << cases[i] << " (0x" << std::hex << bits_of(cases[i])
                      << ") rounds to 0x" << bits_of(got[i]) << ", round_inplace gives 0x" << bits_of(expect[i]);
      }
    }
    EXPECT_EQ(mismatches, 0) << to_string(f);
    // The case list really exercises rounding: most values change.
    int changed = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) changed += bits_of(expect[i]) != bits_of(cases[i]) ? 1 : 0;
    EXPECT_GT(changed, static_cast<int>(cases.size() / 2)) << to_string(f);
  }
}

TEST(DeviceRounding, Fp8AndDoubleContainersAreRefused) {
  torch::Tensor f = torch::ones({4});
  EXPECT_THROW(round_with_conversions(f, Format::fp8_e4m3), Error);
  torch::Tensor d = torch::ones({4}, torch::kDouble);
  EXPECT_THROW(round_with_conversions(d, Format::bf16), Error);
  round_with_conversions(d, Format::fp64);  // the identity needs no conversion
}

Variant native_variant(Format precision) {
  Variant v = tiny_variant(AttentionKind::flash, precision);
  v.train.arithmetic = Arithmetic::native;
  return v;
}

double initial_loss(const Variant& v) {
  Engine e(v, TrainHooks{}, nullptr);
  return e.step().log.loss;
}

TEST(Native, Bf16LossIsWithinBf16RoundoffOfFp64AndNotFp32s) {
  const double l64 = initial_loss(native_variant(Format::fp64));
  const double l32 = initial_loss(native_variant(Format::fp32));
  const double l16 = initial_loss(native_variant(Format::bf16));
  // fp32: the loss passes 2L+1 = 5 linear layers, LayerNorms and the attention; each contributes a few
  // fp32 roundings relative to its output (reductions of at most 64 terms: gamma_64 = 64u), so 5 x 64u
  // bounds the relative change to first order (the loss's relative sensitivity to relative logit changes
  // is <= 2 max|z| / loss < 1 at init).
  EXPECT_LE(std::abs(l32 - l64), 5 * 64 * kU32 * l64);
  // bf16: the inputs of every linear layer and its product are rounded to bf16 (2 roundings per layer,
  // 5 layers along the longest path: 10u), with a factor 5 for the attention's and GELU's amplification.
  EXPECT_LE(std::abs(l16 - l64), 50 * kUBf16 * l64);
  // ... and the bf16 arithmetic really ran: its losses leave fp32's bound. One loss is a mean over the
  // batch's tokens, whose bf16 errors can cancel (at step 1 on an AVX2 CPU |l16 - l32| was 0.55 of the
  // bound), so the largest difference over the first four steps is asserted.
  Engine e32(native_variant(Format::fp32), TrainHooks{}, nullptr);
  Engine e16(native_variant(Format::bf16), TrainHooks{}, nullptr);
  double largest = 0.0;
  for (int i = 0; i < 4; ++i) largest = std::max(largest, std::abs(e16.step().log.loss - e32.step().log.loss));
  EXPECT_GT(largest, 5 * 64 * kU32 * l64);
}

TEST(Native, EmulatedBf16TracksItAndItResumesBitIdentically) {
  const Variant native = native_variant(Format::bf16);
  const Variant emulated = tiny_variant(AttentionKind::flash, Format::bf16);
  {
    // The emulation models this arithmetic (inputs and outputs of every linear layer, GELU and the
    // gradients in bf16, the rest fp32): four steps' losses agree within the bf16 bound above.
    Engine n(native, TrainHooks{}, nullptr), e(emulated, TrainHooks{}, nullptr);
    double worst = 0.0;
    for (int i = 0; i < 4; ++i) {
      const double ln = n.step().log.loss, le = e.step().log.loss;
      worst = std::max(worst, std::abs(ln - le) / le);
    }
    EXPECT_LE(worst, 50 * kUBf16);
    std::cout << "native vs emulated bf16: largest relative loss difference over 4 steps " << worst << "\n";
  }

  Engine whole(native, TrainHooks{}, nullptr);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(std::isfinite(whole.step().log.loss));
  Engine first(native, TrainHooks{}, nullptr);
  first.step();
  first.step();
  const TrainState half = first.state();
  Engine second(native, TrainHooks{}, &half);
  second.step();
  second.step();
  expect_identical(whole.state(), second.state());
  EXPECT_EQ(whole.state().attrs.at("device"), "cpu");
}

TEST(DeviceProblem, NamesWhatEachDeviceCannotRun) {
  Variant v = tiny_variant(AttentionKind::flash, Format::bf16);
  EXPECT_EQ(device_problem(v, Device::cpu), "");
  // A GPU: this build's LibTorch has no CUDA, or (with one) fp64 and CPU-only numerics are refused.
  const std::string cuda = device_problem(v, Device::cuda);
  if (!FASTUDY_TORCH_CUDA) {
    EXPECT_NE(cuda.find("without CUDA"), std::string::npos) << cuda;
  } else {
    EXPECT_EQ(cuda, "");
    Variant wide = tiny_variant(AttentionKind::flash, Format::fp64);
    EXPECT_NE(device_problem(wide, Device::cuda).find("fp64"), std::string::npos);
    Variant stochastic = v;
    stochastic.attention_cfg.policy = "mixed";
    stochastic.attention_cfg.custom_policies["sr"] = CustomPolicy{"mixed", Rounding::stochastic, {}, {}, {}};
    stochastic.attention_cfg.policy = "sr";
    EXPECT_NE(device_problem(stochastic, Device::cuda).find("not available in the CUDA"), std::string::npos);
  }
  // Native arithmetic: fp16 and tf32 need a GPU; the emulated numerics are refused on every device.
  Variant half = native_variant(Format::fp16);
  EXPECT_NE(device_problem(half, Device::cpu).find("needs a GPU"), std::string::npos);
  Variant tf32 = native_variant(Format::tf32);
  EXPECT_NE(device_problem(tf32, Device::cpu).find("needs a GPU"), std::string::npos);
  Variant split = native_variant(Format::bf16);
  split.numerics.split_k = 2;
  EXPECT_NE(device_problem(split, Device::cpu).find("emulated arithmetic"), std::string::npos);
  // Shadow attention compares fastudy's kernels only.
  Variant sdpa = v;
  sdpa.sdpa = SdpaBackend::math;
  sdpa.train.shadow_attention = true;
  EXPECT_NE(device_problem(sdpa, Device::cpu).find("shadow_attention"), std::string::npos);
  // The engine asks too (a Variant built in code skips the preflight).
  EXPECT_THROW(Engine(half, TrainHooks{}, nullptr), Error);
}

}  // namespace
}  // namespace fastudy::train
