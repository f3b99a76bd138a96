// The ranking of deviation sources and the verdict: the implementation of analysis/ranking.hpp (the text
// rank 0 prints of it: ranking_table.cpp).
#include "analysis/ranking.hpp"

#include "base/hash.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

namespace fastudy {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
using Pair = std::pair<std::size_t, std::size_t>;

double mean_of(const std::vector<double>& x) {
  if (x.empty()) return kNaN;
  return std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(x.size());
}

double ratio_of(double num, double den) {
  if (std::isnan(num) || std::isnan(den)) return kNaN;
  if (den == 0) return num == 0 ? kNaN : std::numeric_limits<double>::infinity();
  return num / den;
}

// Linear interpolation between order statistics (numpy's default percentile).
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return kNaN;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const std::size_t k = static_cast<std::size_t>(pos);
  if (k + 1 >= sorted.size()) return sorted.back();
  return sorted[k] + (pos - static_cast<double>(k)) * (sorted[k + 1] - sorted[k]);
}

// Least-squares slope of y against x (centred, for accuracy); NaN with fewer than two distinct x.
double ls_slope(const std::vector<double>& xs, const std::vector<double>& ys) {
  const double xm = mean_of(xs), ym = mean_of(ys);
  double sxx = 0, sxy = 0;
  for (std::size_t t = 0; t < xs.size(); ++t) {
    sxx += (xs[t] - xm) * (xs[t] - xm);
    sxy += (xs[t] - xm) * (ys[t] - ym);
  }
  return xs.size() >= 2 && sxx > 0 ? sxy / sxx : kNaN;
}

// The most pairs that share no variant, greedily in the given order.
std::size_t independent_pairs(const std::vector<Pair>& pairs) {
  std::vector<std::size_t> used;
  std::size_t n = 0;
  for (const auto& [i, j] : pairs) {
    if (std::find(used.begin(), used.end(), i) != used.end() || std::find(used.begin(), used.end(), j) != used.end())
      continue;
    used.push_back(i);
    used.push_back(j);
    ++n;
  }
  return n;
}

// A group of pairs: one ranking row per step.
struct Group {
  std::size_t axis;
  std::string condition, value_a, value_b;
  std::vector<Pair> pairs;
};

// One side of a comparison at the final step and over the steps: the finite final W1 of its pairs
// (and which pairs they are, for the independent count) and each pair's slope.
struct Evidence {
  std::vector<double> final_w1;
  std::vector<Pair> final_pairs;
  std::vector<double> slopes;
};

// A pair of values of a reference axis (value indices, baseline first); kAnyReplicates: any two
// replicates of a replicate axis.
using ValuePair = std::pair<int, int>;
constexpr ValuePair kAnyReplicates{-1, -1};

class Ranker {
 public:
  Ranker(const std::vector<RankingAxis>& axes, const std::vector<RankingVariant>& variants,
         const std::vector<StepMatrices>& steps, const RankingOptions& options)
      : axes_(axes),
        variants_(variants),
        steps_(steps),
        options_(options),
        variant_count_(variants.size()),
        axis_count_(axes.size()) {}

  Ranking run();
  // The pairs that differ in one axis, every axis's together, ascending (verdict_pairs).
  std::vector<Pair> one_axis_pairs();

 private:
  const std::vector<RankingAxis>& axes_;
  const std::vector<RankingVariant>& variants_;
  const std::vector<StepMatrices>& steps_;
  const RankingOptions& options_;
  const std::size_t variant_count_, axis_count_;
  std::vector<std::vector<int>> value_index_;           // variant x axis -> index of its value
  std::vector<int> baseline_index_;                     // axis -> index of its baseline value
  std::vector<std::size_t> step_order_;                 // indices of steps_, steps ascending
  std::vector<std::vector<Pair>> single_axis_pairs_;    // axis -> pairs that differ in it only
  std::uint64_t bootstrap_stream_ = 0;                  // bootstrap() calls so far
  Ranking result_;

