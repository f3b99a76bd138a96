// The MPI wrapper and the gradient reducer, on every rank count the test runs with (1, 2, 4).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "src/runtime/mpi.hpp"
#include "src/runtime/gpu.hpp"
#include "src/runtime/placement.hpp"
#include "src/runtime/reducer.hpp"

namespace fastudy {
namespace {

using mpi::Comm;

TEST(Mpi, WorldAndThreadLevel) {
  Comm world = Comm::world();
  EXPECT_GE(world.size(), 1);
  EXPECT_GE(world.rank(), 0);
  EXPECT_LT(world.rank(), world.size());
  EXPECT_TRUE(mpi::MpiSession::initialized());
  // Open MPI here supports MPI_THREAD_MULTIPLE, which the multi-group scheduler needs.
  EXPECT_EQ(mpi::MpiSession::provided_level(), mpi::ThreadLevel::multiple);
}

TEST(Mpi, BcastStringsAndBytes) {
  Comm world = Comm::world();
  std::string s = world.is_root() ? std::string("from root, with\0nul", 19) : "";
  world.bcast(s);
  EXPECT_EQ(s, std::string("from root, with\0nul", 19));
  std::int64_t v = world.is_root() ? -42 : 0;
  world.bcast(v);
  EXPECT_EQ(v, -42);
  std::string empty = world.is_root() ? "" : "junk";
  world.bcast(empty);
  EXPECT_TRUE(empty.empty());
}

TEST(Mpi, AllreduceSumAndMax) {
  Comm world = Comm::world();
  const int P = world.size(), r = world.rank();
  std::vector<double> d{1.0 * r, -2.0, 0.5};
  world.allreduce_sum(d.data(), d.size());
  EXPECT_EQ(d[0], P * (P - 1) / 2.0);
  EXPECT_EQ(d[1], -2.0 * P);
  EXPECT_EQ(d[2], 0.5 * P);
  std::vector<float> f{static_cast<float>(r), -static_cast<float>(r)};
  world.allreduce_max(f.data(), f.size());
  EXPECT_EQ(f[0], static_cast<float>(P - 1));
  EXPECT_EQ(f[1], 0.0f);
  std::vector<std::int64_t> i{std::int64_t{1} << 40, r};
  world.allreduce_sum(i.data(), i.size());
  EXPECT_EQ(i[0], (std::int64_t{1} << 40) * P);
  EXPECT_EQ(i[1], P * (P - 1) / 2);
  EXPECT_EQ(world.allreduce_max(std::int64_t{r}), P - 1);
  float fs = 1.5f;
  world.allreduce_sum(&fs, 1);
  EXPECT_EQ(fs, 1.5f * P);
  double dm = -r;
  world.allreduce_max(&dm, 1);
  EXPECT_EQ(dm, 0.0);
  std::int64_t im = -r;
  world.allreduce_max(&im, 1);
  EXPECT_EQ(im, 0);
}

// alltoallv: rank r sends q + 1 values "100 r + q" to rank q (none to itself when r == q == 1, to
// cover an empty message); every rank gets, in rank order, what each rank sent it.
TEST(Mpi, AlltoallvDeliversEachRanksMessageInRankOrder) {
  Comm world = Comm::world();
  const int P = world.size(), r = world.rank();
  const auto count = [](int from, int to) { return from == 1 && to == 1 ? 0 : to + 1; };
  std::vector<std::int32_t> send;
  std::vector<std::size_t> send_bytes, recv_bytes;
  for (int q = 0; q < P; ++q) {
    for (int k = 0; k < count(r, q); ++k) send.push_back(100 * r + q);
    send_bytes.push_back(static_cast<std::size_t>(count(r, q)) * sizeof(std::int32_t));
    recv_bytes.push_back(static_cast<std::size_t>(count(q, r)) * sizeof(std::int32_t));
  }
  std::vector<std::int32_t> recv(std::accumulate(recv_bytes.begin(), recv_bytes.end(), std::size_t{0}) /
                                 sizeof(std::int32_t), -1);
  world.alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
  std::vector<std::int32_t> want;
  for (int q = 0; q < P; ++q)
    for (int k = 0; k < count(q, r); ++k) want.push_back(100 * q + r);
  EXPECT_EQ(recv, want);
  EXPECT_THROW(world.alltoallv(send.data(), {1}, recv.data(), {1, 2, 3, 4, 5}), UsageError);
}

TEST(Mpi, GatherAndAllgatherHostnames) {
  Comm world = Comm::world();
  const std::string host = mpi::processor_name();
  EXPECT_FALSE(host.empty());
  const std::string mine = host + "#" + std::string(static_cast<std::size_t>(world.rank()), 'x');
  std::vector<std::string> all = world.allgather(mine);
  ASSERT_EQ(all.size(), static_cast<std::size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) EXPECT_EQ(all[r], host + "#" + std::string(r, 'x'));
  std::vector<std::string> at_root = world.gather(mine);
  if (world.is_root()) {
    EXPECT_EQ(at_root, all);
  } else {
    EXPECT_TRUE(at_root.empty());
  }
}

TEST(Mpi, SplitDupAndPointToPoint) {
  Comm world = Comm::world();
  Comm half = world.split(world.rank() % 2, world.rank());
  EXPECT_EQ(half.size(), (world.size() + 1 - world.rank() % 2) / 2);
  EXPECT_EQ(half.rank(), world.rank() / 2);
  Comm copy = world.dup();
  EXPECT_EQ(copy.rank(), world.rank());
  // A ring: each rank sends to the next and receives from the previous (self on one rank).
  const int next = (world.rank() + 1) % world.size(), prev = (world.rank() + world.size() - 1) % world.size();
  copy.send(next, 7, "hello from " + std::to_string(world.rank()));
  mpi::Message m = copy.recv(prev, 7);
  EXPECT_EQ(m.source, prev);
  EXPECT_EQ(m.tag, 7);
  EXPECT_EQ(m.payload, "hello from " + std::to_string(prev));
  EXPECT_FALSE(copy.try_recv().has_value());
  copy.barrier();
  Comm moved = std::move(copy);
  EXPECT_TRUE(moved.valid());
  EXPECT_FALSE(copy.valid());  // NOLINT(bugprone-use-after-move): moved-from state is specified
}

TEST(Mpi, ErrorsBecomeMpiErrorWithCallAndRank) {
  Comm world = Comm::world();
  std::int64_t v = 0;
  try {
    world.bcast(v, world.size() + 3);  // an invalid root: MPI returns MPI_ERR_ROOT on every rank
    FAIL() << "no exception";
  } catch (const mpi::MpiError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.call(), "MPI_Bcast");
    EXPECT_EQ(e.rank(), world.rank());
    EXPECT_NE(what.find("MPI_Bcast failed on rank " + std::to_string(world.rank())), std::string::npos) << what;
    EXPECT_NE(what.find("mpi.cpp:"), std::string::npos) << what;
  }
}

TEST(Reducer, MeanIsExactWhenSumsAre) {
  Comm world = Comm::world();
  auto reducer = make_reducer(world, "mpi");
  EXPECT_STREQ(reducer->name(), "mpi");
  const int P = world.size(), r = world.rank();
  // Small integers and halves: every partial sum is exact in fp32/fp64, so the mean must be exact.
  std::vector<float> f(1000);
  std::vector<double> d(1000);
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = static_cast<float>(r) + 0.5f * static_cast<float>(i);
    d[i] = -static_cast<double>(r) * 4 + static_cast<double>(i);
  }
  reducer->allreduce_mean(f.data(), f.size());
  reducer->allreduce_mean(d.data(), d.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    ASSERT_EQ(f[i], (P - 1) / 2.0f + 0.5f * static_cast<float>(i)) << i;
    ASSERT_EQ(d[i], -2.0 * (P - 1) + static_cast<double>(i)) << i;
  }
}

