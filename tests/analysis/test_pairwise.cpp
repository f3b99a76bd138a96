// Tests of the pairwise engine in analysis/distance.hpp: V x V matrices against naive per-pair
// references, agreement with the one-shot functions, the split-invariance guarantee (bit-identical for
// block-aligned splits in any combination order, rounding-level for arbitrary cuts), the MPI-style
// reduction of the raw buffers, and the handling of non-finite values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "analysis/distance.hpp"
#include "tests/analysis/pairwise_data.hpp"

namespace fastudy {
namespace {

using test::Data;
using test::make_data;

constexpr double kU64 = 0x1p-53;  // fp64 unit roundoff
// Our sums: a block holds <= kPairwiseBlock = 2048 terms in 8 lanes of <= 256 terms each, folded by a
// 3-level tree: <= 259 roundings, each <= u relative to the (non-negative) partial sum; blocks then add
// exactly and the total is rounded once more. So relative error <= 260 u < 2^9 u against the exact
// sum (the long double reference is ~2^11 times more accurate than that).
constexpr double kSumTol = 0x1p9 * kU64;

struct Naive {
  long double w1, w2, max_abs, mean_abs, rel_l2;
};
Naive naive_pair(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> sa(a), sb(b);
  std::sort(sa.begin(), sa.end());
  std::sort(sb.begin(), sb.end());
  long double s1 = 0, s2 = 0, mx = 0, ma = 0, sq = 0, nb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const long double d = static_cast<long double>(sa[i]) - sb[i];
    s1 += std::fabs(d);
    s2 += d * d;
    const long double e = static_cast<long double>(a[i]) - b[i];
    mx = std::max(mx, std::fabs(e));
    ma += std::fabs(e);
    sq += e * e;
    nb += static_cast<long double>(b[i]) * b[i];
  }
  const long double n = a.size();
  return {s1 / n, std::sqrt(s2 / n), mx, ma / n, std::sqrt(sq) / std::sqrt(nb)};
}

void expect_same_bits(const PairwiseMatrix& a, const PairwiseMatrix& b) {
  ASSERT_EQ(a.variants, b.variants);
  for (std::size_t i = 0; i < a.pairs.size(); ++i) {
    const PairMetrics &x = a.pairs[i], &y = b.pairs[i];
    EXPECT_EQ(std::memcmp(&x.w1, &y.w1, sizeof(double)), 0) << i << ": " << x.w1 << " vs " << y.w1;
    EXPECT_EQ(std::memcmp(&x.w2, &y.w2, sizeof(double)), 0) << i;
    EXPECT_EQ(std::memcmp(&x.max_abs, &y.max_abs, sizeof(double)), 0) << i;
    EXPECT_EQ(std::memcmp(&x.mean_abs, &y.mean_abs, sizeof(double)), 0) << i;
    EXPECT_EQ(std::memcmp(&x.rel_l2, &y.rel_l2, sizeof(double)), 0) << i;
    EXPECT_EQ(x.count, y.count);
    EXPECT_EQ(x.count_sorted, y.count_sorted);
  }
}

// Runs the pieces [cuts[k], cuts[k+1]) separately and combines them. naive_w1_sums (if given) gets,
// per pair, the fp64 sum of the pieces' rounded W1 sums: what a combination in doubles would give.
PairwiseMatrix split_run(const Data& d, const SortedSet<float>& set, const std::vector<std::size_t>& cuts,
                         bool reverse, std::vector<double>* naive_w1_sums = nullptr) {
  // cuts: 0 = c0 < c1 < ... < ck = n. Each piece is one "rank"; combine in forward or reverse order.
  std::vector<PairwisePartials> parts;
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
    PairwisePartials p(d.x.size());
    accumulate_sorted(set, cuts[k], cuts[k + 1], p);
    accumulate_elementwise(d.ptrs(), cuts[k], cuts[k + 1], p);
    parts.push_back(std::move(p));
  }
  if (reverse) std::reverse(parts.begin(), parts.end());
  if (naive_w1_sums) {
    naive_w1_sums->assign(parts.front().pair_count(), 0.0);
    for (const auto& p : parts)
      for (std::size_t k = 0; k < p.pair_count(); ++k)
        (*naive_w1_sums)[k] += exact_value(p.sums() + k * PairwisePartials::kPairSums);  // sorted |d|
  }
  PairwisePartials total(d.x.size());
  for (const auto& p : parts) total.combine(p);
  return total.finalize();
}