  // Input checks and indices (run's first steps).
  void check_options_and_axes() const;
  void index_variants();
  void check_matrices() const;
  void order_steps();
  void index_baselines();
  void index_single_axis_pairs();

  double entry(const std::vector<double>& m, std::size_t i, std::size_t j) const {
    if (m.empty()) return kNaN;
    const double v = m[i * variant_count_ + j];
    return std::isnan(v) ? m[j * variant_count_ + i] : v;
  }
  const std::string& value_name(std::size_t axis, int index) const {
    return axes_[axis].values[static_cast<std::size_t>(index)];
  }
  std::int64_t final_step() const { return step_order_.empty() ? 0 : steps_[step_order_.back()].step; }
  // Whether axis b is a condition axis of axis x (neither x, nor a replicate, nor a noise axis).
  bool conditions_axis(std::size_t x, std::size_t b) const {
    return b != x && !axes_[b].replicate && axes_[b].role != SourceRole::noise;
  }
  // Whether variant i has the condition of x that variant `at` has (every condition axis of x equal),
  // ignoring axis `except`.
  bool same_condition(std::size_t x, std::size_t i, std::size_t at, std::size_t except) const {
    for (std::size_t c = 0; c < axis_count_; ++c)
      if (c != except && conditions_axis(x, c) && value_index_[i][c] != value_index_[at][c]) return false;
    return true;
  }
  std::string condition_of(std::size_t x, std::size_t v) const;

  // Ranking rows.
  void add_rows(const Group& g);
  void add_axis_rows(std::size_t a);
  std::vector<Group> per_condition_groups(std::size_t x) const;

  // The comparisons and the verdict of one optimisation (compare), step by step.
  std::vector<double> final_values(const std::vector<Pair>& pairs, std::vector<Pair>* kept = nullptr) const;
  std::vector<double> pair_slopes(const std::vector<Pair>& pairs) const;
  Evidence evidence_of(const std::vector<Pair>& pairs) const;
  bool bit_identical(const std::vector<Pair>& pairs) const;
  std::size_t measured_noise_axis() const;
  double noise_floor(std::size_t x, int value, std::size_t at, std::size_t noise) const;
  std::vector<ValuePair> reference_value_pairs(std::size_t r, std::size_t at) const;
  std::vector<Pair> reference_pairs(std::size_t x, std::size_t r, std::size_t at, ValuePair values) const;
  void bootstrap(const std::vector<double>& a, const std::vector<double>& b, double& lo, double& hi);
  ComparisonRow comparison_head(const Group& g, int value, const Evidence& optimisation, double noise_w1) const;
  ComparisonRow compare_with(const Group& g, int value, const Evidence& optimisation, double noise_w1,
                             std::size_t r, ValuePair values, const std::vector<Pair>& reference);
  static std::string judge(std::vector<ComparisonRow>& rows, bool identical, double noise_w1, double final_w1);
  void note_disagreements(std::size_t x, std::size_t first_comparison);
  void compare(std::size_t x);
  void twins();
};

void Ranker::check_options_and_axes() const {
  if (!(options_.interval > 0 && options_.interval < 1) || options_.bootstrap_resamples < 0)
    throw RankingError("ranking: bootstrap interval " + std::to_string(options_.interval) + " with " +
                           std::to_string(options_.bootstrap_resamples) + " resamples",
                       "the interval must lie in (0, 1) and the number of resamples be >= 0");
  for (std::size_t a = 0; a < axis_count_; ++a)
    for (std::size_t b = a + 1; b < axis_count_; ++b)
      if (axes_[a].name == axes_[b].name) throw RankingError("ranking: axis '" + axes_[a].name + "' is given twice");
}

