// CPU tests of the CUDA kernels' numerics: the host twin (kernels/cuda/tile_reference.cpp) runs the
// same tile math (kernels/cuda/tile_math.hpp) the device kernels run, in the same order. Checked
// against the fp64 reference with unit-roundoff bounds through the check harness (kernels/check.hpp),
// and against the CPU kernels of kernels/attention.hpp in the same policy (every reading but FA3's FP8
// path, which the CUDA kernels do not run; each kind with its reading's policy): bit for bit where the
// products are the same (fp32 storage, the pure reading), within the harness's bound where the GPU's are
// tensor-core products (eager, mixed, fa2, fa3 at fp16/bf16: the MMA model's, the CPU's fused dot
// products). Runs on every machine; no GPU involved.
//
// B batch, H heads, N sequence, d head dim.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "kernels/attention.hpp"
#include "kernels/check.hpp"
#include "kernels/cuda/tile_dispatch.hpp"
#include "kernels/cuda/tile_math.hpp"
#include "kernels/cuda/tile_reference.hpp"
#include "tests/gpu/common.hpp"

namespace fastudy {
namespace {

using namespace gpu_test;

AttentionShape make_shape(std::int64_t n, std::int64_t d, bool causal) {
  AttentionShape s;
  s.batch = 1;
  s.heads = 2;
  s.seq_len = n;
  s.head_dim = d;
  s.causal = causal;
  return s;
}

AttentionParams make_params(const Variant& var, const PrecisionPolicy& policy) {
  AttentionParams p;
  p.attention = var.attention;
  p.order = var.order;
  p.policy = policy;
  p.block_q = 8;
  p.block_kv = 10;  // ragged last tile for N = 37
  p.threads = 1;
  return p;
}

// The CPU kernels fuse their dot products (and expf) on the AVX2 and AVX-512 builds.
bool cpu_kernels_fuse() { return attention_isa_name() != "generic"; }

// Whether the twin's products are tensor-core products (cuda_tile::TileRounding::kMma) under a policy.
bool tensor_core_products(const PrecisionPolicy& policy) {
  bool mma = false;
  cuda_tile::dispatch_tile_rounding(policy, [&](auto rd) { mma = decltype(rd)::kMma; });
  return mma;
}

// The twin and the CPU kernels compute the same values bit for bit: the CPU kernels fuse, and the twin's
// products are theirs.
bool same_arithmetic(const PrecisionPolicy& policy) { return cpu_kernels_fuse() && !tensor_core_products(policy); }

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(TileMath, ExpMatchesStdExpWithinTwoUlpAndSpecialValues) {
  // exp_f32 is the Cephes expf (~1 ulp); two ulp of fp32 is 2 * 2^-23 relative.
  const double two_ulp = 2.0 * std::ldexp(1.0, -23);
  for (float x = -87.0f; x <= 88.0f; x += 0.01953125f) {
    const double ref = std::exp(static_cast<double>(x));
    EXPECT_LE(std::fabs(cuda_tile::exp_f32(x) - ref), two_ulp * ref) << x;
  }
  EXPECT_EQ(cuda_tile::exp_f32(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(cuda_tile::exp_f32(0.0f), 1.0f);
  EXPECT_TRUE(std::isinf(cuda_tile::exp_f32(100.0f)));
  EXPECT_TRUE(std::isnan(cuda_tile::exp_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST(TileMath, Exp2MatchesStdExp2WithinTwoUlpAndSpecialValues) {
  // exp2_f32 is the Cephes exp2f (~1 ulp); two ulp of fp32 is 2 * 2^-23 relative. Results below 2^-126
  // are flushed to 0, as the GPU's ex2.approx.ftz does.
  const double two_ulp = 2.0 * std::ldexp(1.0, -23);
  for (float x = -126.0f; x <= 127.9f; x += 0.01953125f) {
    const double ref = std::exp2(static_cast<double>(x));
    EXPECT_LE(std::fabs(cuda_tile::exp2_f32(x) - ref), two_ulp * ref) << x;
  }
  for (int n = -126; n <= 127; ++n) EXPECT_EQ(cuda_tile::exp2_f32(static_cast<float>(n)), std::ldexp(1.0f, n)) << n;
  EXPECT_EQ(cuda_tile::exp2_f32(-126.5f), 0.0f);
  EXPECT_EQ(cuda_tile::exp2_f32(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isinf(cuda_tile::exp2_f32(128.0f)));
  EXPECT_TRUE(std::isnan(cuda_tile::exp2_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST(TileMath, RoundingObjectsRoundAsThePolicySays) {
  using Mixed16 = cuda_tile::TileRounding<Format::fp16, Format::fp32, Format::fp32>;
  using Eager16 = cuda_tile::TileRounding<Format::fp16, Format::fp32, Format::fp16>;
  using Pure16 = cuda_tile::TileRounding<Format::bf16, Format::bf16, Format::bf16>;
  const float x = 1.0f + std::ldexp(1.0f, -12);  // below half an fp16 ulp above 1: rounds to 1 in fp16
  EXPECT_EQ(Mixed16::p(x), 1.0f);
  EXPECT_EQ(Mixed16::accum(x), x);  // fp32 accumulator: unchanged
  EXPECT_EQ(Pure16::stats(1.0f + std::ldexp(1.0f, -9)), 1.0f);  // bf16 ulp at 1 is 2^-7
  // eager: in-op values in fp32, the running state stored in the format.
  EXPECT_EQ(Eager16::stats(x), x);
  EXPECT_EQ(Eager16::softmax(x), x);
  EXPECT_EQ(Eager16::stats_running(x), 1.0f);
  EXPECT_EQ(Eager16::o_running(x), 1.0f);
  EXPECT_EQ(Eager16::exp_arg(x), 1.0f);
  EXPECT_EQ(Mixed16::o_running(x), x);
}

void check_twin_forward(std::int64_t n, std::int64_t d) {
  for (bool causal : {false, true}) {
    const AttentionShape shape = make_shape(n, d, causal);
    const std::size_t size = static_cast<std::size_t>(shape.batch * shape.heads * n * d);
    const std::vector<float> q0 = random_normal(size, 11), k0 = random_normal(size, 12), v0 = random_normal(size, 13);
    for (const auto& reading : kReadings) {
      if (!reading.cuda) continue;
      const std::string preset(reading.name);
      for (Format f : kCudaFormats) {
        // The reference on Q, K, V rounded to f, as the kernels store them (both kinds alike).
        const AttentionReference ref =
            make_reference(shape, make_policy(preset, f, AttentionKind::flash), widen(q0), widen(k0), widen(v0));
        for (const Variant& var : kVariants) {
          const AttentionParams params = make_params(var, make_policy(preset, f, var.attention));
          // bound: forward_bound on float buffers (block_kv 10); lse: the same relative error as l plus
          // u_stats |lse| when stored (lse_bound).
          const ForwardCheck<float> twin = check_forward<float>(ref, params, cuda_tile::attention_forward_host);
          const std::string what = std::string(var.name) + " " + preset + " " + std::string(to_string(f)) +
                                   (causal ? " causal" : "");
          EXPECT_LE(twin.error.max_abs, twin.bound) << what;
          EXPECT_LE(twin.lse_error.max_abs, twin.lse_bound) << what;
          // The CPU kernels take the same rounding steps in the same order with the same expf: on an
          // instruction set with FMA (their dot products fuse, as the twin's and the GPU's do) the
          // results are equal bit for bit; on the generic SSE build only within the bound.
          const ForwardCheck<float> cpu = check_forward<float>(ref, params);
          if (same_arithmetic(params.policy)) {
            EXPECT_TRUE(bit_equal(twin.o, cpu.o)) << what << " O vs CPU kernels (" << attention_isa_name() << ")";
            EXPECT_TRUE(bit_equal(twin.lse, cpu.lse)) << what << " lse vs CPU kernels";
          } else {
            EXPECT_LE(error_metrics(twin.o, widen(cpu.o)).max_abs, 2 * twin.bound) << what << " vs CPU kernels";
          }
          EXPECT_EQ(twin.stats.tiles_kv, cpu.stats.tiles_kv) << what;
          EXPECT_DOUBLE_EQ(twin.stats.rescales_per_row, cpu.stats.rescales_per_row) << what;
        }
      }
    }
  }
}

TEST(TileMath, ForwardWithinUnitRoundoffBoundOfReference) { check_twin_forward(37, 12); }
TEST(TileMath, ForwardSingleTileAndTinyHeads) { check_twin_forward(7, 3); }

TEST(TileMath, BackwardWithinUnitRoundoffBoundOfReference) {
  for (bool causal : {false, true}) {
    const AttentionShape shape = make_shape(21, 8, causal);
    const std::size_t size = static_cast<std::size_t>(shape.batch * shape.heads * 21 * 8);
    const std::vector<float> q0 = random_normal(size, 21), k0 = random_normal(size, 22), v0 = random_normal(size, 23);
    const std::vector<float> g0 = random_normal(size, 24);
    for (const auto& reading : kReadings) {
      if (!reading.cuda) continue;
      const std::string preset(reading.name);
      for (Format f : kCudaFormats) {
        // Q, K, V and dO rounded to f (the storage and grad formats of both kinds).
        const AttentionReference ref = make_reference(shape, make_policy(preset, f, AttentionKind::flash), widen(q0),
                                                      widen(k0), widen(v0), widen(g0));
        const std::vector<float> q = narrow(ref.q), k = narrow(ref.k), v = narrow(ref.v), g = narrow(ref.dout);
        for (const Variant& var : kVariants) {
          const AttentionParams params = make_params(var, make_policy(preset, f, var.attention));
          const BackwardCheck<float> twin = check_backward<float>(ref, params, cuda_tile::attention_forward_host,
                                                                  cuda_tile::attention_backward_host);
          const std::string what = std::string(var.name) + " " + preset + " " + std::string(to_string(f)) +
                                   (causal ? " causal" : "");
          EXPECT_LE(twin.dq_error.rel_l2, twin.bound) << what << " dq";
          EXPECT_LE(twin.dk_error.rel_l2, twin.bound) << what << " dk";
          EXPECT_LE(twin.dv_error.rel_l2, twin.bound) << what << " dv";
          // The CPU backward from the twin's O and lse; dQ|dK|dV concatenated, as the check's grad.
          std::vector<float> c(3 * size);
          attention_backward<float>(shape, params, q.data(), k.data(), v.data(), twin.o.data(), twin.lse.data(),
                                    g.data(), c.data(), c.data() + size, c.data() + 2 * size);
          if (same_arithmetic(params.policy)) {
            EXPECT_TRUE(bit_equal(twin.grad, c)) << what << " vs CPU kernels";
          } else {
            // Both within the bound of the fp64 reference: of each other within twice the bound.
            EXPECT_LE(error_metrics(twin.grad, widen(c)).rel_l2, 2 * twin.bound) << what << " vs CPU kernels";
          }
        }
      }
    }
  }
}

TEST(TileMath, FlashErrorAtMostTwiceBaseline) {
  // FlashAttention's acceptance rule, the kernels (fa2) and the mixed reading against the framework
  // baseline at fp16/bf16 (16 KV tiles of 8 keys).
  const AttentionShape shape = make_shape(128, 16, false);
  const std::size_t size = static_cast<std::size_t>(shape.batch * shape.heads * 128 * 16);
  const std::vector<float> q0 = random_normal(size, 31), k0 = random_normal(size, 32), v0 = random_normal(size, 33);
  for (const char* reading : {"fa2", "mixed"}) {
    for (Format f : {Format::fp16, Format::bf16}) {
      const AttentionReference ref =
          make_reference(shape, make_policy(reading, f, AttentionKind::flash), widen(q0), widen(k0), widen(v0));
      double err[3];
      for (int i = 0; i < 3; ++i) {
        AttentionParams params = make_params(kVariants[i], make_policy(reading, f, kVariants[i].attention));
        params.block_kv = 8;
        err[i] = check_forward<float>(ref, params, cuda_tile::attention_forward_host).error.max_abs;
      }
      EXPECT_LE(err[1], 2 * err[0]) << reading << " " << to_string(f) << " flash kv_outer vs baseline";
      EXPECT_LE(err[2], 2 * err[0]) << reading << " " << to_string(f) << " flash q_outer vs baseline";
    }
  }
}

// The baseline's scale placements in the twin: forward and backward bit for bit with the CPU kernels
// (where they fuse) and within the bounds of the fp64 reference.
TEST(TileMath, BaselineScalePlacementsMatchTheCpuKernels) {
  const AttentionShape shape = make_shape(21, 12, true);
  const std::size_t size = static_cast<std::size_t>(shape.batch * shape.heads * 21 * 12);
  const std::vector<float> q0 = random_normal(size, 41), k0 = random_normal(size, 42), v0 = random_normal(size, 43);
  const std::vector<float> g0 = random_normal(size, 44);
  for (ScalePlacement placement : {ScalePlacement::fused, ScalePlacement::after, ScalePlacement::before}) {
    PrecisionPolicy policy = make_policy("fa2", Format::bf16, AttentionKind::baseline);
    policy.scale = placement;
    const AttentionReference ref = make_reference(shape, policy, widen(q0), widen(k0), widen(v0), widen(g0));
    const AttentionParams params = make_params(kVariants[0], policy);
    const ForwardCheck<float> twin = check_forward<float>(ref, params, cuda_tile::attention_forward_host);
    EXPECT_TRUE(twin.ok()) << to_string(placement) << ": " << twin.summary();
    const BackwardCheck<float> twin_b = check_backward<float>(ref, params, cuda_tile::attention_forward_host,
                                                              cuda_tile::attention_backward_host);
    EXPECT_TRUE(twin_b.ok()) << to_string(placement) << ": " << twin_b.summary();
    // fa2's baseline at bf16 multiplies on the tensor cores; its fp32 policy as the CPU kernels do.
    PrecisionPolicy wide = make_policy("fa2", Format::fp32, AttentionKind::baseline);
    wide.scale = placement;
    const AttentionReference ref32 = make_reference(shape, wide, widen(q0), widen(k0), widen(v0), widen(g0));
    const AttentionParams params32 = make_params(kVariants[0], wide);
    if (!same_arithmetic(wide)) continue;
    EXPECT_TRUE(bit_equal(check_forward<float>(ref32, params32, cuda_tile::attention_forward_host).o,
                          check_forward<float>(ref32, params32).o))
        << to_string(placement);
    EXPECT_TRUE(bit_equal(check_backward<float>(ref32, params32, cuda_tile::attention_forward_host,
                                                cuda_tile::attention_backward_host)
                              .grad,
                          check_backward<float>(ref32, params32).grad))
        << to_string(placement);
  }
}

// max_offset (Qiu & Yao's fix) in the twin: every reading's kernels (framework loops, fa2, fa3, the
// baseline) with beta = 2 on inputs whose row maxima repeat (keys 0 to 3 one vector with a large
// logit), forward and backward bit for bit with the CPU kernels (where they fuse) and within the
// bounds of the fp64 reference.
TEST(TileMath, MaxOffsetMatchesTheCpuKernels) {
  const AttentionShape shape = make_shape(37, 12, true);
  const std::int64_t n = 37, d = 12;
  const std::size_t size = static_cast<std::size_t>(shape.batch * shape.heads * n * d);
  std::vector<float> q0 = random_normal(size, 51), k0 = random_normal(size, 52), v0 = random_normal(size, 53);
  const std::vector<float> g0 = random_normal(size, 54);
  for (std::int64_t h = 0; h < shape.batch * shape.heads; ++h)
    for (std::int64_t j = 0; j < 4; ++j)
      for (std::int64_t t = 0; t < d; ++t) k0[(h * n + j) * d + t] = 3.0f * q0[(h * n + 5) * d + t];
  // bf16 (the tensor-core readings within the bounds, pure bit for bit with the CPU kernels) and fp32
  // (every reading bit for bit).
  for (const auto& reading : kReadings)
  for (Format f : {Format::bf16, Format::fp32}) {
    if (!reading.cuda) continue;
    const std::string preset(reading.name);
    for (const Variant& var : kVariants) {
      PrecisionPolicy policy = make_policy(preset, f, var.attention);
      policy.max_offset = 2.0;
      const AttentionReference ref = make_reference(shape, policy, widen(q0), widen(k0), widen(v0), widen(g0));
      const AttentionParams params = make_params(var, policy);
      const std::string what = std::string(var.name) + " " + preset + " " + std::string(to_string(f));
      const ForwardCheck<float> twin = check_forward<float>(ref, params, cuda_tile::attention_forward_host);
      EXPECT_TRUE(twin.ok()) << what << ": " << twin.summary();
      const BackwardCheck<float> twin_b = check_backward<float>(ref, params, cuda_tile::attention_forward_host,
                                                                cuda_tile::attention_backward_host);
      EXPECT_TRUE(twin_b.ok()) << what << ": " << twin_b.summary();
      if (!same_arithmetic(policy)) continue;
      const ForwardCheck<float> cpu = check_forward<float>(ref, params);
      EXPECT_TRUE(bit_equal(twin.o, cpu.o)) << what << " O";
      EXPECT_TRUE(bit_equal(twin.lse, cpu.lse)) << what << " lse";
      EXPECT_TRUE(bit_equal(twin_b.grad, check_backward<float>(ref, params).grad)) << what << " grad";
    }
  }
}

// A reading's row says whether the CUDA kernels run it (kReadings' .cuda: the sweep check and the help
// read it); the dispatch decides from the policies themselves. The two agree: a reading marked cuda has
// every policy of fp32, fp16 and bf16 (both kinds) accepted, any other has one refused.
TEST(TileMath, ReadingRowsSayWhatTheDispatchRuns) {
  for (const auto& reading : kReadings) {
    std::string refused;
    for (Format f : kCudaFormats)
      for (AttentionKind kind : {AttentionKind::flash, AttentionKind::baseline}) {
        try {
          EXPECT_EQ(cuda_tile::tile_storage_format(make_policy(reading.name, f, kind)), f) << reading.name;
        } catch (const UsageError& e) {
          refused = e.what();
        }
      }
    EXPECT_EQ(refused.empty(), reading.cuda) << reading.name << ": " << refused;
  }
  EXPECT_EQ(cuda_reading_names(), "pure, eager, fa2, fa3 and mixed");
}

TEST(TileMath, UnsupportedPoliciesAreRefusedWithTheirName) {
  AttentionParams params;
  params.policy = make_policy("pure", Format::tf32, AttentionKind::flash);
  const AttentionShape shape = make_shape(4, 2, false);
  std::vector<float> x(16), o(16);
  try {
    cuda_tile::attention_forward_host(shape, params, x.data(), x.data(), x.data(), o.data(), nullptr);
    FAIL() << "tf32 policy accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'pure'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tf32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fastudy