TEST(Pairwise, MatchesNaiveReferencePerPair) {
  const Data d = make_data(5, 10007, 1);
  const PairwiseMatrix m = pairwise_matrix(d.ptrs(), d.n);
  ASSERT_EQ(m.variants, 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(m.at(i, i).w1, 0.0);
    for (std::size_t j = 0; j < 5; ++j) {
      if (i == j) continue;
      const PairMetrics& p = m.at(i, j);
      const Naive r = naive_pair(d.x[i], d.x[j]);
      EXPECT_NEAR(p.w1, static_cast<double>(r.w1), kSumTol * r.w1) << i << "," << j;
      // sqrt halves the relative error of its argument and adds one rounding.
      EXPECT_NEAR(p.w2, static_cast<double>(r.w2), kSumTol * r.w2) << i << "," << j;
      EXPECT_EQ(p.max_abs, static_cast<double>(r.max_abs));  // a float difference is exact in fp64
      EXPECT_NEAR(p.mean_abs, static_cast<double>(r.mean_abs), kSumTol * r.mean_abs);
      // Two sums (each <= 2^9 u), two square roots and a division.
      EXPECT_NEAR(p.rel_l2, static_cast<double>(r.rel_l2), 2 * kSumTol * r.rel_l2);
      EXPECT_EQ(p.count, d.n);
      EXPECT_EQ(p.count_sorted, d.n);
      EXPECT_EQ(p.nonfinite + p.nonfinite_sorted, 0u);
      EXPECT_EQ(p.w1, m.at(j, i).w1);
    }
  }
}

TEST(Pairwise, AgreesBitForBitWithTheOneShotFunctions) {
  const Data d = make_data(3, 5000, 2);
  const PairwiseMatrix m = pairwise_matrix(d.ptrs(), d.n);
  EXPECT_EQ(m.at(0, 2).w1, wasserstein1(d.x[0], d.x[2]));
  EXPECT_EQ(m.at(1, 2).w2, wasserstein2(d.x[1], d.x[2]));
  const ElementwiseMetrics e = elementwise_metrics(d.x[2], d.x[1]);
  EXPECT_EQ(m.at(2, 1).max_abs, e.max_abs);
  EXPECT_EQ(m.at(2, 1).mean_abs, e.mean_abs);
  EXPECT_EQ(m.at(2, 1).rel_l2, e.rel_l2);
}

TEST(Pairwise, BlockAlignedSplitsAreBitIdentical) {
  const std::size_t n = 7 * kPairwiseBlock + 123;
  const Data d = make_data(6, n, 3, true);
  SortedSet<float> set;
  for (const auto& x : d.x) set.add(x);
  std::vector<double> whole_naive, naive;
  const PairwiseMatrix whole = split_run(d, set, {0, n}, false, &whole_naive);
  int naive_differs = 0;
  for (std::size_t parts : {2u, 3u, 4u, 9u}) {
    std::vector<std::size_t> cuts{0};
    for (std::size_t k = 0; k < parts; ++k) {
      const IndexRange r = block_aligned_part(n, parts, k);
      ASSERT_EQ(r.begin, cuts.back());
      cuts.push_back(r.end);
    }
    ASSERT_EQ(cuts.back(), n);
    for (bool reverse : {false, true}) {
      SCOPED_TRACE("parts " + std::to_string(parts) + (reverse ? " reversed" : ""));
      expect_same_bits(whole, split_run(d, set, cuts, reverse, &naive));
      for (std::size_t k = 0; k < naive.size(); ++k) naive_differs += naive[k] != whole_naive[k];
    }
  }
  // The data is hard enough: combining the pieces in fp64 would have changed some results.
  EXPECT_GT(naive_differs, 0);
}

