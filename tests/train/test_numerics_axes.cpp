// The arithmetic axes of [numerics] (matmul, split_k, layernorm, gelu, recompute): each value computes
// exactly the arithmetic src/train/model.hpp documents, checked against fp64 references with bounds
// derived from the unit roundoff, and each is live in training (recompute, a control, is not: its
// weights are bit-identical). Shapes: M rows (tokens), K reduction length, N output columns.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "jobs/estimate.hpp"
#include "src/train/engine.hpp"
#include "src/train/libtorch.hpp"
#include "src/train/model.hpp"
#include "tests/train/tiny.hpp"

namespace fastudy::train {
namespace {

const double kU32 = std::ldexp(1.0, -24);   // fp32 unit roundoff
const double kU64 = std::ldexp(1.0, -53);   // fp64 unit roundoff
const double kUBf16 = std::ldexp(1.0, -8);  // bf16 unit roundoff (8 significant bits)

// A copy of a float tensor with every element rounded by the kernels' scalar round_to.
torch::Tensor rounded(const torch::Tensor& t, Format f) {
  torch::Tensor c = t.contiguous().clone();
  float* x = c.data_ptr<float>();
  for (std::int64_t i = 0; i < c.numel(); ++i) x[i] = round_to(f, x[i]);
  return c;
}

// sum_k |a_ik| |b_kj| in fp64: the scale of a dot product's rounding error.
torch::Tensor abs_scale(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::mm(a.to(torch::kDouble).abs(), b.to(torch::kDouble).abs());
}

// max over elements of |got - want| / scale (scale > 0 everywhere for these random inputs).
double worst_ratio(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& scale) {
  return ((got.to(torch::kDouble) - want) .abs() / scale).max().item<double>();
}

TEST(SplitK, RangesAreContiguousAndAsEqualAsPossible) {
  using R = std::vector<std::pair<std::int64_t, std::int64_t>>;
  EXPECT_EQ(split_ranges(10, 1), (R{{0, 10}}));
  EXPECT_EQ(split_ranges(10, 3), (R{{0, 4}, {4, 7}, {7, 10}}));  // the first 10 mod 3 ranges one longer
  EXPECT_EQ(split_ranges(12, 4), (R{{0, 3}, {3, 6}, {6, 9}, {9, 12}}));
  EXPECT_EQ(split_ranges(3, 5), (R{{0, 1}, {1, 2}, {2, 3}}));  // k > K is clamped to K
}

TEST(SplitK, IsTheInOrderSumOfFp32PartialProducts) {
  torch::manual_seed(11);  // the test's inputs only
  const std::int64_t M = 9, K = 64, N = 7;
  const torch::Tensor a = torch::randn({M, K}), b = torch::randn({K, N});
  const torch::Tensor whole = numerics_matmul(a, b, MatmulArithmetic::fp32, 1);
  const torch::Tensor ref = torch::mm(a.to(torch::kDouble), b.to(torch::kDouble));
  const torch::Tensor scale = abs_scale(a, b);
  bool differs = false;
  for (int k : {2, 3, 5}) {
    SCOPED_TRACE(k);
    const torch::Tensor got = numerics_matmul(a, b, MatmulArithmetic::fp32, k);
    // The documented arithmetic: fp32 products of contiguous copies of the ranges, added in order.
    torch::Tensor want;
    for (const auto& [k0, k1] : split_ranges(K, k)) {
      const torch::Tensor part = torch::mm(a.narrow(1, k0, k1 - k0).contiguous(), b.narrow(0, k0, k1 - k0).contiguous());
      if (!want.defined()) {
        want = part;
        continue;
      }
      float* w = want.data_ptr<float>();
      const float* p = part.data_ptr<float>();
      for (std::int64_t i = 0; i < want.numel(); ++i) w[i] = w[i] + p[i];
    }
    EXPECT_TRUE(torch::equal(got, want));
    // Any order of the K - 1 additions (and the partials' own) keeps the fp32 error within
    // gamma_K ~ K u per unit of sum |a||b| (Higham, Thm 3.1), split or not.
    EXPECT_LT(worst_ratio(got, ref, scale), K * kU32);
    differs = differs || !torch::equal(got, whole);
  }
  EXPECT_TRUE(differs) << "splitting the reduction never changed a bit: the axis would be dead";
}

TEST(MatmulArithmetic, Tf32AndBf16AreFp32ProductsOfRoundedInputs) {
  torch::manual_seed(12);
  const std::int64_t M = 8, K = 64, N = 6;
  const torch::Tensor a = torch::randn({M, K}), b = torch::randn({K, N});
  const torch::Tensor plain = numerics_matmul(a, b, MatmulArithmetic::fp32, 1);
  for (auto [arith, f] : {std::pair{MatmulArithmetic::tf32, Format::tf32}, std::pair{MatmulArithmetic::bf16, Format::bf16}}) {
    SCOPED_TRACE(to_string(arith));
    const torch::Tensor ar = rounded(a, f), br = rounded(b, f);
    const torch::Tensor got = numerics_matmul(a, b, arith, 1);
    EXPECT_TRUE(torch::equal(got, torch::mm(ar, br)));
    // Products of tf32/bf16 values are exact in fp32 (at most 2 x 11 significant bits), so against
    // the fp64 product of the rounded inputs only the fp32 accumulation errs: <= gamma_K ~ K u32.
    EXPECT_LT(worst_ratio(got, torch::mm(ar.to(torch::kDouble), br.to(torch::kDouble)), abs_scale(ar, br)), K * kU32);
    EXPECT_FALSE(torch::equal(got, plain));
  }
}

TEST(MatmulArithmetic, Bf16x3ErrorIsFarBelowBf16Roundoff) {
  torch::manual_seed(13);
  const std::int64_t M = 8, K = 64, N = 6;
  const torch::Tensor a = torch::randn({M, K}), b = torch::randn({K, N});
  const torch::Tensor ref = torch::mm(a.to(torch::kDouble), b.to(torch::kDouble));
  const torch::Tensor scale = abs_scale(a, b);
  const double x3 = worst_ratio(numerics_matmul(a, b, MatmulArithmetic::bf16x3, 1), ref, scale);
  const double x3_split = worst_ratio(numerics_matmul(a, b, MatmulArithmetic::bf16x3, 4), ref, scale);
  const double bf16 = worst_ratio(numerics_matmul(a, b, MatmulArithmetic::bf16, 1), ref, scale);
  // a = a_hi + a_lo + r_a with |a_lo| <= u_b |a| and |r_a| <= u_b^2 |a| (a - a_hi is exact, a_lo its
  // bf16 rounding), so each product drops a_lo b_lo + r_a b + a r_b: <= 3 u_b^2 |a b|. The three fp32
  // products err by <= gamma_K each and the two final adds by u32 each: in all
  // (3 u_b^2 + (K + 2) u32) sum |a||b|, times 1.1 for the second-order terms. About 5e-5, against
  // the bf16 unit roundoff 3.9e-3.
  const double tol = 1.1 * (3.0 * kUBf16 * kUBf16 + (K + 2) * kU32);
  EXPECT_LT(x3, tol);
  EXPECT_LT(x3_split, tol);
  EXPECT_LT(tol, kUBf16 / 50);
  EXPECT_GT(bf16, 10.0 * x3) << "plain bf16 should be far less accurate than bf16x3";
}

TEST(MatmulArithmetic, Fp64ContainerRoundsTheOperandsAndAccumulatesInFp64) {
  torch::manual_seed(14);
  const std::int64_t K = 32;
  const torch::Tensor a = torch::randn({5, K}, torch::kDouble), b = torch::randn({K, 4}, torch::kDouble);
  const torch::Tensor got = numerics_matmul(a, b, MatmulArithmetic::bf16, 1);
  const torch::Tensor ar = round_copy(a, Format::bf16), br = round_copy(b, Format::bf16);
  EXPECT_LT(worst_ratio(got, torch::mm(ar, br), abs_scale(ar, br)), K * kU64);
  EXPECT_GT(worst_ratio(got, torch::mm(a, b), abs_scale(a, b)), 1e3 * K * kU64);  // the operands were rounded
}

// emulated_linear runs its three matmuls with the arithmetic: Y = X W^T + b (bias after the
// reduction), dX = G W (reduction over the output features), dW = G^T X (over the tokens).
TEST(MatmulArithmetic, LinearForwardAndBothBackwardProductsUseIt) {
  torch::manual_seed(15);
  const std::int64_t M = 12, in = 20, out = 10;
  const torch::Tensor x = torch::randn({M, in}).requires_grad_(true);
  const torch::Tensor w = torch::randn({out, in}).requires_grad_(true);
  const torch::Tensor b = torch::randn({out}).requires_grad_(true);
  const torch::Tensor g = torch::randn({M, out});
  for (MatmulArithmetic arith :
       {MatmulArithmetic::fp32, MatmulArithmetic::tf32, MatmulArithmetic::bf16, MatmulArithmetic::bf16x3}) {
    for (int k : {1, 3}) {
      SCOPED_TRACE(std::string(to_string(arith)) + " split_k " + std::to_string(k));
      NumericsConfig n;
      n.matmul = arith;
      n.split_k = k;
      const Emulation e = Emulation::of(Format::fp32, n);
      for (const torch::Tensor& t : {x, w, b}) t.mutable_grad() = torch::Tensor();
      const torch::Tensor y = emulated_linear(x, w, b, e);
      y.backward(g);
      const torch::Tensor xd = x.detach(), wd = w.detach(), bd = b.detach();
      torch::Tensor want_y;
      if (k == 1 && arith != MatmulArithmetic::bf16x3) {  // one GEMM: the bias is its C operand
        const Format f = arith == MatmulArithmetic::tf32   ? Format::tf32
                         : arith == MatmulArithmetic::bf16 ? Format::bf16
                                                           : Format::fp32;
        want_y = torch::addmm(bd, rounded(xd, f), rounded(wd, f).t());
      } else {
        want_y = numerics_matmul(xd, wd.t(), arith, k) + bd;
      }
      EXPECT_TRUE(torch::equal(y.detach(), want_y));
      EXPECT_TRUE(torch::equal(x.grad(), numerics_matmul(g, wd, arith, k)));
      EXPECT_TRUE(torch::equal(w.grad(), numerics_matmul(g.t(), xd, arith, k)));
      EXPECT_TRUE(torch::equal(b.grad(), g.sum(0)));
    }
  }
}

TEST(MatmulArithmetic, Tf32ChangesNothingUnderBf16Training) {
  // bf16 values are tf32 values: with precision bf16 the tf32 rounding of the operands is the identity.
  torch::manual_seed(16);
  const torch::Tensor x = torch::randn({6, 16}), w = torch::randn({8, 16}), b = torch::randn({8});
  NumericsConfig tf32;
  tf32.matmul = MatmulArithmetic::tf32;
  EXPECT_TRUE(torch::equal(emulated_linear(x, w, b, Emulation::of(Format::bf16, tf32)),
                           emulated_linear(x, w, b, Emulation::of(Format::bf16))));
}

// ---- LayerNorm --------------------------------------------------------------------------------

// LayerNorm of each row of x in fp64 (the reference), x float or double.
torch::Tensor layer_norm_fp64(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  const torch::Tensor xd = x.to(torch::kDouble);
  const torch::Tensor mean = xd.mean(-1, true);
  const torch::Tensor var = (xd - mean).pow(2).mean(-1, true);
  return (xd - mean) / (var + 1e-5).sqrt() * w.to(torch::kDouble) + b.to(torch::kDouble);
}

TEST(LayerNorm, WelfordAndTwoPassAreWithinFp32RoundoffButDiffer) {
  torch::manual_seed(21);
  const std::int64_t R = 64, D = 48;
  // Rows with an offset: mean ~ 4, std ~ 1 (the condition number max|x|/std ~ 8 scales the error).
  const torch::Tensor x = torch::randn({2, R / 2, D}) + 4.0;
  const torch::Tensor w = torch::randn({D}), b = torch::randn({D});
  const torch::Tensor ref = layer_norm_fp64(x, w, b);
  // The sums of D terms err by <= gamma_D ~ D u relative to sum |x_i| (mean) or to the sum of the
  // squares (variance); relative to std that is D u kappa with kappa = max|x| / std. The
  // normalisation adds a few u, and y scales by |w|, plus |b| u: tol = 4 D u kappa (|w| + 1) + u|b|,
  // with kappa measured on the input and 4 covering mean, variance, rstd and the affine step.
  const torch::Tensor xd = x.to(torch::kDouble);
  const double kappa = (xd.abs().amax(-1) / xd.std(-1, false)).max().item<double>();
  const torch::Tensor tol = 4.0 * D * kU32 * kappa * (w.to(torch::kDouble).abs() + 1.0) + kU32 * b.to(torch::kDouble).abs();
  torch::Tensor outs[3];
  int i = 0;
  for (LayerNormAlgorithm a : {LayerNormAlgorithm::torch, LayerNormAlgorithm::two_pass, LayerNormAlgorithm::welford}) {
    SCOPED_TRACE(to_string(a));
    outs[i] = layer_norm(x, w, b, a);
    EXPECT_EQ(outs[i].sizes(), x.sizes());
    EXPECT_TRUE(((outs[i].to(torch::kDouble) - ref).abs() <= tol).all().item<bool>())
        << "worst error / tol " << ((outs[i].to(torch::kDouble) - ref).abs() / tol).max().item<double>();
    ++i;
  }
  EXPECT_FALSE(torch::equal(outs[1], outs[2])) << "two_pass and welford gave the same bits on every row";
  EXPECT_FALSE(torch::equal(outs[0], outs[2]));
}

TEST(LayerNorm, GradientsMatchTorchLayerNormInDouble) {
  torch::manual_seed(22);
  const std::int64_t D = 24;
  const torch::Tensor x0 = torch::randn({3, 5, D}, torch::kDouble) * 2.0 + 1.0;
  const torch::Tensor w0 = torch::randn({D}, torch::kDouble), b0 = torch::randn({D}, torch::kDouble);
  const torch::Tensor g = torch::randn({3, 5, D}, torch::kDouble);
  auto run = [&](LayerNormAlgorithm a) {
    torch::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true),
                  b = b0.clone().requires_grad_(true);
    torch::Tensor y = a == LayerNormAlgorithm::torch ? torch::layer_norm(x, {D}, w, b, 1e-5) : layer_norm(x, w, b, a);
    y.backward(g);
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
  };
  const auto want = run(LayerNormAlgorithm::torch);
  // Both sides evaluate the same fp64 formulas in different orders: each result is a sum of at most
  // 15 rows or D terms of magnitude |g| |xhat| |w| ~ 10, so differences stay below
  // c (15 + D) u64 10 with c = 8 for the chained steps (mean, rstd^3, products).
  const double tol = 8.0 * (15 + D) * kU64 * 10.0;
  for (LayerNormAlgorithm a : {LayerNormAlgorithm::two_pass, LayerNormAlgorithm::welford}) {
    SCOPED_TRACE(to_string(a));
    const auto got = run(a);
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_LT((got[i] - want[i]).abs().max().item<double>(), tol) << i;
  }
}

// ---- GELU -------------------------------------------------------------------------------------

TEST(Gelu, TanhMatchesItsFormulaInDoubleForwardAndBackward) {
  const torch::Tensor x = torch::linspace(-8.0, 8.0, 4001, torch::kFloat).requires_grad_(true);
  const torch::Tensor y = gelu(x, GeluApproximation::tanh);
  y.backward(torch::ones_like(y));
  const torch::Tensor xd = x.detach().to(torch::kDouble);
  const double c = std::sqrt(2.0 / M_PI);
  const torch::Tensor t = torch::tanh(c * (xd + 0.044715 * xd.pow(3)));
  const torch::Tensor ref = 0.5 * xd * (1.0 + t);
  const torch::Tensor dref = 0.5 * (1.0 + t) + 0.5 * xd * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * xd * xd);
  // fp32 evaluation of the same formula: each of its ~8 operations (and tanh, within a few ulp)
  // errs by u relative to its own result; 1 + tanh cancels for x < 0, so the bound is in units of
  // |x| rather than |y|: |dy| <= 16 u (|x| + |y|). The derivative has one more product and the
  // factor x^2: 32 u (1 + |x| (1 + 0.134 x^2)).
  const torch::Tensor ax = xd.abs();
  EXPECT_TRUE(((y.detach().to(torch::kDouble) - ref).abs() <= 16.0 * kU32 * (ax + ref.abs())).all().item<bool>());
  EXPECT_TRUE(((x.grad().to(torch::kDouble) - dref).abs() <= 32.0 * kU32 * (1.0 + ax * (1.0 + 0.134 * ax * ax)))
                  .all()
                  .item<bool>());
  EXPECT_FALSE(torch::equal(y.detach(), gelu(x.detach(), GeluApproximation::erf)));
}

