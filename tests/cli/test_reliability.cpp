// Reliability of the command line (issue 15): one writer per study (the lock), verify before parse
// (byte flips and attribute tampering in checkpoints, deviation.h5, status.csv and study.toml are
// named errors, and --resume repairs damaged checkpoints to the clean result), and signals always
// stop the tool and its child process. Readiness is always an explicit event (a file appears); the
// tests assert that each fault really landed (the process was stopped, the file differs).
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "base/checksum.hpp"
#include "base/manifest.hpp"
#include "base/proc.hpp"
#include "fastudy/version.hpp"  // FASTUDY_TORCH_CUDA, FASTUDY_TORCH_SDPA, FASTUDY_TORCH_VERSION
#include "src/io/checkpoint.hpp"
#include "tests/cli/checkpoint_util.hpp"
#include "tests/cli/cli_util.hpp"

using namespace fastudy;
using namespace fastudy::test;
namespace fs = std::filesystem;

namespace {

// 16 bytes from `at` (clamped to the file) inverted: never equal to the original.
std::string flip16(std::string bytes, std::size_t at) {
  at = std::min(at, bytes.size() - std::min<std::size_t>(16, bytes.size()));
  for (std::size_t i = at; i < std::min(bytes.size(), at + 16); ++i) bytes[i] = static_cast<char>(~bytes[i]);
  return bytes;
}

// Every path under dir, relative, sorted.
std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) out.insert(fs::relative(e.path(), dir).string());
  return out;
}

// Polls `ready` until it holds (the readiness event) or the process `pid` ends or 120 s pass; true
// when ready. The sleep is the polling interval, not a synchronisation.
bool wait_until(const std::function<bool()>& ready, pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ready()) return true;
    int status = 0;
    if (pid > 0 && ::waitpid(pid, &status, WNOHANG) == pid) return ready();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

