// Tests of the microbenchmark point library (kernels/microbench.hpp): deterministic inputs that do
// not depend on the format, policy, blocks or loop order; fp64 points that agree with the golden
// result; error rows that grow as mantissa bits shrink; error columns that are the check harness's
// metrics (kernels/check.hpp), within its bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "kernels/check.hpp"
#include "kernels/microbench.hpp"

namespace fastudy {
namespace {

MicrobenchPoint small_point() {
  MicrobenchPoint p;
  p.seq_len = 48;
  p.head_dim = 16;
  p.block_q = 16;
  p.block_kv = 8;
  p.heads = 2;
  return p;
}

TEST(Microbench, SeedDependsOnlyOnSeedTrialShapeAndDistribution) {
  const MicrobenchPoint a = small_point();
  MicrobenchPoint b = a;
  b.format = Format::bf16;
  b.policy = "pure";
  b.block_q = 3;
  b.block_kv = 48;
  b.loop_order = LoopOrder::kv_outer;
  b.pass = Pass::backward;
  b.causal = true;
  EXPECT_EQ(microbench_seed(a), microbench_seed(b));
  for (auto change : {+[](MicrobenchPoint& p) { p.trial = 1; }, +[](MicrobenchPoint& p) { p.seed = 8; },
                      +[](MicrobenchPoint& p) { p.seq_len = 49; }, +[](MicrobenchPoint& p) { p.head_dim = 8; },
                      +[](MicrobenchPoint& p) { p.distribution = InputDistribution::uniform; }}) {
    MicrobenchPoint c = a;
    change(c);
    EXPECT_NE(microbench_seed(a), microbench_seed(c));
  }
}

TEST(Microbench, InputsAreDeterministicAndShared) {
  const MicrobenchPoint a = small_point();
  MicrobenchPoint b = a;
  b.format = Format::fp16;
  b.policy = "pure";
  const MicrobenchInputs x = microbench_inputs(a), y = microbench_inputs(b);
  EXPECT_EQ(x.q, y.q);
  EXPECT_EQ(x.k, y.k);
  EXPECT_EQ(x.v, y.v);
  EXPECT_EQ(x.dout, y.dout);
  EXPECT_NE(x.q, x.k);
  EXPECT_EQ(x.q.size(), static_cast<std::size_t>(1 * 2 * 48 * 16));
}

TEST(Microbench, DistributionsHaveTheirMoments) {
  // 2^16 samples: the sample mean is within 4 sigma/sqrt(n) ~ 0.016 of 0 and the variance within
  // about 4 sqrt(2/n) ~ 0.022 of 1 (normal; uniform's variance of the variance is smaller).
  for (InputDistribution dist : {InputDistribution::normal, InputDistribution::uniform}) {
    std::mt19937_64 rng(1);
    std::vector<double> x(1 << 16);
    generate_values(rng, dist, 0, 1, x.data(), x.size());
    double mean = 0, var = 0;
    for (double v : x) mean += v;
    mean /= x.size();
    for (double v : x) var += (v - mean) * (v - mean);
    var /= x.size();
    EXPECT_NEAR(mean, 0.0, 0.016) << to_string(dist);
    EXPECT_NEAR(var, 1.0, 0.022) << to_string(dist);
  }
  std::mt19937_64 rng(2);
  std::vector<double> x(1 << 16);
  generate_values(rng, InputDistribution::outliers, 0.05, 1000.0, x.data(), x.size());
  int big = 0;
  for (double v : x) big += std::fabs(v) > 50;  // a normal value beyond 50 never happens
  EXPECT_GT(big, 0.04 * x.size());
  EXPECT_LT(big, 0.06 * x.size());
  // captured inputs come from a checkpoint and file ones from a tensor file, never from the generator.
  EXPECT_THROW(generate_values(rng, InputDistribution::captured, 0, 1, x.data(), 1), std::exception);
  EXPECT_THROW(generate_values(rng, InputDistribution::file, 0, 1, x.data(), 1), std::exception);
}

// A file point runs on the given Q, K, V and dO (rounded to the policy's formats), a captured one on the
// given Q, K, V and a dO of its own; a point without them, or with them of another shape, is refused.
TEST(Microbench, FileInputsAreTheGivenTensors) {
  MicrobenchPoint p = small_point();
  p.pass = Pass::backward;
  p.format = Format::bf16;
  p.distribution = InputDistribution::file;
  const std::size_t n = 1 * 2 * 48 * 16;
  MicrobenchInputs given;
  int tensor = 0;
  for (std::vector<double>* x : {&given.q, &given.k, &given.v, &given.dout}) {
    x->resize(n);
    for (std::size_t i = 0; i < n; ++i) (*x)[i] = std::sin(0.37 * static_cast<double>(i) + tensor);
    ++tensor;
  }
  const MicrobenchRun run = prepare_microbench_point(p, std::nullopt, 1, &given);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(run.q[i], round_to(Format::bf16, given.q[i]));
    ASSERT_EQ(run.dout[i], round_to(Format::bf16, given.dout[i]));
  }
  p.distribution = InputDistribution::captured;
  EXPECT_NE(prepare_microbench_point(p, std::nullopt, 1, &given).dout, run.dout);  // captured: dO of its own
  p.distribution = InputDistribution::file;
  EXPECT_THROW(prepare_microbench_point(p, std::nullopt, 1, nullptr), Error);
  given.dout.resize(n - 1);
  EXPECT_THROW(prepare_microbench_point(p, std::nullopt, 1, &given), Error);
}

TEST(Microbench, RunIsDeterministic) {
  MicrobenchPoint p = small_point();
  p.format = Format::bf16;
  const auto a = run_microbench_point(p), b = run_microbench_point(p, std::nullopt, 2);
  ASSERT_EQ(a.size(), 3u);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].algorithm, b[i].algorithm);
    EXPECT_EQ(a[i].max_abs, b[i].max_abs);
    EXPECT_EQ(a[i].rel_l2, b[i].rel_l2);
  }
  EXPECT_EQ(a[0].algorithm, "flash");
  EXPECT_EQ(a[1].algorithm, "baseline");
  EXPECT_EQ(a[2].algorithm, "flash_vs_baseline");
  EXPECT_EQ(a[0].tiles_kv, 6);
  EXPECT_EQ(a[0].rescales_per_row, 5.0);
  EXPECT_EQ(a[1].tiles_kv, 1);
  EXPECT_EQ(a[0].point.format, Format::bf16);
}

