// The gradient reducers on GPUs (src/runtime/reducer.hpp, nccl_reducer.hpp) under mpirun -n 1 and 2.
// NCCL takes one GPU per rank of a communicator; ranks that share a GPU (a one-GPU machine with 2
// ranks) average with MPI on host copies instead, which must give the mean exactly where it is exact
// and the same bits as MPI on host buffers. Tests that need a GPU per rank skip with "needs more GPUs:
// ..." on a machine with fewer (scripts/gpu-check.sh lists them as not run); the other device tests
// skip with "no CUDA device: <reason>" without a device, and the refusals are checked there.
// Own main: MPI is initialised for the whole binary; ranks other than 0 print only failures.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "src/runtime/gpu.hpp"
#include "src/runtime/mpi.hpp"
#include "src/runtime/nccl_reducer.hpp"
#include "src/runtime/placement.hpp"
#include "src/runtime/reducer.hpp"

namespace fastudy {
namespace {

class NcclReducerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// Values whose sum over the ranks and division by the rank count are exact (multiples of 1/4 below
// 2^10 for up to 4 ranks), so the mean is compared exactly.
template <class T>
std::vector<T> rank_values(int rank, std::size_t n) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(rank * 4 + static_cast<int>(i % 64)) * T(0.25);
  return x;
}
template <class T>
std::vector<T> expected_mean(int size, std::size_t n) {
  std::vector<T> sum(n, T(0));
  for (int r = 0; r < size; ++r) {
    const auto x = rank_values<T>(r, n);
    for (std::size_t i = 0; i < n; ++i) sum[i] += x[i];
  }
  for (T& v : sum) v /= static_cast<T>(size);
  return sum;
}

// Values whose sum rounds (sines): where the reducers could part.
std::vector<float> rounded_values(int rank, std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank));
  return x;
}