void Ranker::index_variants() {
  value_index_.assign(variant_count_, std::vector<int>(axis_count_, -1));
  for (std::size_t v = 0; v < variant_count_; ++v) {
    for (const auto& [name, value] : variants_[v].axes) {
      std::size_t a = 0;
      while (a < axis_count_ && axes_[a].name != name) ++a;
      if (a == axis_count_)
        throw RankingError("ranking: variant '" + variants_[v].id + "' has axis '" + name +
                           "', which is not a grid axis");
      const auto& values = axes_[a].values;
      const auto it = std::find(values.begin(), values.end(), value);
      if (it == values.end())
        throw RankingError("ranking: variant '" + variants_[v].id + "' has " + name + " = '" + value +
                           "', which is not one of the grid's values for that axis");
      if (value_index_[v][a] >= 0)
        throw RankingError("ranking: variant '" + variants_[v].id + "' gives axis '" + name + "' twice");
      value_index_[v][a] = static_cast<int>(it - values.begin());
    }
    for (std::size_t a = 0; a < axis_count_; ++a)
      if (value_index_[v][a] < 0)
        throw RankingError("ranking: variant '" + variants_[v].id + "' has no value for axis '" + axes_[a].name + "'");
  }
}

void Ranker::check_matrices() const {
  for (const auto& s : steps_)
    if (s.w1.size() != variant_count_ * variant_count_ ||
        (!s.max_abs.empty() && s.max_abs.size() != variant_count_ * variant_count_))
      throw RankingError("ranking: the matrices of step " + std::to_string(s.step) + " have " +
                             std::to_string(s.w1.size()) + " entries, expected " + std::to_string(variant_count_) +
                             " x " + std::to_string(variant_count_),
                         "pass V x V row-major matrices over the variants, in the variants' order");
}

void Ranker::order_steps() {
  step_order_.resize(steps_.size());
  std::iota(step_order_.begin(), step_order_.end(), 0);
  std::stable_sort(step_order_.begin(), step_order_.end(),
                   [&](std::size_t x, std::size_t y) { return steps_[x].step < steps_[y].step; });
}

// Each axis's declared baseline where the grid lists it, else its first value (noted for the axes
// that are judged or judge).
void Ranker::index_baselines() {
  baseline_index_.assign(axis_count_, 0);
  for (std::size_t a = 0; a < axis_count_; ++a) {
    const auto& ax = axes_[a];
    if (ax.values.empty()) throw RankingError("ranking: axis '" + ax.name + "' has no values");
    if (ax.baseline.empty()) continue;
    const auto it = std::find(ax.values.begin(), ax.values.end(), ax.baseline);
    if (it != ax.values.end()) baseline_index_[a] = static_cast<int>(it - ax.values.begin());
    else if ((ax.role == SourceRole::optimisation || ax.role == SourceRole::reference) && !ax.replicate &&
             ax.values.size() > 1)
      result_.notes.push_back("axis '" + ax.name + "': its baseline " + ax.baseline +
                              " is not in the grid, so its first value " + ax.values.front() + " is the baseline");
  }
}

// The evidence of every axis: the pairs of variants (i < j) that differ in it alone.
void Ranker::index_single_axis_pairs() {
  single_axis_pairs_.assign(axis_count_, {});
  for (std::size_t i = 0; i < variant_count_; ++i)
    for (std::size_t j = i + 1; j < variant_count_; ++j) {
      std::size_t differ = 0, which = axis_count_;
      for (std::size_t b = 0; b < axis_count_; ++b)
        if (value_index_[i][b] != value_index_[j][b]) ++differ, which = b;
      if (differ == 1) single_axis_pairs_[which].emplace_back(i, j);
    }
}

// The condition's label (and key): axis=value of every condition axis, except optimisation axes at
// their baseline value ("precision=bf16;dp_width=4" rather than every axis of a [[grid.vary]] design);
// "all" when nothing is left.
std::string Ranker::condition_of(std::size_t x, std::size_t v) const {
  std::string c;
  for (std::size_t b = 0; b < axis_count_; ++b) {
    if (!conditions_axis(x, b) || axes_[b].values.size() < 2) continue;
    const std::string& value = value_name(b, value_index_[v][b]);
    const std::string& baseline = axes_[b].baseline.empty() ? axes_[b].values.front() : axes_[b].baseline;
    if (axes_[b].role == SourceRole::optimisation && value == baseline) continue;
    c += (c.empty() ? "" : ";") + axes_[b].name + "=" + value;
  }
  return c.empty() ? "all" : c;
}

