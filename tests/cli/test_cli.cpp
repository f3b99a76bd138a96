// The command line end to end: help, exit codes (0 ok, 1 runtime failure, 2 usage/config error with
// nothing written), plan output, the output-directory policy, and config errors under mpirun.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "fastudy/version.hpp"  // FASTUDY_CUDA_KERNELS, FASTUDY_TORCH_SDPA, FASTUDY_TORCH_CUDA
#include "kernels/attention.hpp"
#include "tests/cli/cli_util.hpp"

using namespace fastudy::test;
using fastudy::kReadings;
using fastudy::Reading;
namespace fs = std::filesystem;

namespace {
const std::string kConfigs = FASTUDY_CONFIGS;
}

TEST(Cli, HelpAndVersion) {
  RunResult r = run_fastudy("--help");
  EXPECT_EQ(r.code, 0) << r.output;
  for (const char* job : {"run", "plan", "microbench", "train", "reduce", "report", "status", "slurm"})
    EXPECT_NE(r.output.find(job), std::string::npos) << job;
  EXPECT_NE(r.output.find("exit codes"), std::string::npos);
  EXPECT_EQ(run_fastudy("").code, 2);
  RunResult v = run_fastudy("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.output.find("fastudy 0."), std::string::npos);
}

// `fastudy readings`: the readings table (kReadings) as text and as the JSON the report's renderer
// reads, answered without a grid; anything but --json is a usage error.
TEST(Cli, ReadingsListsEveryRowOfTheTable) {
  const RunResult text = run_fastudy("readings");
  EXPECT_EQ(text.code, 0) << text.output;
  const RunResult json = run_fastudy("readings --json");
  EXPECT_EQ(json.code, 0) << json.output;
  for (const Reading& r : kReadings) {
    EXPECT_NE(text.output.find("  " + std::string(r.name) + " "), std::string::npos) << r.name;
    EXPECT_NE(json.output.find("\"name\": \"" + std::string(r.name) + "\""), std::string::npos) << r.name;
    EXPECT_NE(json.output.find("\"report\": \"" + std::string(r.report) + "\""), std::string::npos) << r.name;
  }
  EXPECT_NE(text.output.find("source: Dao-AILab/flash-attention csrc/flash_attn/src"), std::string::npos) << text.output;
  EXPECT_NE(run_fastudy("--help").output.find("  readings    list the readings"), std::string::npos);
  const RunResult bad = run_fastudy("readings --csv");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("takes no argument but --json (got '--csv')"), std::string::npos) << bad.output;
}

TEST(Cli, EveryJobHasHelp) {
  for (const char* job : {"run", "plan", "microbench", "train", "reduce", "report", "status", "slurm"}) {
    RunResult r = run_fastudy(std::string(job) + " --help");
    EXPECT_EQ(r.code, 0) << job << ": " << r.output;
    EXPECT_NE(r.output.find("usage: fastudy"), std::string::npos) << job;
    EXPECT_NE(r.output.find("--out"), std::string::npos) << job;
  }
}

TEST(Cli, UsageErrorsExitTwo) {
  RunResult r = run_fastudy("plan " + kConfigs + "/quick.toml --bogus");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("bogus"), std::string::npos);
  r = run_fastudy("plan");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("needs"), std::string::npos);
  r = run_fastudy("plan /no/such/grid.toml");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("/no/such/grid.toml"), std::string::npos);
}

TEST(Cli, BadConfigExitsTwoAndWritesNothing) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("bad.toml", "[study]\nout = \"" + out + "\"\n[model]\nd_modle = 64\n");
  for (const char* job : {"run", "train", "microbench", "plan"}) {
    RunResult r = run_fastudy(std::string(job) + " " + grid);
    EXPECT_EQ(r.code, 2) << job << ": " << r.output;
    EXPECT_NE(r.output.find("bad.toml:4:1"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("did you mean `d_model`?"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out)) << job << " wrote " << out;
  }
}