TEST(Pairwise, ArbitrarySplitsAgreeToRoundingLevel) {
  const std::size_t n = 5 * kPairwiseBlock + 77;
  const Data d = make_data(4, n, 4);
  SortedSet<float> set;
  for (const auto& x : d.x) set.add(x);
  const PairwiseMatrix whole = split_run(d, set, {0, n}, false);
  const PairwiseMatrix cut = split_run(d, set, {0, 1, 1234, 5555, 5556, n}, true);
  // Both are within kSumTol of the exact sums (see MatchesNaiveReferencePerPair), so of each other
  // within 2 kSumTol.
  for (std::size_t i = 0; i < whole.pairs.size(); ++i) {
    EXPECT_NEAR(cut.pairs[i].w1, whole.pairs[i].w1, 2 * kSumTol * whole.pairs[i].w1);
    EXPECT_NEAR(cut.pairs[i].mean_abs, whole.pairs[i].mean_abs, 2 * kSumTol * whole.pairs[i].mean_abs);
    EXPECT_EQ(cut.pairs[i].max_abs, whole.pairs[i].max_abs);
    EXPECT_EQ(cut.pairs[i].count, whole.pairs[i].count);
  }
}

TEST(Pairwise, RawBufferReductionIsWhatMpiDoes) {
  // What MPI_Allreduce(MPI_SUM on sums, MPI_MAX on maxima) does, on raw buffers, without normalizing:
  // finalize() must accept it and give the same bits as combine().
  const std::size_t n = 3 * kPairwiseBlock + 5;
  const Data d = make_data(4, n, 5);
  SortedSet<float> set;
  for (const auto& x : d.x) set.add(x);
  std::vector<PairwisePartials> ranks;
  for (std::size_t r = 0; r < 3; ++r) {
    const IndexRange range = block_aligned_part(n, 3, r);
    PairwisePartials p(4);
    accumulate_sorted(set, range.begin, range.end, p);
    accumulate_elementwise(d.ptrs(), range.begin, range.end, p);
    ranks.push_back(std::move(p));
  }
  PairwisePartials reduced(4), combined(4);
  reduced.set_has_w2(true);
  for (const auto& p : ranks) {
    for (std::size_t k = 0; k < p.sums_size(); ++k) reduced.sums()[k] += p.sums()[k];
    for (std::size_t k = 0; k < p.maxima_size(); ++k)
      reduced.maxima()[k] = std::max(reduced.maxima()[k], p.maxima()[k]);
    combined.combine(p);
  }
  expect_same_bits(combined.finalize(), reduced.finalize());
  expect_same_bits(pairwise_matrix(d.ptrs(), n), reduced.finalize());
}

TEST(Pairwise, NonFiniteValuesAreReported) {
  const std::size_t n = 3000;
  Data d = make_data(3, n, 6);
  d.x[1][17] = std::numeric_limits<float>::quiet_NaN();
  d.x[1][2500] = -std::numeric_limits<float>::infinity();
  const PairwiseMatrix m = pairwise_matrix(d.ptrs(), n);
  // Pairs with variant 1: W1 undefined (NaN) and the offending sorted positions counted (the NaN sorts
  // to the top end, -inf to the bottom end: 2 positions).
  for (std::size_t j : {0u, 2u}) {
    const PairMetrics& p = m.at(1, j);
    EXPECT_TRUE(std::isnan(p.w1));
    EXPECT_TRUE(std::isnan(p.w2));
    EXPECT_EQ(p.nonfinite_sorted, 2u);
    EXPECT_EQ(p.nonfinite, 2u);
    EXPECT_EQ(p.count, n - 2);
    // The elementwise metrics are those of the finite indices only.
    std::vector<float> a, b;
    for (std::size_t k = 0; k < n; ++k)
      if (k != 17 && k != 2500) {
        a.push_back(d.x[1][k]);
        b.push_back(d.x[j][k]);
      }
    const ElementwiseMetrics e = elementwise_metrics(a, b);
    EXPECT_EQ(p.max_abs, e.max_abs);
    EXPECT_NEAR(p.mean_abs, e.mean_abs, 2 * kSumTol * e.mean_abs);
  }
  // The pair without it is untouched.
  EXPECT_FALSE(std::isnan(m.at(0, 2).w1));
  EXPECT_EQ(m.at(0, 2).nonfinite + m.at(0, 2).nonfinite_sorted, 0u);
}

