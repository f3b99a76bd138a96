// Running the fastudy binary from a test: exit code and combined output; a tiny grid and its variants;
// a spawned run (its output dropped, or kept in a file); files read and written whole.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace fastudy::test {

// The variants of tiny_grid, in grid order.
inline const char* const kIds[] = {"baseline-fp32", "baseline-bf16", "flash-fp32", "flash-bf16"};

// A file's bytes ("" when it cannot be read), and a file written with exactly these bytes.
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
inline void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// 4 variants, tiny model: a few seconds per run.
inline std::string tiny_grid(const std::string& out, int steps, int checkpoint_every) {
  std::ostringstream os;
  os << "[study]\nname = \"e2e\"\nout = \"" << out << "\"\nphases = [\"train\", \"reduce\"]\n"
     << "[grid]\nattention = [\"baseline\", \"flash\"]\nprecision = [\"fp32\", \"bf16\"]\n"
     << "[model]\nvocab = 32\nd_model = 16\nheads = 2\nlayers = 1\nseq_len = 16\nmlp_ratio = 2\n"
     << "[data]\nspan_len = 4\n"
     << "[train]\nsteps = " << steps << "\nbatch = 4\nwarmup = 2\ncheckpoint_every = " << checkpoint_every << "\n"
     << "[attention]\nblock_q = 8\nblock_kv = 8\n";
  return os.str();
}

// Starts argv (argv[0] a path) with stdout and stderr into the file `log`; returns its pid (waitpid
// it), or -1 when it cannot start.
inline pid_t spawn_logged(std::vector<std::string> args, const std::string& log) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// Starts fastudy with `args` and -q, its output to /dev/null; returns its pid (waitpid it).
inline pid_t spawn_fastudy(const std::vector<std::string>& args) {
  std::vector<std::string> all{FASTUDY_EXE};
  all.insert(all.end(), args.begin(), args.end());
  all.push_back("-q");
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn(&pid, FASTUDY_EXE, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

struct RunResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

// Each command gets an Open MPI session directory of its own (orte_tmpdir_base), removed after it: two
// commands of parallel tests share /tmp/ompi.HOST.UID otherwise, and one ending can remove the job-family
// folder the other is creating ("A call to mkdir was unable to create the desired directory").
inline RunResult run_command(const std::string& cmd) {
  RunResult r;
  const std::string own_session = "export OMPI_MCA_orte_tmpdir_base=\"$(mktemp -d)\"; ";
  const std::string cleanup = "; rc=$?; rm -rf \"$OMPI_MCA_orte_tmpdir_base\"; exit $rc";
  FILE* p = popen((own_session + cmd + " 2>&1" + cleanup).c_str(), "r");
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