// The real-kernel microbenchmark (docs/microbench.md "Real kernels") where it cannot run: refused with exit 2 before
// any work, naming the grid file, the key and the reason; nothing of the study is written.
TEST(Cli, MicrobenchRealKernelsRefusedWhereTheyCannotRun) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string head = "[study]\nout = \"" + out + "\"\nphases = [\"microbench\"]\n[microbench]\n"
                           "formats = [\"bf16\"]\npolicies = [\"mixed\"]\nseq_lens = [32]\nblocks = [[16, 16]]\n"
                           "trials = 1\n";
  const std::string cuda = dir.file("cuda.toml", head + "devices = [\"cpu\", \"cuda\"]\n");
  RunResult r = run_fastudy("microbench " + cuda);
  if (FASTUDY_CUDA_KERNELS && r.code == 0) GTEST_SKIP() << "a CUDA device is visible here: nothing to refuse";
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("cuda.toml"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("devices"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(FASTUDY_CUDA_KERNELS ? "needs a CUDA device, and rank 0 sees none" : "no CUDA kernels"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out)) << out;

  const std::string fw = dir.file("fw.toml", head + "framework = [\"sdpa_flash\"]\n");
  r = run_fastudy("microbench " + fw);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("fw.toml"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("framework"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out)) << out;
}

// `fastudy train --profile` (docs/gpu.md "Where the time goes"): one table per variant, the phases of
// the step with their host milliseconds, nested phases inside their parent's time, the checkpoint
// between steps; `--cuda-graph` on the CPU trains op by op and says why.
TEST(Cli, TrainProfilePrintsWhereTheStepsSpendTheirTime) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("g.toml", tiny_grid(out, 4, 2));
  RunResult r = run_fastudy("train " + grid + " --variant flash-bf16 --profile --cuda-graph --device cpu");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("profile of flash-bf16: ms per step over 3 step(s) after the first"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--cuda-graph ignored: it trains on the CPU"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("profile of baseline-fp32"), std::string::npos) << "only the variant asked for";
  // "  <phase>  <host ms>  [device ms]  <share>%": the numbers of each phase's first line.
  auto host_ms = [&](const std::string& phase) {
    const std::size_t at = r.output.find("\n  " + phase + " ", r.output.find("profile of flash-bf16"));
    if (at == std::string::npos) return -1.0;
    return std::stod(r.output.substr(r.output.find_first_not_of(' ', at + 3 + phase.size())));
  };
  const double step = host_ms("step"), forward = host_ms("  forward"), backward = host_ms("  backward");
  const double attention = host_ms("    attention"), roundings = host_ms("    roundings");
  const double optimizer = host_ms("  optimizer"), sync = host_ms("  host sync"), checkpoint = host_ms("checkpoint");
  for (double x : {step, forward, backward, attention, roundings, optimizer, sync, checkpoint})
    EXPECT_GT(x, 0.0) << r.output;
  EXPECT_LE(forward + backward + optimizer, step * 1.001) << r.output;  // parts of the step, printed to 3 decimals
  EXPECT_LE(attention, forward) << r.output;
  EXPECT_EQ(r.output.find("device", r.output.find("profile of flash-bf16")), std::string::npos)
      << "no device column on the CPU:\n" << r.output;
}

TEST(Cli, BadConfigUnderMpiExitsTwoOnceWithoutHanging) {
  TempDir dir;
  const std::string grid = dir.file("bad.toml", "[grid]\nprecision = [\"fp33\"]\n");
  RunResult r = run_fastudy_mpi(2, "train " + grid);
  EXPECT_EQ(r.code, 2) << r.output;
  const std::string needle = "bad.toml:2:";
  const auto first = r.output.find(needle);
  ASSERT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(needle, first + 1), std::string::npos) << "printed more than once:\n" << r.output;
}

