// Distances between weight distributions: 1-D Wasserstein (W1, W2) and elementwise deviation
// (max |a-b|, mean |a-b|, relative L2), in fp64, exact-summed so that results do not depend on how the
// work was split. Free of LibTorch and MPI: this file only computes (the distributed recipe over MPI is
// analysis/sorted_exchange.hpp).
//
// Two layers:
//  - one-shot functions with scipy's semantics, for a single pair of arbitrary arrays:
//      wasserstein1(u, v, u_weights, v_weights)  == scipy.stats.wasserstein_distance
//      elementwise_metrics(a, ref)
//  - the pairwise engine for V variants of the same tensor (all of length n): sort each variant once
//    (SortedSet, linear-time radix sort), then every pair i<j of a pair list (all pairs, or only those
//    a caller needs: the reducer's pairs on demand) with one linear pass over an index range
//    [begin, end), accumulated into PairwisePartials. Partials of disjoint ranges combine by integer
//    addition (exact sums) and max, so ranks can split [0, n) and combine with MPI:
//      MPI_Allreduce(MPI_IN_PLACE, p.sums(),   p.sums_size(),   MPI_INT64_T, MPI_SUM, comm);
//      MPI_Allreduce(MPI_IN_PLACE, p.maxima(), p.maxima_size(), MPI_DOUBLE,  MPI_MAX, comm);
//    then finalize() gives the V x V matrices.
//
// Determinism guarantee (tested in tests/analysis/test_pairwise.cpp):
//  - The index range is cut into fixed blocks at global multiples of kPairwiseBlock. Inside a block the
//    sums are plain fp64 lane sums in a fixed order (and -ffp-contract=off, so every ISA variant of the
//    kernel rounds identically); each block's sum is then added EXACTLY into a fixed-point integer
//    accumulator (ExactSum). Integer addition is associative, so:
//      * splits of [0, n) whose cut points are multiples of kPairwiseBlock (block_aligned_part) give
//        bit-identical results for any number of parts and any combination order;
//      * arbitrary cut points change only the rounding of the (at most two) blocks that are cut: the
//        results agree to rounding level (a few ulp of the block sums; see the test for the bound).
//  - finalize() rounds each exact sum to double once (within about 1 ulp) and then divides.
//
// Whole model (all parameters flattened into one distribution):
//  - the elementwise sums are additive over tensors: combine_elementwise() of the per-tensor partials
//    gives the whole-model max |d|, mean |d| and relative L2 exactly, with no second pass;
//  - W1 is not: the sorted order interleaves the tensors (combine() of per-tensor sorted sums would give
//    the size-weighted mean of per-tensor W1, only an upper bound of the whole-model W1). So concatenate
//    each variant's tensors in one fixed order and build a SortedSet over the concatenation. The radix
//    sort is linear in n, so a k-way merge of the per-tensor sorted arrays (O(n log k)) would not be
//    cheaper; sorting the concatenation is also simpler to split over ranks.
//
// Non-finite values (NaN, +-inf) are counted, never silently propagated:
//  - elementwise metrics skip the indices where either value is non-finite and report their number in
//    PairMetrics::nonfinite (max/mean/rel_l2 are then over the finite indices only);
//  - W1/W2 of a distribution containing a non-finite value is undefined: w1 = w2 = NaN and
//    PairMetrics::nonfinite_sorted counts the offending sorted positions.
//  - the one-shot wasserstein1() throws DistanceError instead (like scipy's input validation).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "analysis/value_buffer.hpp"
#include "base/error.hpp"
#include "base/pair_metrics.hpp"