int exit_code_of(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
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

TEST(Integrity, ByteFlipsAndTamperingAreNamedAndResumeRepairs) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 4, 2));
  ASSERT_EQ(run_fastudy(grid + " --out " + a + " -q").code, 0);  // train and reduce
  std::map<std::string, std::map<std::string, std::string>> clean;
  for (const char* id : kIds) clean[id] = final_state(a, id, 4);
  const std::string clean_deviation = slurp(a + "/deviation.csv");

  // status.csv, deviation.h5 and study.toml with 16 bytes flipped (at two offsets, one for
  // study.toml; bench/reliability/byte_flips.py flips at 40+ offsets per file), and a damaged
  // sidecar, are named errors of the jobs that read them.
  struct Case {
    std::string file, command;
    int code;
  };
  for (const Case& c : {Case{"status.csv", "status " + a, 1}, Case{"deviation.h5", "report " + a, 1},
                        Case{"study.toml", "status " + a, 1}}) {
    const std::string path = a + "/" + c.file;
    const std::string bytes = slurp(path), side = slurp(checksum_path(path));
    for (std::size_t at : {bytes.size() / 3, bytes.size()}) {
      if (c.file == "study.toml" && at != bytes.size()) continue;  // one case: the suite stays quick
      SCOPED_TRACE(c.file + " at " + std::to_string(at));
      spit(path, flip16(bytes, at));
      ASSERT_NE(slurp(path), bytes);
      const RunResult r = run_fastudy(c.command);
      EXPECT_EQ(r.code, c.code) << r.output;
      EXPECT_NE(r.output.find(path + "': checksum mismatch"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("hint: "), std::string::npos) << r.output;
    }
    spit(path, bytes);
    if (c.file != "status.csv") continue;
    spit(checksum_path(path), flip16(side, 4));
    const RunResult r = run_fastudy(c.command);
    EXPECT_EQ(r.code, c.code) << r.output;
    EXPECT_NE(r.output.find("is damaged"), std::string::npos) << r.output;
    spit(checksum_path(path), side);
  }

  // A damaged status.csv on --resume is set aside and rebuilt from the checkpoints.
  const std::string status = slurp(a + "/status.csv");
  spit(a + "/status.csv", flip16(status, status.size() / 2));
  RunResult r = run_fastudy("train " + grid + " --out " + a + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("set aside as " + a + "/status.csv.set-aside-1"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(a + "/status.csv.set-aside-1"));
  r = run_fastudy("status " + a);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("4 variants: 4 done"), std::string::npos) << r.output;

  // An intermediate checkpoint with flipped bytes: reduce names it and a command that repairs it,
  // status no longer says done, --resume retrains from the last good checkpoint before it.
  const std::string mid = checkpoint_path(a, "flash-bf16", 2);
  const std::string mid_bytes = slurp(mid);
  spit(mid, flip16(mid_bytes, mid_bytes.size() / 2));
  r = run_fastudy("reduce " + a);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(mid), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fastudy train '"), std::string::npos) << r.output;
  r = run_fastudy("status " + a);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("3 done, 1 failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("repair: fastudy train '"), std::string::npos) << r.output;
  // Root attribute tampering (data_cursor, not covered by any dataset's crc32) in a final checkpoint.
  const std::string last = checkpoint_path(a, "baseline-fp32", 4);
  {
    const hid_t f = H5Fopen(last.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const hid_t attr = H5Aopen(f, "data_cursor", H5P_DEFAULT);
    ASSERT_GE(attr, 0);
    const std::int64_t cursor = 3;
    EXPECT_GE(H5Awrite(attr, H5T_NATIVE_INT64, &cursor), 0);
    H5Aclose(attr);
    H5Fclose(f);
  }
  EXPECT_TRUE(checkpoint_problem(last).has_value());
  r = run_fastudy("train " + grid + " --out " + a + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("requeue flash-bf16: checkpoint of step 2 was damaged"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("requeue baseline-fp32: checkpoint of step 4 was damaged"), std::string::npos) << r.output;
  for (const char* id : kIds) {
    SCOPED_TRACE(id);
    EXPECT_EQ(final_state(a, id, 4), clean[id]);
    for (auto s : list_checkpoint_steps(checkpoint_dir(a, id)))
      EXPECT_FALSE(checkpoint_problem(checkpoint_path(a, id, s)).has_value()) << s;
  }
  EXPECT_EQ(run_fastudy("status " + a).code, 0);
  ASSERT_EQ(run_fastudy("reduce " + a + " -q").code, 0);
  // The same distances as before the damage (the provenance header names another command).
  const std::string repaired = slurp(a + "/deviation.csv");
  EXPECT_TRUE(repaired.substr(repaired.find("\nstep")) == clean_deviation.substr(clean_deviation.find("\nstep")));
}

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

namespace {

// A grid of ci.toml's shape with `data` as its [data] section and `extra` appended.
std::string grid_with(const std::string& out, const std::string& data, const std::string& extra = "") {
  return "[study]\nname = \"pre\"\nout = \"" + out + "\"\nphases = [\"microbench\", \"train\", \"reduce\"]\n" +
         "[grid]\nseed = [1, 2]\n[model]\nvocab = 32\nd_model = 16\nheads = 2\nlayers = 1\nseq_len = 16\nmlp_ratio = 2\n" +
         "[data]\n" + data + "[train]\nsteps = 2\nbatch = 4\nwarmup = 1\ncheckpoint_every = 2\n" +
         "[attention]\nblock_q = 8\nblock_kv = 8\n" +
         "[microbench]\nformats = [\"fp32\"]\npolicies = [\"mixed\"]\nseq_lens = [16]\nhead_dims = [8]\nblocks = [[8, 8]]\n" +
         "loop_orders = [\"q_outer\"]\ntrials = 1\nheads = 1\n" + extra;
}

std::string little_endian(const std::vector<std::uint32_t>& ids, int width) {
  std::string bytes;
  for (auto id : ids)
    for (int b = 0; b < width; ++b) bytes += static_cast<char>((id >> (8 * b)) & 0xff);
  return bytes;
}

}  // namespace

TEST(Preflight, EveryDataProblemExitsTwoNamesItAndWritesNothing) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  std::vector<std::uint32_t> ids(200), big(200);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::uint32_t>(i % 30), big[i] = static_cast<std::uint32_t>(i % 40);
  dir.file("u16.bin", little_endian(ids, 2));
  dir.file("u32.bin", little_endian(ids, 4));
  dir.file("big.bin", little_endian(big, 2));
  dir.file("short.bin", little_endian(std::vector<std::uint32_t>(10, 1), 2));
  dir.file("odd.bin", little_endian(ids, 2) + "x");
  fs::create_directories(dir / "folder");
  struct Case {
    std::string data, message;
  };
  const std::string d = dir.str() + "/";
  int n = 0;
  for (const Case& c : {
           Case{"kind = \"tokens\"\npath = \"" + d + "missing.bin\"\n", "cannot open data file '" + d + "missing.bin': No such file"},
           Case{"kind = \"tokens\"\npath = \"" + d + "folder\"\n", "data file '" + d + "folder' is not a regular file (a directory)"},
           Case{"kind = \"tokens\"\npath = \"" + d + "short.bin\"\n", "holds 10 tokens, fewer than one sequence (seq_len + 1 = 17)"},
           Case{"kind = \"tokens\"\npath = \"" + d + "big.bin\"\n", "token id 32 at position 32 is >= [model] vocab = 32"},
           Case{"kind = \"tokens\"\npath = \"" + d + "u32.bin\"\n", "it looks like a file of uint32 ids; hint: set [data] token_bytes = 4"},
           Case{"kind = \"tokens\"\npath = \"" + d + "odd.bin\"\n", "401 bytes, not a whole number of uint16 token ids"},
           Case{"kind = \"tokens\"\ntoken_bytes = 4\npath = \"" + d + "u16.bin\"\n", "token id 65536 at position 0 is >= [model] vocab = 32"},
       }) {
    SCOPED_TRACE(c.data);
    const std::string grid = dir.file("g.toml", grid_with(out, c.data));
    // `run` (the microbench phase comes first in the grid) for even cases, `train` for odd ones, and
    // `plan` for two: every job that trains runs the same preflight (one process each keeps it quick).
    const std::string job = ++n % 2 == 0 ? "run" : "train";
    const RunResult r = run_fastudy(job + " " + grid);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("found 1 problem (nothing was run or written)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out)) << job << " wrote " << out;
    if (n > 2) continue;
    const RunResult plan = run_fastudy("plan " + grid);
    EXPECT_EQ(plan.code, 2) << plan.output;
    EXPECT_NE(plan.output.find("would stop before it starts"), std::string::npos) << plan.output;
    EXPECT_NE(plan.output.find(c.message), std::string::npos) << plan.output;
  }
  // The uint32 file with its width declared trains.
  const std::string grid = dir.file("g.toml", grid_with(out, "kind = \"tokens\"\ntoken_bytes = 4\npath = \"" + d + "u32.bin\"\n"));
  const RunResult r = run_fastudy("train " + grid + " -q");
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST(Preflight, ABadThreadCountStopsARunBeforeItsFirstPhase) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("g.toml", grid_with(out, "kind = \"synthetic\"\n"));
  for (const char* value : {"x", "0", "2.5"}) {
    const RunResult r = run_command("FASTUDY_TORCH_THREADS=" + std::string(value) + " " + FASTUDY_EXE + " " + grid);
    EXPECT_EQ(r.code, 2) << value << ": " << r.output;
    EXPECT_NE(r.output.find("FASTUDY_TORCH_THREADS = '" + std::string(value) + "' is not a thread count"),
              std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out)) << value << ": the microbench phase ran or study.toml was written";
  }
}

TEST(Preflight, WhatADeviceOrThisLibTorchCannotRunStopsTheRunNamingIt) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string base = grid_with(out, "kind = \"synthetic\"\n");
  auto with_axes = [&](const std::string& name, const std::string& axes) {
    std::string text = base;
    text.replace(text.find("seed = [1, 2]\n"), 14, "seed = [1, 2]\n" + axes);
    return dir.file(name, text);
  };
  struct Case {
    std::string args, message;
  };
  std::vector<Case> cases{
      {dir.file("g.toml", base) + " --device gpu", "--device gpu is not a device"},
      // Native fp16 needs a GPU: refused on the CPU on every machine.
      {with_axes("native.toml", "arithmetic = [\"native\"]\nprecision = [\"fp16\"]\n") + " --device cpu",
       "arithmetic = native with precision fp16 needs a GPU"},
      {with_axes("split.toml", "arithmetic = [\"emulated\", \"native\"]\nsplit_k = [2]\n") + " --device cpu",
       "split_k and layernorm are emulated arithmetic"},
  };
  if (!FASTUDY_TORCH_CUDA) {
    cases.push_back({dir.file("g2.toml", base) + " --device cuda", "needs a CUDA LibTorch; this build links LibTorch"});
  }
  if (!FASTUDY_TORCH_SDPA) {
    cases.push_back({with_axes("sdpa.toml", "attention = [\"flash\", \"sdpa_flash\"]\n"),
                     "needs LibTorch >= 2.3; this build links LibTorch " FASTUDY_TORCH_VERSION});
  }
  for (const Case& c : cases) {
    for (const char* job : {"run", "train"}) {
      const RunResult r = run_fastudy(std::string(job) + " " + c.args);
      EXPECT_EQ(r.code, 2) << job << " " << c.args << ": " << r.output;
      EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
      EXPECT_FALSE(fs::exists(out)) << job << " " << c.args << ": something was written";
    }
  }
  // The key of an unknown device is named with its position.
  std::string text = base;
  text.replace(text.find("steps = 2\n"), 10, "steps = 2\ndevice = \"gpu\"\n");
  const RunResult r = run_fastudy("train " + dir.file("bad.toml", text));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[train] device = \"gpu\" is unknown; allowed: auto, cpu, cuda"), std::string::npos) << r.output;
}

