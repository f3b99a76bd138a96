// The distribution recipe of analysis/distance.hpp under mpirun (1, 2, 4 ranks): each rank accumulates
// its block-aligned part of [0, n), the partials are combined by MPI_Allreduce (MPI_SUM on the int64
// sums, MPI_MAX on the maxima), and the finalized V x V matrices must be bit-identical to the matrices
// one process computes alone. A split at arbitrary cut points must agree to rounding level. The reduce
// job's distributed sort (analysis/sorted_exchange.hpp) must leave every rank exactly its window of
// every variant's sorted values, for smooth values, heavy ties, a single value and non-finite ones,
// in one all-to-all or in many pieces, and the sums over those windows must be one process's, bit for
// bit; a subset of the pairs gives those pairs' bits.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "analysis/distance.hpp"
#include "analysis/sorted_exchange.hpp"
#include "analysis/value_buffer.hpp"
#include "src/runtime/mpi.hpp"
#include "tests/analysis/pairwise_data.hpp"

namespace fastudy {
namespace {

constexpr double kU64 = 0x1p-53;  // fp64 unit roundoff
// Each side is within 2^9 u of the exact sums (derivation in test_pairwise.cpp): 2^10 u apart at most.
constexpr double kSplitTol = 0x1p10 * kU64;

using test::Data;

// The same data on every rank (fixed seed): a shared base plus a drift per variant.
Data make_data(std::size_t V, std::size_t n) { return test::make_data(V, n, 77); }

// What a rank of the reduce job does: sort (here every variant; the job shares the sorting and
// exchanges windows), keep only its window of the sorted arrays and its slice of the unsorted ones,
// accumulate, reduce.
PairwiseMatrix distributed(const Data& d, std::size_t begin, std::size_t end) {
  SortedSet<float> set;
  std::vector<std::vector<float>> slices;
  std::vector<const float*> slice_ptrs;
  for (const auto& x : d.x) {
    std::vector<float> sorted(x);
    radix_sort(sorted.data(), sorted.size());
    set.add_sorted_window(std::vector<float>(sorted.begin() + static_cast<std::ptrdiff_t>(begin),
                                             sorted.begin() + static_cast<std::ptrdiff_t>(end)),
                          begin, d.n);
    slices.emplace_back(x.begin() + static_cast<std::ptrdiff_t>(begin), x.begin() + static_cast<std::ptrdiff_t>(end));
    slice_ptrs.push_back(slices.back().data());
  }
  PairwisePartials p(d.x.size());
  accumulate_sorted(set, begin, end, p);
  accumulate_elementwise(slice_ptrs, begin, end, p, begin);
  MPI_Allreduce(MPI_IN_PLACE, p.sums(), static_cast<int>(p.sums_size()), MPI_INT64_T, MPI_SUM,
                MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, p.maxima(), static_cast<int>(p.maxima_size()), MPI_DOUBLE, MPI_MAX,
                MPI_COMM_WORLD);
  return p.finalize();
}

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size_of() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

TEST(PairwiseMpi, BlockAlignedSplitIsBitIdenticalToOneProcess) {
  const std::size_t n = 11 * kPairwiseBlock + 333;
  const Data d = make_data(5, n);
  const IndexRange r = block_aligned_part(n, static_cast<std::size_t>(size_of()),
                                          static_cast<std::size_t>(rank_of()));
  const PairwiseMatrix got = distributed(d, r.begin, r.end);
  const PairwiseMatrix want = pairwise_matrix(d.ptrs(), n);
  ASSERT_EQ(got.pairs.size(), want.pairs.size());
  for (std::size_t k = 0; k < got.pairs.size(); ++k) {
    const PairMetrics &a = got.pairs[k], &b = want.pairs[k];
    EXPECT_EQ(std::memcmp(&a.w1, &b.w1, sizeof(double)), 0) << k;
    EXPECT_EQ(std::memcmp(&a.w2, &b.w2, sizeof(double)), 0) << k;
    EXPECT_EQ(std::memcmp(&a.mean_abs, &b.mean_abs, sizeof(double)), 0) << k;
    EXPECT_EQ(std::memcmp(&a.rel_l2, &b.rel_l2, sizeof(double)), 0) << k;
    EXPECT_EQ(a.max_abs, b.max_abs) << k;
    if (k % (got.variants + 1) != 0) {  // off the diagonal
      EXPECT_EQ(a.count, n) << k;
    }
  }
}

TEST(PairwiseMpi, ArbitrarySplitAgreesToRoundingLevel) {
  const std::size_t n = 4 * kPairwiseBlock + 1001;
  const Data d = make_data(4, n);
  const std::size_t R = static_cast<std::size_t>(size_of()), me = static_cast<std::size_t>(rank_of());
  const std::size_t begin = n * me / R + (me > 0 ? 17 : 0);  // cut points off the block grid
  const std::size_t end = me + 1 == R ? n : n * (me + 1) / R + 17;
  const PairwiseMatrix got = distributed(d, begin, end);
  const PairwiseMatrix want = pairwise_matrix(d.ptrs(), n);
  for (std::size_t k = 0; k < got.pairs.size(); ++k) {
    EXPECT_NEAR(got.pairs[k].w1, want.pairs[k].w1, kSplitTol * want.pairs[k].w1) << k;
    EXPECT_NEAR(got.pairs[k].mean_abs, want.pairs[k].mean_abs, kSplitTol * want.pairs[k].mean_abs) << k;
    EXPECT_EQ(got.pairs[k].max_abs, want.pairs[k].max_abs) << k;
    EXPECT_EQ(got.pairs[k].count, want.pairs[k].count) << k;
  }
}

// Every metric of two matrices bit for bit (NaN equal to NaN), and every count.
void expect_bit_identical(const PairwiseMatrix& got, const PairwiseMatrix& want) {
  ASSERT_EQ(got.pairs.size(), want.pairs.size());
  for (std::size_t k = 0; k < got.pairs.size(); ++k) {
    const PairMetrics &a = got.pairs[k], &b = want.pairs[k];
    for (const auto field : {&PairMetrics::w1, &PairMetrics::w2, &PairMetrics::max_abs, &PairMetrics::mean_abs,
                             &PairMetrics::rel_l2})
      EXPECT_EQ(std::memcmp(&(a.*field), &(b.*field), sizeof(double)), 0) << k << ": " << a.*field << " vs " << b.*field;
    EXPECT_EQ(a.count_sorted, b.count_sorted) << k;
    EXPECT_EQ(a.count, b.count) << k;
    EXPECT_EQ(a.nonfinite, b.nonfinite) << k;
    EXPECT_EQ(a.nonfinite_sorted, b.nonfinite_sorted) << k;
  }
}

// ---- the distributed sort (sorted_exchange.hpp) ----------------------------------------------------

// V variants of n values of a kind that stresses the sample sort: smooth (a base plus drifts), heavy ties
// (five values repeated: bf16-like weights, LayerNorm gains), one value only, non-finite values
// (NaN, +-inf, -0 and +0), and a distribution with fewer blocks than ranks.
enum class Kind { smooth, ties, constant, nonfinite };

template <class T>
std::vector<std::vector<T>> make_values(Kind kind, std::size_t V, std::size_t n) {
  std::vector<std::vector<T>> x(V, std::vector<T>(n));
  const Data d = test::make_data(V, n, 91);
  const T few[5] = {T(-0.5), T(0), T(0), T(0.25), T(1)};
  for (std::size_t v = 0; v < V; ++v)
    for (std::size_t i = 0; i < n; ++i) {
      switch (kind) {
        case Kind::smooth: x[v][i] = static_cast<T>(d.x[v][i]); break;
        case Kind::ties: x[v][i] = few[(i * 7 + v * 3 + i / 13) % 5]; break;
        case Kind::constant: x[v][i] = T(1); break;
        case Kind::nonfinite: {
          const T special[6] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                                -std::numeric_limits<T>::infinity(), T(-0.0), T(0.0), -std::numeric_limits<T>::quiet_NaN()};
          x[v][i] = i % 97 == v ? special[(i / 97) % 6] : static_cast<T>(d.x[v][i]);
          break;
        }
      }
    }
  return x;
}

// Every variant sorted on one process: the reference of every window.
template <class T>
std::vector<std::vector<T>> sorted_copies(const std::vector<std::vector<T>>& x) {
  std::vector<std::vector<T>> s(x);
  for (auto& v : s) radix_sort(v.data(), v.size());
  return s;
}

// Rank r's window [w.begin, w.end) of every sorted variant, bit for bit.
template <class T>
void expect_windows(const std::vector<std::vector<T>>& sorted, IndexRange w, const T* got, std::size_t stride,
                    const std::string& what) {
  const std::size_t L = w.end - w.begin;
  for (std::size_t v = 0; v < sorted.size(); ++v) {
    const T* want = sorted[v].data() + w.begin;
    const T* have = got + v * stride;
    EXPECT_EQ(std::memcmp(want, have, L * sizeof(T)), 0) << what << ": variant " << v << ", window [" << w.begin << ", "
                                                         << w.end << ")";
  }
}

// Variant v's window of a buffer of V windows of L values each: buf[v L, (v+1) L).
template <class T>
std::vector<T*> variant_windows(ValueBuffer<T>& buf, std::size_t V, std::size_t L) {
  std::vector<T*> out;
  for (std::size_t v = 0; v < V; ++v) out.push_back(buf.data() + v * L);
  return out;
}

template <class T>
void check_sort_windows(Kind kind, std::size_t V, std::size_t n, std::size_t exchange_bytes) {
  mpi::Comm world = mpi::Comm::world();
  const auto x = make_values<T>(kind, V, n);
  const auto sorted = sorted_copies(x);
  const IndexRange w = block_aligned_part(n, static_cast<std::size_t>(world.size()), static_cast<std::size_t>(world.rank()));
  const std::size_t L = w.end - w.begin;
  ValueBuffer<T> buf;
  buf.assign_uninitialized(V * L);
  for (std::size_t v = 0; v < V; ++v) std::copy(x[v].begin() + w.begin, x[v].begin() + w.end, buf.data() + v * L);
  DistributedSort<T> sorter(world, exchange_bytes);
  ValueBuffer<T> again;
  again.append(buf.data(), buf.size());
  sorter.sort_windows(variant_windows(buf, V, L), n);
  ASSERT_EQ(buf.size(), V * L);
  expect_windows(sorted, w, buf.data(), L, "sort_windows");
  // The same into windows elsewhere (the reduce's: each variant's window at the end of its share).
  std::vector<std::vector<T>> shares(V, std::vector<T>(L + 3));
  std::vector<T*> windows;
  for (auto& s : shares) windows.push_back(s.data() + 3);
  sorter.sort_windows(variant_windows(again, V, L), n, windows);
  for (std::size_t v = 0; v < V; ++v)
    EXPECT_EQ(std::memcmp(sorted[v].data() + w.begin, windows[v], L * sizeof(T)), 0) << "sort_windows elsewhere, variant " << v;
}

// Shares of a model of tensors (`tensor_sizes`, summing to n): each rank's windows of the tensors of at
// least 4 blocks and, dealt by index, the smaller ones whole; with sorted_runs each piece sorted first.
template <class T>
void check_sort_shares(Kind kind, std::size_t V, const std::vector<std::size_t>& tensor_sizes, bool sorted_runs,
                       std::size_t exchange_bytes) {
  mpi::Comm world = mpi::Comm::world();
  const std::size_t R = static_cast<std::size_t>(world.size()), r = static_cast<std::size_t>(world.rank());
  std::size_t n = 0;
  for (auto t : tensor_sizes) n += t;
  const auto x = make_values<T>(kind, V, n);
  const auto sorted = sorted_copies(x);
  std::vector<ValueBuffer<T>> shares(V);
  std::vector<std::size_t> runs;
  std::size_t at = 0;
  for (std::size_t t = 0; t < tensor_sizes.size(); ++t) {
    const std::size_t size = tensor_sizes[t];
    IndexRange piece{0, 0};
    if (size >= 4 * kPairwiseBlock) piece = block_aligned_part(size, R, r);
    else if (t % R == r) piece = {0, size};
    for (std::size_t v = 0; v < V; ++v) {
      std::vector<T> part(x[v].begin() + at + piece.begin, x[v].begin() + at + piece.end);
      if (sorted_runs) radix_sort(part.data(), part.size());
      shares[v].append(part.data(), part.size());
    }
    if (piece.end > piece.begin) runs.push_back(piece.end - piece.begin);  // as reduce lists its tasks
    at += size;
  }
  DistributedSort<T> sorter(world, exchange_bytes);
  sorter.sort_shares(shares, n, sorted_runs ? runs : std::vector<std::size_t>{});
  const IndexRange w = block_aligned_part(n, R, r);
  for (std::size_t v = 0; v < V; ++v) {
    ASSERT_EQ(shares[v].size(), w.end - w.begin);
    expect_windows(std::vector<std::vector<T>>{sorted[v]}, w, shares[v].data(), 0,
                   std::string("sort_shares, variant ") + std::to_string(v));
  }
  // The sorted sums over the windows, combined over the ranks: those of one process, bit for bit.
  SortedSet<T> set;
  for (std::size_t v = 0; v < V; ++v) set.add_sorted_view(shares[v].data(), w.end - w.begin, w.begin, n);
  PairwisePartials p(V);
  accumulate_sorted(set, w.begin, w.end, p);
  allreduce_partials(world, p);
  p.set_has_w2(true);
  SortedSet<T> whole;
  for (std::size_t v = 0; v < V; ++v) whole.add_sorted_view(sorted[v].data(), n, 0, n);
  PairwisePartials want(V);
  accumulate_sorted(whole, 0, n, want);
  expect_bit_identical(p.finalize(), want.finalize());
}

const std::size_t kWhole = std::size_t{1} << 30;  // the default exchange size: one all-to-all
const std::size_t kPieces = 4096;                 // bytes: every exchange goes in many pieces

TEST(DistributedSort, WindowsAreExactlyTheSortedPositionsOfOneProcess) {
  for (Kind kind : {Kind::smooth, Kind::ties, Kind::constant, Kind::nonfinite}) {
    SCOPED_TRACE(static_cast<int>(kind));
    check_sort_windows<float>(kind, 5, 9 * kPairwiseBlock + 777, kWhole);
    check_sort_windows<double>(kind, 3, 5 * kPairwiseBlock + 1, kWhole);
  }
  check_sort_windows<float>(Kind::smooth, 5, 9 * kPairwiseBlock + 777, kPieces);
  check_sort_windows<float>(Kind::smooth, 2, kPairwiseBlock + 3, kWhole);  // fewer blocks than 4 ranks
  // Windows of 32,768 values or more on 1, 2 and 4 ranks: the partition finds most keys' ranks by their
  // top bits in a table, and searches the splitters only for keys whose top bits hold one (ties too).
  for (Kind kind : {Kind::smooth, Kind::ties, Kind::nonfinite}) {
    SCOPED_TRACE(static_cast<int>(kind));
    check_sort_windows<float>(kind, 2, 70 * kPairwiseBlock + 777, kWhole);
    check_sort_windows<double>(kind, 1, 70 * kPairwiseBlock + 1, kWhole);
  }
}

TEST(DistributedSort, SharesBecomeTheSortedWindowsAndGiveTheSumsOfOneProcess) {
  const std::vector<std::size_t> tensors{7 * kPairwiseBlock + 5, 100, 4 * kPairwiseBlock, 3, 2 * kPairwiseBlock + 9, 1};
  for (Kind kind : {Kind::smooth, Kind::ties, Kind::constant, Kind::nonfinite})
    for (bool runs : {true, false}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(kind)) + (runs ? " sorted runs" : " unsorted"));
      check_sort_shares<float>(kind, 5, tensors, runs, kWhole);
      check_sort_shares<double>(kind, 3, tensors, runs, kWhole);
    }
  check_sort_shares<float>(Kind::ties, 4, tensors, true, kPieces);
  check_sort_shares<float>(Kind::smooth, 4, tensors, false, kPieces);
  // Fewer tensors than ranks: a rank with an empty share (no runs) takes the sorted runs' path with the
  // others.
  check_sort_shares<float>(Kind::smooth, 3, {100, 3}, true, kWhole);
  check_sort_shares<float>(Kind::ties, 3, {1, 2 * kPairwiseBlock + 9}, true, kPieces);
}

