// The reduce's schedule (jobs/reduce_work.hpp schedule_reduce): tensors dealt whole while every rank's
// values stay within kDealBalance of the mean, the largest split over all ranks only as far as the
// balance needs, and none below kSplitElements.
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

}  // namespace
}  // namespace fastudy
