// The NCCL gradient reducer (src/runtime/nccl_reducer.hpp) under mpirun -n 2. With devices: host and
// device buffers averaged over the ranks, one device per local rank. Without a device (CI machines):
// the device tests skip with "no CUDA device: <reason>", and the reducer's refusal is checked.
// Own main: MPI is initialised for the whole binary; ranks other than 0 print only failures.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "src/runtime/mpi.hpp"
#include "src/runtime/gpu.hpp"
#include "src/runtime/nccl_reducer.hpp"

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

TEST_F(NcclReducerTest, HostBuffersAreAveragedOverTheGroup) {
  const mpi::Comm world = mpi::Comm::world();
  auto reducer = nccl::make_nccl_reducer(world);
  EXPECT_STREQ(reducer->name(), "nccl");
  auto f = rank_values<float>(world.rank(), 1000);
  reducer->allreduce_mean(f.data(), f.size());
  EXPECT_EQ(f, expected_mean<float>(world.size(), 1000));
  auto d = rank_values<double>(world.rank(), 777);
  reducer->allreduce_mean(d.data(), d.size());
  EXPECT_EQ(d, expected_mean<double>(world.size(), 777));
}

TEST_F(NcclReducerTest, DeviceBuffersAreAveragedInPlace) {
  const mpi::Comm world = mpi::Comm::world();
  auto reducer = nccl::make_nccl_reducer(world);
  const auto x = rank_values<float>(world.rank(), 4096);
  cuda::DeviceBuffer<float> buf(x.size());
  FASTUDY_CUDA_CHECK(cudaMemcpy(buf.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  reducer->allreduce_mean(buf.get(), x.size());
  std::vector<float> y(x.size());
  FASTUDY_CUDA_CHECK(cudaMemcpy(y.data(), buf.get(), y.size() * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(y, expected_mean<float>(world.size(), x.size()));
}

TEST_F(NcclReducerTest, OneDevicePerLocalRank) {
  const mpi::Comm world = mpi::Comm::world();
  const int device = nccl::select_device(world);
  int current = -1;
  FASTUDY_CUDA_CHECK(cudaGetDevice(&current));
  EXPECT_EQ(device, current);
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
