// Tests of the ranking of deviation sources (analysis/ranking.hpp) on hand-made matrices whose answer
// is known: a 2 x 3 x 2 grid (attention x precision x seed, precision with 3 values), pairs that
// differ in two axes (must be ignored), missing pairs, steps given out of order, a single step, no
// attention axis, fp64 twins, bootstrap intervals and the printed table.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "analysis/ranking.hpp"

namespace fastudy {
namespace {

// Every expected value is a short sum/ratio of small exact numbers: a few roundings, <= 8 u relative.
constexpr double kTol = 8 * 0x1p-53;
#define EXPECT_CLOSE(a, b) EXPECT_NEAR((a), (b), kTol * std::fabs(b))

struct Study {
  GridAxes axes;
  std::vector<RankingVariant> variants;
};

Study make_study(bool with_attention = true) {
  Study s;
  if (with_attention) s.axes.push_back({"attention", {"flash", "baseline"}});
  s.axes.push_back({"precision", {"fp64", "fp32", "fp16"}});
  s.axes.push_back({"seed", {"1", "2"}});
  const std::vector<std::string> atts = with_attention ? std::vector<std::string>{"flash", "baseline"}
                                                       : std::vector<std::string>{""};
  for (const auto& a : atts)
    for (const std::string p : {"fp64", "fp32", "fp16"})
      for (const std::string seed : {"1", "2"}) {
        RankingVariant v;
        v.id = (a.empty() ? "" : a + "-") + p + "-s" + seed;
        if (!a.empty()) v.axes.push_back({"attention", a});
        v.axes.push_back({"precision", p});
        v.axes.push_back({"seed", seed});
        s.variants.push_back(v);
      }
  return s;
}

std::string value(const RankingVariant& v, const std::string& axis) {
  for (const auto& [a, x] : v.axes)
    if (a == axis) return x;
  return "";
}

// W1 at step s for pairs that differ in one axis only: attention (1 + 0.5 seed index), seed 3,
// precision fp64-fp32 0.5, fp64-fp16 8.5, fp32-fp16 8; all times s / 100. Pairs differing in more
// than one axis get 1e6 (they must never be used). max |dW| = 10 W1.
StepMatrices make_step(const Study& st, std::int64_t step) {
  const std::size_t V = st.variants.size();
  StepMatrices m{step, std::vector<double>(V * V, 0.0), std::vector<double>(V * V, 0.0)};
  const double f = static_cast<double>(step) / 100.0;
  for (std::size_t i = 0; i < V; ++i)
    for (std::size_t j = 0; j < V; ++j) {
      if (i == j) continue;
      const auto &a = st.variants[i], &b = st.variants[j];
      std::vector<std::string> differ;
      for (const auto& [axis, x] : a.axes)
        if (value(b, axis) != x) differ.push_back(axis);
      double w = 1e6;
      if (differ.size() == 1) {
        if (differ[0] == "attention") w = 1.0 + 0.5 * (value(a, "seed") == "2");
        if (differ[0] == "seed") w = 3.0;
        if (differ[0] == "precision") {
          const std::string p = value(a, "precision"), q = value(b, "precision");
          const bool has64 = p == "fp64" || q == "fp64", has16 = p == "fp16" || q == "fp16";
          w = has64 && has16 ? 8.5 : has64 ? 0.5 : 8.0;
        }
      }
      m.w1[i * V + j] = w * f;
      m.max_abs[i * V + j] = 10 * w * f;
    }
  return m;
}

const RankingRow& row(const Ranking& r, const std::string& axis, const std::string& a, const std::string& b,
                      std::int64_t step) {
  for (const auto& x : r.rows)
    if (x.axis == axis && x.value_a == a && x.value_b == b && x.step == step) return x;
  throw std::runtime_error("no row " + axis + " " + a + " " + b + " " + std::to_string(step));
}

TEST(Ranking, KnownAnswerOnATwoByThreeByTwoGrid) {
  const Study st = make_study();
  // Steps out of order: rows must come out ascending.
  const Ranking r = rank_deviation_sources(st.axes, st.variants, {make_step(st, 200), make_step(st, 100)});

  const RankingRow& att = row(r, "attention", "*", "*", 100);
  EXPECT_EQ(att.pairs, 6u);  // 3 precisions x 2 seeds
  EXPECT_CLOSE(att.w1_mean, 1.25);
  EXPECT_EQ(att.w1_min, 1.0);
  EXPECT_EQ(att.w1_max, 1.5);
  EXPECT_CLOSE(att.max_abs_mean, 12.5);
  EXPECT_CLOSE(att.slope, 0.0125);
  EXPECT_EQ(att.ratio_to_attention, 1.0);
  EXPECT_EQ(att.ratio_lo, 1.0);
  EXPECT_EQ(att.ratio_hi, 1.0);

  const RankingRow& seed = row(r, "seed", "*", "*", 200);
  EXPECT_EQ(seed.pairs, 6u);
  EXPECT_CLOSE(seed.w1_mean, 6.0);
  EXPECT_CLOSE(seed.ratio_to_attention, 6.0 / 2.5);
  // Source constant 3 (x2), attention means of resamples lie in [1, 1.5] (x2): ratio in [2, 3].
  EXPECT_GE(seed.ratio_lo, 2.0);
  EXPECT_LE(seed.ratio_hi, 3.0);
  EXPECT_LT(seed.ratio_lo, seed.ratio_to_attention);
  EXPECT_GT(seed.ratio_hi, seed.ratio_to_attention);

  const RankingRow& prec = row(r, "precision", "*", "*", 100);
  EXPECT_EQ(prec.pairs, 12u);  // 4 contexts x 3 value pairs
  EXPECT_CLOSE(prec.w1_mean, (0.5 + 8.5 + 8.0) / 3);
  EXPECT_EQ(prec.w1_min, 0.5);
  EXPECT_EQ(prec.w1_max, 8.5);
  // Value pairs in the grid's order of values: fp64<->fp32, fp64<->fp16, fp32<->fp16.
  const RankingRow& p6432 = row(r, "precision", "fp64", "fp32", 100);
  const RankingRow& p6416 = row(r, "precision", "fp64", "fp16", 100);
  const RankingRow& p3216 = row(r, "precision", "fp32", "fp16", 200);
  EXPECT_EQ(p6432.pairs, 4u);
  EXPECT_CLOSE(p6432.w1_mean, 0.5);
  EXPECT_CLOSE(p6416.w1_mean, 8.5);
  EXPECT_CLOSE(p3216.w1_mean, 16.0);
  EXPECT_CLOSE(p3216.slope, 0.08);
  EXPECT_CLOSE(p3216.ratio_to_attention, 16.0 / 2.5);
  EXPECT_CLOSE(p3216.max_abs_mean, 160.0);

  // Order: axes in grid order, "*" first, steps ascending; 1 + 1 + 3 + ... groups x 2 steps.
  ASSERT_EQ(r.rows.size(), 2u * (1 + 1 + 1 + 3 + 1 + 1));
  EXPECT_EQ(r.rows[0].axis, "attention");
  EXPECT_EQ(r.rows[0].step, 100);
  EXPECT_EQ(r.rows[1].step, 200);
  EXPECT_EQ(r.rows[4].axis, "precision");
  EXPECT_EQ(r.rows[4].value_a, "*");
  EXPECT_TRUE(r.notes.empty());
}

TEST(Ranking, MissingPairsAreSkipped) {
  const Study st = make_study();
  StepMatrices s100 = make_step(st, 100);
  const std::size_t V = st.variants.size();
  // flash-fp64-s1 (0) vs baseline-fp64-s1 (6) differ in attention only: drop it, both triangles.
  s100.w1[0 * V + 6] = s100.w1[6 * V + 0] = std::nan("");
  const Ranking r = rank_deviation_sources(st.axes, st.variants, {s100, make_step(st, 200)});
  const RankingRow& att = row(r, "attention", "*", "*", 100);
  EXPECT_EQ(att.pairs, 5u);
  EXPECT_CLOSE(att.w1_mean, (2 * 1.0 + 3 * 1.5) / 5);
  EXPECT_EQ(row(r, "attention", "*", "*", 200).pairs, 6u);
  // max |dW| is still there for that pair: its mean is over 6 pairs.
  EXPECT_CLOSE(att.max_abs_mean, 12.5);
  // A matrix filled in the upper triangle only is read the same way.
  StepMatrices upper = make_step(st, 100);
  for (std::size_t i = 0; i < V; ++i)
    for (std::size_t j = 0; j < i; ++j) upper.w1[i * V + j] = std::nan("");
  const Ranking u = rank_deviation_sources(st.axes, st.variants, {upper});
  EXPECT_EQ(row(u, "attention", "*", "*", 100).pairs, 6u);
  EXPECT_CLOSE(row(u, "attention", "*", "*", 100).w1_mean, 1.25);
}

TEST(Ranking, SingleStepHasNoSlope) {
  const Study st = make_study();
  const Ranking r = rank_deviation_sources(st.axes, st.variants, {make_step(st, 100)});
  EXPECT_TRUE(std::isnan(row(r, "precision", "*", "*", 100).slope));
  EXPECT_CLOSE(row(r, "precision", "*", "*", 100).w1_mean, 17.0 / 3);
}

TEST(Ranking, NoAttentionAxis) {
  const Study st = make_study(false);
  const Ranking r = rank_deviation_sources(st.axes, st.variants, {make_step(st, 100), make_step(st, 300)});
  const RankingRow& seed = row(r, "seed", "*", "*", 300);
  EXPECT_CLOSE(seed.w1_mean, 9.0);
  EXPECT_CLOSE(seed.slope, 0.03);
  EXPECT_TRUE(std::isnan(seed.ratio_to_attention));
  EXPECT_TRUE(std::isnan(seed.ratio_lo));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("no 'attention' axis"), std::string::npos);
  EXPECT_NE(format_ranking_table(r).find("note: the grid has no 'attention' axis"), std::string::npos);
}

TEST(Ranking, TwinsAreTheFp64VariantsWithTheSameOtherAxes) {
  const Study st = make_study();
  const Ranking r = rank_deviation_sources(st.axes, st.variants, {make_step(st, 100), make_step(st, 200)});
  ASSERT_EQ(r.twins.size(), 8u * 2);  // 8 non-fp64 variants x 2 steps
  for (const auto& t : r.twins) {
    const std::string prec = t.variant.find("fp16") != std::string::npos ? "fp16" : "fp32";
    EXPECT_EQ(t.precision, prec);
    std::string twin = t.variant;
    twin.replace(twin.find(prec), 4, "fp64");
    EXPECT_EQ(t.twin, twin);
    EXPECT_CLOSE(t.w1, (prec == "fp16" ? 8.5 : 0.5) * static_cast<double>(t.step) / 100);
    EXPECT_CLOSE(t.max_abs, 10 * t.w1);
  }
  // No fp64 value on the precision axis: no twins.
  Study no64 = make_study();
  no64.axes[1].second = {"fp64x", "fp32", "fp16"};
  for (auto& v : no64.variants)
    for (auto& [a, x] : v.axes)
      if (x == "fp64") x = "fp64x";
  EXPECT_TRUE(rank_deviation_sources(no64.axes, no64.variants, {make_step(st, 100)}).twins.empty());
}

TEST(Ranking, BootstrapIsDeterministicAndCollapsesWithOnePair) {
  const Study st = make_study();
  const std::vector<StepMatrices> steps{make_step(st, 100)};
  const Ranking a = rank_deviation_sources(st.axes, st.variants, steps);
  const Ranking b = rank_deviation_sources(st.axes, st.variants, steps);
  for (std::size_t i = 0; i < a.rows.size(); ++i) {
    EXPECT_EQ(a.rows[i].ratio_lo, b.rows[i].ratio_lo);
    EXPECT_EQ(a.rows[i].ratio_hi, b.rows[i].ratio_hi);
  }
  // Two variants differing in attention, two in seed, sharing one: one pair each, no spread.
  GridAxes axes{{"attention", {"flash", "baseline"}}, {"seed", {"1", "2"}}};
  std::vector<RankingVariant> v{{"f1", {{"attention", "flash"}, {"seed", "1"}}},
                                {"b1", {{"attention", "baseline"}, {"seed", "1"}}},
                                {"f2", {{"attention", "flash"}, {"seed", "2"}}}};
  const double nan = std::nan("");
  StepMatrices s{7, {0, 2, 6, 2, 0, nan, 6, nan, 0}, {}};
  const Ranking r = rank_deviation_sources(axes, v, {s});
  const RankingRow& seed = row(r, "seed", "*", "*", 7);
  EXPECT_EQ(seed.pairs, 1u);
  EXPECT_EQ(seed.ratio_to_attention, 3.0);
  EXPECT_EQ(seed.ratio_lo, 3.0);
  EXPECT_EQ(seed.ratio_hi, 3.0);
  EXPECT_TRUE(std::isnan(seed.max_abs_mean));  // no max |dW| matrix given
}

TEST(Ranking, AxesWithoutEvidenceAreNoted) {
  GridAxes axes{{"attention", {"flash", "baseline"}}, {"precision", {"fp32", "fp16"}}};
  std::vector<RankingVariant> v{{"f32", {{"attention", "flash"}, {"precision", "fp32"}}},
                                {"b16", {{"attention", "baseline"}, {"precision", "fp16"}}}};
  const Ranking r = rank_deviation_sources(axes, v, {{1, {0, 1, 1, 0}, {}}});
  EXPECT_TRUE(r.rows.empty());
  EXPECT_EQ(r.notes.size(), 3u);  // two axes without pairs, and no attention pairs
  EXPECT_NE(format_ranking_table(r).find("none"), std::string::npos);
}

TEST(Ranking, RejectsInconsistentInput) {
  const Study st = make_study();
  Study bad = st;
  bad.variants[3].axes[1].second = "fp8";
  EXPECT_THROW(rank_deviation_sources(bad.axes, bad.variants, {make_step(st, 1)}), RankingError);
  bad = st;
  bad.variants[2].axes.push_back(bad.variants[2].axes.front());
  EXPECT_THROW(rank_deviation_sources(bad.axes, bad.variants, {make_step(st, 1)}), RankingError);
  bad = st;
  bad.variants[0].axes.pop_back();
  EXPECT_THROW(rank_deviation_sources(bad.axes, bad.variants, {make_step(st, 1)}), RankingError);
  StepMatrices small{1, {0, 1, 1, 0}, {}};
  EXPECT_THROW(rank_deviation_sources(st.axes, st.variants, {small}), RankingError);
  RankingOptions opt;
  opt.interval = 1.5;
  EXPECT_THROW(rank_deviation_sources(st.axes, st.variants, {make_step(st, 1)}, opt), RankingError);
  const Ranking none = rank_deviation_sources(st.axes, st.variants, {});
  EXPECT_TRUE(none.rows.empty());
  ASSERT_FALSE(none.notes.empty());
  EXPECT_NE(none.notes[0].find("no checkpoint steps"), std::string::npos);
}

TEST(Ranking, TableRanksSourcesLargestFirst) {
  const Study st = make_study();
  const Ranking r = rank_deviation_sources(st.axes, st.variants, {make_step(st, 100), make_step(st, 200)});
  const std::string t = format_ranking_table(r);
  const auto p = t.find("precision"), s = t.find("seed"), a = t.find("\n3    attention");
  ASSERT_NE(p, std::string::npos) << t;
  ASSERT_NE(a, std::string::npos) << t;
  EXPECT_LT(p, s);
  EXPECT_LT(s, a);
  EXPECT_NE(t.find("step 200"), std::string::npos);
  EXPECT_NE(t.find("fp32<->fp16"), std::string::npos);  // precision has 3 value pairs: listed
  EXPECT_EQ(t.find("1<->2"), std::string::npos);        // seed has one: not repeated
  EXPECT_NE(t.find("fp16 17 (4 variants)"), std::string::npos) << t;  // twin mean at step 200
}

}  // namespace
}  // namespace fastudy