// ---- training: recompute is a control, every other value is live ------------------------------

TrainState train_steps(const Variant& v, int steps, std::size_t* shadow_records = nullptr) {
  Engine e(v, TrainHooks{}, nullptr);
  for (int i = 0; i < steps; ++i) {
    e.step();
    if (shadow_records != nullptr) *shadow_records += e.shadow().size();
  }
  return e.state();
}

bool same_params(const TrainState& a, const TrainState& b) {
  for (std::size_t i = 0; i < a.params.size(); ++i)
    if (!train_test::same_bytes(a.params[i], b.params[i])) return false;
  return true;
}

TEST(Recompute, GivesBitIdenticalWeightsWithAttentionCaptureShadowAndStochasticRounding) {
  // fp32 flash; bf16 baseline attention with stochastic rounding (the rerun must draw the same bits)
  // and shadow attention (the rerun must not record twice); fp16 with splits and bf16x3.
  std::vector<Variant> cases{train_test::tiny_variant(AttentionKind::flash, Format::fp32),
                             train_test::tiny_variant(AttentionKind::baseline, Format::bf16),
                             train_test::tiny_variant(AttentionKind::flash, Format::fp16)};
  CustomPolicy stochastic;
  stochastic.preset = "mixed";
  stochastic.rounding = Rounding::stochastic;
  cases[1].attention_cfg.custom_policies["sr"] = stochastic;
  cases[1].attention_cfg.policy = "sr";
  cases[1].train.shadow_attention = true;
  cases[2].numerics.matmul = MatmulArithmetic::bf16x3;
  cases[2].numerics.split_k = 3;
  cases[2].numerics.layernorm = LayerNormAlgorithm::welford;
  for (Variant v : cases) {
    SCOPED_TRACE(v.id);
    std::size_t shadow_off = 0, shadow_on = 0;
    const TrainState off = train_steps(v, 4, &shadow_off);
    v.numerics.recompute = true;
    const TrainState on = train_steps(v, 4, &shadow_on);
    train_test::expect_identical(off, on);
    EXPECT_EQ(shadow_off, shadow_on);
    // The capture (a forward without gradients) sees the same Q, K, V with recompute on.
    Engine a(v, TrainHooks{}, &off);
    v.numerics.recompute = false;
    Engine b(v, TrainHooks{}, &off);
    EXPECT_EQ(a.capture(1, 3).q, b.capture(1, 3).q);
  }
}

