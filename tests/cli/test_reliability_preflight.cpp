// Reliability of the command line, what is checked before work starts (suites Preflight and Usage):
// bad data, thread counts, what this device or LibTorch cannot run, layout, memory and disk stop a run
// before its first phase, naming the problem, exit 2 and nothing written; usage mistakes likewise.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fastudy/version.hpp"  // FASTUDY_TORCH_CUDA, FASTUDY_TORCH_SDPA, FASTUDY_TORCH_VERSION
#include "tests/cli/reliability_util.hpp"

using namespace fastudy;
using namespace fastudy::test;
namespace fs = std::filesystem;

namespace {

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