TEST(Pairwise, DoubleStorageAndW1Only) {
  const Data f = make_data(3, 4000, 7);
  std::vector<std::vector<double>> x;
  std::vector<const double*> ptrs;
  for (const auto& v : f.x) x.emplace_back(v.begin(), v.end());
  for (const auto& v : x) ptrs.push_back(v.data());
  // Same values stored as float or double: identical results (the kernels widen to fp64 first).
  expect_same_bits(pairwise_matrix(f.ptrs(), f.n), pairwise_matrix(ptrs, f.n));
  SortedSet<double> set;
  for (const auto& v : x) set.add(v);
  PairwisePartials p(3);
  accumulate_sorted(set, 0, f.n, p, SortedMetrics::w1);
  const PairwiseMatrix m = p.finalize();
  EXPECT_EQ(m.at(0, 1).w1, wasserstein1(x[0], x[1]));
  EXPECT_TRUE(std::isnan(m.at(0, 1).w2));
  EXPECT_TRUE(std::isnan(m.at(0, 1).mean_abs));  // no elementwise pass: no elementwise counts
}

TEST(Pairwise, W2OnlyWhenEveryPieceHadIt) {
  const Data d = make_data(3, 3 * kPairwiseBlock, 8);
  SortedSet<float> set;
  for (const auto& x : d.x) set.add(x);
  PairwisePartials a(3), b(3), total(3);
  accumulate_sorted(set, 0, kPairwiseBlock, a, SortedMetrics::w1_w2);
  accumulate_sorted(set, kPairwiseBlock, d.n, b, SortedMetrics::w1);
  total.combine(a);
  EXPECT_TRUE(total.has_w2());
  EXPECT_FALSE(std::isnan(total.finalize().at(0, 1).w2));
  total.combine(b);
  EXPECT_FALSE(total.has_w2());
  EXPECT_TRUE(std::isnan(total.finalize().at(0, 1).w2));
  EXPECT_EQ(total.finalize().at(0, 1).w1, pairwise_matrix(d.ptrs(), d.n).at(0, 1).w1);
}