TEST(NumericsAxes, EveryNonBaselineValueChangesTheWeights) {
  const Variant base = train_test::tiny_variant(AttentionKind::flash, Format::fp32);
  const TrainState reference = train_steps(base, 3);
  std::vector<std::pair<std::string, NumericsConfig>> values;
  for (MatmulArithmetic m : {MatmulArithmetic::tf32, MatmulArithmetic::bf16, MatmulArithmetic::bf16x3}) {
    NumericsConfig n;
    n.matmul = m;
    values.emplace_back("matmul " + std::string(to_string(m)), n);
  }
  for (int k : {2, 3}) {
    NumericsConfig n;
    n.split_k = k;
    values.emplace_back("split_k " + std::to_string(k), n);
  }
  for (LayerNormAlgorithm l : {LayerNormAlgorithm::two_pass, LayerNormAlgorithm::welford}) {
    NumericsConfig n;
    n.layernorm = l;
    values.emplace_back("layernorm " + std::string(to_string(l)), n);
  }
  NumericsConfig tanh;
  tanh.gelu = GeluApproximation::tanh;
  values.emplace_back("gelu tanh", tanh);
  for (const auto& [name, n] : values) {
    SCOPED_TRACE(name);
    Variant v = base;
    v.numerics = n;
    const TrainState got = train_steps(v, 3);
    EXPECT_FALSE(same_params(got, reference)) << "the value does not change the weights";
    // ... but only by a numeric deviation: the weights stay close (step 3, lr <= 3e-3).
    for (std::size_t i = 0; i < got.params.size(); ++i) {
      const float* p = got.params[i].as<float>();
      const float* q = reference.params[i].as<float>();
      for (std::int64_t j = 0; j < got.params[i].numel(); ++j) ASSERT_NEAR(p[j], q[j], 1e-2) << got.params[i].name;
    }
  }
}

