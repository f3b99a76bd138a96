// Running the fastudy binary from a test: exit code and combined output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace fastudy::test {

struct RunResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

inline RunResult run_command(const std::string& cmd) {
  RunResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline RunResult run_fastudy(const std::string& args) { return run_command(std::string(FASTUDY_EXE) + " " + args); }

inline RunResult run_fastudy_mpi(int ranks, const std::string& args) {
  return run_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(FASTUDY_MPIEXEC) +
                     " -n " + std::to_string(ranks) + " --oversubscribe " + FASTUDY_EXE + " " + args);
}

// A fresh temporary directory, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("fastudy-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name, const std::string& content) const {
    std::string p = (path_ / name).string();
    std::ofstream(p) << content;
    return p;
  }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace fastudy::test
