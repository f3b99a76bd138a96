// The reliability tests' shared helpers (tests/cli/test_reliability_*.cpp): a byte range inverted, a
// readiness event waited for, a spawned process's exit code, and a small grid of ci.toml's shape.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "tests/cli/checkpoint_util.hpp"
#include "tests/cli/cli_util.hpp"

namespace fastudy::test {

// 16 bytes from `at` (clamped to the file) inverted: never equal to the original.
inline std::string flip16(std::string bytes, std::size_t at) {
  at = std::min(at, bytes.size() - std::min<std::size_t>(16, bytes.size()));
  for (std::size_t i = at; i < std::min(bytes.size(), at + 16); ++i) bytes[i] = static_cast<char>(~bytes[i]);
  return bytes;
}

// Polls `ready` until it holds (the readiness event) or the process `pid` ends or 120 s pass; true
// when ready. The sleep is the polling interval, not a synchronisation.
inline bool wait_until(const std::function<bool()>& ready, pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ready()) return true;
    int status = 0;
    if (pid > 0 && ::waitpid(pid, &status, WNOHANG) == pid) return ready();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

inline int exit_code_of(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A grid of ci.toml's shape with `data` as its [data] section and `extra` appended.
inline std::string grid_with(const std::string& out, const std::string& data, const std::string& extra = "") {
  return "[study]\nname = \"pre\"\nout = \"" + out + "\"\nphases = [\"microbench\", \"train\", \"reduce\"]\n" +
         "[grid]\nseed = [1, 2]\n[model]\nvocab = 32\nd_model = 16\nheads = 2\nlayers = 1\nseq_len = 16\nmlp_ratio = 2\n" +
         "[data]\n" + data + "[train]\nsteps = 2\nbatch = 4\nwarmup = 1\ncheckpoint_every = 2\n" +
         "[attention]\nblock_q = 8\nblock_kv = 8\n" +
         "[microbench]\nformats = [\"fp32\"]\npolicies = [\"mixed\"]\nseq_lens = [16]\nhead_dims = [8]\nblocks = [[8, 8]]\n" +
         "loop_orders = [\"q_outer\"]\ntrials = 1\nheads = 1\n" + extra;
}

}  // namespace fastudy::test