TEST(Preflight, LayoutMemoryDiskAndReportAllAtOnceBeforeAnythingIsWritten) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  // Tiny weights (checkpoints fit any disk) but activations of about 13 TB per rank.
  std::string text = grid_with(out, "kind = \"synthetic\"\n", "");
  text.replace(text.find("vocab = 32"), 10, "vocab = 65536");
  text.replace(text.find("seq_len = 16"), 12, "seq_len = 4096");
  text.replace(text.find("batch = 4\n"), 10, "batch = 4096\n");
  text.replace(text.find("seq_lens = [16]"), 15, "seq_lens = [32]");
  const std::string grid = dir.file("g.toml", text);
  std::string overridden = text;
  overridden.replace(overridden.find("[study]\n"), 8, "[study]\nmemory_check = false\n");
  const std::string grid_override = dir.file("o.toml", overridden);
  text.replace(text.find("steps = 2\n"), 10, "steps = 2\nranks_per_variant = 2\n");
  const std::string grid2 = dir.file("g2.toml", text);
  RunResult r = run_fastudy("train " + grid);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("of memory per rank while training (estimate), more than the"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[study] memory_check = false"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
  // The override: plan then finds nothing in the way.
  r = run_fastudy("plan " + grid_override);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("preflight: every check passed"), std::string::npos) << r.output;
  // Its time estimate would train a step that does not fit: plan says so instead of trying.
  EXPECT_NE(r.output.find("time estimate: not measured: a training step of"), std::string::npos) << r.output;
  // Under MPI with a layout that does not divide: both problems at once, exit 2 on every rank.
  r = run_fastudy_mpi(3, grid2 + " --out " + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("found 2 problems"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the job has 3 ranks, not a multiple of ranks_per_variant = 2"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out)) << "the microbench phase ran or study.toml was written";
  // The report phase's modules, checked up front too.
  std::string rtext = grid_with(out, "kind = \"synthetic\"\n");
  rtext.replace(rtext.find("\"reduce\"]"), 9, "\"reduce\", \"report\"]");
  const std::string rgrid = dir.file("r.toml", rtext);
  r = run_command("FASTUDY_PYTHON=/bin/false " + std::string(FASTUDY_EXE) + " " + rgrid);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("/bin/false failed to start"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
}

TEST(Slurm, PrintedCommandsAreShellQuotedAndQuotesRefusedInOutput) {
  TempDir dir;
  const std::string out = (dir / "o$(id)").string();  // a path a shell would expand if pasted unquoted
  const std::string grid = dir.file("g.toml", tiny_grid(out, 2, 2));
  RunResult r = run_fastudy("slurm " + grid + " --nodes 1 --ntasks-per-node 1 --time 00:10:00");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("submit it with: sbatch '" + out + "/fastudy.sbatch'"), std::string::npos) << r.output;
  const std::string script = slurp(out + "/fastudy.sbatch");
  EXPECT_NE(script.find("# Submit: sbatch '" + out + "/fastudy.sbatch'   Progress: fastudy status '" + out + "'"),
            std::string::npos) << script;
  // An #SBATCH line takes no quoting: an output directory with a quote is refused, nothing written.
  const std::string quoted = (dir / "it's").string();
  r = run_fastudy("slurm " + grid + " --out \"" + quoted + "\" --nodes 1 --ntasks-per-node 1 --time 00:10:00");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("a quote"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(quoted));
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

// Issue 28, item 13: usage mistakes are named before anything runs or is written (exit 2).
TEST(Usage, UnknownJobMissingStudyAndBadGracePeriodAreNamed) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 2, 2));
  RunResult r = run_fastudy("trian " + grid);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown job 'trian'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the jobs are run, plan, microbench, train, advise, replay, bisect, reduce, report, status, slurm"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("positional"), std::string::npos) << r.output;

  for (const char* job : {"status", "reduce", "report"}) {
    r = run_fastudy(std::string(job) + " " + a);
    EXPECT_EQ(r.code, 2) << job << ": " << r.output;
    EXPECT_NE(r.output.find(a + " does not exist"), std::string::npos) << job << ": " << r.output;
    EXPECT_EQ(r.output.find("grid file'"), std::string::npos) << r.output;
  }
  EXPECT_FALSE(fs::exists(a));

  for (const char* value : {"abc", "-1", "1.5", "86400", "", "99999999999999999999"}) {
    r = run_command("FASTUDY_STOP_GRACE_S='" + std::string(value) + "' " + FASTUDY_EXE + " train " + grid);
    EXPECT_EQ(r.code, 2) << value << ": " << r.output;
    EXPECT_NE(r.output.find("FASTUDY_STOP_GRACE_S = '" + std::string(value) + "' is not a number of seconds"),
              std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(a)) << value;
  }
  r = run_command("FASTUDY_STOP_GRACE_S=0 " + std::string(FASTUDY_EXE) + " status " + grid);
  EXPECT_NE(r.output.find("no status file"), std::string::npos) << r.output;  // 0 is accepted
}