std::vector<double> Ranker::final_values(const std::vector<Pair>& pairs, std::vector<Pair>* kept) const {
  std::vector<double> x;
  if (step_order_.empty()) return x;
  const StepMatrices& s = steps_[step_order_.back()];
  for (const auto& p : pairs) {
    const double w = entry(s.w1, p.first, p.second);
    if (!std::isfinite(w)) continue;
    x.push_back(w);
    if (kept) kept->push_back(p);
  }
  return x;
}

std::vector<double> Ranker::pair_slopes(const std::vector<Pair>& pairs) const {
  std::vector<double> out;
  for (const auto& [i, j] : pairs) {
    std::vector<double> xs, ys;
    for (std::size_t k : step_order_) {
      const double w = entry(steps_[k].w1, i, j);
      if (!std::isfinite(w)) continue;
      xs.push_back(static_cast<double>(steps_[k].step));
      ys.push_back(w);
    }
    const double s = ls_slope(xs, ys);
    if (!std::isnan(s)) out.push_back(s);
  }
  return out;
}

void Ranker::add_rows(const Group& g) {
  const std::size_t first_row = result_.rows.size();
  std::vector<double> xs, ys;
  for (std::size_t k : step_order_) {
    const StepMatrices& s = steps_[k];
    std::vector<double> w, m;
    std::vector<Pair> finite;
    for (const auto& [i, j] : g.pairs) {
      const double a = entry(s.w1, i, j), b = entry(s.max_abs, i, j);
      if (std::isfinite(a)) w.push_back(a), finite.emplace_back(i, j);
      if (std::isfinite(b)) m.push_back(b);
    }
    RankingRow r;
    r.axis = axes_[g.axis].name;
    r.role = axes_[g.axis].role;
    r.condition = g.condition;
    r.value_a = g.value_a;
    r.value_b = g.value_b;
    r.step = s.step;
    r.pairs = w.size();
    r.independent = independent_pairs(finite);
    r.w1_mean = mean_of(w);
    r.w1_min = w.empty() ? kNaN : *std::min_element(w.begin(), w.end());
    r.w1_max = w.empty() ? kNaN : *std::max_element(w.begin(), w.end());
    r.max_abs_mean = mean_of(m);
    if (!w.empty()) xs.push_back(static_cast<double>(s.step)), ys.push_back(r.w1_mean);
    result_.rows.push_back(std::move(r));
  }
  const double slope = ls_slope(xs, ys);
  for (std::size_t t = first_row; t < result_.rows.size(); ++t) result_.rows[t].slope = slope;
}

// Every row of axis a: pooled over the conditions (the whole axis, then each value pair in the grid's
// order of values), then per condition unless a is a setting. A note when a has no evidence.
void Ranker::add_axis_rows(std::size_t a) {
  const std::vector<Pair>& pairs = single_axis_pairs_[a];
  if (pairs.empty()) {
    if (axes_[a].values.size() > 1)
      result_.notes.push_back("axis '" + axes_[a].name + "': no two variants differ in it alone, so it is not ranked");
    return;
  }
  add_rows({a, "*", "*", "*", pairs});
  std::map<ValuePair, std::vector<Pair>> by_value;
  for (const auto& [i, j] : pairs)
    by_value[{std::min(value_index_[i][a], value_index_[j][a]), std::max(value_index_[i][a], value_index_[j][a])}]
        .emplace_back(i, j);
  for (const auto& [values, value_pairs] : by_value)
    add_rows({a, "*", value_name(a, values.first), value_name(a, values.second), value_pairs});
  if (axes_[a].role != SourceRole::setting)
    for (const Group& g : per_condition_groups(a)) add_rows(g);
}

