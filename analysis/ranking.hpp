// The ranking of deviation sources and the verdict: which grid axis moves the weights most, and does
// each optimisation stay within the deviation the accepted references cause, condition by condition
// (the paper's "Flash's deviation is bounded by random init and low-precision training", as numbers
// the tool prints, without pooling conditions whose distances differ by orders of magnitude).
//
// Input: the grid's axes with their roles (RankingAxis, filled by jobs/reduce.cpp from the axis table
// in src/core/grid.cpp (kGridAxes); tests pass synthetic ones), the variants (id and axis values), and per
// checkpoint step the V x V matrices of whole-model W1 and max |dW| (analysis/distance.hpp). A NaN
// entry is a missing pair (variant left out, non-finite weights) and is skipped. Nothing here looks
// at an axis's name except the fp64 twins (options.precision_axis): roles decide everything.
//
// Roles (src/core/config.hpp AxisRole): an optimisation (attention, matmul, split_k, ...) is judged;
// a reference (seed, precision) is an accepted source of deviation that bounds it; a setting (lr,
// init) only defines conditions; a noise axis (repeat) measures the noise floor. A replicate axis
// (seed, data_seed, repeat) is an independent draw: it never defines a condition, and its values give
// the independent pairs.
//
// Definitions (tested in tests/analysis/test_ranking.cpp):
//  - Evidence of an axis X: the pairs of variants that differ in X only (every other axis equal).
//  - Condition of X: the values of the condition axes of X = every other axis that is neither a
//    replicate nor a noise axis; written "a=x;b=y" over those axes with more than one grid value,
//    leaving out optimisation axes at their baseline value ("all" when nothing is left). Example: attention's conditions in attention x precision x seed are
//    precision=fp32, precision=fp16, precision=bf16; its pairs at precision=bf16 are the flash/baseline
//    variants with the same seed.
//  - Baseline of X: its declared baseline when the grid lists it, else the grid's first value (noted).
//  - Rows (RankingRow), for every step:
//      pooled (condition "*"): the whole axis (value_a = value_b = "*") and each value pair, as before
//        per-condition rows existed: the summary, for every axis with evidence;
//      per condition, for optimisation, reference and noise axes: a replicate axis has one row per
//        condition over all its pairs ("*" <-> "*"); any other axis one row per condition and value v
//        != baseline, value_a = baseline, value_b = v.
//    pairs = pairs with a finite W1 at that step; independent = the most of them that share no variant
//    (a greedy matching, exact for the grid's structures: disjoint pairs, or all pairs among k
//    replicates, which give floor(k/2)); slope = least-squares slope of the mean W1 over the steps.
//  - Comparisons (ComparisonRow): for each optimisation X, condition c and value v != baseline b, with
//    each reference axis R != X "under the same condition":
//      R a replicate (seed): the pairs that differ in R only, with X = b and the condition axes = c;
//      R not a replicate (precision; R is then one of c's axes, with value r): the pairs that differ in
//        R only, with X = b, the other condition axes = c, and R's values {baseline of R, r}; when r is
//        R's baseline, one comparison per other value r' of R ({baseline, r'}).
//      end-point ratio = mean W1(X pairs) / mean W1(R pairs) at the final step (<= 1: within the bound);
//      slope ratio = mean per-pair slope(X) / mean per-pair slope(R), each pair's slope the least-squares
//        slope of its W1 over the steps (>= 2 steps; NaN otherwise, or when R's mean slope is <= 0);
//      intervals: percentile bootstrap (default 2000 resamples, 95 %) resampling the X pairs and the R
//        pairs independently, from a fixed-seed SplitMix64 stream (same numbers on every platform);
//        only when both sides rest on >= kMinIndependentPairs independent pairs, else NaN and
//        informative = false (the report prints "not informative (n pairs)").
//      noise_w1: the mean final W1 of the noise axis's pairs with X in {b, v} and the condition axes =
//        c; NaN when the grid has no noise axis (the floor is then 0 by construction on the CPU).
//  - Verdict (one per X, v, c; repeated on its comparison rows): measure = "slope" when every
//    comparison has a slope ratio (the paper's measure: "note the slope"; it also removes the offset
//    that references such as seed carry from step 0, where the optimisation's pairs start equal), else
//    "end-point". Per comparison, with ratio q of that measure and interval [lo, hi]: within if q <= 1
//    (and hi <= 1 when informative), outside if q > 1 (and lo > 1 when informative), else undecided.
//    Verdict: "bit-identical" when every X pair has W1 = 0 at every step; "within noise" when the noise
//    floor is measured and X's final mean W1 is at most it; "no reference" without comparisons;
//    "outside" if any comparison is outside; "within" if all are within; else "undecided".
//    A note says when an optimisation's value gets different verdicts under different conditions.
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