TEST(Microbench, Fp64PointsMatchTheGolden) {
  // fp64 on double buffers: only fp64 roundoff, (d + N) 2^-53 relative ~ 1e-14.
  for (Pass pass : kAllPasses) {
    MicrobenchPoint p = small_point();
    p.pass = pass;
    p.format = Format::fp64;
    p.policy = "pure";
    p.causal = true;
    for (const MicrobenchRow& r : run_microbench_point(p)) {
      EXPECT_LT(r.max_abs, 1e-12) << to_string(pass) << " " << r.algorithm;
      EXPECT_LT(r.rel_l2, 1e-13) << to_string(pass) << " " << r.algorithm;
      EXPECT_LE(r.mean_abs, r.max_abs);
    }
  }
}

TEST(Microbench, ErrorGrowsAsMantissaShrinks) {
  // Golden errors scale with u: fp32 (2^-24) < fp16 (2^-11) < bf16 (2^-8), for both algorithms.
  MicrobenchPoint p = small_point();
  p.policy = "pure";
  double last[2] = {0, 0};
  for (Format f : {Format::fp32, Format::fp16, Format::bf16}) {
    p.format = f;
    const auto rows = run_microbench_point(p);
    for (int a = 0; a < 2; ++a) {
      EXPECT_GT(rows[a].max_abs, last[a]) << to_string(f) << " " << rows[a].algorithm;
      EXPECT_GT(rows[a].mean_abs, 0.0);
      last[a] = rows[a].max_abs;
    }
  }
}