// x averaged by `reducer` in a device buffer of the current device.
std::vector<float> mean_on_device(GradientReducer& reducer, const std::vector<float>& x) {
  cuda::DeviceBuffer<float> buf(x.size());
  FASTUDY_CUDA_CHECK(cudaMemcpy(buf.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  reducer.allreduce_mean(buf.get(), x.size());
  std::vector<float> y(x.size());
  FASTUDY_CUDA_CHECK(cudaMemcpy(y.data(), buf.get(), y.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return y;
}

// Whether the world's ranks, each on its node-local rank's GPU, have a GPU each (the same answer on
// every rank: all see the same placements).
bool a_gpu_per_rank(const mpi::Comm& world) {
  const auto placements = gather_placements(world, true);
  return choose_reducer(placements, 0, true, true).backend != "mpi";
}

// 2 ranks on one GPU (every rank on device 0): auto chooses MPI on host copies; device buffers are
// averaged exactly where the mean is exact, and bit for bit as MPI averages host buffers.
TEST_F(NcclReducerTest, RanksSharingAGpuAverageWithMpiOnHostCopies) {
  const mpi::Comm world = mpi::Comm::world();
  use_gpu(0);
  auto reducer = make_reducer(world, "auto");
  EXPECT_STREQ(reducer->name(), "mpi");  // one rank: nothing for NCCL to do; 2 on one GPU: NCCL refuses them
  EXPECT_EQ(mean_on_device(*reducer, rank_values<float>(world.rank(), 4096)), expected_mean<float>(world.size(), 4096));
  const auto x = rounded_values(world.rank(), 4096);
  auto host = x;
  make_reducer(world, "mpi")->allreduce_mean(host.data(), host.size());
  EXPECT_EQ(mean_on_device(*reducer, x), host);
  if (world.size() > 1) {
    try {
      make_reducer(world, "nccl");
      FAIL() << "nccl made for ranks that share a GPU";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("share GPU 0"), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("mpi"), std::string::npos) << e.hint();
    }
  }
}

// Each rank on its node-local rank's GPU: auto takes NCCL where each rank has its own (always with one
// rank), MPI on host copies where they share; either gives the exact mean.
TEST_F(NcclReducerTest, AutoFollowsThePlacement) {
  const mpi::Comm world = mpi::Comm::world();
  select_gpu(world);
  const bool own = a_gpu_per_rank(world);
  auto reducer = make_reducer(world, "auto");
  EXPECT_STREQ(reducer->name(), own && world.size() > 1 ? "nccl" : "mpi");
  EXPECT_EQ(mean_on_device(*reducer, rank_values<float>(world.rank(), 1000)), expected_mean<float>(world.size(), 1000));
}

TEST_F(NcclReducerTest, NcclAveragesHostAndDeviceBuffers) {
  const mpi::Comm world = mpi::Comm::world();
  select_gpu(world);
  if (!a_gpu_per_rank(world))
    GTEST_SKIP() << "needs more GPUs: " << world.size() << " ranks, " << cuda::device_count()
                 << " GPU(s) (NCCL takes one per rank)";
  auto reducer = make_reducer(world, "nccl");
  EXPECT_STREQ(reducer->name(), "nccl");
  auto f = rank_values<float>(world.rank(), 1000);
  reducer->allreduce_mean(f.data(), f.size());
  EXPECT_EQ(f, expected_mean<float>(world.size(), 1000));
  auto d = rank_values<double>(world.rank(), 777);
  reducer->allreduce_mean(d.data(), d.size());
  EXPECT_EQ(d, expected_mean<double>(world.size(), 777));
  EXPECT_EQ(mean_on_device(*reducer, rank_values<float>(world.rank(), 4096)), expected_mean<float>(world.size(), 4096));
}

// What the docs promise: for up to 2 ranks NCCL and MPI give the same bits (a + b in either order,
// then one IEEE division), also where the sums round.
TEST_F(NcclReducerTest, NcclAndMpiGiveTheSameBitsForUpToTwoRanks) {
  const mpi::Comm world = mpi::Comm::world();
  select_gpu(world);
  ASSERT_LE(world.size(), 2) << "the promise is for groups of 2 ranks at most";
  if (!a_gpu_per_rank(world))
    GTEST_SKIP() << "needs more GPUs: " << world.size() << " ranks, " << cuda::device_count() << " GPU(s)";
  const auto x = rounded_values(world.rank(), 4096);
  EXPECT_EQ(mean_on_device(*make_reducer(world, "nccl"), x), mean_on_device(*make_reducer(world, "mpi"), x));
}

TEST_F(NcclReducerTest, OneDevicePerLocalRank) {
  const mpi::Comm world = mpi::Comm::world();
  const int device = select_gpu(world);
  EXPECT_EQ(device, current_gpu());
  const int local = local_rank_from_env();
  if (local >= 0) {
    EXPECT_EQ(device, local % cuda::device_count());
  }
}

TEST(NcclReducerNoDevice, RefusesWithAHintWhenNoDeviceExists) {
  if (cuda::device_available()) GTEST_SKIP() << "a CUDA device exists: the refusal path is not taken";
  try {
    nccl::make_nccl_reducer(mpi::Comm::world());
    FAIL() << "reducer made without a device";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("sees none"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("mpi allreduce backend"), std::string::npos) << e.hint();
  }
}

TEST(NcclReducerNoDevice, LauncherLocalRankIsWithinTheJob) {
  // Under mpirun (Open MPI) OMPI_COMM_WORLD_LOCAL_RANK is set; on one host it equals the world rank.
  const int local = local_rank_from_env();
  if (local < 0) GTEST_SKIP() << "no launcher local-rank variable in the environment";
  const mpi::Comm world = mpi::Comm::world();
  EXPECT_GE(local, 0);
  EXPECT_LT(local, world.size());
}

class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
              r.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace fastudy

int main(int argc, char** argv) {
  fastudy::mpi::MpiSession session(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  const int rank = fastudy::mpi::Comm::world().rank();
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new fastudy::RankFailurePrinter(rank));
  }
  const int failed = RUN_ALL_TESTS();
  return fastudy::mpi::Comm::world().allreduce_sum(static_cast<std::int64_t>(failed)) == 0 ? 0 : 1;
}