// Issue 28, item 10: a status.csv that cannot be read back (a directory in its place, malformed
// rows under a valid checksum) is set aside, never deleted, and --resume rebuilds it, under MPI too.
TEST(Resume, StatusCsvReplacedByADirectoryIsSetAsideAndRebuilt) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 2, 2));
  ASSERT_EQ(run_fastudy("train " + grid + " -q").code, 0);
  const std::string status = a + "/status.csv";
  fs::remove(status);
  fs::create_directories(status);
  spit(status + "/note.txt", "mine");
  RunResult r = run_fastudy_mpi(2, "train " + grid + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(status + ": not a regular file; set aside as " + status + ".set-aside-1"), std::string::npos) << r.output;
  EXPECT_EQ(slurp(status + ".set-aside-1/note.txt"), "mine");
  EXPECT_TRUE(fs::exists(status + ".set-aside-1.crc"));  // the sidecar went with it
  EXPECT_FALSE(checksum_problem(status).has_value());
  r = run_fastudy("status " + a);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("4 variants: 4 done"), std::string::npos) << r.output;

  // Malformed rows with a checksum that matches them: read back, refused, set aside, rebuilt.
  spit(status, "variant,state,step,loss,wall_time_s,reason\nbaseline-fp32,done\n");
  write_checksum(status);
  r = run_fastudy("status " + a);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("expected 6 fields"), std::string::npos) << r.output;
  r = run_fastudy("train " + grid + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("set aside as " + status + ".set-aside-2"), std::string::npos) << r.output;
  EXPECT_EQ(run_fastudy("status " + a).code, 0);
}