// What an axis is to the verdict: the same words as src/core/config.hpp AxisRole.
enum class SourceRole { optimisation, reference, setting, noise };
const char* source_role_name(SourceRole role);

// One grid axis: name, values in grid order, role, declared baseline ("" = the first value), replicate.
struct RankingAxis {
  std::string name;
  std::vector<std::string> values;
  SourceRole role = SourceRole::setting;
  std::string baseline;
  bool replicate = false;
};

// Fewer independent pairs than this on either side: the interval is not informative (not printed).
constexpr std::size_t kMinIndependentPairs = 3;

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
  std::string precision_axis = "precision";  // for the fp64 twins only
  std::string reference_precision = "fp64";
  int bootstrap_resamples = 2000;
  double interval = 0.95;             // central bootstrap interval
  std::uint64_t seed = 0x2405028003;  // the bootstrap stream
};

struct RankingRow {
  std::string axis;
  SourceRole role = SourceRole::setting;
  std::string condition;  // "*": pooled over every condition
  std::string value_a;    // "*" on the whole-axis row
  std::string value_b;
  std::size_t pairs = 0;
  std::size_t independent = 0;
  std::int64_t step = 0;
  double w1_mean = 0, w1_min = 0, w1_max = 0;
  double max_abs_mean = 0;
  double slope = 0;  // d(w1_mean)/d(step), least squares over the steps (same on every step's row)
};

struct ComparisonRow {
  std::string axis;       // the optimisation
  std::string baseline;   // its baseline value
  std::string value;      // the value compared with it
  std::string condition;
  std::string reference;       // the reference axis
  std::string reference_pair;  // "*" (a replicate reference) or "fp32<->bf16" (baseline first)
  std::size_t pairs = 0, independent = 0;                      // the optimisation's, at the final step
  std::size_t reference_pairs = 0, reference_independent = 0;  // the reference's, at the final step
  std::int64_t step = 0;                                       // the final step
  double w1 = 0, reference_w1 = 0;                             // mean W1 at the final step
  double end_ratio = 0, end_lo = 0, end_hi = 0;
  double slope = 0, reference_slope = 0;  // mean per-pair slopes
  double slope_ratio = 0, slope_lo = 0, slope_hi = 0;
  bool informative = false;
  double noise_w1 = 0;      // NaN: no noise axis
  std::string measure;      // "slope" or "end-point": what the verdict uses
  std::string comparison;   // "within", "outside", "undecided": this comparison alone
  std::string verdict;      // of (axis, value, condition): "within", "outside", "undecided",
                            // "bit-identical", "within noise", "no reference"
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
  std::vector<RankingRow> rows;               // axis in grid order: pooled rows, then per condition
  std::vector<ComparisonRow> comparisons;     // optimisation, value, condition, reference
  std::vector<TwinRow> twins;                 // variant order, steps ascending
  std::vector<std::string> notes;             // what a reader must know
  std::string noise_axis;                     // "" when the grid has no noise axis
};

Ranking rank_deviation_sources(const std::vector<RankingAxis>& axes, const std::vector<RankingVariant>& variants,
                               const std::vector<StepMatrices>& steps, const RankingOptions& options = {});

// Every pair (i, j), i < j, of variants that differ in exactly one axis: the only pairs whose matrix
// entries rank_deviation_sources reads (each axis's evidence, the conditions' groups, the references'
// pairs, the noise floor, the fp64 twins), so a reducer that computes these gives the same ranking as
// one that computes every pair. Ascending. Throws RankingError for inconsistent input, as
// rank_deviation_sources does.
std::vector<std::pair<std::size_t, std::size_t>> verdict_pairs(const std::vector<RankingAxis>& axes,
                                                               const std::vector<RankingVariant>& variants);

// The short text rank 0 prints: one verdict line per optimisation, value and condition; the pooled
// sources ranked by mean W1 at the last step; the noise floor; the fp64 twins; the notes.
std::string format_ranking_table(const Ranking& ranking, const RankingOptions& options = {});

}  // namespace fastudy