// A fastudy started without mpirun keeps its Open MPI session directory to itself (src/runtime/mpi.cpp):
// concurrent singletons would otherwise share TMP/ompi.HOST.UID/jf.0/1/0, and the first to finish removes
// it under the others. A plain file where that shared folder goes stands in for the race: it makes every
// singleton that uses the shared folder fail in MPI_Init, every time. The private folder is gone after the
// command, and the user's own orte_top_session_dir still wins (then the blocked place fails as it should).
TEST(Cli, ASingletonKeepsItsOpenMpiSessionDirectoryToItself) {
  RunResult version = run_command(std::string(FASTUDY_MPIEXEC) + " --version");
  if (version.output.find("(OpenRTE) 4.") == std::string::npos && version.output.find("(Open MPI) 4.") == std::string::npos) {
    GTEST_SKIP() << "the session folders of Open MPI 4 only; this MPI: " << version.output;
  }
  TempDir dir;
  const std::string grid = dir.file("grid.toml",
                                    "[study]\nname = \"session\"\nout = \"" + (dir / "out").string() +
                                        "\"\nphases = [\"microbench\"]\n"
                                        "[grid]\nattention = [\"baseline\"]\nprecision = [\"fp32\"]\n"
                                        "[microbench]\nformats = [\"fp32\"]\npolicies = [\"mixed\"]\nseq_lens = [16]\n"
                                        "head_dims = [8]\nblocks = [[8, 8]]\nloop_orders = [\"q_outer\"]\n"
                                        "trials = 1\nheads = 1\n");
  const fs::path base = dir / "tmp";
  fs::create_directories(base);
  RunResult host = run_command("hostname -s; id -u");
  ASSERT_EQ(host.code, 0) << host.output;
  std::istringstream lines(host.output);
  std::string node, uid;
  lines >> node >> uid;
  const fs::path shared = base / ("ompi." + node + "." + uid);
  spit(shared.string(), "");  // a file where Open MPI's shared session folder would go

  const std::string env = "OMPI_MCA_orte_tmpdir_base='" + base.string() + "' ";
  RunResult r = run_command(env + FASTUDY_EXE + " " + grid + " -q");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "out" / "microbench.h5")) << r.output;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(base)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{shared.filename().string()}) << "the private session folder outlived the command";

  RunResult user = run_command(env + "OMPI_MCA_orte_top_session_dir='" + (shared / "mine").string() + "' " +
                               FASTUDY_EXE + " " + grid + " -q");
  EXPECT_NE(user.code, 0) << "the user's orte_top_session_dir was not used:\n" << user.output;
  EXPECT_NE(user.output.find("MPI_Init"), std::string::npos) << user.output;
}