// A value repeated far more often than a window holds is spread over the ranks, not sent to one.
TEST(DistributedSort, ARepeatedValueDoesNotOverloadOneRank) {
  mpi::Comm world = mpi::Comm::world();
  if (world.size() < 2) GTEST_SKIP() << "one rank holds everything";
  check_sort_windows<float>(Kind::constant, 2, 16 * kPairwiseBlock, kWhole);
  DistributedSort<float> sorter(world);
  const std::size_t n = 16 * kPairwiseBlock;
  const IndexRange w = block_aligned_part(n, static_cast<std::size_t>(world.size()), static_cast<std::size_t>(world.rank()));
  ValueBuffer<float> buf;
  buf.assign_uninitialized(2 * (w.end - w.begin));
  std::fill(buf.data(), buf.data() + buf.size(), 1.0f);
  sorter.sort_windows(variant_windows(buf, 2, w.end - w.begin), n);
  // Round robin over the ranks that the repeated splitter bounds: within a value or two of the window.
  EXPECT_LT(sorter.traffic().largest_excess, 0.01);
}

// Partials of a subset of the pairs: each listed pair's numbers are the bits it has among all pairs.
TEST(DistributedSort, ASubsetOfPairsGivesThoseEntriesOfAllPairs) {
  mpi::Comm world = mpi::Comm::world();
  const std::size_t V = 6, n = 5 * kPairwiseBlock + 11;
  const auto x = make_values<float>(Kind::smooth, V, n);
  const IndexRange w = block_aligned_part(n, static_cast<std::size_t>(world.size()), static_cast<std::size_t>(world.rank()));
  ValueBuffer<float> buf;
  buf.assign_uninitialized(V * (w.end - w.begin));
  for (std::size_t v = 0; v < V; ++v) std::copy(x[v].begin() + w.begin, x[v].begin() + w.end, buf.data() + v * (w.end - w.begin));
  std::vector<const float*> unsorted;
  for (std::size_t v = 0; v < V; ++v) unsorted.push_back(buf.data() + v * (w.end - w.begin));
  const std::vector<VariantPair> some{{0, 3}, {1, 2}, {4, 5}};
  PairwisePartials all(V), subset(V, some);
  accumulate_elementwise(unsorted, w.begin, w.end, all, w.begin);
  accumulate_elementwise(unsorted, w.begin, w.end, subset, w.begin);
  DistributedSort<float> sorter(world);
  sorter.sort_windows(variant_windows(buf, V, w.end - w.begin), n);
  SortedSet<float> set;
  for (std::size_t v = 0; v < V; ++v) set.add_sorted_view(buf.data() + v * (w.end - w.begin), w.end - w.begin, w.begin, n);
  accumulate_sorted(set, w.begin, w.end, all);
  accumulate_sorted(set, w.begin, w.end, subset);
  allreduce_partials(world, all);
  allreduce_partials(world, subset);
  const PairwiseMatrix a = all.finalize(), s = subset.finalize();
  for (std::size_t i = 0; i < V; ++i)
    for (std::size_t j = 0; j < V; ++j) {
      if (i == j) continue;
      const bool listed = std::find(some.begin(), some.end(), VariantPair{std::min(i, j), std::max(i, j)}) != some.end();
      if (listed) {
        expect_bit_identical(PairwiseMatrix{1, {s.at(i, j)}}, PairwiseMatrix{1, {a.at(i, j)}});
      } else {
        EXPECT_TRUE(std::isnan(s.at(i, j).w1) && std::isnan(s.at(i, j).max_abs)) << i << "," << j;
      }
    }
}

}  // namespace
}  // namespace fastudy

int main(int argc, char** argv) {
  fastudy::mpi::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one report: the other ranks still run every test and its collectives
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return failed;  // the session finalises MPI
}