// The rows are the harness's error metrics of the same kernels on the same rounded inputs, bit for
// bit (one definition of the metrics), and the golden errors stay within the harness's bounds.
TEST(Microbench, RowsAreTheHarnessMetricsWithinItsBounds) {
  auto expect_same = [](const MicrobenchRow& row, const ErrorMetrics& m, const std::string& what) {
    EXPECT_EQ(row.max_abs, m.max_abs) << what;
    EXPECT_EQ(row.mean_abs, m.mean_abs) << what;
    EXPECT_EQ(row.std_abs, m.std_abs) << what;
    EXPECT_EQ(row.rel_l2, m.rel_l2) << what;
    EXPECT_EQ(row.rmse, m.rmse) << what;
    EXPECT_EQ(row.mean_signed, m.mean_signed) << what;
  };
  for (Pass pass : kAllPasses) {
    for (Format f : {Format::fp32, Format::bf16}) {
      MicrobenchPoint p = small_point();
      p.pass = pass;
      p.format = f;
      p.causal = f == Format::bf16;
      const std::vector<MicrobenchRow> rows = run_microbench_point(p);
      const MicrobenchInputs in = microbench_inputs(p);
      const AttentionShape shape = microbench_shape(p);
      // Each kind with the point's reading's policy of that kind.
      const ReadingPolicies policies = make_reading(p.policy, p.format);
      AttentionParams params;
      params.policy = policies.flash;
      params.block_q = p.block_q;
      params.block_kv = p.block_kv;
      params.order = p.loop_order;
      params.threads = 1;
      const AttentionReference ref = make_reference(shape, params.policy, in.q, in.k, in.v, in.dout);
      const std::string what = std::string(to_string(pass)) + " " + std::string(to_string(f));
      AttentionParams base_params = params;
      base_params.attention = AttentionKind::baseline;
      base_params.policy = policies.baseline;
      if (p.pass == Pass::forward) {
        params.attention = AttentionKind::flash;
        const ForwardCheck<float> flash = check_forward<float>(ref, params);
        const ForwardCheck<float> baseline = check_forward<float>(ref, base_params);
        expect_same(rows[0], flash.error, what + " flash");
        expect_same(rows[1], baseline.error, what + " baseline");
        expect_same(rows[2], error_metrics(flash.o, std::vector<double>(baseline.o.begin(), baseline.o.end())),
                    what + " flash_vs_baseline");
        EXPECT_LE(rows[0].max_abs, flash.bound) << what;
        EXPECT_LE(rows[1].max_abs, baseline.bound) << what;
        // max_ulp = max|d| / (u_format * max|golden|), exactly as documented.
        EXPECT_EQ(rows[0].max_ulp, rows[0].max_abs / (unit_roundoff(f) * max_abs(ref.o))) << what;
        EXPECT_EQ(rows[1].max_ulp, rows[1].max_abs / (unit_roundoff(f) * max_abs(ref.o))) << what;
      } else {
        params.attention = AttentionKind::flash;
        const BackwardCheck<float> flash = check_backward<float>(ref, params);
        const BackwardCheck<float> baseline = check_backward<float>(ref, base_params);
        expect_same(rows[0], flash.error, what + " flash");
        expect_same(rows[1], baseline.error, what + " baseline");
        expect_same(rows[2],
                    error_metrics(flash.grad, std::vector<double>(baseline.grad.begin(), baseline.grad.end())),
                    what + " flash_vs_baseline");
        EXPECT_LE(rows[0].rel_l2, flash.bound) << what;
        EXPECT_LE(rows[1].rel_l2, baseline.bound) << what;
        EXPECT_EQ(rows[1].max_ulp, rows[1].max_abs / (unit_roundoff(f) * max_abs(ref.grad))) << what;
      }
    }
  }
}

TEST(Microbench, CustomPolicyOverride) {
  MicrobenchPoint p = small_point();
  p.policy = "p_only_bf16";
  ReadingPolicies custom = make_reading("pure", Format::fp32);
  for (PrecisionPolicy* kind : {&custom.flash, &custom.baseline}) {
    kind->name = p.policy;
    kind->p = Format::bf16;
  }
  const auto rows = run_microbench_point(p, custom);
  EXPECT_GT(rows[0].max_abs, 0.0);
  EXPECT_THROW(run_microbench_point(p), std::exception);  // not a preset, and no override given
}

TEST(Microbench, ErrorMetricsRmseAndSignedMean) {
  // d = a - ref = {+1, -3, +2}: rmse = sqrt(14/3), mean_signed = 0, mean_abs = 2 (exact in double).
  const std::vector<double> a{1, -3, 2}, ref{0, 0, 0};
  const ErrorMetrics m = error_metrics(a, ref);
  EXPECT_DOUBLE_EQ(m.rmse, std::sqrt(14.0 / 3.0));
  EXPECT_EQ(m.mean_signed, 0.0);
  EXPECT_EQ(m.mean_abs, 2.0);
  const ErrorMetrics shifted = error_metrics(std::vector<double>{1.5, -2.5, 2.5}, ref);
  EXPECT_DOUBLE_EQ(shifted.mean_signed, 0.5);  // a bias of +0.5 shows in the signed mean only
}

