// The ranking of deviation sources: the implementation of analysis/ranking.hpp.
#include "analysis/ranking.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>

namespace fastudy {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// SplitMix64: a tiny fixed generator, so the bootstrap gives the same interval on every platform.
struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) {  // uniform in [0, n)
    return static_cast<std::size_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
};

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

struct Group {
  std::size_t axis;
  int value_a, value_b;  // -1: the whole axis
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
};

std::string fmt(double x, const char* f = "%.3g") {
  if (std::isnan(x)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

}  // namespace

Ranking rank_deviation_sources(const GridAxes& axes, const std::vector<RankingVariant>& variants,
                               const std::vector<StepMatrices>& steps, const RankingOptions& options) {
  const std::size_t V = variants.size(), A = axes.size();
  Ranking out;
  if (!(options.interval > 0 && options.interval < 1) || options.bootstrap_resamples < 0)
    throw RankingError("ranking: bootstrap interval " + std::to_string(options.interval) + " with " +
                           std::to_string(options.bootstrap_resamples) + " resamples",
                       "the interval must lie in (0, 1) and the number of resamples be >= 0");
  if (steps.empty()) out.notes.push_back("no checkpoint steps were given: nothing to rank");

  // Each variant's value index on each axis.
  std::vector<std::vector<int>> vidx(V, std::vector<int>(A, -1));
  for (std::size_t v = 0; v < V; ++v) {
    for (const auto& [name, value] : variants[v].axes) {
      std::size_t a = 0;
      while (a < A && axes[a].first != name) ++a;
      if (a == A)
        throw RankingError("ranking: variant '" + variants[v].id + "' has axis '" + name +
                           "', which is not a grid axis");
      const auto& values = axes[a].second;
      const auto it = std::find(values.begin(), values.end(), value);
      if (it == values.end())
        throw RankingError("ranking: variant '" + variants[v].id + "' has " + name + " = '" + value +
                           "', which is not one of the grid's values for that axis");
      if (vidx[v][a] >= 0)
        throw RankingError("ranking: variant '" + variants[v].id + "' gives axis '" + name + "' twice");
      vidx[v][a] = static_cast<int>(it - values.begin());
    }
    for (std::size_t a = 0; a < A; ++a)
      if (vidx[v][a] < 0)
        throw RankingError("ranking: variant '" + variants[v].id + "' has no value for axis '" +
                           axes[a].first + "'");
  }
  for (const auto& s : steps) {
    if (s.w1.size() != V * V || (!s.max_abs.empty() && s.max_abs.size() != V * V))
      throw RankingError("ranking: the matrices of step " + std::to_string(s.step) + " have " +
                             std::to_string(s.w1.size()) + " entries, expected " + std::to_string(V) +
                             " x " + std::to_string(V),
                         "pass V x V row-major matrices over the variants, in the variants' order");
  }
  std::vector<std::size_t> order(steps.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t x, std::size_t y) { return steps[x].step < steps[y].step; });

  // Sources: pairs of variants that differ in exactly one axis; per axis, then per value pair.
  std::vector<Group> groups;
  for (std::size_t a = 0; a < A; ++a) {
    Group all{a, -1, -1, {}};
    std::map<std::pair<int, int>, std::vector<std::pair<std::size_t, std::size_t>>> by_value;
    for (std::size_t i = 0; i < V; ++i)
      for (std::size_t j = i + 1; j < V; ++j) {
        std::size_t differ = 0, which = A;
        for (std::size_t b = 0; b < A; ++b)
          if (vidx[i][b] != vidx[j][b]) ++differ, which = b;
        if (differ != 1 || which != a) continue;
        all.pairs.emplace_back(i, j);
        const int p = std::min(vidx[i][a], vidx[j][a]), q = std::max(vidx[i][a], vidx[j][a]);
        by_value[{p, q}].emplace_back(i, j);
      }
    if (all.pairs.empty()) {
      if (axes[a].second.size() > 1)
        out.notes.push_back("axis '" + axes[a].first +
                            "': no two variants differ in it alone, so it is not ranked");
      continue;
    }
    groups.push_back(std::move(all));
    for (auto& [vp, pairs] : by_value) groups.push_back({a, vp.first, vp.second, std::move(pairs)});
  }

  // Entry (i, j), accepting a matrix filled in either triangle; NaN if absent.
  auto entry = [&](const std::vector<double>& m, std::size_t i, std::size_t j) {
    if (m.empty()) return kNaN;
    const double v = m[i * V + j];
    return std::isnan(v) ? m[j * V + i] : v;
  };
  // Per group and step: the finite W1 and max |dW| values.
  auto values_at = [&](const Group& g, const StepMatrices& s, bool w1) {
    std::vector<double> x;
    for (const auto& [i, j] : g.pairs) {
      const double v = entry(w1 ? s.w1 : s.max_abs, i, j);
      if (std::isfinite(v)) x.push_back(v);
    }
    return x;
  };

  const Group* attention = nullptr;
  for (const auto& g : groups)
    if (g.value_a < 0 && axes[g.axis].first == options.attention_axis) attention = &g;
  if (!attention) {
    bool has_axis = false;
    for (const auto& ax : axes) has_axis = has_axis || ax.first == options.attention_axis;
    out.notes.push_back(has_axis ? "no pairs differ in '" + options.attention_axis +
                                       "' alone: ratio_to_attention is not available"
                                 : "the grid has no '" + options.attention_axis +
                                       "' axis: ratio_to_attention is not available");
  }

  const double tail = (1.0 - options.interval) / 2.0;
  std::uint64_t row_counter = 0;
  for (const auto& g : groups) {
    const std::size_t first_row = out.rows.size();
    std::vector<double> xs, ys;  // (step, w1_mean) for the slope
    for (std::size_t k : order) {
      const StepMatrices& s = steps[k];
      const std::vector<double> w = values_at(g, s, true), m = values_at(g, s, false);
      RankingRow r;
      r.axis = axes[g.axis].first;
      r.value_a = g.value_a < 0 ? "*" : axes[g.axis].second[static_cast<std::size_t>(g.value_a)];
      r.value_b = g.value_b < 0 ? "*" : axes[g.axis].second[static_cast<std::size_t>(g.value_b)];
      r.step = s.step;
      r.pairs = w.size();
      r.w1_mean = mean_of(w);
      r.w1_min = w.empty() ? kNaN : *std::min_element(w.begin(), w.end());
      r.w1_max = w.empty() ? kNaN : *std::max_element(w.begin(), w.end());
      r.max_abs_mean = mean_of(m);
      if (!w.empty()) {
        xs.push_back(static_cast<double>(s.step));
        ys.push_back(r.w1_mean);
      }
      r.ratio_to_attention = r.ratio_lo = r.ratio_hi = kNaN;
      if (&g == attention) {
        if (!w.empty()) r.ratio_to_attention = r.ratio_lo = r.ratio_hi = 1.0;
      } else if (attention) {
        const std::vector<double> att = values_at(*attention, s, true);
        r.ratio_to_attention = ratio_of(r.w1_mean, mean_of(att));
        if (!w.empty() && !att.empty() && options.bootstrap_resamples > 0) {
          SplitMix64 rng{options.seed ^ (0x9e3779b97f4a7c15ull * ++row_counter)};
          std::vector<double> ratios;
          ratios.reserve(static_cast<std::size_t>(options.bootstrap_resamples));
          for (int b = 0; b < options.bootstrap_resamples; ++b) {
            double sw = 0, sa = 0;
            for (std::size_t t = 0; t < w.size(); ++t) sw += w[rng.below(w.size())];
            for (std::size_t t = 0; t < att.size(); ++t) sa += att[rng.below(att.size())];
            const double q = ratio_of(sw / static_cast<double>(w.size()), sa / static_cast<double>(att.size()));
            if (!std::isnan(q)) ratios.push_back(q);
          }
          std::sort(ratios.begin(), ratios.end());
          r.ratio_lo = percentile(ratios, tail);
          r.ratio_hi = percentile(ratios, 1.0 - tail);
        }
      }
      out.rows.push_back(std::move(r));
    }
    // Least-squares slope of the mean W1 over the steps with pairs (centred, for accuracy).
    double slope = kNaN;
    const double xm = mean_of(xs), ym = mean_of(ys);
    double sxx = 0, sxy = 0;
    for (std::size_t t = 0; t < xs.size(); ++t) {
      sxx += (xs[t] - xm) * (xs[t] - xm);
      sxy += (xs[t] - xm) * (ys[t] - ym);
    }
    if (xs.size() >= 2 && sxx > 0) slope = sxy / sxx;
    for (std::size_t t = first_row; t < out.rows.size(); ++t) out.rows[t].slope = slope;
  }

  // Twins: the variant with the same other axes and the reference precision.
  std::size_t pa = A;
  for (std::size_t a = 0; a < A; ++a)
    if (axes[a].first == options.precision_axis) pa = a;
  if (pa < A) {
    const auto& pv = axes[pa].second;
    const auto ref = std::find(pv.begin(), pv.end(), options.reference_precision);
    if (ref != pv.end()) {
      const int r = static_cast<int>(ref - pv.begin());
      for (std::size_t i = 0; i < V; ++i) {
        if (vidx[i][pa] == r) continue;
        for (std::size_t j = 0; j < V; ++j) {
          if (vidx[j][pa] != r) continue;
          bool same = true;
          for (std::size_t b = 0; b < A && same; ++b) same = b == pa || vidx[i][b] == vidx[j][b];
          if (!same) continue;
          for (std::size_t k : order) {
            const StepMatrices& s = steps[k];
            TwinRow t{variants[i].id, variants[j].id, pv[static_cast<std::size_t>(vidx[i][pa])], s.step,
                      entry(s.w1, i, j), entry(s.max_abs, i, j)};
            out.twins.push_back(std::move(t));
          }
        }
      }
    }
  }
  return out;
}

