// The distribution recipe of analysis/distance.hpp under mpirun (1, 2, 4 ranks): each rank accumulates
// its block-aligned part of [0, n), the partials are combined by MPI_Allreduce (MPI_SUM on the int64
// sums, MPI_MAX on the maxima), and the finalized V x V matrices must be bit-identical to the matrices
// one process computes alone. A split at arbitrary cut points must agree to rounding level.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "analysis/distance.hpp"
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