TEST(Microbench, PaperTilesFollowTheRules) {
  // d = 32, M = 16384: ceil(M / 4d) = 128 > d, so the rules differ.
  EXPECT_EQ(paper_tiles(16384, 32, "paper"), std::make_pair(32, 128));    // B_r = min(128, 32), B_c = 128
  EXPECT_EQ(paper_tiles(16384, 32, "swapped"), std::make_pair(128, 32));  // exchanged: 4x the KV tiles
  EXPECT_EQ(paper_tiles(16384, 32, "square"), std::make_pair(128, 128));
  // d = 64, M = 16384: ceil = 64 = d: all three agree. M = 100: ceil(100 / 256) = 1.
  for (const char* rule : {"paper", "swapped", "square"}) {
    EXPECT_EQ(paper_tiles(16384, 64, rule), std::make_pair(64, 64)) << rule;
    EXPECT_EQ(paper_tiles(100, 64, rule), std::make_pair(1, 1)) << rule;
  }
  EXPECT_EQ(paper_tiles(16385, 64, "paper"), std::make_pair(64, 65));  // the ceiling
  EXPECT_THROW(paper_tiles(16384, 64, "diagonal"), std::exception);
  EXPECT_THROW(paper_tiles(0, 64, "paper"), std::exception);
}

TEST(Microbench, OutliersFollowFa3Recipe) {
  // N(0,1) + N(0, s^2) Bernoulli(p), p = 0.001, s = 10: mean 0, variance 1 + p s^2 = 1.1.
  // n = 2^20 samples: sd of the mean sqrt(1.1 / n) ~ 1.0e-3 (4 sd: 0.0041); the sample variance has
  // sd sqrt((E x^4 - 1.1^2) / n) with E x^4 = 3 (1 - p) + 3 p (1 + s^2)^2 = 33.6: 5.6e-3 (4 sd: 0.022).
  const MicrobenchPoint defaults;
  EXPECT_EQ(defaults.outlier_fraction, 0.001);
  EXPECT_EQ(defaults.outlier_scale, 10.0);
  std::mt19937_64 rng(3);
  std::vector<double> x(1 << 20);
  generate_values(rng, InputDistribution::outliers, defaults.outlier_fraction, defaults.outlier_scale, x.data(), x.size());
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= x.size();
  for (double v : x) var += (v - mean) * (v - mean);
  var /= x.size();
  EXPECT_NEAR(mean, 0.0, 0.0041);
  EXPECT_NEAR(var, 1.1, 0.022);
}

TEST(Microbench, SinkKeyHasItsLogit) {
  // Key 0's scaled logit is sink_logit for every query (exact up to fp64 roundoff: d products of
  // which one is nonzero); the other keys' logits are the normal ones of d - 1 components: mean 0,
  // variance (d - 1)/d. They are correlated through the shared queries and keys, so the sampling
  // bounds use the number of independent query vectors n = B H N = 256: 4 sd of the mean
  // 4 sqrt(1/n) = 0.25 and of the variance 4 sqrt(2/n) = 0.35.
  MicrobenchPoint p = small_point();
  p.distribution = InputDistribution::sink;
  p.seq_len = 128;
  p.sink_logit = 12.0;
  const MicrobenchInputs in = microbench_inputs(p);
  const int n = p.seq_len, d = p.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  double sum = 0, sum_sq = 0, worst_other = -INFINITY;
  std::size_t count = 0;
  for (int h = 0; h < p.batch * p.heads; ++h)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int t = 0; t < d; ++t) s += in.q[(h * n + i) * d + t] * in.k[(h * n + j) * d + t];
        s *= scale;
        if (j == 0) {
          EXPECT_NEAR(s, p.sink_logit, 1e-12) << "head " << h << " row " << i;
        } else {
          sum += s;
          sum_sq += s * s;
          ++count;
          worst_other = std::max(worst_other, s);
        }
      }
  const double mean = sum / count, var = sum_sq / count - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.25);
  EXPECT_NEAR(var, (d - 1.0) / d, 0.35);
  // The margin: the largest of ~3e4 roughly unit-variance logits stays below 7, so the sink leads by
  // more than sink_logit - 7 in every row.
  EXPECT_LT(worst_other, p.sink_logit - 5.0);
}

