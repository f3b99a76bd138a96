// Tests of the ranking of deviation sources and the per-condition verdict (analysis/ranking.hpp) on
// hand-made matrices whose answer is known: a 2 x 3 x k grid (an optimisation "opt" x a reference
// "prec" with 3 values x a replicate reference "rep" with k values), with the axes' roles given
// synthetically (no name is special). Pairs that differ in two axes get 1e6 and must never be used.
// Checked: per-condition rows and their pairing, the pooled summary, the reference "under the same
// condition", the slope ratio and the end-point ratio, the < 3 independent pairs rule, the noise floor
// from a noise axis, bit-identical controls, disagreeing conditions, fp64 twins and the printed text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "analysis/ranking.hpp"

namespace fastudy {
namespace {

// Every expected value is a short sum/ratio/least-squares fit of small exact numbers: a few dozen
// roundings, <= 64 u relative.
constexpr double kTol = 64 * 0x1p-53;
#define EXPECT_CLOSE(a, b) EXPECT_NEAR((a), (b), kTol * std::fabs(b))

struct Study {
  std::vector<RankingAxis> axes;
  std::vector<RankingVariant> variants;
};

std::string value(const RankingVariant& v, const std::string& axis) {
  for (const auto& [a, x] : v.axes)
    if (a == axis) return x;
  return "";
}

// The cross product of the axes, first axis slowest (as the grid expands).
Study make_study(std::vector<RankingAxis> axes) {
  Study s;
  s.axes = std::move(axes);
  std::vector<std::size_t> k(s.axes.size(), 0);
  while (true) {
    RankingVariant v;
    for (std::size_t a = 0; a < s.axes.size(); ++a) {
      v.axes.push_back({s.axes[a].name, s.axes[a].values[k[a]]});
      v.id += (a ? "-" : "") + s.axes[a].values[k[a]];
    }
    s.variants.push_back(v);
    std::size_t a = s.axes.size();
    while (a > 0 && ++k[a - 1] == s.axes[a - 1].values.size()) k[--a] = 0;
    if (a == 0) break;
  }
  return s;
}

// opt: optimisation, baseline "base" (listed second); prec: reference, baseline "p32", not a replicate;
// rep: replicate reference with `reps` values.
Study standard(int reps = 3) {
  std::vector<std::string> r;
  for (int i = 1; i <= reps; ++i) r.push_back(std::to_string(i));
  return make_study({{"opt", {"fast", "base"}, SourceRole::optimisation, "base", false},
                     {"prec", {"p32", "p16", "p8"}, SourceRole::reference, "p32", false},
                     {"rep", r, SourceRole::reference, "", true}});
}

using W1Rule = std::function<double(const RankingVariant&, const RankingVariant&, const std::string& axis)>;

// W1 at step s = rule(pair differing in one axis) * s; other pairs 1e6; max |dW| = 10 W1.
StepMatrices make_step(const Study& st, std::int64_t step, const W1Rule& rule) {
  const std::size_t V = st.variants.size();
  StepMatrices m{step, std::vector<double>(V * V, 0.0), std::vector<double>(V * V, 0.0)};
  for (std::size_t i = 0; i < V; ++i)
    for (std::size_t j = 0; j < V; ++j) {
      if (i == j) continue;
      const auto &a = st.variants[i], &b = st.variants[j];
      std::vector<std::string> differ;
      for (const auto& [axis, x] : a.axes)
        if (value(b, axis) != x) differ.push_back(axis);
      const double w = differ.size() == 1 ? rule(a, b, differ[0]) * static_cast<double>(step) : 1e6;
      m.w1[i * V + j] = w;
      m.max_abs[i * V + j] = 10 * w;
    }
  return m;
}

// The optimisation: 1 at p32, 2 at p16, 40 at p8 (grows with coarser precision; never by replicate).
// prec: p32<->p16 10, p32<->p8 20, p16<->p8 30, whatever opt is; rep: 5 (any pair).
double standard_rule(const RankingVariant& a, const RankingVariant& b, const std::string& axis) {
  if (axis == "opt") {
    const std::string p = value(a, "prec");
    return p == "p32" ? 1.0 : p == "p16" ? 2.0 : 40.0;
  }
  if (axis == "prec") {
    const std::string p = value(a, "prec"), q = value(b, "prec");
    const bool has32 = p == "p32" || q == "p32", has8 = p == "p8" || q == "p8";
    return has32 && has8 ? 20.0 : has32 ? 10.0 : 30.0;
  }
  return 5.0;
}

const RankingRow& row(const Ranking& r, const std::string& axis, const std::string& condition, const std::string& a,
                      const std::string& b, std::int64_t step) {
  for (const auto& x : r.rows)
    if (x.axis == axis && x.condition == condition && x.value_a == a && x.value_b == b && x.step == step) return x;
  throw std::runtime_error("no row " + axis + " " + condition + " " + a + " " + b + " " + std::to_string(step));
}

std::vector<const ComparisonRow*> comparisons(const Ranking& r, const std::string& condition) {
  std::vector<const ComparisonRow*> out;
  for (const auto& c : r.comparisons)
    if (c.condition == condition) out.push_back(&c);
  return out;
}

const ComparisonRow& comparison(const Ranking& r, const std::string& condition, const std::string& reference,
                                const std::string& pair) {
  for (const auto& c : r.comparisons)
    if (c.condition == condition && c.reference == reference && c.reference_pair == pair) return c;
  throw std::runtime_error("no comparison " + condition + " " + reference + " " + pair);
}

Ranking rank_standard(const Study& st, const W1Rule& rule = standard_rule) {
  return rank_deviation_sources(st.axes, st.variants, {make_step(st, 20, rule), make_step(st, 10, rule)});
}

TEST(Ranking, PerConditionRowsPairTheBaselineWithEachValueUnderEqualConditions) {
  const Study st = standard();
  const Ranking r = rank_standard(st);
  // opt's conditions are prec's values (rep is a replicate): one row each, baseline first, 3 pairs.
  for (const auto& [cond, w] : std::vector<std::pair<std::string, double>>{{"prec=p32", 1}, {"prec=p16", 2}, {"prec=p8", 40}}) {
    const RankingRow& x = row(r, "opt", cond, "base", "fast", 20);
    EXPECT_EQ(x.role, SourceRole::optimisation);
    EXPECT_EQ(x.pairs, 3u);
    EXPECT_EQ(x.independent, 3u);
    EXPECT_CLOSE(x.w1_mean, 20 * w);
    EXPECT_CLOSE(x.slope, w);
    EXPECT_CLOSE(x.max_abs_mean, 200 * w);
  }
  // The pooled summary keeps every pair: mean (1 + 2 + 40) / 3, 9 pairs.
  const RankingRow& pooled = row(r, "opt", "*", "*", "*", 10);
  EXPECT_EQ(pooled.pairs, 9u);
  EXPECT_CLOSE(pooled.w1_mean, 10 * 43.0 / 3);
  EXPECT_EQ(pooled.w1_min, 10.0);
  EXPECT_EQ(pooled.w1_max, 400.0);
  // prec (not a replicate) per condition: conditions are opt's values, opt at its baseline labelled "all"
  // (an optimisation axis at its baseline is left out of the label); p32 (the baseline) vs p16 and p8.
  const RankingRow& p = row(r, "prec", "all", "p32", "p8", 10);
  EXPECT_EQ(p.pairs, 3u);
  EXPECT_CLOSE(p.w1_mean, 200.0);
  EXPECT_THROW(row(r, "prec", "all", "p16", "p8", 10), std::runtime_error);  // not a baseline pair
  EXPECT_CLOSE(row(r, "prec", "*", "p16", "p8", 10).w1_mean, 300.0);              // but pooled it is there
  // rep (a replicate): one row per condition (opt x prec) over all pairs of its 3 values, 1 independent.
  const RankingRow& rr = row(r, "rep", "opt=fast;prec=p16", "*", "*", 20);
  EXPECT_EQ(rr.pairs, 3u);
  EXPECT_EQ(rr.independent, 1u);
  EXPECT_CLOSE(rr.w1_mean, 100.0);
  // Rows are ascending in step.
  EXPECT_EQ(r.rows[0].step, 10);
  EXPECT_EQ(r.rows[1].step, 20);
}

TEST(Ranking, ComparesEachConditionWithTheReferencesUnderTheSameCondition) {
  const Study st = standard(6);
  const Ranking r = rank_standard(st);
  // prec=p16: precision reference = p32<->p16 with opt at its baseline (10 per step), 6 pairs.
  const ComparisonRow& p16 = comparison(r, "prec=p16", "prec", "p32<->p16");
  EXPECT_EQ(p16.axis, "opt");
  EXPECT_EQ(p16.baseline, "base");
  EXPECT_EQ(p16.value, "fast");
  EXPECT_EQ(p16.pairs, 6u);
  EXPECT_EQ(p16.independent, 6u);
  EXPECT_EQ(p16.reference_pairs, 6u);
  EXPECT_EQ(p16.step, 20);
  EXPECT_CLOSE(p16.w1, 40.0);
  EXPECT_CLOSE(p16.reference_w1, 200.0);
  EXPECT_CLOSE(p16.end_ratio, 0.2);
  EXPECT_CLOSE(p16.slope, 2.0);
  EXPECT_CLOSE(p16.reference_slope, 10.0);
  EXPECT_CLOSE(p16.slope_ratio, 0.2);
  EXPECT_TRUE(p16.informative);
  // Constant values on both sides: every resample gives the same ratio.
  EXPECT_CLOSE(p16.end_lo, 0.2);
  EXPECT_CLOSE(p16.end_hi, 0.2);
  EXPECT_CLOSE(p16.slope_lo, 0.2);
  EXPECT_EQ(p16.comparison, "within");
  // prec=p32 is the reference's baseline: one comparison per other precision.
  EXPECT_CLOSE(comparison(r, "prec=p32", "prec", "p32<->p16").end_ratio, 0.1);
  EXPECT_CLOSE(comparison(r, "prec=p32", "prec", "p32<->p8").end_ratio, 0.05);
  // The replicate reference at the same condition: rep pairs with opt = base and prec = p8:
  // 15 pairs among 6 replicates, 3 independent.
  const ComparisonRow& rep = comparison(r, "prec=p8", "rep", "*");
  EXPECT_EQ(rep.reference_pairs, 15u);
  EXPECT_EQ(rep.reference_independent, 3u);
  EXPECT_TRUE(rep.informative);
  EXPECT_CLOSE(rep.end_ratio, 8.0);
  EXPECT_EQ(rep.comparison, "outside");
  EXPECT_EQ(rep.verdict, "outside");
  EXPECT_EQ(rep.measure, "slope");
  EXPECT_EQ(comparison(r, "prec=p16", "rep", "*").verdict, "within");  // 2 / 5 and 2 / 10
  EXPECT_EQ(comparisons(r, "prec=p32").size(), 3u);                     // rep, p32<->p16, p32<->p8
  // The conditions disagree, and a note says where.
  bool noted = false;
  for (const auto& n : r.notes)
    noted = noted || (n.find("opt fast vs base: the conditions disagree") != std::string::npos &&
                      n.find("within at prec=p32, prec=p16") != std::string::npos &&
                      n.find("outside at prec=p8") != std::string::npos);
  EXPECT_TRUE(noted);
  // No noise axis: the floor is stated as 0 by construction.
  EXPECT_TRUE(std::isnan(rep.noise_w1));
  EXPECT_TRUE(r.noise_axis.empty());
  bool floor = false;
  for (const auto& n : r.notes) floor = floor || n.find("noise floor: 0 by construction") != std::string::npos;
  EXPECT_TRUE(floor);
}

TEST(Ranking, FewerThanThreeIndependentPairsIsNotInformative) {
  // 2 replicates: 2 optimisation pairs per condition, 1 replicate pair: no interval is computed.
  const Study st = standard(2);
  const Ranking r = rank_standard(st);
  const ComparisonRow& c = comparison(r, "prec=p16", "prec", "p32<->p16");
  EXPECT_EQ(c.independent, 2u);
  EXPECT_FALSE(c.informative);
  EXPECT_TRUE(std::isnan(c.end_lo) && std::isnan(c.end_hi) && std::isnan(c.slope_lo) && std::isnan(c.slope_hi));
  EXPECT_CLOSE(c.end_ratio, 0.2);  // the point estimate is still there
  EXPECT_EQ(c.comparison, "within");
  const std::string t = format_ranking_table(r);
  EXPECT_NE(t.find("0.2 not informative (2 pairs)"), std::string::npos) << t;
  EXPECT_NE(t.find("not informative (1 pair)"), std::string::npos) << t;
  // 3 replicates: 3 optimisation pairs: informative against prec, not against rep (1 independent pair).
  const Ranking r3 = rank_standard(standard(3));
  EXPECT_TRUE(comparison(r3, "prec=p16", "prec", "p32<->p16").informative);
  EXPECT_FALSE(comparison(r3, "prec=p16", "rep", "*").informative);
}

TEST(Ranking, SlopeRatioRemovesTheReferencesOffset) {
  // rep starts apart: W1 = 100 + step (an offset from step 0); opt grows as 3 * step from 0.
  const Study st = standard(6);
  const W1Rule rule = [](const RankingVariant& a, const RankingVariant& b, const std::string& axis) {
    return axis == "rep" ? 0.0 : standard_rule(a, b, axis);
  };
  std::vector<StepMatrices> steps;
  for (std::int64_t s : {10, 20, 30, 40}) {
    StepMatrices m = make_step(st, s, rule);
    const std::size_t V = st.variants.size();
    for (std::size_t i = 0; i < V; ++i)
      for (std::size_t j = 0; j < V; ++j) {
        std::size_t differ = 0;
        bool rep = false;
        for (const auto& [axis, x] : st.variants[i].axes)
          if (value(st.variants[j], axis) != x) ++differ, rep = axis == "rep";
        if (differ == 1 && rep) m.w1[i * V + j] = 100.0 + static_cast<double>(s);
      }
    steps.push_back(m);
  }
  const Ranking r = rank_deviation_sources(st.axes, st.variants, steps);
  const ComparisonRow& c = comparison(r, "prec=p8", "rep", "*");
  EXPECT_CLOSE(c.end_ratio, 40.0 * 40 / 140);  // the end-point says outside ...
  EXPECT_CLOSE(c.slope_ratio, 40.0);           // ... and so does the slope, 40x
  const ComparisonRow& d = comparison(r, "prec=p32", "rep", "*");
  EXPECT_CLOSE(d.end_ratio, 40.0 / 140);  // end-point: within, thanks to the offset
  EXPECT_CLOSE(d.slope_ratio, 1.0);       // slope: as fast as the reference
  EXPECT_EQ(d.measure, "slope");
  EXPECT_EQ(d.comparison, "within");  // q = 1 <= 1, interval [1, 1]
  // One step: no slope, the verdict falls back to the end-point ratio.
  const Ranking one = rank_deviation_sources(st.axes, st.variants, {steps.back()});
  const ComparisonRow& e = comparison(one, "prec=p32", "rep", "*");
  EXPECT_TRUE(std::isnan(e.slope_ratio));
  EXPECT_EQ(e.measure, "end-point");
  EXPECT_TRUE(std::isnan(row(one, "opt", "prec=p32", "base", "fast", 40).slope));
}

TEST(Ranking, NoiseAxisGivesTheFloorAndControlsAreBitIdentical) {
  // A noise axis (replicate) "again" [1, 2]; opt has a control value "same" that moves nothing.
  const Study st = make_study({{"opt", {"base", "fast", "same"}, SourceRole::optimisation, "", false},
                               {"rep", {"1", "2", "3"}, SourceRole::reference, "", true},
                               {"again", {"1", "2"}, SourceRole::noise, "", true}});
  const W1Rule rule = [](const RankingVariant& a, const RankingVariant& b, const std::string& axis) {
    if (axis == "again") return 0.5;
    if (axis == "rep") return 4.0;
    const bool control = value(a, "opt") == "same" || value(b, "opt") == "same";
    const bool fast = value(a, "opt") == "fast" || value(b, "opt") == "fast";
    return control && !fast ? 0.0 : fast && !control ? 0.25 : 9.0;
  };
  const Ranking r = rank_standard(st, rule);
  EXPECT_EQ(r.noise_axis, "again");
  // Noise rows per condition (opt's values) and pooled.
  EXPECT_CLOSE(row(r, "again", "opt=fast", "*", "*", 20).w1_mean, 10.0);
  EXPECT_EQ(row(r, "again", "*", "*", "*", 20).pairs, 9u);
  // fast vs base: W1 0.25 / step, below the floor 0.5 / step: within noise. Condition "all" (no
  // condition axis has two values).
  const ComparisonRow& fast = comparison(r, "all", "rep", "*");
  EXPECT_EQ(fast.value, "fast");
  EXPECT_CLOSE(fast.noise_w1, 10.0);
  EXPECT_EQ(fast.verdict, "within noise");
  // The 6 optimisation pairs (3 reps x 2 noise values) and 6 reference pairs of 3 reps x 2: 2 independent.
  EXPECT_EQ(fast.pairs, 6u);
  EXPECT_EQ(fast.reference_independent, 2u);
  for (const auto& c : r.comparisons)
    if (c.value == "same") {
      EXPECT_EQ(c.verdict, "bit-identical");
    }
  bool floor_note = false;
  for (const auto& n : r.notes) floor_note = floor_note || n.find("by construction") != std::string::npos;
  EXPECT_FALSE(floor_note);
  EXPECT_NE(format_ranking_table(r).find("noise floor (axis again, 9 pairs)"), std::string::npos);
}

TEST(Ranking, RolesNotNamesDecide) {
  // The same grid with the axes renamed and reordered gives the same comparisons.
  const Study a = standard(3);
  const Study b = make_study({{"zz", {"1", "2", "3"}, SourceRole::reference, "", true},
                              {"kernel", {"fast", "base"}, SourceRole::optimisation, "base", false},
                              {"fmt", {"p32", "p16", "p8"}, SourceRole::reference, "p32", false}});
  const W1Rule rename = [](const RankingVariant& x, const RankingVariant& y, const std::string& axis) {
    RankingVariant u{x.id, {{"opt", value(x, "kernel")}, {"prec", value(x, "fmt")}, {"rep", value(x, "zz")}}};
    RankingVariant v{y.id, {{"opt", value(y, "kernel")}, {"prec", value(y, "fmt")}, {"rep", value(y, "zz")}}};
    return standard_rule(u, v, axis == "kernel" ? "opt" : axis == "fmt" ? "prec" : "rep");
  };
  const Ranking ra = rank_standard(a), rb = rank_standard(b, rename);
  ASSERT_EQ(ra.comparisons.size(), rb.comparisons.size());
  const ComparisonRow& x = comparison(rb, "fmt=p16", "fmt", "p32<->p16");
  EXPECT_EQ(x.axis, "kernel");
  EXPECT_CLOSE(x.end_ratio, 0.2);
  // A setting axis gets no per-condition rows and no verdict; it splits the conditions.
  Study s = standard(3);
  s = make_study({s.axes[0], s.axes[1], s.axes[2], {"lr", {"1", "2"}, SourceRole::setting, "", false}});
  const Ranking rs = rank_standard(s, [](const RankingVariant& x, const RankingVariant& y, const std::string& axis) {
    return axis == "lr" ? 7.0 : standard_rule(x, y, axis);
  });
  for (const auto& row : rs.rows)
    if (row.axis == "lr") {
      EXPECT_EQ(row.condition, "*");
    }
  EXPECT_NO_THROW(comparison(rs, "prec=p16;lr=2", "prec", "p32<->p16"));
}

TEST(Ranking, DeclaredBaselineMissingFromTheGridFallsBackToTheFirstValue) {
  const Study st = make_study({{"opt", {"fast", "slow"}, SourceRole::optimisation, "base", false},
                               {"rep", {"1", "2"}, SourceRole::reference, "", true}});
  const Ranking r = rank_standard(st, [](const RankingVariant&, const RankingVariant&, const std::string& axis) {
    return axis == "opt" ? 1.0 : 2.0;
  });
  EXPECT_EQ(r.comparisons.front().baseline, "fast");
  EXPECT_EQ(r.comparisons.front().value, "slow");
  bool noted = false;
  for (const auto& n : r.notes) noted = noted || n.find("its baseline base is not in the grid") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(Ranking, WithoutAReferenceTheVerdictSaysSo) {
  // A replicate setting (a data seed) gives pairs but bounds nothing.
  const Study st = make_study({{"opt", {"base", "fast"}, SourceRole::optimisation, "", false},
                               {"data", {"1", "2", "3"}, SourceRole::setting, "", true}});
  const Ranking r = rank_standard(st, [](const RankingVariant&, const RankingVariant&, const std::string&) { return 1.0; });
  ASSERT_EQ(r.comparisons.size(), 1u);
  const ComparisonRow& c = r.comparisons.front();
  EXPECT_EQ(c.condition, "all");
  EXPECT_TRUE(c.reference.empty());
  EXPECT_EQ(c.verdict, "no reference");
  EXPECT_EQ(c.pairs, 3u);
  EXPECT_CLOSE(c.w1, 20.0);
  EXPECT_TRUE(std::isnan(c.end_ratio));
  EXPECT_NE(format_ranking_table(r).find("no reference (end-point)"), std::string::npos) << format_ranking_table(r);
}

TEST(Ranking, MissingPairsAreSkipped) {
  const Study st = standard(3);
  StepMatrices s10 = make_step(st, 10, standard_rule);
  const std::size_t V = st.variants.size();
  // fast-p32-1 (0) vs base-p32-1 (9) differ in opt only: drop it, both triangles.
  ASSERT_EQ(st.variants[9].id, "base-p32-1");
  s10.w1[0 * V + 9] = s10.w1[9 * V + 0] = std::nan("");
  const Ranking r = rank_deviation_sources(st.axes, st.variants, {s10, make_step(st, 20, standard_rule)});
  EXPECT_EQ(row(r, "opt", "prec=p32", "base", "fast", 10).pairs, 2u);
  EXPECT_EQ(row(r, "opt", "prec=p32", "base", "fast", 20).pairs, 3u);
  EXPECT_CLOSE(row(r, "opt", "prec=p32", "base", "fast", 10).max_abs_mean, 100.0);  // max |dW| is still there
  // A matrix filled in the upper triangle only is read the same way.
  StepMatrices upper = make_step(st, 10, standard_rule);
  for (std::size_t i = 0; i < V; ++i)
    for (std::size_t j = 0; j < i; ++j) upper.w1[i * V + j] = std::nan("");
  const Ranking u = rank_deviation_sources(st.axes, st.variants, {upper});
  EXPECT_EQ(row(u, "opt", "*", "*", "*", 10).pairs, 9u);
}

TEST(Ranking, BootstrapIsDeterministic) {
  // Jittered values so that the interval is not a point.
  const Study st = standard(6);
  const W1Rule rule = [](const RankingVariant& a, const RankingVariant& b, const std::string& axis) {
    return standard_rule(a, b, axis) * (1 + 0.1 * std::stoi(value(a, "rep")) + 0.05 * std::stoi(value(b, "rep")));
  };
  const Ranking a = rank_standard(st, rule), b = rank_standard(st, rule);
  ASSERT_EQ(a.comparisons.size(), b.comparisons.size());
  for (std::size_t i = 0; i < a.comparisons.size(); ++i) {
    EXPECT_EQ(a.comparisons[i].end_lo, b.comparisons[i].end_lo);
    EXPECT_EQ(a.comparisons[i].slope_hi, b.comparisons[i].slope_hi);
  }
  const ComparisonRow& c = comparison(a, "prec=p16", "prec", "p32<->p16");
  EXPECT_LT(c.end_lo, c.end_ratio);
  EXPECT_GT(c.end_hi, c.end_ratio);
}

TEST(Ranking, TwinsAreTheFp64VariantsWithTheSameOtherAxes) {
  const Study st = make_study({{"opt", {"fast", "base"}, SourceRole::optimisation, "base", false},
                               {"precision", {"fp64", "fp32", "fp16"}, SourceRole::reference, "fp32", false}});
  const Ranking r = rank_standard(st, [](const RankingVariant& a, const RankingVariant& b, const std::string& axis) {
    if (axis != "precision") return 1.0;
    const bool has16 = value(a, "precision") == "fp16" || value(b, "precision") == "fp16";
    return has16 ? 8.5 : 0.5;
  });
  ASSERT_EQ(r.twins.size(), 4u * 2);  // 4 non-fp64 variants x 2 steps
  for (const auto& t : r.twins) {
    EXPECT_EQ(t.twin.substr(0, t.twin.find('-')), t.variant.substr(0, t.variant.find('-')));
    EXPECT_NE(t.twin.find("fp64"), std::string::npos);
    EXPECT_CLOSE(t.w1, (t.precision == "fp16" ? 8.5 : 0.5) * static_cast<double>(t.step));
  }
  EXPECT_NE(format_ranking_table(r).find("fp16 170 (2 variants)"), std::string::npos) << format_ranking_table(r);
}

TEST(Ranking, AxesWithoutEvidenceAreNoted) {
  const std::vector<RankingAxis> axes{{"opt", {"fast", "base"}, SourceRole::optimisation, "base", false},
                                      {"prec", {"p32", "p16"}, SourceRole::reference, "", false}};
  std::vector<RankingVariant> v{{"f32", {{"opt", "fast"}, {"prec", "p32"}}}, {"b16", {{"opt", "base"}, {"prec", "p16"}}}};
  const Ranking r = rank_deviation_sources(axes, v, {{1, {0, 1, 1, 0}, {}}});
  EXPECT_TRUE(r.rows.empty());
  EXPECT_TRUE(r.comparisons.empty());
  EXPECT_NE(format_ranking_table(r).find("none"), std::string::npos);
  EXPECT_NE(format_ranking_table(r).find("axis 'opt': no two variants differ in it alone"), std::string::npos);
}

TEST(Ranking, RejectsInconsistentInput) {
  const Study st = standard(2);
  const auto step = make_step(st, 1, standard_rule);
  Study bad = st;
  bad.variants[3].axes[1].second = "p4";
  EXPECT_THROW(rank_deviation_sources(bad.axes, bad.variants, {step}), RankingError);
  bad = st;
  bad.variants[2].axes.push_back(bad.variants[2].axes.front());
  EXPECT_THROW(rank_deviation_sources(bad.axes, bad.variants, {step}), RankingError);
  bad = st;
  bad.variants[0].axes.pop_back();
  EXPECT_THROW(rank_deviation_sources(bad.axes, bad.variants, {step}), RankingError);
  bad = st;
  bad.axes.push_back(bad.axes.front());
  EXPECT_THROW(rank_deviation_sources(bad.axes, bad.variants, {step}), RankingError);
  StepMatrices small{1, {0, 1, 1, 0}, {}};
  EXPECT_THROW(rank_deviation_sources(st.axes, st.variants, {small}), RankingError);
  RankingOptions opt;
  opt.interval = 1.5;
  EXPECT_THROW(rank_deviation_sources(st.axes, st.variants, {step}, opt), RankingError);
  const Ranking none = rank_deviation_sources(st.axes, st.variants, {});
  EXPECT_TRUE(none.rows.empty());
  ASSERT_FALSE(none.notes.empty());
  EXPECT_NE(none.notes[0].find("no checkpoint steps"), std::string::npos);
}

// Every number of a ranking in hexadecimal (NaN as "nan"), and every text: equal dumps are equal bits.
std::string dump(const Ranking& r) {
  std::string s;
  const auto num = [&](double x) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%a ", x);
    s += buf;
  };
  for (const auto& x : r.rows) {
    s += x.axis + "|" + x.condition + "|" + x.value_a + "|" + x.value_b + "|" + std::to_string(x.pairs) + "|" +
         std::to_string(x.independent) + "|" + std::to_string(x.step) + "|";
    for (double v : {x.w1_mean, x.w1_min, x.w1_max, x.max_abs_mean, x.slope}) num(v);
    s += "\n";
  }
  for (const auto& c : r.comparisons) {
    s += c.axis + "|" + c.value + "|" + c.condition + "|" + c.reference + "|" + c.reference_pair + "|" +
         std::to_string(c.pairs) + "|" + std::to_string(c.reference_pairs) + "|" + c.measure + "|" + c.comparison + "|" +
         c.verdict + "|";
    for (double v : {c.w1, c.reference_w1, c.end_ratio, c.end_lo, c.end_hi, c.slope, c.reference_slope, c.slope_ratio,
                     c.slope_lo, c.slope_hi, c.noise_w1})
      num(v);
    s += "\n";
  }
  for (const auto& t : r.twins) {
    s += t.variant + "|" + t.twin + "|" + std::to_string(t.step) + "|";
    num(t.w1);
    num(t.max_abs);
    s += "\n";
  }
  for (const auto& n : r.notes) s += n + "\n";
  return s;
}

// verdict_pairs lists exactly the pairs that differ in one axis, and they are the only entries the
// ranking reads: NaN in every other entry (a reducer that computes only these pairs) gives the same
// ranking, verdict, intervals and twins, bit for bit.
TEST(Ranking, VerdictPairsAreTheOnlyEntriesTheRankingReads) {
  const Study noise = make_study({{"opt", {"base", "fast", "same"}, SourceRole::optimisation, "", false},
                                  {"rep", {"1", "2", "3"}, SourceRole::reference, "", true},
                                  {"again", {"1", "2"}, SourceRole::noise, "", true}});
  const Study twins = make_study({{"opt", {"fast", "base"}, SourceRole::optimisation, "base", false},
                                  {"precision", {"fp64", "fp32", "fp16"}, SourceRole::reference, "fp32", false},
                                  {"rep", {"1", "2", "3", "4"}, SourceRole::reference, "", true}});
  const W1Rule varied = [](const RankingVariant& a, const RankingVariant& b, const std::string& axis) {
    return 1.0 + static_cast<double>(a.id.size() % 3) + 0.5 * static_cast<double>(b.id.size() % 5) + (axis == "opt" ? 0.25 : 0.0);
  };
  for (const Study* st : {&noise, &twins}) {
    const auto pairs = verdict_pairs(st->axes, st->variants);
    const std::size_t V = st->variants.size();
    std::vector<std::pair<std::size_t, std::size_t>> want;
    for (std::size_t i = 0; i < V; ++i)
      for (std::size_t j = i + 1; j < V; ++j) {
        int differ = 0;
        for (const auto& [axis, x] : st->variants[i].axes) differ += value(st->variants[j], axis) != x;
        if (differ == 1) want.emplace_back(i, j);
      }
    EXPECT_EQ(pairs, want);
    std::vector<StepMatrices> full{make_step(*st, 20, varied), make_step(*st, 10, varied)}, masked = full;
    for (auto& m : masked)
      for (std::size_t i = 0; i < V; ++i)
        for (std::size_t j = 0; j < V; ++j)
          if (i != j && std::find(pairs.begin(), pairs.end(), std::make_pair(std::min(i, j), std::max(i, j))) == pairs.end())
            m.w1[i * V + j] = m.max_abs[i * V + j] = std::numeric_limits<double>::quiet_NaN();
    const Ranking a = rank_deviation_sources(st->axes, st->variants, full);
    const Ranking b = rank_deviation_sources(st->axes, st->variants, masked);
    EXPECT_FALSE(a.comparisons.empty());
    EXPECT_EQ(dump(b), dump(a));
  }
}

TEST(Ranking, TextOpensWithTheVerdictRowsThenThePooledSummary) {
  const Ranking r = rank_standard(standard(3));
  const std::string t = format_ranking_table(r);
  const auto v = t.find("# verdict per optimisation and condition at step 20");
  const auto line_with = [&](const std::string& a, const std::string& b) {
    for (std::size_t at = t.find(a); at != std::string::npos; at = t.find(a, at + 1))
      if (t.substr(at, t.find('\n', at) - at).find(b) != std::string::npos) return at;
    return std::string::npos;
  };
  const auto row32 = line_with("opt fast vs base", "prec=p32");
  const auto row8 = line_with("opt fast vs base", "prec=p8");
  const auto summary = t.find("# summary: deviation sources pooled");
  ASSERT_NE(v, std::string::npos) << t;
  ASSERT_NE(row32, std::string::npos) << t;
  ASSERT_NE(row8, std::string::npos) << t;
  ASSERT_NE(summary, std::string::npos) << t;
  EXPECT_LT(v, row32);
  EXPECT_LT(row8, summary);
  EXPECT_NE(t.find("outside (slope)"), std::string::npos) << t;
  // Pooled: prec (mean 200 at step 20 over its value pairs... largest) first; opt's spread 40x.
  EXPECT_NE(t.find("40x"), std::string::npos) << t;
  EXPECT_LT(t.find("\n1    prec"), t.find("\n2    opt")) << t;
}

}  // namespace
}  // namespace fastudy