// Per condition of axis x: a replicate axis one group over all its pairs, any other axis one group
// per value v != baseline (baseline <-> v, the baseline side first in every pair). Conditions in order
// of first appearance, values in grid order within a condition.
std::vector<Group> Ranker::per_condition_groups(std::size_t x) const {
  const auto& ax = axes_[x];
  const int baseline = baseline_index_[x];
  std::vector<std::string> conditions;
  std::map<std::pair<std::string, int>, std::vector<Pair>> pairs;
  for (const auto& [i, j] : single_axis_pairs_[x]) {
    const std::string c = condition_of(x, i);
    int other = -1;
    Pair p{i, j};
    if (!ax.replicate) {
      if (value_index_[i][x] == baseline) other = value_index_[j][x];
      else if (value_index_[j][x] == baseline) other = value_index_[i][x], p = {j, i};
      else continue;  // neither side is the baseline
    }
    if (std::find(conditions.begin(), conditions.end(), c) == conditions.end()) conditions.push_back(c);
    pairs[{c, other}].push_back(p);
  }
  std::vector<Group> groups;
  for (const auto& c : conditions)
    for (auto& [key, list] : pairs) {
      if (key.first != c) continue;
      const std::string a = key.second < 0 ? "*" : value_name(x, baseline);
      const std::string b = key.second < 0 ? "*" : value_name(x, key.second);
      groups.push_back({x, c, a, b, list});
    }
  return groups;
}

Evidence Ranker::evidence_of(const std::vector<Pair>& pairs) const {
  Evidence e;
  e.final_w1 = final_values(pairs, &e.final_pairs);
  e.slopes = pair_slopes(pairs);
  return e;
}

// W1 = 0 for every pair at every step (and at least one value seen).
bool Ranker::bit_identical(const std::vector<Pair>& pairs) const {
  bool all_zero = true, any = false;
  for (std::size_t k : step_order_)
    for (const auto& [i, j] : pairs) {
      const double w = entry(steps_[k].w1, i, j);
      if (!std::isfinite(w)) continue;
      any = true;
      all_zero = all_zero && w == 0;
    }
  return any && all_zero;
}

// The last noise axis with evidence; axis_count_ when there is none.
std::size_t Ranker::measured_noise_axis() const {
  std::size_t noise = axis_count_;
  for (std::size_t a = 0; a < axis_count_; ++a)
    if (axes_[a].role == SourceRole::noise && !single_axis_pairs_[a].empty()) noise = a;
  return noise;
}

// The noise floor of optimisation x at `value` under the condition of variant `at`: the mean final W1
// of the noise axis's pairs with x in {baseline, value} and the condition axes as at `at`. NaN without
// a noise axis.
double Ranker::noise_floor(std::size_t x, int value, std::size_t at, std::size_t noise) const {
  if (noise == axis_count_) return kNaN;
  std::vector<Pair> pairs;
  for (const auto& [i, j] : single_axis_pairs_[noise]) {
    if (value_index_[i][x] != baseline_index_[x] && value_index_[i][x] != value) continue;
    if (same_condition(x, i, at, axis_count_)) pairs.emplace_back(i, j);
  }
  return mean_of(final_values(pairs));
}

// The value pairs of reference axis r under the condition of variant `at`: any two replicates for a
// replicate axis; else {baseline, r's value at `at`}, or, when that value is the baseline, {baseline,
// o} for every other value o.
std::vector<ValuePair> Ranker::reference_value_pairs(std::size_t r, std::size_t at) const {
  if (axes_[r].replicate) return {kAnyReplicates};
  const int baseline = baseline_index_[r], here = value_index_[at][r];
  if (here != baseline) return {{baseline, here}};
  std::vector<ValuePair> out;
  for (int o = 0; o < static_cast<int>(axes_[r].values.size()); ++o)
    if (o != baseline) out.push_back({baseline, o});
  return out;
}

// The pairs that differ in reference axis r only, with optimisation x at its baseline, the other
// condition axes of x as at variant `at`, and r's values `values` (either order; any for
// kAnyReplicates).
std::vector<Pair> Ranker::reference_pairs(std::size_t x, std::size_t r, std::size_t at, ValuePair values) const {
  const auto [a, b] = values;
  std::vector<Pair> out;
  for (const auto& [i, j] : single_axis_pairs_[r]) {
    if (value_index_[i][x] != baseline_index_[x] || !same_condition(x, i, at, r)) continue;
    const int vi = value_index_[i][r], vj = value_index_[j][r];
    if (values != kAnyReplicates && !((vi == a && vj == b) || (vi == b && vj == a))) continue;
    out.emplace_back(i, j);
  }
  return out;
}