std::string format_ranking_table(const Ranking& ranking, const RankingOptions& options) {
  std::string s;
  if (ranking.rows.empty()) {
    s += "# deviation sources: none (no two variants differ in exactly one axis)\n";
  } else {
    std::int64_t last = ranking.rows.front().step;
    for (const auto& r : ranking.rows) last = std::max(last, r.step);
    std::vector<const RankingRow*> axis_rows;
    for (const auto& r : ranking.rows)
      if (r.step == last && r.value_a == "*") axis_rows.push_back(&r);
    std::stable_sort(axis_rows.begin(), axis_rows.end(), [](const RankingRow* x, const RankingRow* y) {
      if (std::isnan(x->w1_mean) != std::isnan(y->w1_mean)) return std::isnan(y->w1_mean);
      return x->w1_mean > y->w1_mean;
    });
    char line[256];
    s += "# deviation sources at step " + std::to_string(last) +
         " (whole-model W1 between variants that differ in one axis only), largest first\n";
    std::snprintf(line, sizeof line, "%-4s %-24s %5s %10s %21s %10s %11s  %s\n", "rank", "source", "pairs",
                  "W1 mean", "W1 [min, max]", "max|dW|", "W1/step",
                  ("x " + options.attention_axis + " [" + fmt(100 * options.interval, "%g") + "%]").c_str());
    s += line;
    int rank = 0;
    for (const RankingRow* a : axis_rows) {
      std::vector<const RankingRow*> rows{a};
      std::vector<const RankingRow*> sub;
      for (const auto& r : ranking.rows)
        if (r.step == last && r.axis == a->axis && r.value_a != "*") sub.push_back(&r);
      if (sub.size() > 1) rows.insert(rows.end(), sub.begin(), sub.end());
      for (const RankingRow* r : rows) {
        const bool head = r == a;
        const std::string name = head ? r->axis : "  " + r->value_a + "<->" + r->value_b;
        const std::string range = "[" + fmt(r->w1_min) + ", " + fmt(r->w1_max) + "]";
        const std::string ratio = fmt(r->ratio_to_attention, "%.2f") + " [" + fmt(r->ratio_lo, "%.2f") +
                                  ", " + fmt(r->ratio_hi, "%.2f") + "]";
        std::snprintf(line, sizeof line, "%-4s %-24s %5zu %10s %21s %10s %11s  %s\n",
                      head ? std::to_string(++rank).c_str() : "", name.c_str(), r->pairs,
                      fmt(r->w1_mean).c_str(), range.c_str(), fmt(r->max_abs_mean).c_str(),
                      fmt(r->slope).c_str(), ratio.c_str());
        s += line;
      }
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
  }
  for (const auto& note : ranking.notes) s += "# note: " + note + "\n";
  return s;
}

}  // namespace fastudy
