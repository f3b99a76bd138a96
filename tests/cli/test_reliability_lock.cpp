// Reliability of the command line, one writer per study (suite Lock): a second writer is refused while
// the first runs, a live holder is named, a stale lock (or a zombie holder) is taken over, and a lock
// that is no record fastudy wrote is refused with the command that removes it, never cleared.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <set>
#include <string>

#include "base/proc.hpp"
#include "tests/cli/reliability_util.hpp"

using namespace fastudy;
using namespace fastudy::test;
namespace fs = std::filesystem;

namespace {

// Every path under dir, relative, sorted.
std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) out.insert(fs::relative(e.path(), dir).string());
  return out;
}

std::string host_name() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string lock_record(const std::string& host, long pid) {
  return "host=" + host + "\npid=" + std::to_string(pid) + "\nstart=\nsince=2026-01-01T00:00:00Z\ncommand=fastudy train held.toml\n";
}

}  // namespace

TEST(Lock, SecondWriterIsRefusedWhileTheFirstRunsAndTheFirstEqualsALoneRun) {
  TempDir dir;
  const std::string a = (dir / "a").string(), b = (dir / "b").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 4, 2));
  const pid_t first = spawn_fastudy({"train", grid, "--out", a});
  ASSERT_GT(first, 0);
  // Ready: the first run holds the lock and has written a checkpoint. Then it is frozen (SIGSTOP), so
  // the second writers meet it mid-run whatever the machine's load.
  ASSERT_TRUE(wait_until([&] { return fs::exists(a + "/fastudy.lock") && !list_checkpoint_steps(checkpoint_dir(a, kIds[0])).empty(); }, first))
      << "the first run never reached its first checkpoint";
  ASSERT_EQ(::kill(first, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(first, &status, WUNTRACED), first);
  ASSERT_TRUE(WIFSTOPPED(status)) << "the first run ended before the second writers came (status " << status << ")";

  for (const std::string& args : {"train " + grid + " --out " + a, "train " + grid + " --out " + a + " --resume",
                                 "train " + grid + " --out " + a + " --force", grid + " --out " + a + " --resume --force",
                                 "reduce " + a}) {
    SCOPED_TRACE(args);
    const RunResult r = run_fastudy(args);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("is being written by another fastudy job: pid " + std::to_string(first)), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("fastudy train"), std::string::npos) << r.output;  // the holder's command
  }
  const RunResult mpi = run_fastudy_mpi(2, "train " + grid + " --out " + a + " --resume");
  EXPECT_EQ(mpi.code, 2) << mpi.output;
  EXPECT_NE(mpi.output.find("pid " + std::to_string(first)), std::string::npos) << mpi.output;

  ASSERT_EQ(::kill(first, SIGCONT), 0);
  EXPECT_EQ(exit_code_of(first), 0);
  EXPECT_FALSE(fs::exists(a + "/fastudy.lock"));

  const RunResult lone = run_fastudy("train " + grid + " --out " + b + " -q");
  ASSERT_EQ(lone.code, 0) << lone.output;
  for (const char* id : kIds) {
    SCOPED_TRACE(id);
    EXPECT_EQ(final_state(a, id, 4), final_state(b, id, 4));
    EXPECT_EQ(list_checkpoint_steps(checkpoint_dir(a, id)), list_checkpoint_steps(checkpoint_dir(b, id)));
  }
  EXPECT_EQ(run_fastudy("status " + a).code, 0);
}