// Issue 28, item 11: -q never hides why a job failed.
TEST(Quiet, AFailedVariantIsAnErrorLineUnderQuiet) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 2, 2));
  ASSERT_EQ(run_fastudy("train " + grid + " -q").code, 0);
  // flash-fp32's checkpoint says it was trained with another configuration: that variant fails on
  // --resume (without --force, which would retrain it).
  retag(checkpoint_path(a, "flash-fp32", 2), "config_hash", "00000000deadbeef");
  for (const std::string& args : {"train " + grid + " --resume -q", grid + " --resume -q"}) {
    const RunResult r = run_fastudy(args);
    EXPECT_EQ(r.code, 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << args << ": " << r.output;
    EXPECT_NE(r.output.find("flash-fp32 failed at step 0: checkpoint"), std::string::npos) << args << ": " << r.output;
  }
  const RunResult r = run_fastudy("status " + a + " -q");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("error: 1 of 4 variants failed or diverged"), std::string::npos) << r.output;
}

namespace {

// Every regular file and symbolic link under dir (relative) with its bytes (a link: "-> target").
std::map<std::string, std::string> contents(const std::string& dir) {
  std::map<std::string, std::string> m;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    const std::string rel = e.path().lexically_relative(dir).string();
    if (e.is_symlink()) m[rel] = "-> " + fs::read_symlink(e.path()).string();
    else if (e.is_regular_file()) m[rel] = slurp(e.path().string());
  }
  return m;
}

}  // namespace

