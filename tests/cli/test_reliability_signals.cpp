// Reliability of the command line under signals (suite Signals): SIGTERM, SIGINT and kill -9 always stop
// the tool and its child process (the report's renderer, a stand-in here), a second SIGTERM or the grace
// period ends a hung job, and the renderer starts as fastudy's own child with clean signal state.
// Readiness is always an explicit event (a file appears); the tests assert that each fault really
// landed.
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/manifest.hpp"
#include "base/proc.hpp"
#include "tests/cli/reliability_util.hpp"

using namespace fastudy;
using namespace fastudy::test;
namespace fs = std::filesystem;

namespace {

// A study directory (study.toml only, from `fastudy slurm`) and a stand-in for the report's Python:
// it passes the module check, writes its pid to DIR/ready when it starts rendering, then runs `body`.
struct FakeRenderer {
  TempDir dir;
  std::string out, ready;
  explicit FakeRenderer(const std::string& body) {
    out = (dir / "o").string();
    ready = (dir / "ready").string();
    const std::string grid = dir.file("g.toml", tiny_grid(out, 2, 2));
    const RunResult r = run_fastudy("slurm " + grid + " --nodes 1 --ntasks-per-node 1 --time 00:10:00 -q");
    EXPECT_EQ(r.code, 0) << r.output;
    const std::string script = dir.file("python", "#!/bin/sh\n[ \"$1\" = \"-c\" ] && exit 0\n" + body +
                                                      "\necho $$ > " + ready + ".tmp && mv " + ready + ".tmp " + ready +
                                                      "\nwhile :; do sleep 0.05; done\n");
    fs::permissions(script, fs::perms::owner_all);
    ::setenv("FASTUDY_PYTHON", script.c_str(), 1);
  }
  ~FakeRenderer() { ::unsetenv("FASTUDY_PYTHON"); ::unsetenv("FASTUDY_STOP_GRACE_S"); }
  long child() const { return std::stol(slurp(ready)); }
};

// True once `pid` is gone or a zombie (the orphaned renderer waits for init to reap it).
bool process_ended(long pid) {
  const std::string state = proc_stat_field(pid, 3);
  return state.empty() || state == "Z" || state == "X";
}

}  // namespace

TEST(Signals, SigtermStopsTheReportAndItsRenderer) {
  FakeRenderer fake("");
  const pid_t pid = spawn_fastudy({"report", fake.out});
  ASSERT_TRUE(wait_until([&] { return fs::exists(fake.ready); }, pid)) << "the renderer never started";
  const long child = fake.child();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  EXPECT_EQ(exit_code_of(pid), 1);
  EXPECT_TRUE(process_ended(child));
  EXPECT_FALSE(fs::exists(fake.out + "/report.html"));
  EXPECT_FALSE(fs::exists(fake.out + "/fastudy.lock"));
}

TEST(Signals, SecondSigtermEndsAJobWhoseChildIgnoresTheFirst) {
  FakeRenderer fake("trap 'echo term >> " + std::string("$0.term") + "' TERM");
  ::setenv("FASTUDY_STOP_GRACE_S", "0", 1);  // no deadline: only the second signal can end it
  const pid_t pid = spawn_fastudy({"report", fake.out});
  ASSERT_TRUE(wait_until([&] { return fs::exists(fake.ready); }, pid)) << "the renderer never started";
  const long child = fake.child();
  const std::string seen = (fake.dir / "python.term").string();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  // Ready: the renderer got the forwarded SIGTERM (and ignored it), so fastudy has taken the first.
  ASSERT_TRUE(wait_until([&] { return fs::exists(seen); }, pid)) << "the first SIGTERM was not forwarded";
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  EXPECT_EQ(exit_code_of(pid), 143);
  EXPECT_TRUE(wait_until([&] { return process_ended(child); }, -1));
  EXPECT_FALSE(fs::exists(fake.out + "/fastudy.lock"));
}

TEST(Signals, GracePeriodAfterTheFirstSigtermEndsAHungJob) {
  FakeRenderer fake("trap '' TERM");
  ::setenv("FASTUDY_STOP_GRACE_S", "1", 1);
  const pid_t pid = spawn_fastudy({"report", fake.out});
  ASSERT_TRUE(wait_until([&] { return fs::exists(fake.ready); }, pid)) << "the renderer never started";
  const long child = fake.child();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  EXPECT_EQ(exit_code_of(pid), 143);
  EXPECT_TRUE(wait_until([&] { return process_ended(child); }, -1));
}

// Issue 28, item 12: the renderer writes into a staging folder; a stop signal (the terminal's SIGINT)
// while it runs leaves the study as it was: no new plot in report_files/, no report.html, no staging
// folder, and the message that says nothing was written is then true.
TEST(Signals, SigintDuringTheReportWritesNothing) {
  // The stand-in writes a plot into the folder it was given (--into DIR) before it says it is ready.
  FakeRenderer fake("[ \"$5\" = --into ] && mkdir -p \"$6/report_files\" && echo png > \"$6/report_files/new.png\"");
  // fastudy with its output in a file, to read its message.
  const std::string log = (fake.dir / "report.log").string();
  const pid_t pid = spawn_logged({FASTUDY_EXE, "report", fake.out}, log);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_until([&] { return fs::exists(fake.ready); }, pid)) << "the renderer never started";
  const std::string staged = fake.out + "/report.staging/report_files/new.png";
  ASSERT_TRUE(fs::exists(staged)) << "the renderer was not given the staging folder";  // the fault is in place
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  EXPECT_EQ(exit_code_of(pid), 1);
  const std::string output = slurp(log);
  EXPECT_NE(output.find("stopped by a signal"), std::string::npos) << output;
  EXPECT_NE(output.find("nothing was written"), std::string::npos) << output;
  EXPECT_FALSE(fs::exists(fake.out + "/report_files/new.png"));
  EXPECT_FALSE(fs::exists(fake.out + "/report.staging"));
  EXPECT_FALSE(fs::exists(fake.out + "/report.html"));
  EXPECT_FALSE(fs::exists(fake.out + "/fastudy.lock"));
}

