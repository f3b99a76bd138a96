// The ranking of deviation sources: which grid axis moves the weights most (the paper's "Flash's
// deviation is 2-5x smaller than low-precision training", as numbers the tool prints).
//
// Input: the grid's axes (name and values, in grid order), the variants (id and their axis values),
// and per checkpoint step the V x V matrices of whole-model W1 and max |dW| (from the pairwise engine
// in analysis/distance.hpp; call it again with per-tensor matrices to rank per tensor). A NaN entry is
// a missing pair (variant left out, non-finite weights) and is skipped.
//
// A source is a grid axis; its evidence is every pair of variants that differ in that axis only (all
// other axes equal). Rows are also given per value pair of the axis (e.g. precision fp16<->fp32), with
// value_a before value_b in the grid's order of values; the whole-axis row has value_a = value_b = "*".
// Per source and step: the number of pairs with a finite W1, mean/min/max of W1, mean of max |dW|,
// and over the steps the least-squares slope of the mean W1 against the step.
//
// Conventions (tested in tests/analysis/test_ranking.cpp):
//  - slope: NaN when the source has pairs at fewer than two distinct steps (a slope is undefined from
//    one point; 0 would claim "no growth").
//  - ratio_to_attention = w1_mean(source) / w1_mean(attention axis, "*") at the same step; NaN if there
//    is no attention axis, or either side has no pairs at that step, or both means are 0; +inf if only
//    the attention mean is 0. The attention axis's own "*" row has ratio 1 and interval [1, 1].
//  - ratio_lo / ratio_hi: a percentile bootstrap (default 2000 resamples, 95 %) of the ratio of means,
//    resampling the source's pairs and the attention's pairs independently with replacement, from a
//    fixed-seed SplitMix64 stream (same numbers on every platform). With one pair on both sides the
//    interval collapses to the ratio: the `pairs` column tells the reader how much evidence there is.
//  - twins: for each variant whose precision is not the reference (fp64), its distance to the variant
//    with the same other axes and precision = fp64, when that variant exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/error.hpp"

namespace fastudy {

// Inconsistent ranking input (an axis value not in the grid, a matrix of the wrong size, ...).
class RankingError : public Error {
 public:
  using Error::Error;
};

// The grid: (axis, values) in grid order, like Study::axes.
using GridAxes = std::vector<std::pair<std::string, std::vector<std::string>>>;

struct RankingVariant {
  std::string id;
  std::vector<std::pair<std::string, std::string>> axes;  // (axis, value); every grid axis once
};

// One checkpoint step: V x V row-major matrices over the variants, in the order they were given.
struct StepMatrices {
  std::int64_t step = 0;
  std::vector<double> w1;
  std::vector<double> max_abs;
};

struct RankingOptions {
  std::string attention_axis = "attention";
  std::string precision_axis = "precision";
  std::string reference_precision = "fp64";
  int bootstrap_resamples = 2000;
  double interval = 0.95;             // central bootstrap interval
  std::uint64_t seed = 0x2405028003;  // the bootstrap stream
};

struct RankingRow {
  std::string axis;
  std::string value_a;  // "*" on the whole-axis row
  std::string value_b;
  std::size_t pairs = 0;
  std::int64_t step = 0;
  double w1_mean = 0, w1_min = 0, w1_max = 0;
  double max_abs_mean = 0;
  double slope = 0;               // d(w1_mean)/d(step), least squares over the steps (same on every row)
  double ratio_to_attention = 0;
  double ratio_lo = 0, ratio_hi = 0;
};

struct TwinRow {
  std::string variant;
  std::string twin;       // the fp64 variant with the same other axes
  std::string precision;  // the variant's precision
  std::int64_t step = 0;
  double w1 = 0;
  double max_abs = 0;
};

struct Ranking {
  std::vector<RankingRow> rows;    // axis in grid order, "*" row then value pairs, steps ascending
  std::vector<TwinRow> twins;      // variant order, steps ascending
  std::vector<std::string> notes;  // what a reader must know (no attention axis, sources without pairs)
};

Ranking rank_deviation_sources(const GridAxes& axes, const std::vector<RankingVariant>& variants,
                               const std::vector<StepMatrices>& steps, const RankingOptions& options = {});

// The short table rank 0 prints: the axes ranked by mean W1 at the last step (largest first), with
// their value pairs, the ratio to attention and its interval, the slope, and the mean distance to the
// fp64 twin per precision; then the notes.
std::string format_ranking_table(const Ranking& ranking, const RankingOptions& options = {});

}  // namespace fastudy