// repeated_max: keys 0 to repeated_keys - 1 are one vector, so they share every row's largest logit
// exactly (the same products in every format); every row's maximum repeats (N - 1 of N causal rows:
// row 0 sees one key); V is N(-1, 1): with B H N d = 1536 values its mean is within 4 sd (0.1) of -1.
TEST(Microbench, RepeatedMaxKeysShareEveryRowsLargestLogit) {
  MicrobenchPoint p = small_point();
  p.distribution = InputDistribution::repeated_max;
  p.repeated_keys = 3;
  const MicrobenchInputs in = microbench_inputs(p);
  const int n = p.seq_len, d = p.head_dim;
  for (int h = 0; h < p.batch * p.heads; ++h)
    for (int j = 1; j < p.repeated_keys; ++j)
      for (int t = 0; t < d; ++t) ASSERT_EQ(in.k[(h * n + j) * d + t], in.k[(h * n) * d + t]);
  double mean_v = 0;
  for (double x : in.v) mean_v += x;
  mean_v /= static_cast<double>(in.v.size());
  EXPECT_NEAR(mean_v, -1.0, 0.1);
  for (const auto& [format, policy] : {std::pair{Format::bf16, "pure"}, std::pair{Format::fp32, "mixed"}}) {
    p.format = format;
    p.policy = policy;
    p.causal = false;
    EXPECT_EQ(run_microbench_point(p)[0].repeated_max_rows, 1.0);
    p.causal = true;
    EXPECT_DOUBLE_EQ(run_microbench_point(p)[0].repeated_max_rows, (n - 1.0) / n);
  }
}

// The words of a point's pass and distribution (CSV columns, grid.toml) read back to their values, and
// nothing else reads as one.
TEST(Microbench, PassAndDistributionWordsRoundTrip) {
  for (Pass pass : kAllPasses) EXPECT_EQ(parse_pass(to_string(pass)), pass);
  for (InputDistribution d : kAllInputDistributions) EXPECT_EQ(parse_input_distribution(to_string(d)), d);
  EXPECT_EQ(to_string(Pass::backward), "backward");
  EXPECT_EQ(to_string(InputDistribution::outliers), "outliers");
  EXPECT_FALSE(parse_pass("sideways").has_value());
  EXPECT_FALSE(parse_input_distribution("sinks").has_value());
  EXPECT_FALSE(parse_input_distribution("cauchy").has_value());
}

TEST(Microbench, RepeatedMaxRowsCountsTies) {
  // d = 1, N = 4, scale 1: scores of every row are q_i * k_j with k = {2, 2, 1, 0}: each row's max
  // is attained by keys 0 and 1 (all rows repeated); causal, row 0 sees key 0 alone (3 of 4).
  AttentionShape shape{1, 1, 4, 1, false, 1.0};
  const std::vector<double> q{1, 1, 1, 1}, k{2, 2, 1, 0};
  PrecisionPolicy fp32 = make_policy("pure", Format::fp32, AttentionKind::baseline);
  EXPECT_EQ(repeated_max_fraction(shape, fp32, 0, q.data(), k.data()), 1.0);
  shape.causal = true;
  EXPECT_EQ(repeated_max_fraction(shape, fp32, 0, q.data(), k.data()), 0.75);
  // Keys 1 and 1 + 2^-10 differ in fp32 but are one value in bf16 (spacing 2^-7 at 1): a tie made
  // by the format the scores are stored in.
  shape.causal = false;
  const std::vector<double> k2{1.0, 1.0 + 0x1p-10, 0, 0};
  EXPECT_EQ(repeated_max_fraction(shape, fp32, 0, q.data(), k2.data()), 0.0);
  EXPECT_EQ(repeated_max_fraction(shape, make_policy("pure", Format::bf16, AttentionKind::baseline), 0, q.data(), k2.data()), 1.0);
}

