// Where each rank of a job trains, and which gradient reducer each rank group gets: decided once,
// before any work, from the ranks' hosts and GPUs.
//
// NCCL takes one GPU per rank of a communicator: ncclCommInitRank fails with "invalid usage" when two
// ranks of one communicator are on the same host (NCCL's host hash) and the same GPU (its PCI bus id)
// (NVIDIA/nccl src/init.cc, "Duplicate GPU detected"). On a one-GPU workstation every group of two or
// more ranks is such a group. choose_reducer gives it the MPI reducer on host copies (the device
// buffer is copied to the host, averaged with MPI_Allreduce, copied back); a group whose ranks each
// have their own GPU gets NCCL. The two average the same values: the mean is the sum divided by the
// group size (one IEEE division on either side); the sum's order is each library's own, so for groups
// of 2 ranks the bits agree (a + b in either order), for larger groups the last bits may differ
// ([train] dp_width fixes the order for both).
//
// Pure functions, tested without MPI or a GPU (tests/runtime/test_placement.cpp) and through `fastudy
// plan --gpus-per-node`; gather_placements is the one collective (the train job calls it).
#pragma once

#include <string>
#include <vector>

#include "src/runtime/mpi.hpp"

namespace fastudy {

// One rank: its host (MPI processor name), the CUDA device index it trains on (-1: none, the CPU)
// and that device's identity on the host (its PCI bus id; "" for none).
struct RankPlacement {
  std::string host;
  int device = -1;
  std::string gpu;
};

// The gradient reducer of one rank group.
struct ReducerChoice {
  std::string backend;       // "none" (a group of one rank: nothing to average), "mpi" or "nccl"
  bool host_copies = false;  // mpi for a group on GPUs: the device buffers are averaged on the host
  std::string reason;        // one clause: why this backend ("ranks 0 and 1 share GPU ...")
  std::string name() const;  // "none", "mpi", "mpi on host copies" or "nccl"
  std::string text() const;  // the name and the reason: "nccl (every rank on its own GPU)"
};

// The reducer for a group whose ranks are `group` (in group order; `first_rank` is the world rank of
// the first, for the reason's text). on_gpu: the group trains on GPUs (every rank has a device);
// nccl_built: this build has the NCCL reducer.
ReducerChoice choose_reducer(const std::vector<RankPlacement>& group, int first_rank, bool on_gpu, bool nccl_built);

// The node-local rank's device: local rank modulo the devices it sees (count >= 1).
int device_of_local_rank(int local_rank, int count);

// Node-local ranks from the hosts of every rank (in rank order): a rank's position among the ranks of
// its host.
std::vector<int> local_ranks(const std::vector<std::string>& hosts);

// The placements `fastudy plan` models: `ranks` ranks, ranks_per_node to a node (nodes "node0",
// "node1", ...; 0: all on one node), each node with gpus_per_node GPUs (0: no GPU), device by
// node-local rank (device_of_local_rank).
std::vector<RankPlacement> modelled_placements(int ranks, int ranks_per_node, int gpus_per_node);

// The reducers of every group of ranks_per_group consecutive ranks (the scheduler's groups,
// scheduler.hpp), group g = ranks [g*k, (g+1)*k).
std::vector<ReducerChoice> choose_reducers(const std::vector<RankPlacement>& ranks, int ranks_per_group, bool on_gpu,
                                           bool nccl_built);

// Lines that say which reducer each group gets: one per group up to 8 groups, else one per kind of
// choice with the groups that get it and the first one's reason ("groups 0-3, 6 (5 of 8): nccl (group
// 0: every rank on its own GPU)").
std::vector<std::string> describe_reducers(const std::vector<ReducerChoice>& choices, int ranks_per_group);

// Collective over world: every rank's placement, in rank order. A rank with want_gpu and a visible GPU
// takes its node-local rank's device (the launcher's local rank, else its position among the ranks of
// its host); the others train on the CPU (device -1).
std::vector<RankPlacement> gather_placements(const mpi::Comm& world, bool want_gpu);

}  // namespace fastudy