// Issue 28, item 2: --force deletes only what fastudy wrote, as the study's manifest lists it. A
// folder whose study.toml fastudy did not write (a fake, or the user's own grid with --out .), a study
// without a manifest, and one whose manifest is damaged or lists a path outside the study are refused
// (exit 2) and nothing in them changes.
TEST(Force, RefusesWhatHasNoManifestAndDeletesNothing) {
  TempDir dir;
  const std::string fake = (dir / "fake").string();
  fs::create_directories(fake + "/data");
  spit(fake + "/study.toml", "[study]\nname = \"not fastudy's\"\n");
  spit(fake + "/thesis.tex", "\\documentclass{article}");
  spit(fake + "/data/x.csv", "1,2\n");
  const std::string grid = dir.file("g.toml", tiny_grid(fake, 2, 2));
  const auto fake_before = contents(fake);
  for (const std::string& args : {"train " + grid + " --force", grid + " --force", "microbench " + grid + " --force",
                                  "slurm " + grid + " --time 00:10:00 --force"}) {
    const RunResult r = run_fastudy(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find("holds a study without fastudy.manifest"), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(contents(fake), fake_before) << args;
  }

  // `cd project && fastudy study.toml --out . --force`, the user's grid being called study.toml.
  const std::string project = (dir / "project").string();
  fs::create_directories(project + "/src");
  spit(project + "/study.toml", tiny_grid("unused", 2, 2));
  spit(project + "/README", "mine");
  spit(project + "/src/main.c", "int main() {}");
  const auto project_before = contents(project);
  RunResult r = run_command("cd " + project + " && " + FASTUDY_EXE + " study.toml --out . --force");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("holds a study without fastudy.manifest"), std::string::npos) << r.output;
  EXPECT_EQ(contents(project), project_before);

  // A real study whose manifest is missing, damaged, or lists a path outside the study.
  const std::string a = (dir / "a").string();
  const std::string real = dir.file("r.toml", tiny_grid(a, 2, 2));
  ASSERT_EQ(run_fastudy("train " + real + " -q").code, 0);
  const std::string manifest = a + "/fastudy.manifest", outside = dir.file("outside.txt", "keep me");
  const std::string text = slurp(manifest), side = slurp(checksum_path(manifest));
  struct Case {
    std::string name, message;
    std::function<void()> make;
  };
  for (const Case& c : {Case{"missing", "holds a study without fastudy.manifest", [&] { fs::remove(manifest); }},
                        Case{"damaged", "checksum mismatch", [&] { spit(manifest, flip16(text, text.size() / 2)); }},
                        Case{"outside", "not an entry fastudy writes: file train ../outside.txt",
                             [&] {
                               spit(manifest, text + "file train ../outside.txt\n");
                               write_checksum(manifest);
                             }}}) {
    SCOPED_TRACE(c.name);
    c.make();
    const auto before = contents(a);
    r = run_fastudy("train " + real + " --force");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("deletes nothing"), std::string::npos) << r.output;
    EXPECT_EQ(contents(a), before);
    EXPECT_EQ(slurp(outside), "keep me");
    spit(manifest, text);
    spit(checksum_path(manifest), side);
  }
}

