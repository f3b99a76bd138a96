// LibTorch's own ops on the CPU as microbenchmark rows (src/train/microbench_torch.hpp): the framework
// baseline and FlashAttention-2 as a loop of LibTorch ops are attention (at fp64 they agree with the fp64
// golden value to fp64's rounding, forward and backward, with and without causal masking, on tiles that
// do not divide N); at bf16 they agree bit for bit with the eager reading on at least 99% of the output
// elements (forward: both kinds; backward: the baseline; head dims with an exact and an inexact scale,
// normal and outlier inputs), the reading run with LibTorch's own ops (FrameworkOps, probed: on an
// AVX-512 CPU its oneDNN GEMM, on an AVX2 CPU its cpublas GEMM adding in bf16); the same
// bits on one and two LibTorch threads; fp16 refused with LibTorch's reason.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "fastudy/version.hpp"
#include "src/train/microbench_torch.hpp"
#include "kernels/check.hpp"
#include "src/train/libtorch.hpp"

namespace fastudy {
namespace {

MicrobenchPoint point(Pass pass, Format f, int seq_len, int head_dim, int block_q, int block_kv, bool causal,
                      InputDistribution distribution = InputDistribution::normal) {
  MicrobenchPoint p;
  p.pass = pass;
  p.format = f;
  p.policy = "eager";
  p.seq_len = seq_len;
  p.head_dim = head_dim;
  p.block_q = block_q;
  p.block_kv = block_kv;
  p.causal = causal;
  p.batch = 1;
  p.heads = 2;
  p.distribution = distribution;
  return p;
}

MicrobenchRun prepared(const MicrobenchPoint& p) {
  MicrobenchRun run;
  run_microbench_point(p, std::nullopt, 1, nullptr, &run);
  return run;
}

const char* const kAlgorithms[] = {"torch_baseline", "torch_baseline_before", "torch_flash"};

// At fp64 every op rounds to fp64, so each algorithm is the golden value up to fp64's rounding: an
// output (or gradient) element is a softmax-weighted sum of N terms of d-long dot products, so its
// relative error is about (N + d + c) u with u = 2^-53 (a few exps, logs and divisions per term add
// the constant c; the backward's chain of products and sums adds a few such terms). 8 (N + d) u
// covers them with room, and a wrong tile, mask or index is off by far more than that.
TEST(MicrobenchTorch, Fp64IsTheGoldenValue) {
  for (Pass pass : kAllPasses)
    for (bool causal : {false, true}) {
      const MicrobenchPoint p = point(pass, Format::fp64, 50, 16, 16, 12, causal);  // tiles do not divide N
      const MicrobenchRun run = prepared(p);
      const double bound = 8.0 * (p.seq_len + p.head_dim) * unit_roundoff(Format::fp64);
      for (const char* a : kAlgorithms) {
        const MicrobenchRow row = microbench_torch_row(run, a);
        EXPECT_LT(row.rel_l2, bound) << a << " " << to_string(pass) << " causal " << causal;
        EXPECT_EQ(row.algorithm, a);
        EXPECT_EQ(row.tiles_kv, std::string(a) == "torch_flash" ? 5 : 1);
      }
    }
}

// Whether this CPU has what oneDNN's bf16 GEMM needs (mkldnn_bf16_device_check in LibTorch's
// aten/src/ATen/native/mkldnn/Utils.h: AVX-512 BW, VL and DQ).
bool cpu_has_onednn_bf16() {
  return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
}

// Which ops LibTorch's CPU kernels run (FrameworkOps), probed on LibTorch itself: Debian's LibTorch 1.13
// rounds the scalar to bf16 and the softmax backward's row dot (measured with its Python binding on
// 10^5 values each), and multiplies bf16 matrices in oneDNN where the CPU has AVX-512 (BW, VL, DQ), else
// in its own cpublas GEMM, which adds most of them in bf16 (measured on an AVX2 CPU: P V, P^T dO, dS K
// and dS^T Q on every element); a later LibTorch may do none of this, and is then compared with the
// readings as they are.
TEST(MicrobenchTorch, ProbesLibTorchsOwnOps) {
  if (std::string(FASTUDY_TORCH_VERSION).rfind("1.", 0) == 0) {
    EXPECT_EQ(torch_cpu_ops(), cpu_has_onednn_bf16() ? FrameworkOps::libtorch1_cpu : FrameworkOps::libtorch1_cpublas)
        << torch_cpu_machine();
  }
  EXPECT_EQ(torch_cpu_ops(), torch_cpu_ops());  // asked once
}

// What the rows name as the reading they are compared with: the reading run with the code's scale
// placement and LibTorch's ops, "READING[/scale_PLACEMENT][/OPS] KIND".
std::string compared_reading(const std::string& algorithm) {
  const std::string ops = torch_cpu_ops() == FrameworkOps::opmath ? "" : "/" + std::string(to_string(torch_cpu_ops()));
  if (algorithm == "torch_flash") return "eager" + ops + " flash";
  if (algorithm == "torch_baseline_before") return "eager/scale_before" + ops + " baseline";
  return "eager" + ops + " baseline";
}

// The promise of the eager reading (docs/microbench.md "Real kernels"): at bf16, the framework's ops give the
// reading's bits (run with the code's scale placement and LibTorch's ops) on at least 99% of the output
// elements, forward, on normal and outlier inputs, with and without causal masking, with the scale
// 1/sqrt(64) = 1/8 exact and 1/sqrt(48) not a bf16 value. The rest differ where LibTorch's fused
// softmax sums its row in another order (eight fp32 lanes) and multiplies by the reciprocal of the sum,
// or a matmul's fp32 sum takes another order: one element one bf16 ulp apart moves the elements of its
// output row that are small against the row's largest by a few of their own ulps.
// Every algorithm against the reading it names, at d = 64 and 48, normal and outlier inputs, causal or
// not: at least 99% of the elements bit-identical, N = seq_len.
void expect_eager_agreement(Pass pass, int seq_len) {
  for (int head_dim : {64, 48})
    for (InputDistribution distribution : {InputDistribution::normal, InputDistribution::outliers})
      for (bool causal : {false, true}) {
        const MicrobenchRun run = prepared(point(pass, Format::bf16, seq_len, head_dim, 64, 16, causal, distribution));
        for (const char* a : kAlgorithms) {
          const MicrobenchRow row = microbench_torch_row(run, a);
          EXPECT_GE(row.bit_identical, 0.99) << a << " " << to_string(pass) << " d " << head_dim << " "
                                             << to_string(distribution) << " causal " << causal;
          EXPECT_EQ(row.vs_reading, compared_reading(a));
        }
      }
}

TEST(MicrobenchTorch, EagerForwardIsLibTorchsBitsOnNinetyNinePercent) { expect_eager_agreement(Pass::forward, 256); }

// The same for the backward: the framework baseline's (autograd of matmul, scale, softmax, matmul), both
// scale placements, and FA-2's Algorithm 2 as ops (eager's flash loop stores its running gradients in
// bf16: each tile's product is an op of its own): dQ, dK, dV on at least 99% of their elements, normal
// and outlier inputs.
TEST(MicrobenchTorch, EagerBackwardIsLibTorchsBitsOnNinetyNinePercent) { expect_eager_agreement(Pass::backward, 128); }

// LibTorch's ops do not depend on the number of its threads on these shapes: the rows are the same bits
// on one and two threads (the microbench runs them on the rank's threads).
TEST(MicrobenchTorch, SameBitsOnOneAndTwoThreads) {
  const int threads = torch::get_num_threads();
  for (Pass pass : kAllPasses) {
    const MicrobenchRun run = prepared(point(pass, Format::bf16, 96, 32, 32, 16, true));
    for (const char* a : kAlgorithms) {
      torch::set_num_threads(1);
      const std::vector<double> one = torch_attention(run, a).values;
      torch::set_num_threads(2);
      const std::vector<double> two = torch_attention(run, a).values;
      EXPECT_EQ(one, two) << a << " " << to_string(pass);
    }
  }
  torch::set_num_threads(threads);
}

TEST(MicrobenchTorch, RefusesWhatLibTorchCannotRunOnTheCpu) {
  std::string why;
  EXPECT_TRUE(torch_cpu_runs(Format::bf16, &why));
  EXPECT_EQ(why, "");
  EXPECT_FALSE(torch_cpu_runs(Format::fp8_e4m3, &why));
  EXPECT_NE(why.find("no fp8_e4m3 tensors"), std::string::npos) << why;
  // Debian's LibTorch 1.13 has no fp16 matmul on the CPU; later versions may.
  if (std::string(FASTUDY_TORCH_VERSION).rfind("1.", 0) == 0) {
    EXPECT_FALSE(torch_cpu_runs(Format::fp16, nullptr));
  }
  if (!torch_cpu_runs(Format::fp16, &why)) {
    EXPECT_NE(why.find("no fp16 matmul on the CPU"), std::string::npos) << why;
    EXPECT_THROW(torch_attention(prepared(point(Pass::forward, Format::fp16, 16, 8, 8, 8, false)), "torch_flash"),
                 UsageError);
  }
  MicrobenchPoint kv = point(Pass::forward, Format::bf16, 16, 8, 8, 8, false);
  kv.loop_order = LoopOrder::kv_outer;
  EXPECT_THROW(torch_attention(prepared(kv), "torch_flash"), UsageError);  // FA-2's loop is q_outer
  EXPECT_NO_THROW(torch_attention(prepared(kv), "torch_baseline"));
  EXPECT_THROW(torch_attention(prepared(kv), "sdpa_flash"), UsageError);  // not a CPU algorithm
}

}  // namespace
}  // namespace fastudy
