// Process-level behaviour, with helper programs started without mpirun: a checkpoint is whole or
// absent (a writer killed with SIGKILL at arbitrary moments during writes, verifications and renames
// never leaves a file that is taken for a valid checkpoint), and mpi::abort prints the rank and the
// message, then ends the job with the given code.
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
#include "tests/runner/common.hpp"

extern char** environ;

namespace fastudy {
namespace {

namespace fs = std::filesystem;

// The environment without the variables mpirun sets, so the child starts as its own singleton job.
std::vector<std::string> clean_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    if (v.rfind("OMPI_COMM_WORLD", 0) == 0 || v.rfind("OMPI_MCA_orte", 0) == 0 || v.rfind("OMPI_MCA_ess", 0) == 0 ||
        v.rfind("OMPI_MCA_pmix", 0) == 0 || v.rfind("PMIX_", 0) == 0 || v.rfind("OMPI_FILE_LOCATION", 0) == 0 ||
        v.rfind("OMPI_UNIVERSE_SIZE", 0) == 0 || v.rfind("OMPI_APP_CTX", 0) == 0 || v.rfind("OMPI_FIRST_RANKS", 0) == 0 ||
        v.rfind("OMPI_NUM_APP_CTX", 0) == 0 || v.rfind("OMPI_ARGV", 0) == 0 || v.rfind("OMPI_COMMAND", 0) == 0) {
      continue;
    }
    env.push_back(v);
  }
  return env;
}

TEST(Kill, SigkillDuringCheckpointWritesLeavesOnlyValidCheckpoints) {
  mpi::Comm world = mpi::Comm::world();
  // One rank is enough (the writer is a separate single-rank process); skip the multi-rank runs.
  if (world.size() > 1) GTEST_SKIP() << "runs in the single-rank configurations";
  const std::string out = testing_runner::scratch_dir(world, "kill");
  const std::string helper = std::string(FASTUDY_BINARY_DIR) + "/tests/runner/checkpoint_writer_loop";
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

TEST(Abort, PrintsRankAndMessageThenEndsWithTheCode) {
  mpi::Comm world = mpi::Comm::world();
  if (world.size() > 1) GTEST_SKIP() << "runs in the single-rank configurations";
  const std::string dir = testing_runner::scratch_dir(world, "abort");
  const std::string helper = std::string(FASTUDY_BINARY_DIR) + "/tests/runner/mpi_abort_helper";
  const std::string err = dir + "/stderr.txt";
  std::vector<std::string> env_strings = clean_environment();
  std::vector<char*> env;
  for (auto& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::string arg0 = helper;
  char* args[] = {arg0.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(::posix_spawn(&pid, helper.c_str(), &actions, nullptr, args, env.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 3);
  std::ifstream in(err);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("error: [rank 0] variant x: rank lost its data\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace fastudy