void Ranker::bootstrap(const std::vector<double>& a, const std::vector<double>& b, double& lo, double& hi) {
  lo = hi = kNaN;
  if (a.empty() || b.empty() || options_.bootstrap_resamples <= 0) return;
  // base/hash.hpp: the same bootstrap on every platform
  SplitMix64 rng{options_.seed ^ (kSplitMix64Gamma * ++bootstrap_stream_)};
  std::vector<double> ratios;
  ratios.reserve(static_cast<std::size_t>(options_.bootstrap_resamples));
  for (int r = 0; r < options_.bootstrap_resamples; ++r) {
    double sa = 0, sb = 0;
    for (std::size_t t = 0; t < a.size(); ++t) sa += a[rng.below(a.size())];
    for (std::size_t t = 0; t < b.size(); ++t) sb += b[rng.below(b.size())];
    const double q = ratio_of(sa / static_cast<double>(a.size()), sb / static_cast<double>(b.size()));
    if (!std::isnan(q)) ratios.push_back(q);
  }
  std::sort(ratios.begin(), ratios.end());
  const double tail = (1.0 - options_.interval) / 2.0;
  lo = percentile(ratios, tail);
  hi = percentile(ratios, 1.0 - tail);
}

// The optimisation's side of a comparison row of group g at `value`; the reference's side NaN.
ComparisonRow Ranker::comparison_head(const Group& g, int value, const Evidence& optimisation,
                                      double noise_w1) const {
  ComparisonRow c;
  c.axis = axes_[g.axis].name;
  c.baseline = value_name(g.axis, baseline_index_[g.axis]);
  c.value = value_name(g.axis, value);
  c.condition = g.condition;
  c.pairs = optimisation.final_w1.size();
  c.independent = independent_pairs(optimisation.final_pairs);
  c.step = final_step();
  c.w1 = mean_of(optimisation.final_w1);
  c.slope = mean_of(optimisation.slopes);
  c.reference_w1 = c.end_ratio = c.end_lo = c.end_hi = c.reference_slope = c.slope_ratio = c.slope_lo =
      c.slope_hi = kNaN;
  c.noise_w1 = noise_w1;
  return c;
}

// The comparison of group g at `value` with the `reference` pairs of axis r at `values`: the end-point
// and slope ratios and, when both sides have enough independent pairs, their bootstrap intervals.
ComparisonRow Ranker::compare_with(const Group& g, int value, const Evidence& optimisation, double noise_w1,
                                   std::size_t r, ValuePair values, const std::vector<Pair>& reference) {
  ComparisonRow c = comparison_head(g, value, optimisation, noise_w1);
  c.reference = axes_[r].name;
  c.reference_pair = values == kAnyReplicates ? "*" : value_name(r, values.first) + "<->" + value_name(r, values.second);
  const Evidence ref = evidence_of(reference);
  c.reference_pairs = ref.final_w1.size();
  c.reference_independent = independent_pairs(ref.final_pairs);
  c.reference_w1 = mean_of(ref.final_w1);
  c.end_ratio = ratio_of(c.w1, c.reference_w1);
  c.reference_slope = mean_of(ref.slopes);
  c.slope_ratio = c.reference_slope > 0 ? ratio_of(c.slope, c.reference_slope) : kNaN;
  c.informative = std::min(c.independent, c.reference_independent) >= kMinIndependentPairs;
  if (c.informative) {
    bootstrap(optimisation.final_w1, ref.final_w1, c.end_lo, c.end_hi);
    if (!std::isnan(c.slope_ratio)) bootstrap(optimisation.slopes, ref.slopes, c.slope_lo, c.slope_hi);
  }
  return c;
}

