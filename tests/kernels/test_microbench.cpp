// Tests of the microbenchmark point library (kernels/microbench.hpp): deterministic inputs that do
// not depend on the format, policy, blocks or loop order; fp64 points that agree with the golden
// result; error rows that grow as mantissa bits shrink; error columns that are the check harness's
// metrics (kernels/check.hpp), within its bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

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
  b.pass = "backward";
  b.causal = true;
  EXPECT_EQ(microbench_seed(a), microbench_seed(b));
  for (auto change : {+[](MicrobenchPoint& p) { p.trial = 1; }, +[](MicrobenchPoint& p) { p.seed = 8; },
                      +[](MicrobenchPoint& p) { p.seq_len = 49; }, +[](MicrobenchPoint& p) { p.head_dim = 8; },
                      +[](MicrobenchPoint& p) { p.distribution = "uniform"; }}) {
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
  for (const char* dist : {"normal", "uniform"}) {
    std::mt19937_64 rng(1);
    std::vector<double> x(1 << 16);
    generate_values(rng, dist, 0, 1, x.data(), x.size());
    double mean = 0, var = 0;
    for (double v : x) mean += v;
    mean /= x.size();
    for (double v : x) var += (v - mean) * (v - mean);
    var /= x.size();
    EXPECT_NEAR(mean, 0.0, 0.016) << dist;
    EXPECT_NEAR(var, 1.0, 0.022) << dist;
  }
  std::mt19937_64 rng(2);
  std::vector<double> x(1 << 16);
  generate_values(rng, "outliers", 0.05, 1000.0, x.data(), x.size());
  int big = 0;
  for (double v : x) big += std::fabs(v) > 50;  // a normal value beyond 50 never happens
  EXPECT_GT(big, 0.04 * x.size());
  EXPECT_LT(big, 0.06 * x.size());
  EXPECT_THROW(generate_values(rng, "cauchy", 0, 1, x.data(), 1), std::exception);
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
  for (const char* pass : {"forward", "backward"}) {
    MicrobenchPoint p = small_point();
    p.pass = pass;
    p.format = Format::fp64;
    p.policy = "pure";
    p.causal = true;
    for (const MicrobenchRow& r : run_microbench_point(p)) {
      EXPECT_LT(r.max_abs, 1e-12) << pass << " " << r.algorithm;
      EXPECT_LT(r.rel_l2, 1e-13) << pass << " " << r.algorithm;
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
  };
  for (const char* pass : {"forward", "backward"}) {
    for (Format f : {Format::fp32, Format::bf16}) {
      MicrobenchPoint p = small_point();
      p.pass = pass;
      p.format = f;
      p.causal = f == Format::bf16;
      const std::vector<MicrobenchRow> rows = run_microbench_point(p);
      const MicrobenchInputs in = microbench_inputs(p);
      const AttentionShape shape = microbench_shape(p);
      AttentionParams params;
      params.policy = make_policy(p.policy, p.format);
      params.block_q = p.block_q;
      params.block_kv = p.block_kv;
      params.order = p.loop_order;
      params.threads = 1;
      const AttentionReference ref = make_reference(shape, params.policy, in.q, in.k, in.v, in.dout);
      const std::string what = std::string(pass) + " " + std::string(to_string(f));
      if (p.pass == "forward") {
        params.attention = AttentionKind::flash;
        const ForwardCheck<float> flash = check_forward<float>(ref, params);
        params.attention = AttentionKind::baseline;
        const ForwardCheck<float> baseline = check_forward<float>(ref, params);
        expect_same(rows[0], flash.error, what + " flash");
        expect_same(rows[1], baseline.error, what + " baseline");
        expect_same(rows[2], error_metrics(flash.o, std::vector<double>(baseline.o.begin(), baseline.o.end())),
                    what + " flash_vs_baseline");
        EXPECT_LE(rows[0].max_abs, flash.bound) << what;
        EXPECT_LE(rows[1].max_abs, baseline.bound) << what;
      } else {
        params.attention = AttentionKind::flash;
        const BackwardCheck<float> flash = check_backward<float>(ref, params);
        params.attention = AttentionKind::baseline;
        const BackwardCheck<float> baseline = check_backward<float>(ref, params);
        expect_same(rows[0], flash.error, what + " flash");
        expect_same(rows[1], baseline.error, what + " baseline");
        expect_same(rows[2],
                    error_metrics(flash.grad, std::vector<double>(baseline.grad.begin(), baseline.grad.end())),
                    what + " flash_vs_baseline");
        EXPECT_LE(rows[0].rel_l2, flash.bound) << what;
        EXPECT_LE(rows[1].rel_l2, baseline.bound) << what;
      }
    }
  }
}

TEST(Microbench, CustomPolicyOverride) {
  MicrobenchPoint p = small_point();
  p.policy = "p_only_bf16";
  PrecisionPolicy custom = make_policy("pure", Format::fp32);
  custom.name = p.policy;
  custom.p = Format::bf16;
  const auto rows = run_microbench_point(p, custom);
  EXPECT_GT(rows[0].max_abs, 0.0);
  EXPECT_THROW(run_microbench_point(p), std::exception);  // not a preset, and no override given
  p.pass = "sideways";
  EXPECT_THROW(run_microbench_point(p, custom), std::exception);
}

}  // namespace
}  // namespace fastudy