namespace fastudy {

// Invalid input to a distance (empty array, negative weight, non-finite value, size mismatch).
class DistanceError : public Error {
 public:
  using Error::Error;
};

// A read-only view of n contiguous values (C++17 has no std::span).
template <class T>
struct ArrayView {
  const T* data = nullptr;
  std::size_t size = 0;
  constexpr ArrayView() = default;
  constexpr ArrayView(const T* d, std::size_t n) : data(d), size(n) {}
  ArrayView(const std::vector<T>& v) : data(v.data()), size(v.size()) {}  // NOLINT: implicit on purpose
  bool empty() const { return size == 0; }
  const T& operator[](std::size_t i) const { return data[i]; }
};

// ---- one pair, scipy semantics ------------------------------------------------------------------

// scipy.stats.wasserstein_distance(u, v, u_weights, v_weights): the integral of |F_u - F_v| over the
// merged sorted support, F the (weighted) empirical CDFs. Sizes may differ; weights are optional
// (empty view = uniform), non-negative, with a positive finite sum. Equal sizes without weights use the
// equivalent mean |sorted(u) - sorted(v)|. Throws DistanceError on invalid input (scipy raises
// ValueError for the same cases; scipy does not check non-finite values, this does).
double wasserstein1(ArrayView<double> u, ArrayView<double> v, ArrayView<double> u_weights = {},
                    ArrayView<double> v_weights = {});
double wasserstein1(ArrayView<float> u, ArrayView<float> v, ArrayView<double> u_weights = {},
                    ArrayView<double> v_weights = {});

// W2 for equal sizes without weights: sqrt(mean (sorted(u) - sorted(v))^2). Throws DistanceError.
double wasserstein2(ArrayView<double> u, ArrayView<double> v);
double wasserstein2(ArrayView<float> u, ArrayView<float> v);

// The same parameter in two variants, index by index (a the variant, ref the reference):
//   max_abs  = max_k |a_k - ref_k|
//   mean_abs = sum_k |a_k - ref_k| / count
//   rel_l2   = sqrt(sum_k (a_k - ref_k)^2) / sqrt(sum_k ref_k^2)   (0 if both are 0, +inf if only ref is)
// over the `count` indices where both values are finite; `nonfinite` counts the skipped indices.
// Sums are exact (ExactSum) and rounded once. Throws DistanceError if the sizes differ.
struct ElementwiseMetrics {
  double max_abs = 0;
  double mean_abs = 0;
  double rel_l2 = 0;
  std::uint64_t count = 0;
  std::uint64_t nonfinite = 0;
};
ElementwiseMetrics elementwise_metrics(ArrayView<double> a, ArrayView<double> ref);
ElementwiseMetrics elementwise_metrics(ArrayView<float> a, ArrayView<float> ref);

// ---- exact summation ----------------------------------------------------------------------------

// Exact sum of non-negative finite doubles as a fixed-point integer: limb k holds bits
// [32k, 32k+32) of the value in units of 2^-1074 (the smallest subnormal), so every finite double is
// representable; the top limbs give headroom above DBL_MAX. Limbs are int64 with 31 spare bits, so
// up to 2^31 additions (or MPI_SUM over up to 2^31 normalized accumulators) cannot overflow.
// value() depends only on the exact sum, never on the order of additions.
inline constexpr int kExactLimbs = 68;
void exact_add(std::int64_t* limbs, double x);        // x >= 0 and finite (checked by callers)
void exact_normalize(std::int64_t* limbs);            // propagate carries: limbs[k] in [0, 2^32)
double exact_value(const std::int64_t* limbs);        // within ~1 ulp; inf beyond DBL_MAX

class ExactSum {
 public:
  void add(double x) { exact_add(limbs_.data(), x); }
  void add(const ExactSum& other);
  double value() const { return exact_value(limbs_.data()); }

 private:
  std::array<std::int64_t, kExactLimbs> limbs_{};
};

// ---- the pairwise engine ------------------------------------------------------------------------

// Every variant's values of one tensor (or of the whole model), sorted once. T is float (fp32
// checkpoints: half the memory traffic) or double; all arithmetic is fp64 either way.
//
// A set may hold only a window [window_begin, window_end) of the sorted positions of distributions of
// `size()` values, the same window for every variant. That is how a rank keeps only its part of the
// index range: rank r sorts the variants r, r+R, ... (radix_sort), the ranks exchange the
// windows (MPI_Alltoallv), and each builds a set of its window with add_sorted_window().
template <class T>
class SortedSet {
 public:
  SortedSet() = default;
  // Copies and sorts (radix sort on the IEEE bit pattern, linear time; -0 sorts before +0, NaNs at
  // the ends). Every variant must have the same length. Counts the non-finite values.
  void add(ArrayView<T> values);
  // An array that is already sorted ascending (e.g. sorted on another rank). Checked.
  void add_sorted(std::vector<T> sorted);
  // Sorted positions [offset, offset + window.size()) of a sorted distribution of `total` values.
  void add_sorted_window(std::vector<T> window, std::size_t offset, std::size_t total);
  // The same without a copy: the set only points at `window` (length values), which must stay valid
  // and unchanged while the set is used (e.g. a segment of memory shared by the ranks of a node).
  void add_sorted_view(const T* window, std::size_t length, std::size_t offset, std::size_t total);

