// CPU tests of the CUDA kernels' numerics: the host twin (kernels/cuda/tile_reference.cpp) runs the
// same tile math (kernels/cuda/tile_math.hpp) the device kernels run, in the same order. Checked
// against the fp64 reference with unit-roundoff bounds, and against the CPU kernels of
// kernels/attention.hpp in the same policy. Runs on every machine; no GPU involved.
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
  p.kind = var.kind;
  p.order = var.order;
  p.policy = policy;
  p.block_q = 8;
  p.block_kv = 10;  // ragged last tile for N = 37
  p.threads = 1;
  return p;
}

// The CPU kernels fuse their dot products (and expf) on the AVX2 and AVX-512 builds.
bool cpu_kernels_fuse() { return attention_isa_name() != "generic"; }

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

TEST(TileMath, RoundingObjectsRoundAsThePolicySays) {
  using Mixed16 = cuda_tile::TileRounding<Format::fp16, Format::fp32>;
  using Pure16 = cuda_tile::TileRounding<Format::bf16, Format::bf16>;
  const float x = 1.0f + std::ldexp(1.0f, -12);  // below half an fp16 ulp above 1: rounds to 1 in fp16
  EXPECT_EQ(Mixed16::p(x), 1.0f);
  EXPECT_EQ(Mixed16::accum(x), x);  // fp32 accumulator: unchanged
  EXPECT_EQ(Pure16::stats(1.0f + std::ldexp(1.0f, -9)), 1.0f);  // bf16 ulp at 1 is 2^-7
}

void check_forward(std::int64_t n, std::int64_t d) {
  for (bool causal : {false, true}) {
    const AttentionShape shape = make_shape(n, d, causal);
    const std::size_t size = static_cast<std::size_t>(shape.batch * shape.heads * n * d);
    const std::vector<float> q0 = random_normal(size, 11), k0 = random_normal(size, 12), v0 = random_normal(size, 13);
    for (const char* preset : {"pure", "mixed"}) {
      for (Format f : kCudaFormats) {
        const PrecisionPolicy policy = make_policy(preset, f);
        const std::vector<float> q = rounded(q0, f), k = rounded(k0, f), v = rounded(v0, f);
        std::vector<double> ref(size), ref_lse(size / d);
        attention_forward_reference(shape, widen(q).data(), widen(k).data(), widen(v).data(), ref.data(),
                                    ref_lse.data());
        const double bound = forward_bound(policy, shape, score_magnitude(shape, q, k), max_abs(v), 10);
        for (const Variant& var : kVariants) {
          const AttentionParams params = make_params(var, policy);
          std::vector<float> o(size), lse(size / d), o_cpu(size), lse_cpu(size / d);
          const AttentionStats st = cuda_tile::attention_forward_host(shape, params, q.data(), k.data(), v.data(),
                                                                      o.data(), lse.data());
          const std::string what = std::string(var.name) + " " + preset + " " + std::string(to_string(f)) +
                                   (causal ? " causal" : "");
          EXPECT_LE(max_abs_diff(o, ref), bound) << what;
          // lse = m + log l: the same relative error as l plus u_stats |lse| when stored.
          EXPECT_LE(max_abs_diff(lse, ref_lse), bound / max_abs(v) * (1 + *std::max_element(
                                                    ref_lse.begin(), ref_lse.end(),
                                                    [](double a, double b) { return std::fabs(a) < std::fabs(b); })))
              << what;
          // The CPU kernels take the same rounding steps in the same order with the same expf: on an
          // instruction set with FMA (their dot products fuse, as the twin's and the GPU's do) the
          // results are equal bit for bit; on the generic SSE build only within the bound.
          const AttentionStats st_cpu =
              attention_forward<float>(shape, params, q.data(), k.data(), v.data(), o_cpu.data(), lse_cpu.data());
          if (cpu_kernels_fuse()) {
            EXPECT_TRUE(bit_equal(o, o_cpu)) << what << " O vs CPU kernels (" << attention_isa_name() << ")";
            EXPECT_TRUE(bit_equal(lse, lse_cpu)) << what << " lse vs CPU kernels";
          } else {
            EXPECT_LE(max_abs_diff(o, widen(o_cpu)), bound) << what << " vs CPU kernels";
          }
          EXPECT_EQ(st.tiles_kv, st_cpu.tiles_kv) << what;
          EXPECT_DOUBLE_EQ(st.rescales_per_row, st_cpu.rescales_per_row) << what;
        }
      }
    }
  }
}

