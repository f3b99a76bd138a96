// The short text rank 0 prints of a ranking (format_ranking_table in analysis/ranking.hpp): the
// verdict per optimisation and condition, the pooled sources ranked by mean W1, the noise floor, the
// fp64 twins and the notes.
#include "analysis/ranking.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

namespace fastudy {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string fmt(double x, const char* f = "%.3g") {
  if (std::isnan(x)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

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
