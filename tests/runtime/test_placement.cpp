// Which gradient reducer each rank group gets (src/runtime/placement.hpp), from the ranks' hosts and
// GPUs given as input: NCCL only when every rank of a group has a GPU of its own (NCCL's rule: no two
// ranks of a communicator on the same host and GPU), else MPI on host copies; the CPU, one rank and
// a build without NCCL. No MPI, no GPU: pure functions.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/runtime/placement.hpp"

namespace fastudy {
namespace {

RankPlacement on(const std::string& host, int device, const std::string& bus) { return {host, device, bus}; }

TEST(Placement, NcclWhenEveryRankHasItsOwnGpu) {
  const ReducerChoice c = choose_reducer({on("a", 0, "0000:01:00.0"), on("a", 1, "0000:02:00.0")}, 0, true, true);
  EXPECT_EQ(c.backend, "nccl");
  EXPECT_FALSE(c.host_copies);
  EXPECT_EQ(c.text(), "nccl (every rank on its own GPU)");
}

TEST(Placement, RanksSharingAGpuGetMpiOnHostCopiesNamingThem) {
  const ReducerChoice c = choose_reducer({on("a", 0, "0000:01:00.0"), on("a", 0, "0000:01:00.0")}, 6, true, true);
  EXPECT_EQ(c.backend, "mpi");
  EXPECT_TRUE(c.host_copies);
  EXPECT_EQ(c.text(),
            "mpi on host copies (ranks 6 and 7 share GPU 0 (PCI 0000:01:00.0) on a; NCCL takes one GPU per rank)");
}

// The GPU's identity is its bus id, not its index: with CUDA_VISIBLE_DEVICES set per rank, device 0
// of two ranks can be two GPUs (NCCL accepts that), and two indices can name one GPU.
TEST(Placement, TheBusIdNotTheIndexTellsGpusApart) {
  EXPECT_EQ(choose_reducer({on("a", 0, "0000:01:00.0"), on("a", 0, "0000:02:00.0")}, 0, true, true).backend, "nccl");
  EXPECT_EQ(choose_reducer({on("a", 0, "0000:01:00.0"), on("a", 1, "0000:01:00.0")}, 0, true, true).backend, "mpi");
}

TEST(Placement, TheSameGpuOnTwoHostsIsTwoGpus) {
  EXPECT_EQ(choose_reducer({on("a", 0, "0000:01:00.0"), on("b", 0, "0000:01:00.0")}, 0, true, true).backend, "nccl");
}

TEST(Placement, OneSharedPairAmongDistinctGpusIsEnoughForMpi) {
  const ReducerChoice c = choose_reducer(
      {on("a", 0, "g0"), on("a", 1, "g1"), on("a", 2, "g2"), on("a", 1, "g1")}, 0, true, true);
  EXPECT_EQ(c.backend, "mpi");
  EXPECT_NE(c.reason.find("ranks 1 and 3 share GPU 1"), std::string::npos) << c.reason;
}

TEST(Placement, CpuOneRankAndNoNccl) {
  EXPECT_EQ(choose_reducer({on("a", -1, ""), on("a", -1, "")}, 0, false, true).text(), "mpi (the group trains on the CPU)");
  EXPECT_EQ(choose_reducer({on("a", 0, "g0")}, 0, true, true).backend, "none");
  const ReducerChoice c = choose_reducer({on("a", 0, "g0"), on("a", 1, "g1")}, 0, true, false);
  EXPECT_EQ(c.text(), "mpi on host copies (this build has no NCCL)");
}

TEST(Placement, LocalRanksCountTheRanksOfEachHost) {
  EXPECT_EQ(local_ranks({"a", "a", "b", "a", "b"}), (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(device_of_local_rank(5, 4), 1);
  EXPECT_THROW(device_of_local_rank(0, 0), std::invalid_argument);
}

// A one-GPU workstation with 4 ranks: every group of 2 shares the GPU.
TEST(Placement, OneGpuWorkstation) {
  const auto ranks = modelled_placements(4, 0, 1);
  const auto choices = choose_reducers(ranks, 2, true, true);
  ASSERT_EQ(choices.size(), 2u);
  EXPECT_EQ(choices[0].text(), "mpi on host copies (ranks 0 and 1 share GPU 0 on node0; NCCL takes one GPU per rank)");
  EXPECT_EQ(choices[1].text(), "mpi on host copies (ranks 2 and 3 share GPU 0 on node0; NCCL takes one GPU per rank)");
}

// Two nodes of 4 ranks and 4 GPUs: every group has its GPUs; 8 ranks on a node of 4 GPUs: groups of
// 2 still do (local ranks 0,1 / 2,3 / 4,5 -> GPUs 0,1 / 2,3 / 0,1), groups of 8 do not.
TEST(Placement, NodesAndGroups) {
  for (const auto& c : choose_reducers(modelled_placements(8, 4, 4), 2, true, true)) EXPECT_EQ(c.backend, "nccl");
  for (const auto& c : choose_reducers(modelled_placements(8, 0, 4), 2, true, true)) EXPECT_EQ(c.backend, "nccl");
  const auto big = choose_reducers(modelled_placements(8, 0, 4), 8, true, true);
  ASSERT_EQ(big.size(), 1u);
  EXPECT_EQ(big[0].text(), "mpi on host copies (ranks 0 and 4 share GPU 0 on node0; NCCL takes one GPU per rank)");
  // Groups spanning two nodes of one GPU each: NCCL.
  EXPECT_EQ(choose_reducers(modelled_placements(2, 1, 1), 2, true, true)[0].backend, "nccl");
  // No GPU on the nodes: the groups train on the CPU.
  EXPECT_EQ(choose_reducers(modelled_placements(4, 0, 0), 2, true, true)[0].text(), "mpi (the group trains on the CPU)");
}

TEST(Placement, DescribeOneLinePerGroupOrPerKind) {
  const auto few = describe_reducers(choose_reducers(modelled_placements(4, 0, 1), 2, true, true), 2);
  ASSERT_EQ(few.size(), 2u);
  EXPECT_EQ(few[1], "group 1 (ranks 2-3): mpi on host copies (ranks 2 and 3 share GPU 0 on node0; NCCL takes one GPU per rank)");
  // 20 ranks in groups of 2 on nodes of 3 ranks and one GPU: a group within a node shares its GPU, a
  // group across two nodes does not. More than 8 groups: one line per kind, the groups as ranges.
  const auto choices = choose_reducers(modelled_placements(20, 3, 1), 2, true, true);
  ASSERT_EQ(choices.size(), 10u);
  const auto many = describe_reducers(choices, 2);
  ASSERT_EQ(many.size(), 2u);
  EXPECT_EQ(many[0], "groups 0, 2-3, 5-6, 8-9 (7 of 10): mpi on host copies (group 0: ranks 0 and 1 share GPU 0 on "
                     "node0; NCCL takes one GPU per rank)");
  EXPECT_EQ(many[1], "groups 1, 4, 7 (3 of 10): nccl (group 1: every rank on its own GPU)");
}

}  // namespace
}  // namespace fastudy