TEST(Microbench, RoundingModeAndSeed) {
  // The point's rounding mode reaches the policy; stochastic rounding is reproducible (its seed comes
  // from the point alone, so any rank computes the same rows) and differs from nearest.
  MicrobenchPoint p = small_point();
  p.format = Format::bf16;
  p.policy = "eager";
  const auto nearest = run_microbench_point(p);
  EXPECT_EQ(nearest[0].rounding, Rounding::nearest);
  p.rounding = Rounding::stochastic;
  const auto a = run_microbench_point(p), b = run_microbench_point(p, std::nullopt, 2);
  EXPECT_EQ(a[0].rounding, Rounding::stochastic);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].max_abs, b[i].max_abs);
    EXPECT_EQ(a[i].mean_signed, b[i].mean_signed);
  }
  EXPECT_NE(a[0].mean_abs, nearest[0].mean_abs);
  MicrobenchPoint other = p;
  other.block_kv = 16;  // same inputs, same seed: the seed does not depend on the tiles
  EXPECT_EQ(microbench_rounding_seed(other), microbench_rounding_seed(p));
  other.trial = 1;
  EXPECT_NE(microbench_rounding_seed(other), microbench_rounding_seed(p));
  // A custom policy's own rounding is kept when the point sets none.
  ReadingPolicies zero = make_reading("eager", Format::bf16);
  zero.flash.rounding = zero.baseline.rounding = Rounding::zero;
  MicrobenchPoint own = small_point();
  own.format = Format::bf16;
  EXPECT_EQ(run_microbench_point(own, zero)[0].rounding, Rounding::zero);
}

// FlashAttention's rule in both directions: the real kernel's error within [1/2, 2] of the reading's.
TEST(Microbench, Within2xIsFlashAttentionsRuleBothWays) {
  EXPECT_EQ(within_2x(1.5e-3, 1e-3), Within2x::within);          // real 1.5x the reading
  EXPECT_EQ(within_2x(2e-3, 1e-3), Within2x::within);            // exactly 2x: FA's <=
  EXPECT_EQ(within_2x(3e-3, 1e-3), Within2x::real_larger);       // real 3x the reading
  EXPECT_EQ(within_2x(1e-3, 3e-3), Within2x::reading_larger);    // the reading overstates 3x
  EXPECT_EQ(within_2x(0.6e-3, 1e-3), Within2x::within);
  EXPECT_EQ(within_2x(0.0, 0.0), Within2x::within);              // both exact
  EXPECT_EQ(within_2x(1e-9, 0.0), Within2x::real_larger);
  EXPECT_EQ(within_2x(0.0, 1e-9), Within2x::reading_larger);
  EXPECT_EQ(to_string(Within2x::within), "within 2x");
  EXPECT_EQ(to_string(Within2x::real_larger), "real > 2x reading");
}

TEST(Microbench, CpuCheckIsBitIdentityWherePromisedElseTheBound) {
  MicrobenchRow row;
  row.point.pass = Pass::forward;
  const std::vector<double> cpu{1.0, -2.0, 0.5};
  std::vector<double> same = cpu, near = cpu;
  near[1] += 1e-6;
  set_cpu_check(row, same, cpu, true, 0.0);
  EXPECT_EQ(row.check, "bit-identical");
  EXPECT_EQ(row.vs_cpu, 0.0);
  set_cpu_check(row, near, cpu, true, 1.0);
  EXPECT_EQ(row.check, "DIFFERS");  // promised: any difference fails, whatever the bound
  EXPECT_EQ(row.check_bound, 0.0);
  set_cpu_check(row, near, cpu, false, 2e-6);
  EXPECT_EQ(row.check, "within bound");
  EXPECT_NEAR(row.vs_cpu, 1e-6, 1e-15);  // max |d| on a forward point
  EXPECT_EQ(row.check_bound, 2e-6);
  set_cpu_check(row, near, cpu, false, 0.5e-6);
  EXPECT_EQ(row.check, "EXCEEDS BOUND");
  row.point.pass = Pass::backward;  // vs_cpu is rel_l2 on a backward point
  set_cpu_check(row, near, cpu, false, 1.0);
  EXPECT_NEAR(row.vs_cpu, 1e-6 / std::sqrt(1.0 + 4.0 + 0.25), 1e-15);
}

// The agreement columns: the fraction of elements with the same bits (+0 and -0 differ) and the largest
// distance in ulps of the point's format; "-" and zeros on rows that were compared with no reading.
TEST(Microbench, AgreementCountsIdenticalBitsAndUlps) {
  MicrobenchRow row;
  EXPECT_EQ(row.vs_reading, "-");
  EXPECT_EQ(row.bit_identical, 0.0);
  row.algorithm = "torch_flash";
  row.point.format = Format::bf16;
  const std::vector<double> reading{1.0, -2.0, 0.5, 0.0};
  std::vector<double> values = reading;
  set_agreement(row, values, reading, "eager flash");
  EXPECT_EQ(row.vs_reading, "eager flash");
  EXPECT_EQ(row.bit_identical, 1.0);
  EXPECT_EQ(row.max_ulp_vs, 0.0);
  values[1] = -2.0 - 0x1p-6;  // the next bf16 value below -2 (spacing 2^-6 in [2, 4))
  values[3] = -0.0;           // the same value, other bits
  set_agreement(row, values, reading, "eager flash");
  EXPECT_EQ(row.bit_identical, 0.5);
  EXPECT_EQ(row.max_ulp_vs, 1.0);
  values[2] = 0.5 + 3 * 0x1p-8;  // three bf16 steps above 0.5
  set_agreement(row, values, reading, "eager flash");
  EXPECT_EQ(row.bit_identical, 0.25);
  EXPECT_EQ(row.max_ulp_vs, 3.0);
  EXPECT_THROW(set_agreement(row, {1.0}, reading, "eager flash"), Error);
}