// Issue 28, item 2: --force means the same in every job: the files that job wrote (for `run`, every
// file fastudy wrote) are deleted, as the manifest lists them, and nothing else: notes a user put in
// the study, a symbolic link with a checkpoint's name, files of the other jobs. The study folder stays.
// After every phase, the report and the sbatch script, the manifest covers every file fastudy wrote.
TEST(Force, DeletesOnlyTheFilesTheJobWroteInEveryJob) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 4, 2));
  ASSERT_EQ(run_fastudy(grid + " -q").code, 0);  // train and reduce
  ASSERT_EQ(run_fastudy("report " + a + " -q").code, 0);
  ASSERT_EQ(run_fastudy("slurm " + grid + " --time 00:10:00 --resume -q").code, 0);
  std::map<std::string, std::map<std::string, std::string>> clean;
  for (const char* id : kIds) clean[id] = final_state(a, id, 4);

  // Every file fastudy wrote is listed (a writer that forgets to register shows up here).
  auto listed = manifest::read(a);
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(manifest::unlisted(a, *listed), std::vector<std::string>{}) << "files fastudy wrote but did not list";

  // The user's things inside the study.
  const std::string outside = dir.file("outside.h5", "not a checkpoint");
  const std::string cdir = checkpoint_dir(a, "flash-fp32");
  spit(a + "/notes.txt", "my notes");
  fs::create_directories(a + "/data");
  spit(a + "/data/x.csv", "1\n");
  spit(a + "/variants/flash-fp32/mine.txt", "mine");
  spit(cdir + "/my_step.h5", "mine");
  spit(a + "/report_files/figure_of_mine.pdf", "mine");
  fs::create_symlink(outside, cdir + "/step_0000099.h5");
  const auto theirs = [&] {
    auto all = contents(a);
    std::map<std::string, std::string> m;
    for (const auto& [rel, bytes] : all)
      if ((std::none_of(listed->begin(), listed->end(), [&](const manifest::Entry& e) { return manifest::covers(e, rel); }) &&
           rel.rfind(manifest::kName, 0) != 0) ||
          rel == "checkpoints/flash-fp32/step_0000099.h5")
        m[rel] = bytes;
    return m;
  };
  const auto user = theirs();
  ASSERT_EQ(user.size(), 6u);
  const auto of = [&](const std::string& job) {
    std::set<std::string> files;
    for (const auto& [rel, bytes] : contents(a))
      if (std::any_of(listed->begin(), listed->end(), [&](const manifest::Entry& e) { return e.job == job && manifest::covers(e, rel); }) &&
          !user.count(rel))
        files.insert(rel);
    return files;
  };

  // reduce --force: the reduce phase's files are deleted and written again; the checkpoints stay.
  const auto checkpoints_before = contents(a + "/checkpoints");
  spit(a + "/deviation.csv.tmp.dead-0", "left by a killed reduce");
  RunResult r = run_fastudy("reduce " + a + " --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--force: deleted 13 file(s) and folder(s) that `reduce` wrote"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(a + "/deviation.csv.tmp.dead-0"));
  EXPECT_TRUE(fs::exists(a + "/deviation.csv"));
  EXPECT_EQ(contents(a + "/checkpoints"), checkpoints_before);
  EXPECT_EQ(theirs(), user);

  // report --force: the plots of the report are deleted and written again; the user's pdf stays.
  r = run_fastudy("report " + a + " --force -q");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(theirs(), user);
  EXPECT_TRUE(fs::exists(a + "/report.html"));

  // train --force under MPI: the train phase's files only; reduce's, the report's and the user's stay.
  const auto reduce_files = of("reduce"), report_files = of("report");
  r = run_fastudy_mpi(2, "train " + grid + " --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("that `train` wrote"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kept 5 item(s) fastudy did not write: checkpoints/flash-fp32/my_step.h5, data, notes.txt, "
                          "report_files/figure_of_mine.pdf, variants/flash-fp32/mine.txt"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("warning: --force: kept " + cdir + "/step_0000099.h5: it is not what fastudy wrote there"),
            std::string::npos) << r.output;
  EXPECT_EQ(of("reduce"), reduce_files);
  EXPECT_EQ(of("report"), report_files);
  EXPECT_EQ(theirs(), user);
  for (const char* id : kIds) EXPECT_EQ(final_state(a, id, 4), clean[id]) << id;
  EXPECT_EQ(slurp(outside), "not a checkpoint");

  // run --force: every file fastudy wrote, and only those; the study folder itself stays.
  r = run_fastudy(grid + " --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("that `fastudy` wrote"), std::string::npos) << r.output;
  EXPECT_EQ(theirs(), user);
  EXPECT_FALSE(fs::exists(a + "/report.html")) << "run --force deletes the report of before";
  EXPECT_FALSE(fs::exists(a + "/fastudy.sbatch"));
  for (const char* id : kIds) EXPECT_EQ(final_state(a, id, 4), clean[id]) << id;
  EXPECT_EQ(slurp(outside), "not a checkpoint");
  // What the jobs wrote again is listed again: only the user's things are not.
  ASSERT_EQ(run_fastudy("report " + a + " -q").code, 0);
  listed = manifest::read(a);
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(manifest::unlisted(a, *listed),
            (std::vector<std::string>{"checkpoints/flash-fp32/my_step.h5", "data", "data/x.csv", "notes.txt",
                                      "report_files/figure_of_mine.pdf", "variants/flash-fp32/mine.txt"}));
}

