// The distribution recipe of analysis/distance.hpp under mpirun (1, 2, 4 ranks): each rank accumulates
// its block-aligned part of [0, n), the partials are combined by MPI_Allreduce (MPI_SUM on the int64
// sums, MPI_MAX on the maxima), and the finalized V x V matrices must be bit-identical to the matrices
// one process computes alone. A split at arbitrary cut points must agree to rounding level. The reduce
// job's split tasks (analysis/sorted_exchange.hpp), through node-shared memory and through
// MPI_Alltoallv, must give the partials of one process bit for bit.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "analysis/distance.hpp"
#include "analysis/sorted_exchange.hpp"
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

// Split tasks of 5 variants (not a multiple of 2 or 4 ranks) in T, two sizes (the shared window grows
// for the second), with and without the elementwise sums: combined over the ranks, the same partials
// as local_partials on one process, and (elementwise) as the engine's own pairwise_matrix.
template <class T>
void check_split_tasks(bool shared_memory) {
  if (shared_memory) unsetenv("FASTUDY_REDUCE_SHARED");
  else setenv("FASTUDY_REDUCE_SHARED", "0", 1);
  mpi::Comm world = mpi::Comm::world();
  const std::size_t V = 5;
  const Data small = make_data(V, 3 * kPairwiseBlock + 5), large = make_data(V, 9 * kPairwiseBlock + 777);
  SortedExchange exchange(world, V, large.n);
  if (!shared_memory || world.size() == 1) {
    EXPECT_FALSE(exchange.shared());
  }
  for (const Data* d : {&small, &large}) {
    std::vector<std::vector<T>> x;
    for (const auto& v : d->x) x.emplace_back(v.begin(), v.end());
    const VariantValues<T> values = [&x](std::size_t v, std::size_t begin, std::size_t end, T* dst) {
      std::copy(x[v].begin() + static_cast<std::ptrdiff_t>(begin), x[v].begin() + static_cast<std::ptrdiff_t>(end), dst);
    };
    for (bool elementwise : {true, false}) {
      SCOPED_TRACE("n = " + std::to_string(d->n) + (elementwise ? ", elementwise" : ", sorted only"));
      PairwisePartials split = exchange.split_partials<T>(world, V, d->n, values, elementwise);
      allreduce_partials(world, split);
      split.set_has_w2(true);
      const PairwisePartials local = local_partials<T>(V, d->n, values, elementwise);
      expect_bit_identical(split.finalize(), local.finalize());
      if (elementwise) {
        std::vector<const T*> ptrs;
        for (const auto& v : x) ptrs.push_back(v.data());
        expect_bit_identical(local.finalize(), pairwise_matrix(ptrs, d->n));
      }
    }
  }
}

TEST(SortedExchange, SplitTasksThroughSharedMemoryAreBitIdenticalToOneProcess) {
  check_split_tasks<float>(true);
  check_split_tasks<double>(true);
}

TEST(SortedExchange, SplitTasksThroughAlltoallvAreBitIdenticalToOneProcess) {
  check_split_tasks<float>(false);
  check_split_tasks<double>(false);
  unsetenv("FASTUDY_REDUCE_SHARED");
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