// Each row's comparison on the verdict's measure (the slope when every row has a slope ratio, else the
// end point), and the verdict of them all: bit-identical, within the measured noise floor, no
// reference, outside (any row), within (every row) or undecided.
std::string Ranker::judge(std::vector<ComparisonRow>& rows, bool identical, double noise_w1, double final_w1) {
  bool slopes = !rows.empty();
  for (const auto& c : rows) slopes = slopes && !std::isnan(c.slope_ratio);
  bool any_out = false, all_in = true;
  for (auto& c : rows) {
    c.measure = slopes ? "slope" : "end-point";
    const double q = slopes ? c.slope_ratio : c.end_ratio;
    const double lo = slopes ? c.slope_lo : c.end_lo, hi = slopes ? c.slope_hi : c.end_hi;
    if (std::isnan(q)) c.comparison = "undecided";
    else if (q <= 1 && (!c.informative || hi <= 1)) c.comparison = "within";
    else if (q > 1 && (!c.informative || lo > 1)) c.comparison = "outside";
    else c.comparison = "undecided";
    any_out = any_out || c.comparison == "outside";
    all_in = all_in && c.comparison == "within";
  }
  if (identical) return "bit-identical";
  if (!std::isnan(noise_w1) && noise_w1 > 0 && final_w1 <= noise_w1) return "within noise";
  if (rows.empty()) return "no reference";
  return any_out ? "outside" : all_in ? "within" : "undecided";
}

// A note per value of optimisation x whose conditions got different verdicts (the comparisons from
// `first_comparison` on are x's).
void Ranker::note_disagreements(std::size_t x, std::size_t first_comparison) {
  const auto& ax = axes_[x];
  std::vector<std::string> values;
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> by_value;  // value -> (cond, verdict)
  for (std::size_t k = first_comparison; k < result_.comparisons.size(); ++k) {
    const auto& c = result_.comparisons[k];
    auto& list = by_value[c.value];
    if (list.empty()) values.push_back(c.value);
    if (list.empty() || list.back().first != c.condition) list.emplace_back(c.condition, c.verdict);
  }
  for (const auto& value : values) {
    const auto& list = by_value[value];
    std::vector<std::string> kinds;
    for (const auto& [cond, verdict] : list)
      if (std::find(kinds.begin(), kinds.end(), verdict) == kinds.end()) kinds.push_back(verdict);
    if (kinds.size() < 2) continue;
    std::string note = ax.name + " " + value + " vs " + value_name(x, baseline_index_[x]) + ": the conditions disagree:";
    for (std::size_t t = 0; t < kinds.size(); ++t) {
      note += (t ? ";" : "") + std::string(" ") + kinds[t] + " at ";
      bool first_cond = true;
      for (const auto& [cond, verdict] : list)
        if (verdict == kinds[t]) note += (first_cond ? "" : ", ") + cond, first_cond = false;
    }
    result_.notes.push_back(note);
  }
}

// The comparisons and verdict of optimisation x, per condition and value (per_condition_groups): its
// evidence, the noise floor, one comparison per reference axis and value pair under the same condition
// (or one row saying there is no reference), the verdict on every row; then the disagreement notes.
void Ranker::compare(std::size_t x) {
  const std::size_t first_comparison = result_.comparisons.size();
  const std::size_t noise = measured_noise_axis();
  for (const Group& g : per_condition_groups(x)) {
    const std::size_t at = g.pairs.front().first;  // a baseline-side variant of this condition
    const int value = value_index_[g.pairs.front().second][x];
    const Evidence optimisation = evidence_of(g.pairs);
    const double noise_w1 = noise_floor(x, value, at, noise);
    std::vector<ComparisonRow> rows;
    for (std::size_t r = 0; r < axis_count_; ++r) {
      if (r == x || axes_[r].role != SourceRole::reference) continue;
      for (const ValuePair& values : reference_value_pairs(r, at)) {
        const std::vector<Pair> reference = reference_pairs(x, r, at, values);
        if (!reference.empty()) rows.push_back(compare_with(g, value, optimisation, noise_w1, r, values, reference));
      }
    }
    const std::string verdict =
        judge(rows, bit_identical(g.pairs), noise_w1, mean_of(optimisation.final_w1));
    if (rows.empty()) {
      // No reference under this condition: one row says so.
      ComparisonRow c = comparison_head(g, value, optimisation, noise_w1);
      c.measure = "end-point";
      c.comparison = "undecided";
      rows.push_back(std::move(c));
    }
    for (auto& c : rows) {
      c.verdict = verdict;
      result_.comparisons.push_back(std::move(c));
    }
  }
  note_disagreements(x, first_comparison);
}

