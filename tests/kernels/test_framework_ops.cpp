// How the framework kinds' matmuls add their products under each FrameworkOps (kernels/attention.hpp):
// opmath and libtorch1_cpu (oneDNN's GEMM) sum in fp32 and round the output once; libtorch1_cpublas
// (LibTorch 1.x's own CPU GEMM, on CPUs without AVX-512) adds each product into the bf16 output in
// order, acc = bf16(acc + bf16(a b)). Constructed inputs with known answers, forward and backward, for
// the baseline and the framework flash loop (eager), so that the mode is pinned on every machine, also
// where LibTorch itself runs oneDNN (tests/train/test_microbench_torch.cpp compares with LibTorch).
//
// B batch, H heads, N sequence, d head dim; here B = H = 1, N = 4, d = 1.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/attention.hpp"

namespace fastudy {
namespace {

// Q = 0, so every score is 0 and the baseline's P is exactly 1/4 (flash: P = exp(0) = 1, l = 4).
// V (and dO) = (1, 2^-9, 2^-9, 2^-9): the products 1/4 and three 2^-11 (a quarter of bf16's spacing 2^-9
// at 1/4). Summed in fp32 they give 1/4 + 0.75 2^-9, which rounds to 1/4 + 2^-9; added one at a time into
// a bf16 accumulator each 2^-11 rounds away and O stays 1/4. Flash's P V (1 + 3 2^-9 against bf16's
// spacing 2^-7 at 1) behaves the same, and O = (P V) / 4.
constexpr float kFp32Sum = 0.25f + 0x1p-9f;
constexpr float kBf16Sum = 0.25f;

const std::vector<float> kQ(4, 0.0f), kK{1.0f, 1.0f, 1.0f, 1.0f};
const std::vector<float> kV{1.0f, 0x1p-9f, 0x1p-9f, 0x1p-9f};

AttentionShape shape() {
  AttentionShape s;
  s.seq_len = 4;
  s.head_dim = 1;
  return s;
}

AttentionParams eager(AttentionKind kind, FrameworkOps ops) {
  AttentionParams p;
  p.attention = kind;
  p.policy = make_policy("eager", Format::bf16, kind);
  p.policy.framework_ops = ops;
  p.block_q = 4;
  p.block_kv = 4;
  p.threads = 1;
  return p;
}

float expected(FrameworkOps ops) { return ops == FrameworkOps::libtorch1_cpublas ? kBf16Sum : kFp32Sum; }

std::string name(AttentionKind kind, FrameworkOps ops) {
  return std::string(to_string(kind)) + " under " + std::string(to_string(ops));
}

TEST(FrameworkOps, PvAddsInTheFormatOnlyUnderLibTorchsCpublas) {
  for (AttentionKind kind : {AttentionKind::baseline, AttentionKind::flash})
    for (FrameworkOps ops : {FrameworkOps::opmath, FrameworkOps::libtorch1_cpu, FrameworkOps::libtorch1_cpublas}) {
      std::vector<float> o(4), lse(4);
      attention_forward<float>(shape(), eager(kind, ops), kQ.data(), kK.data(), kV.data(), o.data(), lse.data());
      for (float x : o) EXPECT_EQ(x, expected(ops)) << name(kind, ops);
    }
}

// dV_j = sum_i P_ij dO_i over the queries (autograd's P^T dO; FA-2's backward as ops, one tile), with dO
// = V's values: the same sums as the forward's.
TEST(FrameworkOps, GradientMatmulsAddInTheFormatOnlyUnderLibTorchsCpublas) {
  for (AttentionKind kind : {AttentionKind::baseline, AttentionKind::flash})
    for (FrameworkOps ops : {FrameworkOps::opmath, FrameworkOps::libtorch1_cpu, FrameworkOps::libtorch1_cpublas}) {
      const AttentionParams params = eager(kind, ops);
      std::vector<float> o(4), lse(4), dq(4), dk(4), dv(4);
      attention_forward<float>(shape(), params, kQ.data(), kK.data(), kV.data(), o.data(), lse.data());
      attention_backward<float>(shape(), params, kQ.data(), kK.data(), kV.data(), o.data(), lse.data(), kV.data(),
                                dq.data(), dk.data(), dv.data());
      for (float x : dv) EXPECT_EQ(x, expected(ops)) << name(kind, ops);
    }
}

}  // namespace
}  // namespace fastudy