TEST(Cli, PlanPrintsVariantsGroupsAndEstimates) {
  RunResult r = run_fastudy("plan " + kConfigs + "/quick.toml --ranks 4");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("= 18 variants"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("baseline-fp32-s1"), std::string::npos);
  EXPECT_NE(r.output.find("flash-bf16-s2"), std::string::npos);
  EXPECT_NE(r.output.find("ranks: 4 -> 4 groups of 1 rank"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("memory per rank"), std::string::npos);
  EXPECT_NE(r.output.find("checkpoints:"), std::string::npos);
}

// The time estimate: one step time per kind of variant (the seeds of a kind cost the same), and on
// one rank the phase is the sum over the variants of steps x their kind's step time.
TEST(Cli, PlanEstimatesTheTrainPhaseFromMeasuredStepTimes) {
  RunResult r = run_fastudy("plan " + kConfigs + "/quick.toml --ranks 1 --measure-steps 1");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto at = r.output.find("time estimate, train phase: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const double total = std::stod(r.output.substr(at + 28));
  std::istringstream lines(r.output.substr(at));
  std::string line;
  std::getline(lines, line);
  double sum_ms = 0;
  int kinds = 0;
  while (std::getline(lines, line) && line.rfind("  attention=", 0) == 0) {
    EXPECT_EQ(line.find("seed"), std::string::npos) << "seeds are replicates, not kinds: " << line;
    sum_ms += std::stod(line.substr(line.find(": ") + 2));
    ++kinds;
  }
  EXPECT_EQ(kinds, 6) << r.output;  // attention[2] x precision[3]
  const double want = 3 * 200 * sum_ms / 1e3;  // three seeds per kind, 200 steps each
  // Printed to 3 significant digits (ms, and s below 120 s; 1 s from there on): 1% and 0.5 s cover the rounding.
  EXPECT_NEAR(total, want, 0.01 * want + 0.5) << r.output;
  r = run_fastudy("plan " + kConfigs + "/quick.toml --measure-steps 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("time estimate"), std::string::npos) << r.output;
  r = run_fastudy("plan " + kConfigs + "/quick.toml --measure-steps -1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--measure-steps"), std::string::npos) << r.output;
}

TEST(Cli, PlanRejectsAnImpossibleRankLayout) {
  TempDir dir;
  const std::string grid = dir.file("g.toml", "[train]\nranks_per_variant = 2\n[grid]\nseed = [1, 2, 3]\n");
  RunResult r = run_fastudy("plan " + grid + " --ranks 3 --measure-steps 0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("ranks_per_variant = 2"), std::string::npos) << r.output;
  r = run_fastudy("plan " + grid + " --ranks 6 --measure-steps 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("ranks: 6 -> 3 groups of 2 ranks"), std::string::npos) << r.output;
}

// plan says which gradient reducer each group gets (src/runtime/placement.hpp), for the GPUs and
// nodes it is told of: ranks of a group that share a GPU average with MPI on host copies (NCCL takes
// one GPU per rank), a group whose ranks each have a GPU gets NCCL, a CPU group MPI.
TEST(Cli, PlanShowsEachGroupsReducer) {
  TempDir dir;
  // The train phase alone: plan's preflight then skips the report's Python modules (seconds a call).
  const std::string train = "[study]\nphases = [\"train\"]\n[grid]\nseed = [1, 2]\n";
  const std::string grid = dir.file("g.toml", train + "[train]\nranks_per_variant = 2\n");
  const std::string cpu = dir.file("cpu.toml", train + "[train]\nranks_per_variant = 2\ndevice = \"cpu\"\n");
  const std::string one = dir.file("one.toml", train);
  RunResult r = run_fastudy("plan " + grid + " --ranks 4 --gpus-per-node 1 --measure-steps 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("device: auto -> cuda, one GPU per rank by node-local rank, 1 GPU per node (--gpus-per-node)"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("gradient reducer of group 0 (ranks 0-1): mpi on host copies (ranks 0 and 1 share GPU 0 on "
                          "node0; NCCL takes one GPU per rank)\n"
                          "gradient reducer of group 1 (ranks 2-3): mpi on host copies (ranks 2 and 3 share GPU 0 on "
                          "node0; NCCL takes one GPU per rank)"),
            std::string::npos) << r.output;
  r = run_fastudy("plan " + grid + " --ranks 4 --gpus-per-node 2 --measure-steps 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("gradient reducer of group 1 (ranks 2-3): nccl (every rank on its own GPU)"), std::string::npos)
      << r.output;
  r = run_fastudy("plan " + grid + " --ranks 4 --gpus-per-node 1 --ranks-per-node 1 --measure-steps 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("nodes: 4 of 1 rank (--ranks-per-node)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("gradient reducer of group 0 (ranks 0-1): nccl (every rank on its own GPU)"), std::string::npos)
      << r.output;
  r = run_fastudy("plan " + cpu + " --ranks 2 --gpus-per-node 2 --measure-steps 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("gradient reducer of group 0 (ranks 0-1): mpi (the group trains on the CPU)"), std::string::npos)
      << r.output;
  r = run_fastudy("plan " + one + " --ranks 2 --gpus-per-node 1 --measure-steps 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("gradient reducer: none (one rank per variant: nothing to average)"), std::string::npos)
      << r.output;
  // On this machine, as it is: its GPUs (none on a CPU-only machine: the CPU and MPI).
  r = run_fastudy("plan " + grid + " --ranks 2 --measure-steps 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("gradient reducer of group 0 (ranks 0-1): "), std::string::npos) << r.output;
  for (const char* bad : {"--gpus-per-node=-1", "--ranks-per-node=0", "--ranks=0"}) {
    r = run_fastudy("plan " + grid + " " + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.output;
    EXPECT_NE(r.output.find(std::string(bad).substr(0, std::string(bad).find('=')) + " must be >= "), std::string::npos)
        << r.output;
  }
}

TEST(Cli, RefusesAForeignNonEmptyOutputDirectory) {
  TempDir dir;
  dir.file("precious.txt", "keep me");
  RunResult r = run_fastudy("train " + kConfigs + "/ci.toml --out " + dir.str() + " --force");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("holds no fastudy study"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "precious.txt"));
}

// base/hugepages: a process with FASTUDY_HUGEPAGES_AT_PREINIT() re-executes itself once with
// glibc.malloc.hugetlb=1, before its static initialisers run (they run once, in the new process), and
// its heap is then backed by huge pages; FASTUDY_HUGEPAGES=0 and a user's own GLIBC_TUNABLES setting
// of the tunable are respected.
// The `fastudy` launcher executes fastudy-main beside it (the same arguments); alone, it says which
// file is missing and exits 127.
TEST(Launcher, RunsTheProgramBesideItOrNamesTheMissingOne) {
  const fs::path exe = FASTUDY_EXE;
  ASSERT_TRUE(fs::exists(exe.parent_path() / "fastudy-main"));
  RunResult v = run_command(exe.string() + " --version");
  EXPECT_EQ(v.code, 0) << v.output;
  EXPECT_EQ(v.output.rfind("fastudy ", 0), 0u) << v.output;
  TempDir dir;
  fs::copy_file(exe, dir / "fastudy");
  RunResult alone = run_command((dir / "fastudy").string() + " --version");
  EXPECT_EQ(alone.code, 127) << alone.output;
  EXPECT_NE(alone.output.find((dir / "fastudy-main").string()), std::string::npos) << alone.output;
  EXPECT_NE(alone.output.find("hint:"), std::string::npos) << alone.output;
}

// The jobs that never train run in fastudy-lite, without LibTorch; every other command line reaches
// fastudy-main. With fastudy-main missing beside them, status still runs and train names the missing
// program; without fastudy-lite the launcher starts fastudy-main itself.
TEST(Launcher, JobsThatNeverTrainRunWithoutLibTorchTheRestReachTheFullProgram) {
  const fs::path exe = FASTUDY_EXE;
  const fs::path lite = exe.parent_path() / "fastudy-lite";
  ASSERT_TRUE(fs::exists(lite));
  RunResult needed = run_command("readelf -d " + lite.string());
  ASSERT_EQ(needed.code, 0) << needed.output;
  EXPECT_NE(needed.output.find("libmpi"), std::string::npos) << needed.output;  // the listing is real
  EXPECT_EQ(needed.output.find("libtorch"), std::string::npos) << "fastudy-lite loads LibTorch:\n" << needed.output;
  TempDir dir;
  fs::copy_file(exe, dir / "fastudy");
  fs::copy_file(lite, dir / "fastudy-lite");
  const std::string fastudy = (dir / "fastudy").string();
  RunResult status = run_command(fastudy + " status " + (dir / "no-study").string());
  EXPECT_EQ(status.code, 2) << status.output;
  EXPECT_NE(status.output.find("no-study"), std::string::npos) << status.output;
  for (const std::string& line : {"train " + std::string(FASTUDY_CONFIGS) + "/ci.toml", std::string(" --help"), std::string("")}) {
    RunResult other = run_command(fastudy + " " + line);
    EXPECT_EQ(other.code, 127) << line << ": " << other.output;
    EXPECT_NE(other.output.find((dir / "fastudy-main").string()), std::string::npos) << line << ": " << other.output;
  }
  fs::remove(dir / "fastudy-lite");
  fs::copy_file(exe.parent_path() / "fastudy-main", dir / "fastudy-main");
  RunResult full = run_command(fastudy + " status " + (dir / "no-study").string());
  EXPECT_EQ(full.code, 2) << full.output;
  EXPECT_NE(full.output.find("no-study"), std::string::npos) << full.output;
}

TEST(Hugepages, TheProcessReexecutesWithTheTunableAndGetsHugePages) {
  std::ifstream mode_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(mode_file, mode);
  if (mode.find("[madvise]") == std::string::npos)
    GTEST_SKIP() << "the kernel's transparent huge page mode is not madvise (" << mode << "): nothing to set";
  const std::string probe = FASTUDY_HUGEPAGES_PROBE;
  RunResult on = run_command("env -u GLIBC_TUNABLES -u FASTUDY_HUGEPAGES HUGEPAGES_PROBE_MARK=kept " + probe);
  ASSERT_EQ(on.code, 0) << on.output;
  EXPECT_NE(on.output.find("tunables=glibc.malloc.hugetlb=1\n"), std::string::npos) << on.output;
  EXPECT_NE(on.output.find("mark=kept\n"), std::string::npos) << "the environment was lost: " << on.output;
  const auto count = [](const std::string& out, const std::string& what) {
    std::size_t n = 0;
    for (auto at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(on.output, "initialiser ran"), 1u) << "the initialisers ran before the re-execution: " << on.output;
  EXPECT_EQ(count(on.output, "initialiser ran with tunables=glibc.malloc.hugetlb=1\n"), 1u) << on.output;
  const auto kb = [](const std::string& out) {
    const auto at = out.find("anon_huge_kb=");
    return at == std::string::npos ? -1L : std::stol(out.substr(at + 13));
  };
  EXPECT_GT(kb(on.output), 0) << "no huge page backs the 64 MiB buffer: " << on.output;
  RunResult off = run_command("env -u GLIBC_TUNABLES FASTUDY_HUGEPAGES=0 " + probe);
  ASSERT_EQ(off.code, 0) << off.output;
  EXPECT_NE(off.output.find("tunables=\n"), std::string::npos) << off.output;
  RunResult user = run_command("env -u FASTUDY_HUGEPAGES GLIBC_TUNABLES=glibc.malloc.hugetlb=0 " + probe);
  EXPECT_NE(user.output.find("tunables=glibc.malloc.hugetlb=0\n"), std::string::npos) << user.output;
  RunResult kept = run_command("env -u FASTUDY_HUGEPAGES GLIBC_TUNABLES=glibc.malloc.check=0 " + probe);
  EXPECT_NE(kept.output.find("tunables=glibc.malloc.check=0:glibc.malloc.hugetlb=1\n"), std::string::npos)
      << kept.output;
}