  std::size_t variants() const { return views_.size(); }
  std::size_t size() const { return n_; }  // of the whole distribution
  std::size_t window_begin() const { return offset_; }
  std::size_t window_end() const { return offset_ + (views_.empty() ? n_ : length_); }
  // The window of variant v: window(v)[k] is sorted position window_begin() + k.
  const T* window(std::size_t v) const { return views_[v]; }
  std::uint64_t nonfinite(std::size_t v) const { return nonfinite_[v]; }  // in the window

 private:
  std::size_t n_ = 0;
  std::size_t offset_ = 0;
  std::size_t length_ = 0;                // of every window
  std::vector<std::vector<T>> owned_;     // the windows this set copied or sorted itself
  std::vector<const T*> views_;           // every variant's window (into owned_ or the caller's memory)
  std::vector<std::uint64_t> nonfinite_;
  // The radix sort's scratch (2n keys), kept between add() calls.
  ValueBuffer<std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>> scratch_;
};

// Sort values ascending in place with the same radix sort.
void radix_sort(float* values, std::size_t n);
void radix_sort(double* values, std::size_t n);

// Block size of the fixed global blocking (elements). Cut points that are multiples of it keep the
// results bit-identical (see the guarantee above).
inline constexpr std::size_t kPairwiseBlock = 2048;

struct IndexRange {
  std::size_t begin = 0;
  std::size_t end = 0;
};
// Part `part` of `parts` near-equal block-aligned pieces of [0, n) (some may be empty).
IndexRange block_aligned_part(std::size_t n, std::size_t parts, std::size_t part);

// The finalized metrics of one ordered pair (i, j): j is the reference of rel_l2. The metrics are the
// rows of kPairMetrics (base/pair_metrics.hpp), their values the members of PairDistances:
//   w1        mean |sorted_i - sorted_j| over the sorted positions (NaN if nonfinite_sorted)
//   w2        sqrt(mean (sorted_i - sorted_j)^2) (NaN if nonfinite_sorted or not computed)
//   max_abs   elementwise, over indices where both values are finite
//   mean_abs
//   rel_l2    ||x_i - x_j|| / ||x_j||; ||x_j|| over the finite entries of x_j
struct PairMetrics : PairDistances {
  std::uint64_t count_sorted = 0;      // sorted positions accumulated
  std::uint64_t count = 0;             // elementwise indices with both values finite
  std::uint64_t nonfinite = 0;         // elementwise indices skipped
  std::uint64_t nonfinite_sorted = 0;  // sorted positions where either value is non-finite
};

// V x V, row-major: at(i, j). Symmetric except rel_l2 (row = variant, column = reference); the
// diagonal is zero; a pair the partials did not list has every metric NaN (and counts 0).
struct PairwiseMatrix {
  std::size_t variants = 0;
  std::vector<PairMetrics> pairs;
  const PairMetrics& at(std::size_t i, std::size_t j) const { return pairs[i * variants + j]; }
};

// Which sorted metrics accumulate_sorted computes (W2 costs one more multiply-add per element).
enum class SortedMetrics { w1, w1_w2 };

// An unordered pair of variants, i < j.
using VariantPair = std::pair<std::size_t, std::size_t>;
// Every pair i < j of `variants` variants, row-major upper triangle: (0,1), (0,2), ..., (1,2), ...
std::vector<VariantPair> all_pairs(std::size_t variants);

// Partial sums over some index range for the unordered pairs of a pair list, in two flat buffers:
// `sums` (exact accumulators and counts, combined with integer +) and `maxima` (max |a-b|, combined
// with max). Layout of sums: per listed pair (in the list's order) kPairSums int64 (4 ExactSums: sorted
// |d|, sorted d^2, |d|, d^2; then count_sorted, count, nonfinite, nonfinite_sorted), then per variant
// one ExactSum of x^2 (finite entries; only the variants of some listed pair are summed). Both
// buffers start zeroed; sums are kept normalized between calls. Each pair's sums depend only on its
// two variants, so a pair's results are the same bits whatever else the list holds.
class PairwisePartials {
 public:
  static constexpr std::size_t kPairSums = 4 * kExactLimbs + 4;