TEST(NumericsAxes, DefaultNumericsIsTheBaselineOfEveryAxis) {
  const NumericsConfig n;
  EXPECT_TRUE(n.is_default());
  for (const char* axis : {"matmul", "split_k", "layernorm", "gelu", "recompute"}) {
    const GridAxisInfo* row = find_grid_axis(axis);
    ASSERT_NE(row, nullptr) << axis;
    EXPECT_EQ(row->role, AxisRole::optimisation) << axis;
  }
  EXPECT_EQ(find_grid_axis("matmul")->baseline, to_string(n.matmul));
  EXPECT_EQ(find_grid_axis("split_k")->baseline, std::to_string(n.split_k));
  EXPECT_EQ(find_grid_axis("layernorm")->baseline, to_string(n.layernorm));
  EXPECT_EQ(find_grid_axis("gelu")->baseline, to_string(n.gelu));
  EXPECT_EQ(find_grid_axis("recompute")->baseline, "off");
}

// `fastudy plan` and the preflight: recompute keeps one block input per layer instead of every
// block's activations (plus one block's while it is recomputed); bf16x3 keeps low parts and triples
// the products.
TEST(NumericsAxes, EstimateCountsRecomputeAndBf16x3) {
  Variant v = train_test::tiny_variant(AttentionKind::flash, Format::fp32);
  const VariantEstimate base = estimate_variant(v);
  v.numerics.recompute = true;
  const VariantEstimate recompute = estimate_variant(v);
  const ModelConfig& m = v.model;
  const double block = (10.0 + 2.0 * m.mlp_ratio) * m.d_model;
  const double tokens = static_cast<double>(v.train.batch) * m.seq_len;
  EXPECT_DOUBLE_EQ(base.memory_per_rank - recompute.memory_per_rank,
                   4.0 * tokens * ((m.layers - 1) * block - m.layers * static_cast<double>(m.d_model)));
  EXPECT_DOUBLE_EQ(recompute.matmul_work, 4.0 / 3.0);
  v.numerics.recompute = false;
  v.numerics.matmul = MatmulArithmetic::bf16x3;
  const VariantEstimate x3 = estimate_variant(v);
  EXPECT_GT(x3.memory_per_rank, base.memory_per_rank);
  EXPECT_DOUBLE_EQ(x3.matmul_work, 3.0);
  EXPECT_DOUBLE_EQ(base.matmul_work, 1.0);
  v.numerics.matmul = MatmulArithmetic::fp32;
  v.numerics.split_k = 4;
  EXPECT_DOUBLE_EQ(estimate_variant(v).memory_per_rank, base.memory_per_rank);
}

}  // namespace
}  // namespace fastudy::train
