// The trainer's building blocks against plain LibTorch: the kernel-backed attention (custom autograd
// function) in fp64 against autograd through matmul/softmax, and the emulated Linear's roundings.
// Shapes: B batch, H heads, N sequence, d head dim, D = H*d.
#include <gtest/gtest.h>

#include <cmath>

#include "src/train/libtorch.hpp"
#include "src/train/model.hpp"

namespace fastudy::train {
namespace {

// Causal attention of fused qkv [B, N, 3D] with plain torch ops (autograd does the backward).
torch::Tensor torch_attention(const torch::Tensor& qkv, int heads) {
  const std::int64_t B = qkv.size(0), N = qkv.size(1), D = qkv.size(2) / 3, d = D / heads;
  const auto split = qkv.view({B, N, 3, heads, d}).permute({2, 0, 3, 1, 4});  // [3, B, H, N, d]
  const torch::Tensor q = split[0], k = split[1], v = split[2];
  torch::Tensor s = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  const torch::Tensor mask = torch::ones({N, N}, torch::kBool).triu(1);
  s = s.masked_fill(mask, -std::numeric_limits<double>::infinity());
  const torch::Tensor o = torch::matmul(torch::softmax(s, -1), v);  // [B, H, N, d]
  return o.permute({0, 2, 1, 3}).reshape({B, N, D});
}

class KernelAttentionFp64 : public ::testing::TestWithParam<AttentionKind> {};

TEST_P(KernelAttentionFp64, ForwardAndBackwardMatchTorchAutograd) {
  const int B = 2, H = 2, N = 24, d = 8, D = H * d;
  torch::manual_seed(3);  // the test's inputs only; the trainer never uses the global generator
  const torch::Tensor qkv_ref = torch::randn({B, N, 3 * D}, torch::kDouble).requires_grad_(true);
  const torch::Tensor qkv_kern = qkv_ref.detach().clone().requires_grad_(true);
  const torch::Tensor dout = torch::randn({B, N, D}, torch::kDouble);

  AttentionSetup setup;
  setup.params.attention = GetParam();
  setup.params.policy = make_policy("pure", Format::fp64, GetParam());
  setup.params.block_q = 8;  // 3 x 3 tiles, several rescales per row
  setup.params.block_kv = 8;
  const torch::Tensor o_kern = kernel_attention(qkv_kern, H, setup, 0);
  const torch::Tensor o_ref = torch_attention(qkv_ref, H);
  o_kern.backward(dout);
  o_ref.backward(dout);

  // Both sides are fp64 evaluations of the same sums. A forward output is a softmax-weighted sum of
  // N values after a length-d dot product; the backward chains two more such sums (dP = dO.V^T,
  // dQ = dS.K), so each result carries at most about c*(N + d)*u relative to the magnitude of its
  // terms, c ~ 4 covering exp/log/division steps. Inputs are N(0,1), so terms are O(10):
  // tol = 4 * (N + d) * u * 10 * 8 (a factor 8 for the heaviest-tailed of the few thousand draws).
  const double u = std::ldexp(1.0, -53);
  const double tol = 4.0 * (N + d) * u * 10.0 * 8.0;
  EXPECT_LT((o_kern - o_ref).abs().max().item<double>(), tol);
  EXPECT_LT((qkv_kern.grad() - qkv_ref.grad()).abs().max().item<double>(), tol);
}

INSTANTIATE_TEST_SUITE_P(Kinds, KernelAttentionFp64, ::testing::Values(AttentionKind::baseline, AttentionKind::flash),
                         [](const auto& info) { return std::string(to_string(info.param)); });

bool representable(const torch::Tensor& t, Format f) {
  const torch::Tensor c = t.detach().contiguous();
  for (std::int64_t i = 0; i < c.numel(); ++i) {
    const float v = c.data_ptr<float>()[i];
    if (round_to(f, v) != v) return false;
  }
  return true;
}

TEST(KernelAttention, Bf16OutputsAndGradientsAreInTheFormat) {
  // The model skips re-rounding the attention output and dQKV when the policy stores them in the
  // training format (model.cpp): check that the kernels deliver exactly that.
  torch::manual_seed(6);
  const torch::Tensor qkv = torch::randn({2, 16, 3 * 8}).requires_grad_(true);
  AttentionSetup setup;
  setup.params.block_q = 8;
  setup.params.block_kv = 8;
  for (AttentionKind kind : {AttentionKind::baseline, AttentionKind::flash}) {
    setup.params.attention = kind;
    setup.params.policy = make_policy("fa2", Format::bf16, kind);
    qkv.mutable_grad() = torch::Tensor();
    const torch::Tensor o = kernel_attention(qkv, 2, setup, 0);
    o.backward(round_copy(torch::randn({2, 16, 8}), Format::bf16));
    EXPECT_TRUE(representable(o, Format::bf16)) << to_string(kind);
    EXPECT_TRUE(representable(qkv.grad(), Format::bf16)) << to_string(kind);
  }
}

TEST(EmulatedLinear, Bf16RoundsOutputsAndGradientsTf32OnlyInputs) {
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({5, 7}).requires_grad_(true);
  const torch::Tensor w = torch::randn({3, 7}).requires_grad_(true);
  const torch::Tensor b = torch::randn({3}).requires_grad_(true);
  const torch::Tensor y = emulated_linear(x, w, b, Emulation::of(Format::bf16));
  y.backward(torch::randn({5, 3}));
  EXPECT_TRUE(representable(y, Format::bf16));
  EXPECT_TRUE(representable(x.grad(), Format::bf16));
  EXPECT_TRUE(representable(w.grad(), Format::bf16));
  EXPECT_TRUE(representable(b.grad(), Format::bf16));
  // The product of bf16-rounded inputs with fp32 accumulation, then rounded once.
  const torch::Tensor xr = round_copy(x.detach(), Format::bf16), wr = round_copy(w.detach(), Format::bf16);
  const torch::Tensor expect = round_copy(torch::addmm(round_copy(b.detach(), Format::bf16), xr, wr.t()), Format::bf16);
  EXPECT_TRUE(torch::equal(y.detach(), expect));

  // tf32: inputs rounded, output kept in fp32 (not representable in tf32 in general).
  const torch::Tensor y32 = emulated_linear(x.detach(), w.detach(), b.detach(), Emulation::of(Format::tf32));
  const torch::Tensor expect32 = torch::addmm(b.detach(), round_copy(x.detach(), Format::tf32),
                                              round_copy(w.detach(), Format::tf32).t());
  EXPECT_TRUE(torch::equal(y32, expect32));
  EXPECT_FALSE(representable(y32, Format::tf32));

  // fp32: plain torch.
  EXPECT_TRUE(torch::equal(emulated_linear(x.detach(), w.detach(), b.detach(), Emulation::of(Format::fp32)),
                           torch::addmm(b.detach(), x.detach(), w.detach().t())));
}

TEST(Gpt, Fp64ModelMatchesFp32ModelToFp32Roundoff) {
  // The same initial weights through the fp32 and the fp64 model: the losses agree to a few fp32 ulps
  // times the depth of the computation (~100 rounded steps): |diff| < 100 * 2^-24 * loss.
  ModelConfig m;
  m.vocab = 16; m.d_model = 16; m.heads = 2; m.layers = 2; m.seq_len = 16; m.mlp_ratio = 2;
  Gpt g32(m, torch::kFloat), g64(m, torch::kDouble);
  g32.init(InitScheme::normal, 9);
  g64.init(InitScheme::normal, 9);
  AttentionSetup a32, a64;
  a32.params.policy = make_policy("pure", Format::fp32, AttentionKind::flash);
  a64.params.policy = make_policy("pure", Format::fp64, AttentionKind::flash);
  torch::manual_seed(5);
  const torch::Tensor tokens = torch::randint(0, 16, {3, 17}, torch::kLong);
  const double l32 = g32.loss(tokens, Emulation::of(Format::fp32), a32).item<double>();
  const double l64 = g64.loss(tokens, Emulation::of(Format::fp64), a64).item<double>();
  EXPECT_NEAR(l32, l64, 100 * std::ldexp(1.0, -24) * l64);
}

}  // namespace
}  // namespace fastudy::train