// A reading's kernel on a point prepared for another policy gives that reading's own point's values.
TEST(Microbench, ReadingValuesAreTheReadingsKernel) {
  for (Pass pass : kAllPasses) {
    MicrobenchPoint p = small_point();
    p.pass = pass;
    p.format = Format::bf16;
    p.policy = "pure";
    const MicrobenchRun pure = prepare_microbench_point(p, std::nullopt, 1, nullptr);
    p.policy = "eager";
    p.block_q = 8;
    p.block_kv = 16;
    MicrobenchRun eager;
    run_microbench_point(p, std::nullopt, 1, nullptr, &eager);
    EXPECT_EQ(reading_values(pure, "eager", AttentionKind::flash, 8, 16, p.loop_order), eager.flash.values) << to_string(pass);
    EXPECT_EQ(reading_values(pure, "eager", AttentionKind::baseline, 8, 16, p.loop_order), eager.baseline.values);
    EXPECT_NE(reading_values(pure, "eager", AttentionKind::flash, 16, 8, p.loop_order), eager.flash.values);
  }
  EXPECT_THROW(reading_values(prepare_microbench_point(small_point(), std::nullopt, 1, nullptr), "no_such_reading",
                              AttentionKind::flash, 8, 8, LoopOrder::q_outer),
               Error);
}

// Every real code names its device and, where a reading claims to model it, a reading's name: the
// CPU ones one of the presets.
TEST(Microbench, RealCodeTable) {
  for (const auto& c : kRealCode) {
    EXPECT_TRUE(c.device == "cpu" || c.device == "cuda") << c.algorithm;
    EXPECT_EQ(find_real_code(c.algorithm), &c);
    EXPECT_FALSE(c.code.empty());
    if (c.device == "cpu") {
      EXPECT_TRUE(is_policy_preset(c.reading)) << c.algorithm;
    }
  }
  EXPECT_EQ(find_real_code("flash"), nullptr);
  EXPECT_EQ(real_code_names("cpu"), "torch_baseline, torch_baseline_before, torch_flash");
}

// run_microbench_point's `keep` holds what its rows were computed from: the golden value and the CPU
// kernels' outputs, so another algorithm on the same inputs is compared with the same numbers.
TEST(Microbench, KeptRunReproducesTheRows) {
  for (Pass pass : kAllPasses) {
    MicrobenchPoint p = small_point();
    p.pass = pass;
    p.format = Format::bf16;
    MicrobenchRun run;
    const auto rows = run_microbench_point(p, std::nullopt, 1, nullptr, &run);
    ASSERT_EQ(rows.size(), 3u);
    EXPECT_EQ(rows[0].check, "-");
    EXPECT_TRUE(run.float_buffers);
    const std::size_t n = run.q.size();
    EXPECT_EQ(run.golden.size(), pass == Pass::forward ? n : 3 * n);
    EXPECT_EQ(run.flash.o.size(), n);
    EXPECT_EQ(run.flash.lse.size(), n / 16);
    const MicrobenchRow again = microbench_row(run, "flash", run.flash.values, run.golden, run.flash.stats);
    EXPECT_EQ(again.max_abs, rows[0].max_abs) << to_string(pass);
    EXPECT_EQ(again.max_ulp, rows[0].max_ulp) << to_string(pass);
    EXPECT_EQ(again.tiles_kv, rows[0].tiles_kv) << to_string(pass);
    // The inputs are the point's, rounded to bf16.
    EXPECT_EQ(run.q, prepare_microbench_point(p, std::nullopt, 1, nullptr).q);
    for (double x : run.q) EXPECT_EQ(round_to(Format::bf16, x), x);
  }
}

}  // namespace
}  // namespace fastudy