  PairwisePartials() = default;
  explicit PairwisePartials(std::size_t variants);  // every pair (all_pairs)
  // Only `pairs`: each i < j < variants, no pair twice (in any order; kept sorted). Throws DistanceError.
  PairwisePartials(std::size_t variants, std::vector<VariantPair> pairs);

  std::size_t variants() const { return variants_; }
  std::size_t pair_count() const { return pairs_.size(); }
  const std::vector<VariantPair>& pairs() const { return pairs_; }
  // Whether variant v takes part in a listed pair.
  bool uses(std::size_t v) const { return used_[v] != 0; }

  std::int64_t* sums() { return sums_.data(); }
  const std::int64_t* sums() const { return sums_.data(); }
  std::size_t sums_size() const { return sums_.size(); }
  double* maxima() { return maxima_.data(); }
  const double* maxima() const { return maxima_.data(); }
  std::size_t maxima_size() const { return maxima_.size(); }
  // Whether every sorted accumulation into these partials (and those combined in) included W2; W2 is
  // NaN after finalize() otherwise. Local state, not in the buffers: after an MPI reduction it is
  // right when every rank used the same SortedMetrics (or set it with set_has_w2).
  bool has_w2() const { return w2_ == W2::yes; }
  void set_has_w2(bool b) { w2_ = b ? W2::yes : W2::no; }
  void note_sorted_metrics(SortedMetrics which);  // accumulate_sorted calls it

  // Exactly what the two MPI reductions do, on one process: sums add, maxima take the max.
  void combine(const PairwisePartials& other);
  // Only the elementwise part of other (max |d|, sum |d|, sum d^2, sum x^2, counts): per-tensor
  // partials combined this way give the whole-model elementwise metrics (see the top of this file).
  void combine_elementwise(const PairwisePartials& other);
  PairwiseMatrix finalize() const;

 private:
  std::size_t variants_ = 0;
  std::vector<VariantPair> pairs_;
  std::vector<char> used_;  // per variant: in some listed pair
  enum class W2 { unknown, yes, no } w2_ = W2::unknown;  // unknown: no sorted accumulation yet
  std::vector<std::int64_t> sums_;
  std::vector<double> maxima_;
};

// W1 (and W2) partial sums over sorted positions [begin, end) for every pair of `set`'s variants;
// [begin, end) must lie inside the set's window.
template <class T>
void accumulate_sorted(const SortedSet<T>& set, std::size_t begin, std::size_t end,
                       PairwisePartials& partials, SortedMetrics which = SortedMetrics::w1_w2);
// Elementwise partial sums (max |d|, sum |d|, sum d^2, sum x^2) over indices [begin, end) of the
// unsorted arrays, same order of parameters in every variant: index k is values[v][k - offset], so a
// rank that read only the slice [begin, end) of each variant passes offset = begin.
template <class T>
void accumulate_elementwise(const std::vector<const T*>& values, std::size_t begin, std::size_t end,
                            PairwisePartials& partials, std::size_t offset = 0);

// One process, whole range: sort, accumulate everything (the partial sums, e.g. to combine with
// others'), and finalize. values[v] has n entries.
template <class T>
PairwisePartials pairwise_partials(const std::vector<const T*>& values, std::size_t n);
template <class T>
PairwiseMatrix pairwise_matrix(const std::vector<const T*>& values, std::size_t n);

}  // namespace fastudy