TEST(Pairwise, WindowsOfTheSortedArraysGiveTheSameBits) {
  // Each "rank" keeps only its block-aligned window of every variant's sorted array.
  const std::size_t n = 6 * kPairwiseBlock + 999;
  const Data d = make_data(4, n, 9, true);
  SortedSet<float> full;
  for (const auto& x : d.x) full.add(x);
  PairwisePartials total(4);
  for (std::size_t r = 0; r < 3; ++r) {
    const IndexRange w = block_aligned_part(n, 3, r);
    SortedSet<float> part;
    for (std::size_t v = 0; v < 4; ++v)
      part.add_sorted_window(std::vector<float>(full.window(v) + w.begin, full.window(v) + w.end), w.begin, n);
    EXPECT_EQ(part.size(), n);
    EXPECT_EQ(part.window_begin(), w.begin);
    PairwisePartials p(4);
    accumulate_sorted(part, w.begin, w.end, p);
    if (r == 1) {
      EXPECT_THROW(accumulate_sorted(part, 0, w.end, p), DistanceError);
    }
    total.combine(p);
  }
  PairwisePartials whole(4);
  accumulate_sorted(full, 0, n, whole);
  expect_same_bits(whole.finalize(), total.finalize());
  // Views of the same windows (no copy) give the same bits and are checked the same way.
  for (std::size_t part = 0; part < 3; ++part) {
    const IndexRange w = block_aligned_part(n, 3, part);
    std::vector<std::vector<float>> sorted;
    SortedSet<float> viewed;
    for (std::size_t v = 0; v < 4; ++v) sorted.push_back(std::vector<float>(full.window(v) + w.begin, full.window(v) + w.end));
    for (const auto& s : sorted) viewed.add_sorted_view(s.data(), s.size(), w.begin, n);
    PairwisePartials a(4), b(4);
    accumulate_sorted(viewed, w.begin, w.end, a);
    SortedSet<float> copied;
    for (const auto& s : sorted) copied.add_sorted_window(s, w.begin, n);
    accumulate_sorted(copied, w.begin, w.end, b);
    expect_same_bits(a.finalize(), b.finalize());
  }
  const std::vector<float> unsorted{1, 3, 2};
  SortedSet<float> bad_view;
  EXPECT_THROW(bad_view.add_sorted_view(unsorted.data(), 3, 0, 3), DistanceError);
  SortedSet<float> bad;
  bad.add_sorted_window({1, 2}, 0, 10);
  EXPECT_THROW(bad.add_sorted_window({1, 2}, 2, 10), DistanceError);
  EXPECT_THROW(bad.add_sorted_window({1, 2, 3}, 0, 10), DistanceError);
  EXPECT_THROW(bad.add_sorted_window({1, 2}, 9, 10), DistanceError);
}

TEST(Pairwise, WholeModelFromPerTensorElementwisePartials) {
  // Two tensors per variant; the whole model is their concatenation (tensor 0 first).
  const Data t0 = make_data(3, 3000, 10), t1 = make_data(3, 5000, 11);
  Data all{8000, {}};
  for (std::size_t v = 0; v < 3; ++v) {
    std::vector<float> x(t0.x[v]);
    x.insert(x.end(), t1.x[v].begin(), t1.x[v].end());
    all.x.push_back(std::move(x));
  }
  PairwisePartials whole(3), p0(3), p1(3);
  accumulate_elementwise(t0.ptrs(), 0, t0.n, p0);
  accumulate_elementwise(t1.ptrs(), 0, t1.n, p1);
  whole.combine_elementwise(p0);
  whole.combine_elementwise(p1);
  SortedSet<float> set;
  for (const auto& x : all.x) set.add(x);
  accumulate_sorted(set, 0, all.n, whole);
  const PairwiseMatrix got = whole.finalize(), want = pairwise_matrix(all.ptrs(), all.n);
  for (std::size_t k = 0; k < got.pairs.size(); ++k) {
    EXPECT_EQ(got.pairs[k].w1, want.pairs[k].w1);  // the same sorted pass
    EXPECT_EQ(got.pairs[k].max_abs, want.pairs[k].max_abs);
    EXPECT_EQ(got.pairs[k].count, want.pairs[k].count);
    // Blocks start at each tensor's start instead of the concatenation's: rounding level.
    EXPECT_NEAR(got.pairs[k].mean_abs, want.pairs[k].mean_abs, 2 * kSumTol * want.pairs[k].mean_abs);
    EXPECT_NEAR(got.pairs[k].rel_l2, want.pairs[k].rel_l2, 4 * kSumTol * want.pairs[k].rel_l2);
  }
}