TEST(Reducer, MeanOfRoundedValuesWithinBound) {
  Comm world = Comm::world();
  auto reducer = make_reducer(world, "mpi");
  const int P = world.size(), r = world.rank();
  const std::size_t n = 4096;
  std::vector<float> f(n);
  for (std::size_t i = 0; i < n; ++i) f[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(r));
  reducer->allreduce_mean(f.data(), n);
  // Reference: the fp64 mean of the same fp32 inputs. A sum of P terms in fp32 has error at most
  // (P-1)·u·Σ|x_j| with u = 2^-24, and the division by P adds one more rounding of |mean|·u, so
  // |mean_fp32 - mean_fp64| <= ((P-1)·Σ|x_j|/P + |mean|)·2^-24 <= P·max|x|·2^-24 (|x| <= 1).
  const double u = std::ldexp(1.0, -24);
  for (std::size_t i = 0; i < n; ++i) {
    double ref = 0;
    for (int q = 0; q < P; ++q) {
      ref += static_cast<double>(std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(q)));
    }
    ref /= P;
    ASSERT_LE(std::abs(static_cast<double>(f[i]) - ref), P * u) << i;
  }
}

TEST(Reducer, NcclOrUnknownBackendIsAClearError) {
  Comm world = Comm::world();
  const std::string automatic = make_reducer(world, "auto")->name();
  EXPECT_TRUE(automatic == "mpi" || (have_nccl() && automatic == "nccl")) << automatic;
  try {
    auto nccl = make_reducer(world, "nccl");
    EXPECT_TRUE(have_nccl());
    EXPECT_STREQ(nccl->name(), "nccl");
  } catch (const UsageError& e) {
    // Without NCCL in the build, or (this machine class) with NCCL but no GPU: a clear refusal.
    const std::string want = have_nccl() ? "sees no CUDA device" : "this build of fastudy has no NCCL";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("mpi"), std::string::npos);
  }
  EXPECT_THROW(make_reducer(world, "gloo"), UsageError);
}

// Every rank's placement, gathered in rank order: its host, and with want_gpu the node-local rank's
// GPU where it has one (on a machine without a GPU, or without want_gpu: the CPU, device -1).
TEST(Placement, GatheredInRankOrderWithTheLocalRanksGpu) {
  Comm world = Comm::world();
  const auto hosts = world.allgather(mpi::processor_name());
  for (const bool want_gpu : {false, true}) {
    const auto placements = gather_placements(world, want_gpu);
    ASSERT_EQ(placements.size(), static_cast<std::size_t>(world.size()));
    const auto local = local_ranks(hosts);
    for (std::size_t r = 0; r < placements.size(); ++r) {
      EXPECT_EQ(placements[r].host, hosts[r]) << r;
      if (!want_gpu || !rank_has_gpu()) {
        EXPECT_EQ(placements[r].device, -1) << r;
        EXPECT_EQ(placements[r].gpu, "") << r;
      } else if (static_cast<int>(r) == world.rank()) {
        const int l = local_rank_from_env() >= 0 ? local_rank_from_env() : local[r];
        EXPECT_EQ(placements[r].device, device_of_local_rank(l, visible_gpus()));
        EXPECT_EQ(placements[r].gpu, gpu_bus_id(placements[r].device));
      }
    }
  }
}

}  // namespace
}  // namespace fastudy
