// `fastudy report OUT|GRID.toml`: render OUT/report.html (self-contained) and OUT/report.md with the
// plots in OUT/report_files/, from the study's .csv/.h5 outputs only. Also the last phase of `run`.
// Before it renders, every output is checked against its checksum and against study.toml (its
// configuration hash; the finished variants' checkpoints: check_results_belong).
//
// The renderer is the Python package analysis/report (matplotlib, numpy, h5py from Debian's
// python3-* packages). This job finds an interpreter and the package, checks that the modules import,
// runs `PYTHON -B REPORT_DIR OUT --quiet --into OUT/report.staging` with FASTUDY_BIN set to this
// program, whose `fastudy readings --json` the renderer reads (posix_spawn through
// fastudy-spawn, no shell, so no quoting of paths; the child dies with fastudy), moves the finished
// report into place and turns a failure into a fastudy::Error with a hint, leaving nothing new behind.
// Under MPI (`fastudy run`, or `mpirun -n N fastudy report OUT`) only rank 0 renders.
//
// Interpreter: $FASTUDY_PYTHON, else the one CMake found (FASTUDY_PYTHON in fastudy/version.hpp,
// /usr/bin/python3 when present), else /usr/bin/python3, else python3 on PATH.
// Package: $FASTUDY_REPORT_DIR, else FASTUDY_SOURCE_DIR/analysis/report (a build tree), else
// <prefix>/share/fastudy/report next to an installed bin/fastudy.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "base/checksum.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "base/manifest.hpp"
#include "fastudy/version.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"
#include "src/io/checkpoint.hpp"
#include "src/io/h5.hpp"
#include "src/runtime/status.hpp"

extern char** environ;

namespace fs = std::filesystem;

namespace fastudy {

namespace {

constexpr const char* kModules = "matplotlib numpy h5py";
// The renderer's folder for a report being written (analysis/report/cli.py --into), inside OUT.
constexpr const char* kStaging = "report.staging";
// The renderer's exit code after it printed one line on a file it could not write (a full disk).
constexpr int kRendererCannotWrite = 4;
constexpr const char* kInstallHint =
    "apt-get install python3-matplotlib python3-h5py (Debian's modules are seen by /usr/bin/python3; "
    "set FASTUDY_PYTHON to another interpreter that has them)";

// The outputs with a checksum sidecar that the renderer reads (train_log.csv, appended while training,
// has none).
constexpr const char* kSealedOutputs[] = {"study.toml",  "variants.csv",  "status.csv",    "microbench.h5", "microbench.csv",
                                          "deviation.h5", "deviation.csv", "axes.csv",      "ranking.csv",
                                          "verdict.csv",  "twins.csv",     "advice.csv"};

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool is_executable(const std::string& path) { return !path.empty() && ::access(path.c_str(), X_OK) == 0; }

// The interpreter to run; a bare name ("python3") is searched on PATH (executable_path).
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

// argv[0] as a path to execute: itself when it holds a '/', else the first executable of that name on
// PATH; "" when there is none.
std::string executable_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  std::stringstream dirs(env_or_empty("PATH"));
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && is_executable(d + "/" + name)) return d + "/" + name;
  return "";
}

// This program's path (fastudy-lite or fastudy-main; both answer `readings`).
std::string this_program() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot tell this program's path (/proc/self/exe: " + ec.message() + ")",
                      "run fastudy on Linux with /proc mounted");
  return exe.string();
}

// fastudy-spawn beside this program (jobs/spawn.cpp), which starts a child that dies with fastudy.
std::string spawn_helper() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path helper = ec ? fs::path() : exe.parent_path() / "fastudy-spawn";
  if (helper.empty() || !is_executable(helper.string()))
    throw Error("cannot start the report renderer: " + (helper.empty() ? std::string("fastudy-spawn") : helper.string()) +
                    " is missing",
                "build or install fastudy-spawn beside fastudy (cmake --build BUILD --target fastudy)");
  return helper.string();
}