// Pairs on demand: partials of a pair list give each listed pair the bits it has among all pairs (its
// sums depend on its two variants only), NaN for the others; a bad list is refused.
TEST(Pairwise, APairListGivesThoseEntriesOfAllPairs) {
  const Data d = make_data(5, 3 * kPairwiseBlock + 41, 5);
  const std::vector<VariantPair> some{{3, 4}, {0, 2}};  // any order: kept sorted
  SortedSet<float> set;
  for (const float* v : d.ptrs()) set.add(ArrayView<float>(v, d.n));
  PairwisePartials all(5), listed(5, some);
  for (PairwisePartials* p : {&all, &listed}) {
    accumulate_sorted(set, 0, d.n, *p);
    accumulate_elementwise(d.ptrs(), 0, d.n, *p);
  }
  EXPECT_EQ(listed.pair_count(), 2u);
  EXPECT_EQ(listed.pairs(), (std::vector<VariantPair>{{0, 2}, {3, 4}}));
  const PairwiseMatrix a = all.finalize(), s = listed.finalize();
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t j = 0; j < 5; ++j) {
      const bool in = (i == 0 && j == 2) || (i == 2 && j == 0) || (i == 3 && j == 4) || (i == 4 && j == 3);
      if (in) {
        expect_same_bits(PairwiseMatrix{1, {s.at(i, j)}}, PairwiseMatrix{1, {a.at(i, j)}});
      } else if (i != j) {
        EXPECT_TRUE(std::isnan(s.at(i, j).w1) && std::isnan(s.at(i, j).max_abs) && std::isnan(s.at(i, j).rel_l2)) << i << j;
        EXPECT_EQ(s.at(i, j).count, 0u);
      }
    }
  for (const std::vector<VariantPair>& bad : {std::vector<VariantPair>{{1, 1}}, std::vector<VariantPair>{{2, 1}},
                                               std::vector<VariantPair>{{0, 5}}, std::vector<VariantPair>{{0, 1}, {0, 1}}})
    EXPECT_THROW(PairwisePartials(5, bad), DistanceError);
  PairwisePartials other(5, {{0, 1}});
  EXPECT_THROW(listed.combine(other), DistanceError);
}

// Every row of kPairMetrics (base/pair_metrics.hpp) names a value the engine fills, which the reduce
// writes by the row alone: positive and finite for two different variants, NaN for a pair the partials
// did not list.
TEST(Pairwise, EveryMetricRowIsAValueTheEngineFills) {
  const Data d = make_data(3, kPairwiseBlock + 7, 6);
  SortedSet<float> set;
  for (const float* v : d.ptrs()) set.add(ArrayView<float>(v, d.n));
  PairwisePartials listed(3, {{0, 1}});
  accumulate_sorted(set, 0, d.n, listed);
  accumulate_elementwise(d.ptrs(), 0, d.n, listed);
  const PairwiseMatrix m = listed.finalize();
  for (const PairMetric& metric : kPairMetrics) {
    EXPECT_GT(m.at(0, 1).*metric.value, 0.0) << metric.name;
    EXPECT_TRUE(std::isfinite(m.at(1, 0).*metric.value)) << metric.name;
    EXPECT_TRUE(std::isnan(m.at(0, 2).*metric.value)) << metric.name;
    EXPECT_EQ(m.at(1, 1).*metric.value, 0.0) << metric.name;
    EXPECT_EQ(pair_metric_index(metric.name), static_cast<std::size_t>(&metric - kPairMetrics));
  }
  EXPECT_EQ(pair_metric_index("w3"), kPairMetricCount);
  EXPECT_EQ(m.at(0, 1).w1, m.at(0, 1).*kPairMetrics[pair_metric_index("w1")].value);
}

TEST(Pairwise, InputChecks) {
  SortedSet<float> set;
  set.add(std::vector<float>{1, 2, 3});
  EXPECT_THROW(set.add(std::vector<float>{1, 2}), DistanceError);
  EXPECT_THROW(set.add_sorted({3, 2, 1}), DistanceError);
  PairwisePartials wrong(2);
  EXPECT_THROW(accumulate_sorted(set, 0, 3, wrong), DistanceError);
  PairwisePartials p(1);
  EXPECT_THROW(accumulate_sorted(set, 0, 4, p), DistanceError);
  EXPECT_EQ(p.pair_count(), 0u);
  EXPECT_EQ(p.finalize().pairs.size(), 1u);
  EXPECT_EQ(block_aligned_part(10, 4, 3).end, 10u);
}

}  // namespace
}  // namespace fastudy
