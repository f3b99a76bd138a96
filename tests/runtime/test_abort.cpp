// mpi::abort prints the rank and the message, then ends the job with the given code (mpi_abort_helper,
// started without mpirun).
#include <gtest/gtest.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <fstream>
#include <iterator>

#include "tests/common/mpi_scratch.hpp"

namespace fastudy {
namespace {

using testing_mpi::clean_environment;

TEST(Abort, PrintsRankAndMessageThenEndsWithTheCode) {
  mpi::Comm world = mpi::Comm::world();
  if (world.size() > 1) GTEST_SKIP() << "runs in the single-rank configurations";
  const std::string dir = testing_mpi::scratch_dir(world, "abort");
  const std::string helper = std::string(FASTUDY_BINARY_DIR) + "/tests/runtime/mpi_abort_helper";
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