// Runs argv (argv[0] searched on PATH when it has no '/'); returns the exit code, or 128 + signal.
// With `output` set, the child's stdout and stderr are captured into it instead of inherited.
//
// posix_spawn, never fork() or a hand-made vfork(): this process may hold a CUDA context, NCCL
// communicators and MPI's transports (the report phase of `fastudy run` after training on GPUs);
// glibc's posix_spawn runs no code of ours in the child (its own stack, signals blocked and their
// handlers reset, no atfork handlers) and copies nothing of the process. The child never outlives
// fastudy: a stop signal is forwarded to it (collective.cpp), and it is started through fastudy-spawn,
// which has the kernel kill it when fastudy dies in any way, kill -9 included (PR_SET_PDEATHSIG).
int run_process(const std::vector<std::string>& args, std::string* output) {
  const std::string exe = executable_path(args[0]);
  if (exe.empty())
    throw Error("cannot start " + args[0] + ": not found on PATH",
                std::string("install Python 3 and the plotting modules: ") + kInstallHint);
  const std::string helper = spawn_helper();
  // The errno of a failed start comes back on a pipe whose write end is the helper's fd 3 (a copy
  // of it numbered 4 or more here, so that the dup2 below always makes a new descriptor).
  constexpr int kErrnoFd = 3;
  int pipe_fd[2] = {-1, -1}, exec_fd[2] = {-1, -1};
  if (output && ::pipe2(pipe_fd, O_CLOEXEC) != 0) throw Error(std::string("pipe() failed: ") + std::strerror(errno));
  if (::pipe2(exec_fd, O_CLOEXEC) != 0) throw Error(std::string("pipe() failed: ") + std::strerror(errno));
  const int exec_w = ::fcntl(exec_fd[1], F_DUPFD_CLOEXEC, kErrnoFd + 1);
  ::close(exec_fd[1]);
  exec_fd[1] = exec_w;
  auto close_all = [&] {
    for (int* fd : {&pipe_fd[0], &pipe_fd[1], &exec_fd[0], &exec_fd[1]})
      if (*fd >= 0) ::close(*fd), *fd = -1;
  };
  if (exec_w < 0) {
    close_all();
    throw Error(std::string("fcntl() failed: ") + std::strerror(errno));
  }
  if (stop_signal_received()) {
    close_all();
    throw Error("stopped by a signal before " + args[0] + " started", "run it again");
  }
  // The child's environment: this one, with FASTUDY_BIN naming this program, which the renderer asks for
  // the readings table (`fastudy readings --json`, analysis/report/readings.py): the report describes the
  // readings of the build that renders it.
  std::vector<std::string> env_words{"FASTUDY_BIN=" + this_program()};
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "FASTUDY_BIN=", 12) != 0) env_words.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& w : env_words) envp.push_back(w.data());
  envp.push_back(nullptr);
  std::vector<std::string> words{helper, std::to_string(::getpid()), std::to_string(kErrnoFd), exe};
  words.insert(words.end(), args.begin() + 1, args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  if (output) {
    posix_spawn_file_actions_adddup2(&actions, pipe_fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, pipe_fd[1], STDERR_FILENO);
  }
  posix_spawn_file_actions_adddup2(&actions, exec_fd[1], kErrnoFd);
  // The child starts with no signal blocked and the stop signals at their defaults, whatever this
  // process (or MPI, or its launcher) set.
  sigset_t none, stops;
  sigemptyset(&none);
  sigemptyset(&stops);
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGPIPE, SIGALRM}) sigaddset(&stops, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &stops);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int spawn_errno = ::posix_spawn(&pid, helper.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(exec_fd[1]);
  exec_fd[1] = -1;
  if (output) ::close(pipe_fd[1]), pipe_fd[1] = -1;
  if (spawn_errno != 0) {
    close_all();
    throw Error("cannot start " + args[0] + ": posix_spawn of " + helper + " failed: " + std::strerror(spawn_errno));
  }
  set_child_to_stop(pid);
  if (stop_signal_received()) ::kill(pid, SIGTERM);
  int exec_errno = 0;
  ssize_t n = 0;
  while ((n = ::read(exec_fd[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
  }
  if (n > 0) {
    close_all();
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    set_child_to_stop(0);
    if (exec_errno == ESRCH) throw Error("stopped before " + args[0] + " started (fastudy was ending)", "run it again");
    throw Error("cannot start " + args[0] + ": " + std::strerror(exec_errno),
                exec_errno == ENOENT ? std::string("install Python 3 and the plotting modules: ") + kInstallHint
                                     : std::string());
  }
  if (output) {
    char buf[4096];
    while ((n = ::read(pipe_fd[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
      if (n > 0) output->append(buf, static_cast<std::size_t>(n));
  }
  close_all();
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      set_child_to_stop(0);
      throw Error(std::string("waitpid() failed: ") + std::strerror(errno));
    }
  set_child_to_stop(0);
  if (stop_signal_received()) throw Error("stopped by a signal: " + args[0] + " was stopped with it", "run it again");
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

// The report's own files, registered in the manifest before they are written.
std::vector<manifest::Entry> report_entries(const std::vector<std::string>& plots) {
  std::vector<manifest::Entry> e{{manifest::Kind::scratch, "report", kStaging},
                                 {manifest::Kind::dir, "report", "report_files"},
                                 {manifest::Kind::file, "report", "report.html"},
                                 {manifest::Kind::file, "report", "report.md"}};
  for (const auto& name : plots) e.push_back({manifest::Kind::file, "report", "report_files/" + name});
  return e;
}

// Moves a finished report from the staging folder into place: the new plots into report_files/ (the
// plots of an earlier report that the new one does not have are deleted, files fastudy did not write
// there are kept), then report.md and report.html; the staging folder is removed.
void publish(const fs::path& out, const fs::path& staging) {
  std::vector<std::string> plots;
  for (const auto& e : fs::directory_iterator(staging / "report_files")) plots.push_back(e.path().filename().string());
  std::sort(plots.begin(), plots.end());
  manifest::add(out.string(), report_entries(plots));
  const fs::path files = out / "report_files";
  fs::create_directories(files);
  const std::vector<manifest::Entry> listed = manifest::read(out.string()).value_or(std::vector<manifest::Entry>{});
  for (const auto& e : fs::directory_iterator(files)) {
    const std::string name = e.path().filename().string(), rel = "report_files/" + name;
    const bool ours = std::any_of(listed.begin(), listed.end(), [&](const manifest::Entry& m) {
      return m.job == "report" && manifest::covers(m, rel);
    });
    if (ours && e.is_regular_file() && !e.is_symlink() && !std::binary_search(plots.begin(), plots.end(), name))
      fs::remove(e.path());
  }
  for (const auto& name : plots) fs::rename(staging / "report_files" / name, files / name);
  fs::rename(staging / "report.md", out / "report.md");
  fs::rename(staging / "report.html", out / "report.html");
  fs::remove_all(staging);
}

// The results the report shows belong to the study as study.toml describes it (checked after their
// checksums): every output that records a configuration hash (the `# config_hash:` line of a CSV, the
// config_hash attribute of an .h5) records study.toml's, and every variant status.csv records as
// done has its checkpoints whole, in place and trained with its configuration in study.toml
// (first_damaged_checkpoint, as `fastudy status`). Throws Error naming the first file that does not.
void check_results_belong(const Study& st, const std::string& out_dir) {
  std::error_code ec;
  const std::string grid = shell_quote(st.file), out = shell_quote(out_dir);
  for (const char* name : kSealedOutputs) {
    const std::string file(name), path = (fs::path(out_dir) / file).string();
    if (file == "study.toml" || file == "variants.csv" || file == "status.csv" || !fs::exists(path, ec)) continue;
    std::string hash;
    if (file.size() > 3 && file.compare(file.size() - 3, 3, ".h5") == 0) {
      h5::File f = h5::File::open(path, false, nullptr);
      if (f.root().has_attr("config_hash")) hash = f.root().attr_string("config_hash");
    } else {
      hash = Provenance::parse(read_text_file(path)).config_hash;
    }
    if (hash.empty() || hash == st.hash) continue;
    const bool microbench = file.rfind("microbench", 0) == 0;
    throw Error(path + " was written for configuration " + hash + ", but the study's (study.toml) is " + st.hash +
                    ": it is stale, and the report would show it as this study's",
                microbench ? "compute it again: fastudy microbench " + grid + " --out " + out + " --resume"
                           : "compute it again: fastudy reduce " + out);
  }
  for (const StatusRow& row : read_status_csv((fs::path(out_dir) / "status.csv").string())) {
    const Variant* v = st.find_variant(row.variant);
    if (row.state != TaskState::done || !v) continue;
    const auto damage = first_damaged_checkpoint(out_dir, v->id, checkpoint_schedule(v->train.checkpoint_every, v->train.steps),
                                                 v->train.steps, v->hash);
    if (damage)
      throw Error("variant " + v->id + " is recorded as done, but " + damage->path + ": " + damage->problem,
                  "`fastudy status " + out + "` says how to repair it; then run reduce and the report again");
  }
}

void render(const Study& st, const std::string& out_dir) {
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
  check_results_belong(st, out_dir);
  // ... and the replays' and bisections' tables (fastudy replay, fastudy bisect).
  for (const char* dir : {"replays", "bisect"}) {
    if (!fs::is_directory(fs::path(out_dir) / dir, ec)) continue;
    for (const auto& e : fs::recursive_directory_iterator(fs::path(out_dir) / dir, ec)) {
      if (e.path().extension() == ".csv" && fs::exists(e.path().string() + ".crc", ec))
        verify_sealed(e.path().string(), std::string("run the ") + (dir[0] == 'r' ? "replay" : "bisect") + " again, then the report");
    }
  }
  const std::string python = find_python();
  const fs::path script = find_script();
  check_modules(python);

  // The renderer writes into a staging folder of its own: a failure, a signal or a full disk leaves
  // the report of before (or none) in place and nothing new beside it.
  const fs::path out(out_dir), staging = out / kStaging;
  manifest::add(out_dir, report_entries({}));
  if (fs::exists(fs::symlink_status(staging, ec))) {
    if (!fs::is_directory(fs::symlink_status(staging, ec)))
      throw Error(staging.string() + " exists and is not the folder fastudy makes there",
                  "move it away and run the report again");
    fs::remove_all(staging, ec);  // left by a report that was killed (never follows a symbolic link in it)
  }
  if (!fs::create_directory(staging, ec))
    throw Error("cannot create " + staging.string() + ": " + ec.message(), "check that the study directory is writable");
  log::debug("report: " + python + " " + script.string() + " " + out_dir + " --into " + staging.string());
  int rc = 0;
  try {
    rc = run_process({python, "-B", script.string(), out_dir, "--quiet", "--into", staging.string()}, nullptr);
  } catch (const Error& e) {
    fs::remove_all(staging, ec);
    if (stop_signal_received())
      throw Error(std::string(e.what()) + "; nothing was written (the report of before, if any, is unchanged)", e.hint());
    throw;
  }
  if (rc != 0) {
    fs::remove_all(staging, ec);
    if (rc == kRendererCannotWrite) throw SilentExit(kExitFailure);  // it printed the one line naming the disk
    throw Error("the report renderer failed (exit code " + std::to_string(rc) + "); nothing was written",
                "its message is above; rerun it alone with: FASTUDY_BIN=" + shell_quote(this_program()) + " " + python +
                    " " + script.string() + " " + out_dir);
  }
  try {
    publish(out, staging);
  } catch (const std::exception& e) {
    fs::remove_all(staging, ec);
    throw Error(std::string("cannot move the report into place in ") + out_dir + ": " + e.what(),
                "free space on the file system and run `fastudy report " + out_dir + "` again");
  }
  log::info("report: " + (out / "report.html").string() + " (self-contained; open it in a browser)");
  log::info("report: " + (out / "report.md").string() + ", plots as PNG and SVG in " + (out / "report_files").string());
}

}  // namespace

int job_report(JobContext& ctx) {
  if (ctx.world != nullptr) {
    on_root(*ctx.world, [&] { render(*ctx.study, ctx.out_dir); });
  } else {
    render(*ctx.study, ctx.out_dir);
  }
  return kExitOk;
}

}  // namespace fastudy