TEST(TileMath, ForwardWithinUnitRoundoffBoundOfReference) { check_forward(37, 12); }
TEST(TileMath, ForwardSingleTileAndTinyHeads) { check_forward(7, 3); }

TEST(TileMath, BackwardWithinUnitRoundoffBoundOfReference) {
  for (bool causal : {false, true}) {
    const AttentionShape shape = make_shape(21, 8, causal);
    const std::size_t size = static_cast<std::size_t>(shape.batch * shape.heads * 21 * 8);
    const std::vector<float> q0 = random_normal(size, 21), k0 = random_normal(size, 22), v0 = random_normal(size, 23);
    const std::vector<float> g0 = random_normal(size, 24);
    for (const char* preset : {"pure", "mixed"}) {
      for (Format f : kCudaFormats) {
        const PrecisionPolicy policy = make_policy(preset, f);
        const std::vector<float> q = rounded(q0, f), k = rounded(k0, f), v = rounded(v0, f), g = rounded(g0, f);
        std::vector<double> rq(size), rk(size), rv(size);
        attention_backward_reference(shape, widen(q).data(), widen(k).data(), widen(v).data(), widen(g).data(),
                                     rq.data(), rk.data(), rv.data());
        const double bound = backward_bound(policy, shape, score_magnitude(shape, q, k));
        for (const Variant& var : kVariants) {
          const AttentionParams params = make_params(var, policy);
          std::vector<float> o(size), lse(size / 8), dq(size), dk(size), dv(size);
          cuda_tile::attention_forward_host(shape, params, q.data(), k.data(), v.data(), o.data(), lse.data());
          cuda_tile::attention_backward_host(shape, params, q.data(), k.data(), v.data(), o.data(), lse.data(),
                                             g.data(), dq.data(), dk.data(), dv.data());
          const std::string what = std::string(var.name) + " " + preset + " " + std::string(to_string(f)) +
                                   (causal ? " causal" : "");
          EXPECT_LE(rel_l2(dq, rq), bound) << what << " dq";
          EXPECT_LE(rel_l2(dk, rk), bound) << what << " dk";
          EXPECT_LE(rel_l2(dv, rv), bound) << what << " dv";
          if (cpu_kernels_fuse()) {
            std::vector<float> cq(size), ck(size), cv(size);
            attention_backward<float>(shape, params, q.data(), k.data(), v.data(), o.data(), lse.data(), g.data(),
                                      cq.data(), ck.data(), cv.data());
            EXPECT_TRUE(bit_equal(dq, cq) && bit_equal(dk, ck) && bit_equal(dv, cv)) << what << " vs CPU kernels";
          }
        }
      }
    }
  }
}

TEST(TileMath, MixedFlashErrorAtMostTwiceBaseline) {
  // FlashAttention's acceptance rule in the mixed policy at fp16/bf16 (16 KV tiles of 8 keys).
  const AttentionShape shape = make_shape(128, 16, false);
  const std::size_t size = static_cast<std::size_t>(shape.batch * shape.heads * 128 * 16);
  const std::vector<float> q0 = random_normal(size, 31), k0 = random_normal(size, 32), v0 = random_normal(size, 33);
  for (Format f : {Format::fp16, Format::bf16}) {
    const PrecisionPolicy policy = make_policy("mixed", f);
    const std::vector<float> q = rounded(q0, f), k = rounded(k0, f), v = rounded(v0, f);
    std::vector<double> ref(size);
    attention_forward_reference(shape, widen(q).data(), widen(k).data(), widen(v).data(), ref.data(), nullptr);
    double err[3];
    for (int i = 0; i < 3; ++i) {
      AttentionParams params = make_params(kVariants[i], policy);
      params.block_kv = 8;
      std::vector<float> o(size);
      cuda_tile::attention_forward_host(shape, params, q.data(), k.data(), v.data(), o.data(), nullptr);
      err[i] = max_abs_diff(o, ref);
    }
    EXPECT_LE(err[1], 2 * err[0]) << to_string(f) << " flash q_outer vs baseline";
    EXPECT_LE(err[2], 2 * err[0]) << to_string(f) << " flash kv_outer vs baseline";
  }
}

TEST(TileMath, UnsupportedPoliciesAreRefusedWithTheirName) {
  AttentionParams params;
  params.policy = make_policy("pure", Format::tf32);
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
