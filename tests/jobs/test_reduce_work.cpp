// The reduce's schedule (jobs/reduce_work.hpp schedule_reduce): tensors dealt whole while every rank's
// values stay within kDealBalance of the mean, the largest split over all ranks only as far as the
// balance needs, and none below kSplitElements. And the cost model's step (estimate_reduce): the
// reader thread's reads beside the work as jobs/reduce.cpp's TaskReader does them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "jobs/reduce_work.hpp"

namespace fastudy {
namespace {

// GPT-2 small's tensor sizes (124.4M parameters; the token embedding 38.6M of them).
std::vector<std::int64_t> gpt2_sizes() {
  const std::int64_t d = 768, vocab = 50257, ctx = 1024;
  std::vector<std::int64_t> s{vocab * d, ctx * d};
  for (int layer = 0; layer < 12; ++layer)
    for (std::int64_t n : {d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d}) s.push_back(n);
  s.push_back(d);
  s.push_back(d);
  return s;
}

// Every rank's values (its dealt tensors whole, its window of the split ones) over the mean.
double imbalance(const ReduceSchedule& s, const std::vector<std::int64_t>& sizes, int ranks) {
  double total = 0, most = 0;
  for (auto n : sizes) total += static_cast<double>(n);
  for (int q = 0; q < ranks; ++q) most = std::max(most, static_cast<double>(s.share(static_cast<std::size_t>(q), sizes, ranks)));
  return most / (total / ranks);
}

std::size_t split_count(const ReduceSchedule& s) { return static_cast<std::size_t>(std::count(s.split.begin(), s.split.end(), 1)); }

TEST(ReduceSchedule, OneRankDealsEverything) {
  const auto sizes = gpt2_sizes();
  const ReduceSchedule s = schedule_reduce(sizes, 1);
  EXPECT_EQ(split_count(s), 0u);
  for (int o : s.owner) EXPECT_EQ(o, 0);
}

TEST(ReduceSchedule, DealsWholeWhileTheRanksStayBalanced) {
  const auto sizes = gpt2_sizes();
  // Two ranks: the embedding (31% of the model) fits one rank's half; nothing needs splitting.
  const ReduceSchedule two = schedule_reduce(sizes, 2);
  EXPECT_EQ(split_count(two), 0u);
  EXPECT_LE(imbalance(two, sizes, 2), 1.0 + kDealBalance);
  // Four ranks: the embedding is larger than a rank's quarter and is split; the rest is dealt.
  const ReduceSchedule four = schedule_reduce(sizes, 4);
  EXPECT_EQ(split_count(four), 1u);
  EXPECT_EQ(four.split[0], 1);
  EXPECT_LE(imbalance(four, sizes, 4), 1.0 + kDealBalance);
  // The split tensors come first in the order, then the dealt ones, largest first.
  EXPECT_EQ(four.order.front(), 0u);
  for (std::size_t i = 2; i < four.order.size(); ++i) EXPECT_GE(sizes[four.order[i - 1]], sizes[four.order[i]]);
}

TEST(ReduceSchedule, SplitsTheFewestLargestTensorsTheBalanceNeeds) {
  // Three equal tensors on two ranks cannot be dealt within 3% (2:1); splitting one can (1.5:1.5).
  const std::vector<std::int64_t> three(3, 1 << 20);
  const ReduceSchedule s = schedule_reduce(three, 2);
  EXPECT_EQ(split_count(s), 1u);
  EXPECT_LE(imbalance(s, three, 2), 1.0 + kDealBalance);
  // Below kSplitElements a tensor is never split, balanced or not.
  const std::vector<std::int64_t> small(3, static_cast<std::int64_t>(kSplitElements) - 1);
  const ReduceSchedule t = schedule_reduce(small, 2);
  EXPECT_EQ(split_count(t), 0u);
  // Many ranks for one large tensor: it is split.
  const ReduceSchedule one = schedule_reduce({1 << 22, 10, 10}, 8);
  EXPECT_EQ(one.split[0], 1);
  EXPECT_EQ(one.split[1], 0);
}

// Two tensors (3000 and 1000 values) of two runs on one rank, per tensor only: read k takes
// r_k = 2 L_k 4 read_byte, task k's work w_k = 2 L_k sort_value. With the reader on a core of its own
// the first read has nothing beside it and the next read runs beside the first task's work; without
// it, reads and work add up.
TEST(ReduceEstimate, ReadsRunBesideTheWorkButTheFirst) {
  ReduceShape shape;
  shape.runs = 2, shape.steps = 3, shape.sizes = {1000, 3000}, shape.pairs = 1;
  shape.whole_model = false, shape.elementwise = false;
  ReduceRates rates;
  rates.sort_value = 1e-5;
  // Exact up to a few roundings of doubles (unit roundoff 1.1e-16): a relative 1e-12 is ample.
  const auto near = [](double got, double want) { EXPECT_NEAR(got, want, 1e-12 * want); };
  {  // the work the longer: r_0 + w_0 + w_1 (the second read hidden behind w_0)
    rates.read_byte = 1e-6;
    const double r0 = 2 * 3000 * 4e-6, r1 = 2 * 1000 * 4e-6, w0 = 2 * 3000 * 1e-5, w1 = 2 * 1000 * 1e-5;
    const ReduceEstimate beside = estimate_reduce(shape, 1, 2, rates);
    near(beside.step_seconds, r0 + w0 + w1);
    near(beside.seconds, 3 * (r0 + w0 + w1));
    near(estimate_reduce(shape, 1, 1, rates).step_seconds, r0 + r1 + w0 + w1);
  }
  {  // the reads the longer: r_0 + r_1 + w_1 (the first task's work hidden behind the second read)
    rates.read_byte = 1e-4;
    const double r0 = 2 * 3000 * 4e-4, r1 = 2 * 1000 * 4e-4, w1 = 2 * 1000 * 1e-5;
    near(estimate_reduce(shape, 1, 2, rates).step_seconds, r0 + r1 + w1);
  }
}

}  // namespace
}  // namespace fastudy
