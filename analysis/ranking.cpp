// The ranking of deviation sources and the verdict: the implementation of analysis/ranking.hpp.
#include "analysis/ranking.hpp"

#include "base/hash.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

std::string fmt(double x, const char* f = "%.3g") {
  if (std::isnan(x)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// A group of pairs: one ranking row per step.
struct Group {
  std::size_t axis;
  std::string condition, value_a, value_b;
  std::vector<Pair> pairs;
};

class Ranker {
 public:
  Ranker(const std::vector<RankingAxis>& axes, const std::vector<RankingVariant>& variants,
         const std::vector<StepMatrices>& steps, const RankingOptions& options)
      : axes_(axes), variants_(variants), steps_(steps), opt_(options), V_(variants.size()), A_(axes.size()) {}

  Ranking run();

 private:
  const std::vector<RankingAxis>& axes_;
  const std::vector<RankingVariant>& variants_;
  const std::vector<StepMatrices>& steps_;
  const RankingOptions& opt_;
  const std::size_t V_, A_;
  std::vector<std::vector<int>> vidx_;   // variant x axis -> value index
  std::vector<int> base_;                // axis -> baseline value index
  std::vector<std::size_t> order_;       // steps ascending
  std::vector<std::vector<Pair>> single_;  // axis -> pairs that differ in it only
  std::uint64_t stream_ = 0;
  Ranking out_;

  void index_variants();
  double entry(const std::vector<double>& m, std::size_t i, std::size_t j) const {
    if (m.empty()) return kNaN;
    const double v = m[i * V_ + j];
    return std::isnan(v) ? m[j * V_ + i] : v;
  }
  bool conditions_axis(std::size_t x, std::size_t b) const {
    return b != x && !axes_[b].replicate && axes_[b].role != SourceRole::noise;
  }
  std::string condition_of(std::size_t x, std::size_t v) const;
  void add_rows(const Group& g);
  std::vector<Group> per_condition_groups(std::size_t x) const;
  std::vector<double> final_values(const std::vector<Pair>& pairs, std::vector<Pair>* kept = nullptr) const;
  std::vector<double> pair_slopes(const std::vector<Pair>& pairs) const;
  void bootstrap(const std::vector<double>& a, const std::vector<double>& b, double& lo, double& hi);
  void compare(std::size_t x);
  void twins();
};

void Ranker::index_variants() {
  vidx_.assign(V_, std::vector<int>(A_, -1));
  for (std::size_t v = 0; v < V_; ++v) {
    for (const auto& [name, value] : variants_[v].axes) {
      std::size_t a = 0;
      while (a < A_ && axes_[a].name != name) ++a;
      if (a == A_)
        throw RankingError("ranking: variant '" + variants_[v].id + "' has axis '" + name +
                           "', which is not a grid axis");
      const auto& values = axes_[a].values;
      const auto it = std::find(values.begin(), values.end(), value);
      if (it == values.end())
        throw RankingError("ranking: variant '" + variants_[v].id + "' has " + name + " = '" + value +
                           "', which is not one of the grid's values for that axis");
      if (vidx_[v][a] >= 0)
        throw RankingError("ranking: variant '" + variants_[v].id + "' gives axis '" + name + "' twice");
      vidx_[v][a] = static_cast<int>(it - values.begin());
    }
    for (std::size_t a = 0; a < A_; ++a)
      if (vidx_[v][a] < 0)
        throw RankingError("ranking: variant '" + variants_[v].id + "' has no value for axis '" + axes_[a].name + "'");
  }
}

// The condition's label (and key): axis=value of every condition axis, except optimisation axes at
// their baseline value ("precision=bf16;dp_width=4" rather than every axis of a [[grid.vary]] design);
// "all" when nothing is left.
std::string Ranker::condition_of(std::size_t x, std::size_t v) const {
  std::string c;
  for (std::size_t b = 0; b < A_; ++b) {
    if (!conditions_axis(x, b) || axes_[b].values.size() < 2) continue;
    const std::string& value = axes_[b].values[static_cast<std::size_t>(vidx_[v][b])];
    const std::string& baseline = axes_[b].baseline.empty() ? axes_[b].values.front() : axes_[b].baseline;
    if (axes_[b].role == SourceRole::optimisation && value == baseline) continue;
    c += (c.empty() ? "" : ";") + axes_[b].name + "=" + value;
  }
  return c.empty() ? "all" : c;
}

std::vector<double> Ranker::final_values(const std::vector<Pair>& pairs, std::vector<Pair>* kept) const {
  std::vector<double> x;
  if (order_.empty()) return x;
  const StepMatrices& s = steps_[order_.back()];
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
    for (std::size_t k : order_) {
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
  const std::size_t first_row = out_.rows.size();
  std::vector<double> xs, ys;
  for (std::size_t k : order_) {
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
    out_.rows.push_back(std::move(r));
  }
  const double slope = ls_slope(xs, ys);
  for (std::size_t t = first_row; t < out_.rows.size(); ++t) out_.rows[t].slope = slope;
}

// Per condition of axis x: a replicate axis one group over all its pairs, any other axis one group
// per value v != baseline (baseline <-> v, the baseline side first in every pair). Conditions in order
// of first appearance, values in grid order within a condition.
std::vector<Group> Ranker::per_condition_groups(std::size_t x) const {
  const auto& ax = axes_[x];
  std::vector<std::string> conditions;
  std::map<std::pair<std::string, int>, std::vector<Pair>> pairs;
  for (const auto& [i, j] : single_[x]) {
    const std::string c = condition_of(x, i);
    int other = -1;
    Pair p{i, j};
    if (!ax.replicate) {
      if (vidx_[i][x] == base_[x]) other = vidx_[j][x];
      else if (vidx_[j][x] == base_[x]) other = vidx_[i][x], p = {j, i};
      else continue;  // neither side is the baseline
    }
    if (std::find(conditions.begin(), conditions.end(), c) == conditions.end()) conditions.push_back(c);
    pairs[{c, other}].push_back(p);
  }
  std::vector<Group> groups;
  for (const auto& c : conditions)
    for (auto& [key, list] : pairs) {
      if (key.first != c) continue;
      const std::string a = key.second < 0 ? "*" : ax.values[static_cast<std::size_t>(base_[x])];
      const std::string b = key.second < 0 ? "*" : ax.values[static_cast<std::size_t>(key.second)];
      groups.push_back({x, c, a, b, list});
    }
  return groups;
}

void Ranker::bootstrap(const std::vector<double>& a, const std::vector<double>& b, double& lo, double& hi) {
  lo = hi = kNaN;
  if (a.empty() || b.empty() || opt_.bootstrap_resamples <= 0) return;
  SplitMix64 rng{opt_.seed ^ (kSplitMix64Gamma * ++stream_)};  // base/hash.hpp: the same bootstrap on every platform
  std::vector<double> ratios;
  ratios.reserve(static_cast<std::size_t>(opt_.bootstrap_resamples));
  for (int r = 0; r < opt_.bootstrap_resamples; ++r) {
    double sa = 0, sb = 0;
    for (std::size_t t = 0; t < a.size(); ++t) sa += a[rng.below(a.size())];
    for (std::size_t t = 0; t < b.size(); ++t) sb += b[rng.below(b.size())];
    const double q = ratio_of(sa / static_cast<double>(a.size()), sb / static_cast<double>(b.size()));
    if (!std::isnan(q)) ratios.push_back(q);
  }
  std::sort(ratios.begin(), ratios.end());
  const double tail = (1.0 - opt_.interval) / 2.0;
  lo = percentile(ratios, tail);
  hi = percentile(ratios, 1.0 - tail);
}

void Ranker::compare(std::size_t x) {
  const auto& ax = axes_[x];
  const std::size_t first = out_.comparisons.size();
  std::size_t noise = A_;
  for (std::size_t a = 0; a < A_; ++a)
    if (axes_[a].role == SourceRole::noise && !single_[a].empty()) noise = a;
  for (const Group& g : per_condition_groups(x)) {
    const std::size_t b0 = g.pairs.front().first;  // a baseline-side variant of this condition
    const int v = vidx_[g.pairs.front().second][x];
    std::vector<Pair> opt_kept;
    const std::vector<double> opt_end = final_values(g.pairs, &opt_kept);
    const std::vector<double> opt_slopes = pair_slopes(g.pairs);
    // Bit-identical: W1 = 0 for every pair at every step (and at least one value seen).
    bool all_zero = true, any = false;
    for (std::size_t k : order_)
      for (const auto& [i, j] : g.pairs) {
        const double w = entry(steps_[k].w1, i, j);
        if (!std::isfinite(w)) continue;
        any = true;
        all_zero = all_zero && w == 0;
      }
    // The noise floor under this condition: noise pairs with x in {baseline, v}, condition axes as b0.
    double noise_w1 = kNaN;
    if (noise < A_) {
      std::vector<Pair> np;
      for (const auto& [i, j] : single_[noise]) {
        if (vidx_[i][x] != base_[x] && vidx_[i][x] != v) continue;
        bool same = true;
        for (std::size_t c = 0; c < A_ && same; ++c) same = !conditions_axis(x, c) || vidx_[i][c] == vidx_[b0][c];
        if (same) np.emplace_back(i, j);
      }
      noise_w1 = mean_of(final_values(np));
    }
    std::vector<ComparisonRow> rows;
    for (std::size_t r = 0; r < A_; ++r) {
      if (r == x || axes_[r].role != SourceRole::reference) continue;
      // Reference value pairs under this condition.
      std::vector<std::pair<int, int>> value_pairs;  // (-1, -1): any two replicates
      if (axes_[r].replicate) value_pairs.push_back({-1, -1});
      else {
        const int rc = vidx_[b0][r];
        if (rc != base_[r]) value_pairs.push_back({base_[r], rc});
        else
          for (int o = 0; o < static_cast<int>(axes_[r].values.size()); ++o)
            if (o != base_[r]) value_pairs.push_back({base_[r], o});
      }
      for (const auto& [ra, rb] : value_pairs) {
        std::vector<Pair> rp;
        for (const auto& [i, j] : single_[r]) {
          if (vidx_[i][x] != base_[x]) continue;
          bool same = true;
          for (std::size_t c = 0; c < A_ && same; ++c)
            same = c == r || !conditions_axis(x, c) || vidx_[i][c] == vidx_[b0][c];
          if (!same) continue;
          if (ra >= 0 && !((vidx_[i][r] == ra && vidx_[j][r] == rb) || (vidx_[i][r] == rb && vidx_[j][r] == ra)))
            continue;
          rp.emplace_back(i, j);
        }
        if (rp.empty()) continue;
        ComparisonRow c;
        c.axis = ax.name;
        c.baseline = ax.values[static_cast<std::size_t>(base_[x])];
        c.value = ax.values[static_cast<std::size_t>(v)];
        c.condition = g.condition;
        c.reference = axes_[r].name;
        c.reference_pair = ra < 0 ? "*"
                                  : axes_[r].values[static_cast<std::size_t>(ra)] + "<->" +
                                        axes_[r].values[static_cast<std::size_t>(rb)];
        std::vector<Pair> ref_kept;
        const std::vector<double> ref_end = final_values(rp, &ref_kept);
        const std::vector<double> ref_slopes = pair_slopes(rp);
        c.pairs = opt_end.size();
        c.independent = independent_pairs(opt_kept);
        c.reference_pairs = ref_end.size();
        c.reference_independent = independent_pairs(ref_kept);
        c.step = order_.empty() ? 0 : steps_[order_.back()].step;
        c.w1 = mean_of(opt_end);
        c.reference_w1 = mean_of(ref_end);
        c.end_ratio = ratio_of(c.w1, c.reference_w1);
        c.slope = mean_of(opt_slopes);
        c.reference_slope = mean_of(ref_slopes);
        c.slope_ratio = c.reference_slope > 0 ? ratio_of(c.slope, c.reference_slope) : kNaN;
        c.informative = std::min(c.independent, c.reference_independent) >= kMinIndependentPairs;
        c.end_lo = c.end_hi = c.slope_lo = c.slope_hi = kNaN;
        if (c.informative) {
          bootstrap(opt_end, ref_end, c.end_lo, c.end_hi);
          if (!std::isnan(c.slope_ratio)) bootstrap(opt_slopes, ref_slopes, c.slope_lo, c.slope_hi);
        }
        c.noise_w1 = noise_w1;
        rows.push_back(std::move(c));
      }
    }
    bool slopes = !rows.empty();
    for (const auto& c : rows) slopes = slopes && !std::isnan(c.slope_ratio);
    std::string verdict;
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
    if (any && all_zero) verdict = "bit-identical";
    else if (!std::isnan(noise_w1) && noise_w1 > 0 && mean_of(opt_end) <= noise_w1) verdict = "within noise";
    else if (rows.empty()) verdict = "no reference";
    else verdict = any_out ? "outside" : all_in ? "within" : "undecided";
    if (rows.empty()) {
      // No reference under this condition: one row says so.
      ComparisonRow c;
      c.axis = ax.name;
      c.baseline = ax.values[static_cast<std::size_t>(base_[x])];
      c.value = ax.values[static_cast<std::size_t>(v)];
      c.condition = g.condition;
      c.pairs = opt_end.size();
      c.independent = independent_pairs(opt_kept);
      c.step = order_.empty() ? 0 : steps_[order_.back()].step;
      c.w1 = mean_of(opt_end);
      c.slope = mean_of(opt_slopes);
      c.reference_w1 = c.end_ratio = c.end_lo = c.end_hi = c.reference_slope = c.slope_ratio = c.slope_lo =
          c.slope_hi = kNaN;
      c.noise_w1 = noise_w1;
      c.measure = "end-point";
      c.comparison = "undecided";
      rows.push_back(std::move(c));
    }
    for (auto& c : rows) {
      c.verdict = verdict;
      out_.comparisons.push_back(std::move(c));
    }
  }
  // Conditions that disagree, per value of the optimisation.
  std::vector<std::string> values;
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> by_value;  // value -> (cond, verdict)
  for (std::size_t k = first; k < out_.comparisons.size(); ++k) {
    const auto& c = out_.comparisons[k];
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
    std::string note = ax.name + " " + value + " vs " + ax.values[static_cast<std::size_t>(base_[x])] +
                       ": the conditions disagree:";
    for (std::size_t t = 0; t < kinds.size(); ++t) {
      note += (t ? ";" : "") + std::string(" ") + kinds[t] + " at ";
      bool first_cond = true;
      for (const auto& [cond, verdict] : list)
        if (verdict == kinds[t]) note += (first_cond ? "" : ", ") + cond, first_cond = false;
    }
    out_.notes.push_back(note);
  }
}

void Ranker::twins() {
  std::size_t pa = A_;
  for (std::size_t a = 0; a < A_; ++a)
    if (axes_[a].name == opt_.precision_axis) pa = a;
  if (pa == A_) return;
  const auto& pv = axes_[pa].values;
  const auto ref = std::find(pv.begin(), pv.end(), opt_.reference_precision);
  if (ref == pv.end()) return;
  const int r = static_cast<int>(ref - pv.begin());
  for (std::size_t i = 0; i < V_; ++i) {
    if (vidx_[i][pa] == r) continue;
    for (std::size_t j = 0; j < V_; ++j) {
      if (vidx_[j][pa] != r) continue;
      bool same = true;
      for (std::size_t b = 0; b < A_ && same; ++b) same = b == pa || vidx_[i][b] == vidx_[j][b];
      if (!same) continue;
      for (std::size_t k : order_) {
        const StepMatrices& s = steps_[k];
        out_.twins.push_back({variants_[i].id, variants_[j].id, pv[static_cast<std::size_t>(vidx_[i][pa])], s.step,
                              entry(s.w1, i, j), entry(s.max_abs, i, j)});
      }
    }
  }
}

Ranking Ranker::run() {
  if (!(opt_.interval > 0 && opt_.interval < 1) || opt_.bootstrap_resamples < 0)
    throw RankingError("ranking: bootstrap interval " + std::to_string(opt_.interval) + " with " +
                           std::to_string(opt_.bootstrap_resamples) + " resamples",
                       "the interval must lie in (0, 1) and the number of resamples be >= 0");
  for (std::size_t a = 0; a < A_; ++a)
    for (std::size_t b = a + 1; b < A_; ++b)
      if (axes_[a].name == axes_[b].name) throw RankingError("ranking: axis '" + axes_[a].name + "' is given twice");
  index_variants();
  for (const auto& s : steps_)
    if (s.w1.size() != V_ * V_ || (!s.max_abs.empty() && s.max_abs.size() != V_ * V_))
      throw RankingError("ranking: the matrices of step " + std::to_string(s.step) + " have " +
                             std::to_string(s.w1.size()) + " entries, expected " + std::to_string(V_) + " x " +
                             std::to_string(V_),
                         "pass V x V row-major matrices over the variants, in the variants' order");
  if (steps_.empty()) out_.notes.push_back("no checkpoint steps were given: nothing to rank");
  order_.resize(steps_.size());
  std::iota(order_.begin(), order_.end(), 0);
  std::stable_sort(order_.begin(), order_.end(), [&](std::size_t x, std::size_t y) { return steps_[x].step < steps_[y].step; });

  base_.assign(A_, 0);
  for (std::size_t a = 0; a < A_; ++a) {
    const auto& ax = axes_[a];
    if (ax.values.empty()) throw RankingError("ranking: axis '" + ax.name + "' has no values");
    if (ax.baseline.empty()) continue;
    const auto it = std::find(ax.values.begin(), ax.values.end(), ax.baseline);
    if (it != ax.values.end()) base_[a] = static_cast<int>(it - ax.values.begin());
    else if ((ax.role == SourceRole::optimisation || ax.role == SourceRole::reference) && !ax.replicate && ax.values.size() > 1)
      out_.notes.push_back("axis '" + ax.name + "': its baseline " + ax.baseline +
                           " is not in the grid, so its first value " + ax.values.front() + " is the baseline");
  }
  single_.assign(A_, {});
  for (std::size_t i = 0; i < V_; ++i)
    for (std::size_t j = i + 1; j < V_; ++j) {
      std::size_t differ = 0, which = A_;
      for (std::size_t b = 0; b < A_; ++b)
        if (vidx_[i][b] != vidx_[j][b]) ++differ, which = b;
      if (differ == 1) single_[which].emplace_back(i, j);
    }
  for (std::size_t a = 0; a < A_; ++a) {
    if (axes_[a].role == SourceRole::noise) out_.noise_axis = axes_[a].name;
    if (single_[a].empty()) {
      if (axes_[a].values.size() > 1)
        out_.notes.push_back("axis '" + axes_[a].name + "': no two variants differ in it alone, so it is not ranked");
      continue;
    }
    // Pooled: the whole axis, then each value pair in the grid's order of values.
    add_rows({a, "*", "*", "*", single_[a]});
    std::map<std::pair<int, int>, std::vector<Pair>> by_value;
    for (const auto& [i, j] : single_[a])
      by_value[{std::min(vidx_[i][a], vidx_[j][a]), std::max(vidx_[i][a], vidx_[j][a])}].emplace_back(i, j);
    for (const auto& [vp, pairs] : by_value)
      add_rows({a, "*", axes_[a].values[static_cast<std::size_t>(vp.first)],
                axes_[a].values[static_cast<std::size_t>(vp.second)], pairs});
    if (axes_[a].role != SourceRole::setting)
      for (const Group& g : per_condition_groups(a)) add_rows(g);
  }
  for (std::size_t a = 0; a < A_; ++a) {
    if (axes_[a].role != SourceRole::optimisation || single_[a].empty()) continue;
    if (axes_[a].replicate)
      out_.notes.push_back("axis '" + axes_[a].name + "' is an optimisation and a replicate: it has no baseline, so "
                           "it gets no verdict");
    else
      compare(a);
  }
  if (out_.noise_axis.empty())
    out_.notes.push_back("noise floor: 0 by construction (deterministic CPU arithmetic); add a `repeat` axis to "
                         "measure it");
  twins();
  return std::move(out_);
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

namespace {

// "0.42 [0.3, 0.61]", or "0.42 not informative (2 pairs)" below kMinIndependentPairs.
std::string ratio_text(double q, double lo, double hi, const ComparisonRow& c) {
  std::string s = fmt(q, "%.3g");
  if (c.informative) return s + " [" + fmt(lo, "%.3g") + ", " + fmt(hi, "%.3g") + "]";
  const std::size_t n = std::min(c.independent, c.reference_independent);
  return s + " not informative (" + std::to_string(n) + (n == 1 ? " pair)" : " pairs)");
}

}  // namespace

std::string format_ranking_table(const Ranking& ranking, const RankingOptions& options) {
  std::string s;
  char line[512];
  if (!ranking.comparisons.empty()) {
    s += "# verdict per optimisation and condition at step " + std::to_string(ranking.comparisons.front().step) +
         ": ratio = optimisation W1 / reference W1 (<= 1: within the bound), " + fmt(100 * options.interval, "%g") +
         "% bootstrap interval when both sides have >= " + std::to_string(kMinIndependentPairs) +
         " independent pairs\n";
    std::snprintf(line, sizeof line, "%-28s %-24s %5s  %-22s %-40s %-40s %s\n", "optimisation", "condition", "pairs",
                  "reference", "end-point ratio", "slope ratio", "verdict (measure)");
    s += line;
    std::string last_key;
    for (const auto& c : ranking.comparisons) {
      const std::string key = c.axis + "|" + c.value + "|" + c.condition;
      const bool head = key != last_key;
      last_key = key;
      const std::string what = c.axis + " " + c.value + " vs " + c.baseline;
      const std::string ref = c.reference.empty() ? "-" : c.reference + (c.reference_pair == "*" ? "" : " " + c.reference_pair);
      std::snprintf(line, sizeof line, "%-28s %-24s %5s  %-22s %-40s %-40s %s\n", head ? what.c_str() : "",
                    head ? c.condition.c_str() : "", head ? std::to_string(c.pairs).c_str() : "", ref.c_str(),
                    c.reference.empty() ? "-" : ratio_text(c.end_ratio, c.end_lo, c.end_hi, c).c_str(),
                    c.reference.empty() ? "-" : ratio_text(c.slope_ratio, c.slope_lo, c.slope_hi, c).c_str(),
                    head ? (c.verdict + " (" + c.measure + ")").c_str() : "");
      s += line;
    }
  }
  std::int64_t last = 0;
  for (const auto& r : ranking.rows) last = std::max(last, r.step);
  std::vector<const RankingRow*> axis_rows;
  for (const auto& r : ranking.rows)
    if (r.step == last && r.condition == "*" && r.value_a == "*") axis_rows.push_back(&r);
  if (axis_rows.empty()) {
    s += "# deviation sources: none (no two variants differ in exactly one axis)\n";
  } else {
    std::stable_sort(axis_rows.begin(), axis_rows.end(), [](const RankingRow* x, const RankingRow* y) {
      if (std::isnan(x->w1_mean) != std::isnan(y->w1_mean)) return std::isnan(y->w1_mean);
      return x->w1_mean > y->w1_mean;
    });
    s += "# summary: deviation sources pooled over every condition at step " + std::to_string(last) +
         " (whole-model W1 between variants that differ in one axis only), largest first; spread = largest / "
         "smallest mean W1 over the axis's conditions\n";
    std::snprintf(line, sizeof line, "%-4s %-24s %-12s %5s %10s %21s %10s %11s %8s\n", "rank", "source", "role",
                  "pairs", "W1 mean", "W1 [min, max]", "max|dW|", "W1/step", "spread");
    s += line;
    int rank = 0;
    for (const RankingRow* a : axis_rows) {
      double lo = kNaN, hi = kNaN;
      for (const auto& r : ranking.rows)
        if (r.step == last && r.axis == a->axis && r.condition != "*" && std::isfinite(r.w1_mean)) {
          lo = std::isnan(lo) ? r.w1_mean : std::min(lo, r.w1_mean);
          hi = std::isnan(hi) ? r.w1_mean : std::max(hi, r.w1_mean);
        }
      std::vector<const RankingRow*> rows{a};
      std::vector<const RankingRow*> sub;
      for (const auto& r : ranking.rows)
        if (r.step == last && r.axis == a->axis && r.condition == "*" && r.value_a != "*") sub.push_back(&r);
      if (sub.size() > 1) rows.insert(rows.end(), sub.begin(), sub.end());
      for (const RankingRow* r : rows) {
        const bool head = r == a;
        const std::string name = head ? r->axis : "  " + r->value_a + "<->" + r->value_b;
        const std::string range = "[" + fmt(r->w1_min) + ", " + fmt(r->w1_max) + "]";
        std::snprintf(line, sizeof line, "%-4s %-24s %-12s %5zu %10s %21s %10s %11s %8s\n",
                      head ? std::to_string(++rank).c_str() : "", name.c_str(), head ? source_role_name(r->role) : "",
                      r->pairs, fmt(r->w1_mean).c_str(), range.c_str(), fmt(r->max_abs_mean).c_str(),
                      fmt(r->slope).c_str(), head && lo > 0 ? fmt(hi / lo, "%.3gx").c_str() : "");
        s += line;
      }
    }
  }
  if (!ranking.noise_axis.empty()) {
    for (const auto& r : ranking.rows)
      if (r.step == last && r.axis == ranking.noise_axis && r.condition == "*" && r.value_a == "*")
        s += "# noise floor (axis " + r.axis + ", " + std::to_string(r.pairs) + " pairs): mean W1 " + fmt(r.w1_mean) +
             " at step " + std::to_string(last) + "\n";
  }
  // Mean distance to the fp64 twin per precision (in order of appearance), at the last step.
  if (!ranking.twins.empty()) {
    std::int64_t tl = ranking.twins.front().step;
    for (const auto& t : ranking.twins) tl = std::max(tl, t.step);
    std::vector<std::string> precisions;
    std::map<std::string, std::pair<double, int>> sums;
    for (const auto& t : ranking.twins) {
      if (t.step != tl || !std::isfinite(t.w1)) continue;
      if (!sums.count(t.precision)) precisions.push_back(t.precision);
      sums[t.precision].first += t.w1;
      sums[t.precision].second += 1;
    }
    s += "# mean W1 to the " + options.reference_precision + " twin at step " + std::to_string(tl) + ":";
    for (const auto& p : precisions)
      s += " " + p + " " + fmt(sums[p].first / sums[p].second) + " (" + std::to_string(sums[p].second) +
           (sums[p].second == 1 ? " variant)" : " variants)");
    s += "\n";
  }
  for (const auto& note : ranking.notes) s += "# note: " + note + "\n";
  return s;
}

}  // namespace fastudy