// Issue 28, item 2: microbench --force redoes the microbench (only its two files), never the
// checkpoints; its "already complete" line names exactly what --force replaces.
TEST(Force, MicrobenchForceKeepsTheCheckpoints) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("g.toml", grid_with(out, "kind = \"synthetic\"\n"));
  ASSERT_EQ(run_fastudy(grid + " -q").code, 0);
  const auto checkpoints = contents(out + "/checkpoints");
  ASSERT_FALSE(checkpoints.empty());
  RunResult r = run_fastudy("microbench " + grid + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("replacing only microbench.csv and microbench.h5"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--force reruns it"), std::string::npos) << r.output;
  const std::string before = slurp(out + "/microbench.csv");
  r = run_fastudy("microbench " + grid + " --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--force: deleted 4 file(s) and folder(s) that `microbench` wrote"), std::string::npos) << r.output;
  EXPECT_EQ(contents(out + "/checkpoints"), checkpoints);
  EXPECT_TRUE(fs::exists(out + "/status.csv"));
  EXPECT_NE(slurp(out + "/microbench.csv"), before);  // written again (its header names the new command)
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

// Issue 28, item 2: `train --variant V --force` redoes V only: its files go, the other variants'
// checkpoints stay byte for byte (they are not trained again), and the study goes on.
TEST(Force, TrainOneVariantForceKeepsTheOthers) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 4, 2));
  ASSERT_EQ(run_fastudy("train " + grid + " -q").code, 0);
  const auto clean = final_state(a, "flash-fp32", 4);
  std::map<std::string, std::map<std::string, std::string>> others;
  for (const char* id : {"baseline-fp32", "baseline-bf16", "flash-bf16"}) others[id] = contents(checkpoint_dir(a, id));
  spit(checkpoint_dir(a, "flash-fp32") + "/mine.txt", "mine");
  const RunResult r = run_fastudy("train " + grid + " --variant flash-fp32 --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--force: deleted 6 file(s) and folder(s) that `train --variant flash-fp32` wrote"), std::string::npos)
      << r.output;
  for (const auto& [id, files] : others) EXPECT_EQ(contents(checkpoint_dir(a, id)), files) << id;
  EXPECT_EQ(final_state(a, "flash-fp32", 4), clean);
  EXPECT_EQ(slurp(checkpoint_dir(a, "flash-fp32") + "/mine.txt"), "mine");
  const RunResult s = run_fastudy("status " + a);
  EXPECT_EQ(s.code, 0) << s.output;
  EXPECT_NE(s.output.find("4 variants: 4 done"), std::string::npos) << s.output;
}
