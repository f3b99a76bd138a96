// A checkpoint is whole or absent: a writer (checkpoint_writer_loop, started without mpirun) killed
// with SIGKILL at arbitrary moments during writes, verifications and renames never leaves a file that
// is taken for a valid checkpoint.
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "src/io/checkpoint.hpp"
#include "tests/common/mpi_scratch.hpp"

namespace fastudy {
namespace {

namespace fs = std::filesystem;
using testing_mpi::clean_environment;

TEST(Kill, SigkillDuringCheckpointWritesLeavesOnlyValidCheckpoints) {
  mpi::Comm world = mpi::Comm::world();
  // One rank is enough (the writer is a separate single-rank process); skip the multi-rank runs.
  if (world.size() > 1) GTEST_SKIP() << "runs in the single-rank configurations";
  const std::string out = testing_mpi::scratch_dir(world, "kill");
  const std::string helper = std::string(FASTUDY_BINARY_DIR) + "/tests/io/checkpoint_writer_loop";
  std::vector<std::string> env_strings = clean_environment();
  std::vector<char*> env;
  for (auto& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  int killed_mid_write = 0;
  const int kills = 4;
  for (int k = 0; k < kills; ++k) {
    const std::string run_out = out + "/" + std::to_string(k);
    const std::string dir = checkpoint_dir(run_out, "v");
    std::string arg0 = helper, arg1 = run_out;
    char* args[] = {arg0.data(), arg1.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(::posix_spawn(&pid, helper.c_str(), nullptr, nullptr, args, env.data()), 0) << std::strerror(errno);
    // Once the writer has finished its first checkpoint (MPI start-up takes a while), kill it at
    // staggered moments so the signal lands in different phases of a write.
    for (int i = 0; i < 2000 && list_checkpoint_steps(dir).empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(7 + 13 * k));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended by itself (status " << status << ")";

    bool tmp_left = false;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      tmp_left |= e.path().filename().string().find(".tmp.") != std::string::npos;
    }
    killed_mid_write += tmp_left;
    // Every file with a checkpoint name is whole and valid, and the newest is the one taken.
    const std::vector<std::int64_t> steps = list_checkpoint_steps(dir);
    ASSERT_FALSE(steps.empty());
    for (std::int64_t step : steps) {
      const std::string path = checkpoint_path(run_out, "v", step);
      EXPECT_EQ(checkpoint_problem(path), std::nullopt) << path;
    }
    auto latest = latest_valid_checkpoint(dir);
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(latest->step, steps.back());
  }
  // The kills must have hit writes in progress at least once, or the test proved nothing.
  EXPECT_GT(killed_mid_write, 0);
  std::printf("[ kill     ] %d of %d kills left an interrupted write behind\n", killed_mid_write, kills);
}

}  // namespace
}  // namespace fastudy