void Ranker::twins() {
  std::size_t pa = axis_count_;
  for (std::size_t a = 0; a < axis_count_; ++a)
    if (axes_[a].name == options_.precision_axis) pa = a;
  if (pa == axis_count_) return;
  const auto& pv = axes_[pa].values;
  const auto ref = std::find(pv.begin(), pv.end(), options_.reference_precision);
  if (ref == pv.end()) return;
  const int r = static_cast<int>(ref - pv.begin());
  for (std::size_t i = 0; i < variant_count_; ++i) {
    if (value_index_[i][pa] == r) continue;
    for (std::size_t j = 0; j < variant_count_; ++j) {
      if (value_index_[j][pa] != r) continue;
      bool same = true;
      for (std::size_t b = 0; b < axis_count_ && same; ++b) same = b == pa || value_index_[i][b] == value_index_[j][b];
      if (!same) continue;
      for (std::size_t k : step_order_) {
        const StepMatrices& s = steps_[k];
        result_.twins.push_back({variants_[i].id, variants_[j].id, value_name(pa, value_index_[i][pa]), s.step,
                                 entry(s.w1, i, j), entry(s.max_abs, i, j)});
      }
    }
  }
}

std::vector<Pair> Ranker::one_axis_pairs() {
  check_options_and_axes();
  index_variants();
  index_single_axis_pairs();
  std::vector<Pair> out;
  for (const auto& pairs : single_axis_pairs_) out.insert(out.end(), pairs.begin(), pairs.end());
  std::sort(out.begin(), out.end());
  return out;
}

Ranking Ranker::run() {
  check_options_and_axes();
  index_variants();
  check_matrices();
  if (steps_.empty()) result_.notes.push_back("no checkpoint steps were given: nothing to rank");
  order_steps();
  index_baselines();
  index_single_axis_pairs();
  for (std::size_t a = 0; a < axis_count_; ++a) {
    if (axes_[a].role == SourceRole::noise) result_.noise_axis = axes_[a].name;
    add_axis_rows(a);
  }
  for (std::size_t a = 0; a < axis_count_; ++a) {
    if (axes_[a].role != SourceRole::optimisation || single_axis_pairs_[a].empty()) continue;
    if (axes_[a].replicate)
      result_.notes.push_back("axis '" + axes_[a].name + "' is an optimisation and a replicate: it has no baseline, "
                              "so it gets no verdict");
    else
      compare(a);
  }
  if (result_.noise_axis.empty())
    result_.notes.push_back("noise floor: 0 by construction (deterministic CPU arithmetic); add a `repeat` axis to "
                            "measure it");
  twins();
  return std::move(result_);
}

}  // namespace

const char* source_role_name(SourceRole role) {
  switch (role) {
    case SourceRole::optimisation: return "optimisation";
    case SourceRole::reference: return "reference";
    case SourceRole::setting: return "setting";
    case SourceRole::noise: return "noise";
  }
  return "setting";
}

Ranking rank_deviation_sources(const std::vector<RankingAxis>& axes, const std::vector<RankingVariant>& variants,
                               const std::vector<StepMatrices>& steps, const RankingOptions& options) {
  return Ranker(axes, variants, steps, options).run();
}

std::vector<std::pair<std::size_t, std::size_t>> verdict_pairs(const std::vector<RankingAxis>& axes,
                                                               const std::vector<RankingVariant>& variants) {
  const std::vector<StepMatrices> no_steps;
  const RankingOptions options;
  return Ranker(axes, variants, no_steps, options).one_axis_pairs();
}

}  // namespace fastudy
