// The pair metrics: how far apart the same weights of two variants are, one row each. [reduce] metrics
// (src/core/config_read.cpp) takes its words from this table; the pairwise engine fills a
// PairDistances for every ordered pair (analysis/distance.hpp PairMetrics, its arithmetic in
// analysis/distance.cpp); the reduce computes the passes the listed rows need and writes one matrix
// (deviation.h5) and one column (deviation.csv) per listed row, in the table's order (jobs/reduce*.cpp);
// the report reads the names back from deviation.h5's `metrics` attribute.
//
// A new metric is a member of PairDistances, its row here and its arithmetic in the engine. It lives in
// base because the configuration (src/core) and the engine (analysis) both read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fastudy {

// The metrics of one ordered pair (i, j), j the reference of rel_l2 (the rows below say what each is).
struct PairDistances {
  double w1 = 0;
  double w2 = 0;
  double max_abs = 0;
  double mean_abs = 0;
  double rel_l2 = 0;
};

// Which pass of the engine computes a metric: the sorted one (W1; W2 with one more multiply-add per
// element) or the elementwise one over the unsorted values.
enum class MetricPass : std::uint8_t { sorted, sorted_w2, elementwise };

struct PairMetric {
  std::string_view name;           // the word of [reduce] metrics, deviation.h5's dataset, deviation.csv's column
  double PairDistances::*value;    // where the engine puts it
  MetricPass pass;                 // what computes it
  bool by_default;                 // in [reduce] metrics when the grid does not set it
  std::string_view description;
};

inline constexpr PairMetric kPairMetrics[] = {
    {.name = "w1",
     .value = &PairDistances::w1,
     .pass = MetricPass::sorted,
     .by_default = true,
     .description = "1-D Wasserstein distance between the two weight distributions: mean |sorted a - sorted b| "
                    "(scipy.stats.wasserstein_distance); the ranking's and the verdict's"},
    {.name = "w2",
     .value = &PairDistances::w2,
     .pass = MetricPass::sorted_w2,
     .by_default = false,
     .description = "2-Wasserstein distance: sqrt(mean (sorted a - sorted b)^2)"},
    {.name = "max_abs",
     .value = &PairDistances::max_abs,
     .pass = MetricPass::elementwise,
     .by_default = true,
     .description = "largest elementwise difference max |a - b| (over the indices where both are finite)"},
    {.name = "mean_abs",
     .value = &PairDistances::mean_abs,
     .pass = MetricPass::elementwise,
     .by_default = true,
     .description = "mean elementwise difference mean |a - b|"},
    {.name = "rel_l2",
     .value = &PairDistances::rel_l2,
     .pass = MetricPass::elementwise,
     .by_default = true,
     .description = "relative L2 distance ||a - b|| / ||b||, b the reference (the second variant of the pair)"},
};
inline constexpr std::size_t kPairMetricCount = sizeof kPairMetrics / sizeof kPairMetrics[0];

// The index of the metric named `name` in kPairMetrics, or kPairMetricCount.
constexpr std::size_t pair_metric_index(std::string_view name) {
  std::size_t k = 0;
  while (k < kPairMetricCount && kPairMetrics[k].name != name) ++k;
  return k;
}

// Every metric's name, in the table's order.
inline std::vector<std::string> pair_metric_names() {
  std::vector<std::string> out;
  for (const PairMetric& m : kPairMetrics) out.emplace_back(m.name);
  return out;
}

// The metrics [reduce] metrics lists when the grid does not set it.
inline std::vector<std::string> default_pair_metrics() {
  std::vector<std::string> out;
  for (const PairMetric& m : kPairMetrics)
    if (m.by_default) out.emplace_back(m.name);
  return out;
}

}  // namespace fastudy