// Issue 28, item 12: after kill -9 of `fastudy report`, its renderer does not go on writing: the kernel
// ends it with its parent (PR_SET_PDEATHSIG). The stand-in renderer never ends by itself, so only that
// can stop it. The staging folder it leaves is fastudy's (listed in the manifest): the next report or
// --force removes it.
TEST(Signals, KillNineOfTheReportEndsItsRenderer) {
  FakeRenderer fake("");
  const pid_t pid = spawn_fastudy({"report", fake.out});
  ASSERT_TRUE(wait_until([&] { return fs::exists(fake.ready); }, pid)) << "the renderer never started";
  const long child = fake.child();
  ASSERT_FALSE(process_ended(child)) << "the renderer ended before fastudy was killed";
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  EXPECT_EQ(exit_code_of(pid), 128 + SIGKILL);
  EXPECT_TRUE(wait_until([&] { return process_ended(child); }, -1)) << "the renderer outlived fastudy";
  const auto listed = manifest::read(fake.out);
  ASSERT_TRUE(listed.has_value());
  EXPECT_TRUE(std::any_of(listed->begin(), listed->end(), [](const manifest::Entry& e) {
    return e.path == "report.staging" && e.kind == manifest::Kind::scratch;
  }));
}

// The renderer is fastudy's own child (started through fastudy-spawn, which becomes it), and it starts
// clean, whatever fastudy inherited or set: no signal blocked, the stop signals and SIGPIPE at their
// defaults (posix_spawn's attributes; a plain fork or vfork and exec would pass the mask and the
// ignored signals on). fastudy is started here with SIGUSR2 blocked and SIGPIPE, SIGUSR1 ignored.
TEST(Signals, TheRendererStartsAsFastudysChildWithCleanSignals) {
  // The stand-in reads its own status with the shell's `read` (a child process would show the mask
  // the shell sets while it waits for one).
  FakeRenderer fake("while IFS= read -r l; do case \"$l\" in SigBlk*|SigIgn*|PPid*) echo \"$l\";; esac; done "
                    "< /proc/self/status > \"$0.status.tmp\" && mv \"$0.status.tmp\" \"$0.status\"");
  std::vector<std::string> args{FASTUDY_EXE, "report", fake.out, "-q"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGUSR2);
  posix_spawnattr_setsigmask(&attr, &blocked);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  struct sigaction ignore {}, old_pipe {}, old_usr1 {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &old_pipe);  // ignored signals stay ignored across exec
  ::sigaction(SIGUSR1, &ignore, &old_usr1);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, FASTUDY_EXE, nullptr, &attr, argv.data(), environ);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  ::sigaction(SIGUSR1, &old_usr1, nullptr);
  posix_spawnattr_destroy(&attr);
  ASSERT_EQ(rc, 0);
  const std::string status = (fake.dir / "python.status").string();
  ASSERT_TRUE(wait_until([&] { return fs::exists(fake.ready) && fs::exists(status); }, pid)) << "the renderer never started";
  const std::string text = slurp(status);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  EXPECT_EQ(exit_code_of(pid), 1);
  EXPECT_NE(text.find("PPid:\t" + std::to_string(pid) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("SigBlk:\t0000000000000000\n"), std::string::npos) << text;
  const auto ign = text.find("SigIgn:\t");
  ASSERT_NE(ign, std::string::npos) << text;
  const unsigned long long ignored = std::stoull(text.substr(ign + 8, 16), nullptr, 16);
  for (int sig : {SIGPIPE, SIGUSR1, SIGTERM, SIGINT})
    EXPECT_EQ(ignored & (1ULL << (sig - 1)), 0ULL) << "signal " << sig << " is ignored in the renderer: " << text;
}

// An installation without fastudy-spawn beside the program: the report says so and how to fix it,
// before any renderer runs, and leaves nothing behind.
TEST(Signals, AMissingSpawnHelperIsNamed) {
  FakeRenderer fake("");
  const fs::path alone = fake.dir / "bin";
  fs::create_directories(alone);
  fs::copy_file(std::string(FASTUDY_BINARY_DIR) + "/fastudy-lite", alone / "fastudy-lite");
  const RunResult r = run_command((alone / "fastudy-lite").string() + " report " + fake.out);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("error: cannot start the report renderer: " + (alone / "fastudy-spawn").string() + " is missing"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("hint: build or install fastudy-spawn beside fastudy"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(fake.ready));
  EXPECT_FALSE(fs::exists(fake.out + "/report.staging"));
  EXPECT_FALSE(fs::exists(fake.out + "/fastudy.lock"));
}