TEST(Lock, LiveHolderRefusedStaleTakenOverOtherHostNamed) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 2, 2));
  const std::string lock = a + "/fastudy.lock";
  fs::create_directories(a);

  // A live holder on this host (this test process): refused, nothing written.
  spit(lock, lock_record(host_name(), static_cast<long>(::getpid())));
  const auto before = listing(a);
  RunResult r = run_fastudy("train " + grid + " --out " + a + " --force");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("pid " + std::to_string(::getpid()) + " on host " + host_name() + " (fastudy train held.toml), since 2026-01-01T00:00:00Z"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kill " + std::to_string(::getpid())), std::string::npos) << r.output;
  EXPECT_EQ(listing(a), before);

  // A holder on another host: fastudy cannot tell whether it lives; refused with how to clear it.
  spit(lock, lock_record("elsewhere-node-7", 12));
  r = run_fastudy("train " + grid + " --out " + a + " --resume");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("host elsewhere-node-7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("remove " + lock), std::string::npos) << r.output;
  EXPECT_EQ(listing(a), before);

  // A holder on this host that is gone (a process that has exited): taken over with a warning.
  const pid_t gone = spawn_fastudy({"--version"});
  ASSERT_GT(gone, 0);
  ASSERT_EQ(exit_code_of(gone), 0);
  spit(lock, lock_record(host_name(), static_cast<long>(gone)));
  r = run_fastudy("train " + grid + " --out " + a);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("taking over the lock of " + a + " left by a job that is gone: pid " + std::to_string(gone)),
            std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(lock));
  EXPECT_TRUE(fs::exists(checkpoint_path(a, kIds[0], 2)));
}

// Issue 28, item 13: a lock that is no record fastudy wrote (empty, garbage, a symbolic link) is
// refused as unreadable with the command that removes it, and is never cleared; a holder that is a
// zombie (ended, not yet reaped) is gone and its lock is taken over.
TEST(Lock, UnreadableLocksAreNamedNeverClearedAndZombieHoldersAreGone) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 2, 2));
  const std::string lock = a + "/fastudy.lock";
  ASSERT_EQ(run_fastudy("train " + grid + " -q").code, 0);
  struct Case {
    std::string name, what;
    std::function<void()> make;
  };
  const std::string target = dir.file("elsewhere.txt", "host=x\npid=1\ncommand=y\n");
  for (const Case& c : {Case{"empty", "is unreadable (empty)", [&] { spit(lock, ""); }},
                        Case{"garbage", "is unreadable (not a record of host, pid and command)", [&] { spit(lock, "\x01\x02garbage\n"); }},
                        Case{"no pid", "is unreadable", [&] { spit(lock, "host=" + host_name() + "\npid=abc\n"); }},
                        Case{"symlink", "is a symbolic link", [&] { fs::create_symlink(target, lock); }},
                        Case{"dangling symlink", "is a symbolic link", [&] { fs::create_symlink(a + "/nowhere", lock); }}}) {
    SCOPED_TRACE(c.name);
    c.make();
    const auto before = listing(a);
    for (const std::string& args : {"train " + grid + " --resume", "reduce " + a}) {
      const RunResult r = run_fastudy(args);
      EXPECT_EQ(r.code, 2) << args << ": " << r.output;
      EXPECT_NE(r.output.find("the lock " + lock + " " + c.what), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("remove it (rm '" + lock + "')"), std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("pid ?"), std::string::npos) << r.output;
      EXPECT_EQ(listing(a), before) << args;
    }
    EXPECT_TRUE(fs::exists(fs::symlink_status(lock))) << "the lock was cleared";
    fs::remove(lock);
  }
  EXPECT_EQ(slurp(target), "host=x\npid=1\ncommand=y\n");

  // A zombie holder: the process has ended (state Z) but is not reaped, so kill(pid, 0) still
  // succeeds and its start time still matches.
  const pid_t zombie = spawn_fastudy({"--version"});
  ASSERT_GT(zombie, 0);
  ASSERT_TRUE(wait_until([&] { return proc_stat_field(zombie, 3) == "Z"; }, -1)) << "the child never became a zombie";
  const std::string start = proc_stat_field(zombie, 22);
  ASSERT_FALSE(start.empty());
  ASSERT_EQ(::kill(zombie, 0), 0) << "a zombie answers kill(pid, 0)";
  spit(lock, "host=" + host_name() + "\npid=" + std::to_string(zombie) + "\nstart=" + start +
                 "\nsince=2026-01-01T00:00:00Z\ncommand=fastudy train held.toml\n");
  const RunResult r = run_fastudy("train " + grid + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("taking over the lock of " + a + " left by a job that is gone: pid " + std::to_string(zombie)),
            std::string::npos) << r.output;
  EXPECT_EQ(exit_code_of(zombie), 0);
  EXPECT_FALSE(fs::exists(lock));
}
