// `fastudy report OUT|GRID.toml`: render OUT/report.html (self-contained) and OUT/report.md with the
// plots in OUT/report_files/, from the study's .csv/.h5 outputs only. Also the last phase of `run`.
//
// The renderer is the Python package analysis/report (matplotlib, numpy, h5py from Debian's
// python3-* packages). This job finds an interpreter and the package, checks that the modules import,
// runs `PYTHON -B REPORT_DIR OUT --quiet` with posix_spawn (no shell, so no quoting of paths) and turns
// a failure into a fastudy::Error with a hint. Under MPI (`fastudy run`) only rank 0 renders.
//
// Interpreter: $FASTUDY_PYTHON, else the one CMake found (FASTUDY_PYTHON in fastudy/version.hpp,
// /usr/bin/python3 when present), else /usr/bin/python3, else python3 on PATH.
// Package: $FASTUDY_REPORT_DIR, else FASTUDY_SOURCE_DIR/analysis/report (a build tree), else
// <prefix>/share/fastudy/report next to an installed bin/fastudy.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/checksum.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "fastudy/version.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"

extern char** environ;

namespace fs = std::filesystem;

namespace fastudy {

namespace {

constexpr const char* kModules = "matplotlib numpy h5py";
constexpr const char* kInstallHint =
    "apt-get install python3-matplotlib python3-h5py (Debian's modules are seen by /usr/bin/python3; "
    "set FASTUDY_PYTHON to another interpreter that has them)";

// The outputs with a checksum sidecar that the renderer reads (train_log.csv, appended while training,
// has none).
constexpr const char* kSealedOutputs[] = {"study.toml",  "variants.csv",  "status.csv",    "microbench.h5", "microbench.csv",
                                          "deviation.h5", "deviation.csv", "axes.csv",      "ranking.csv",
                                          "verdict.csv",  "twins.csv"};

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool is_executable(const std::string& path) { return !path.empty() && ::access(path.c_str(), X_OK) == 0; }

// The interpreter to run; a bare name ("python3") is searched on PATH by posix_spawnp.
std::string find_python() {
  for (const std::string& p : {env_or_empty("FASTUDY_PYTHON"), std::string(FASTUDY_PYTHON), std::string("/usr/bin/python3")})
    if (is_executable(p)) return p;
  return "python3";
}

std::vector<fs::path> script_candidates() {
  std::vector<fs::path> c;
  if (const std::string dir = env_or_empty("FASTUDY_REPORT_DIR"); !dir.empty()) c.emplace_back(dir);
  c.emplace_back(fs::path(FASTUDY_SOURCE_DIR) / "analysis" / "report");
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) c.push_back(exe.parent_path().parent_path() / "share" / "fastudy" / "report");
  return c;
}

fs::path find_script() {
  std::string tried;
  for (const auto& dir : script_candidates()) {
    if (fs::exists(dir / "__main__.py")) return dir;
    tried += (tried.empty() ? "" : ", ") + dir.string();
  }
  throw Error("cannot find the report renderer (analysis/report/__main__.py); looked in " + tried,
              "set FASTUDY_REPORT_DIR to the analysis/report directory of the fastudy sources");
}

// Runs argv (argv[0] searched on PATH when it has no '/'); returns the exit code, or 128 + signal.
// With `output` set, the child's stdout and stderr are captured into it instead of inherited.
int run_process(const std::vector<std::string>& args, std::string* output) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  int pipe_fd[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (output) {
    if (::pipe(pipe_fd) != 0) throw Error(std::string("pipe() failed: ") + std::strerror(errno));
    posix_spawn_file_actions_addclose(&actions, pipe_fd[0]);
    posix_spawn_file_actions_adddup2(&actions, pipe_fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, pipe_fd[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&actions, pipe_fd[1]);
  }
  pid_t pid = 0;
  if (stop_signal_received()) throw Error("stopped by a signal before " + args[0] + " started", "run it again");
  const int rc = args[0].find('/') == std::string::npos
                     ? posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ)
                     : posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  // A stop signal is forwarded to the child (collective.cpp), so the renderer never outlives fastudy.
  if (rc == 0) set_child_to_stop(pid);
  if (rc == 0 && stop_signal_received()) ::kill(pid, SIGTERM);
  if (output) ::close(pipe_fd[1]);
  if (rc != 0) {
    if (output) ::close(pipe_fd[0]);
    throw Error("cannot start " + args[0] + ": " + std::strerror(rc),
                rc == ENOENT ? std::string("install Python 3 and the plotting modules: ") + kInstallHint : std::string());
  }
  if (output) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipe_fd[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
      if (n > 0) output->append(buf, static_cast<std::size_t>(n));
    ::close(pipe_fd[0]);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      set_child_to_stop(0);
      throw Error(std::string("waitpid() failed: ") + std::strerror(errno));
    }
  set_child_to_stop(0);
  if (stop_signal_received())
    throw Error("stopped by a signal: " + args[0] + " was stopped with it and nothing was written",
                "run `fastudy report OUT` again");
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// A quick import of the modules the renderer needs, so a missing one gets an install hint rather
// than a Python traceback.
void check_modules(const std::string& python) {
  const std::string code =
      "import importlib.util, sys\n"
      "missing = [m for m in '" + std::string(kModules) + "'.split() if importlib.util.find_spec(m) is None]\n"
      "print(' '.join(missing))\n"
      "sys.exit(3 if missing else 0)\n";
  std::string out;
  const int rc = run_process({python, "-c", code}, &out);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (rc == 0) return;
  if (rc == 3) throw Error(python + " cannot import " + out + ", which the report needs", kInstallHint);
  if (rc == 127) throw Error("cannot run " + python + " (not found)", std::string("install Python 3: ") + kInstallHint);
  throw Error(python + " failed to start (exit code " + std::to_string(rc) + ")" + (out.empty() ? "" : ": " + out),
              kInstallHint);
}

}  // namespace

std::optional<std::string> report_modules_problem() {
  try {
    check_modules(find_python());
    find_script();
  } catch (const Error& e) {
    return std::string(e.what()) + "; hint: " + e.hint();
  }
  return std::nullopt;
}

namespace {

void render(const std::string& out_dir) {
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec))
    throw Error("no study output directory at " + out_dir, "run a phase first, e.g. fastudy microbench GRID.toml --out " + out_dir);
  // Verify before you parse: every output fastudy sealed is checked against its checksum before the
  // renderer (h5py, csv, tomllib) reads it.
  for (const char* name : kSealedOutputs) {
    const fs::path p = fs::path(out_dir) / name;
    if (fs::exists(p, ec))
      verify_sealed(p.string(), std::string("rerun the phase that writes ") + name + " (with --resume or --force), then the report");
  }
  const std::string python = find_python();
  const fs::path script = find_script();
  check_modules(python);
  log::debug("report: " + python + " " + script.string() + " " + out_dir);
  const int rc = run_process({python, "-B", script.string(), out_dir, "--quiet"}, nullptr);
  if (rc != 0)
    throw Error("the report renderer failed (exit code " + std::to_string(rc) + ")",
                "its message is above; rerun it alone with: " + python + " " + script.string() + " " + out_dir);
  const fs::path out(out_dir);
  log::info("report: " + (out / "report.html").string() + " (self-contained; open it in a browser)");
  log::info("report: " + (out / "report.md").string() + ", plots as PNG and SVG in " + (out / "report_files").string());
}

}  // namespace

int job_report(JobContext& ctx) {
  if (ctx.world != nullptr) {
    on_root(*ctx.world, [&] { render(ctx.out_dir); });
  } else {
    render(ctx.out_dir);
  }
  return kExitOk;
}

}  // namespace fastudy
