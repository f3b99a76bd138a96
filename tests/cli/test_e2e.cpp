// End-to-end runs of the pipeline on tiny grids: train on 1 and 2 ranks, kill -9 and resume, reduce on
// 1, 2 and 4 ranks, W1 against scipy on real checkpoint tensors, corrupt checkpoints, changed grids.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "src/io/checkpoint.hpp"
#include "tests/cli/checkpoint_util.hpp"
#include "tests/cli/cli_util.hpp"

using namespace fastudy;
using namespace fastudy::test;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> data_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string l;
  while (std::getline(in, l))
    if (!l.empty() && l[0] != '#') out.push_back(l);
  return out;
}

}  // namespace

TEST(E2E, TrainOnOneAndTwoRanksGivesIdenticalWeightsAndReduceIsRankInvariant) {
  TempDir dir;
  const std::string a = (dir / "a").string(), b = (dir / "b").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 6, 3));
  // One rank on 3 LibTorch threads, two ranks on one thread each: the same weights.
  RunResult r = run_command("FASTUDY_TORCH_THREADS=3 " + std::string(FASTUDY_EXE) + " train " + grid + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_fastudy_mpi(2, "train " + grid + " --out " + b + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* id : kIds) {
    SCOPED_TRACE(id);
    EXPECT_EQ(final_state(a, id, 6), final_state(b, id, 6)) << "weights differ between 1 rank (3 threads) and 2 ranks";
  }
  RunResult st = run_fastudy("status " + a);
  EXPECT_EQ(st.code, 0);
  EXPECT_NE(st.output.find("4 variants: 4 done"), std::string::npos) << st.output;

  ASSERT_EQ(run_fastudy("reduce " + a + " -q").code, 0);
  const auto dev1 = data_lines(a + "/deviation.csv");
  const auto rank1 = data_lines(a + "/ranking.csv");
  ASSERT_GT(dev1.size(), 10u);
  // Several ranks sort the whole model by value range between them (analysis/sorted_exchange.hpp):
  // the same bits.
  for (int ranks : {2, 4}) {
    SCOPED_TRACE(ranks);
    RunResult rr = run_fastudy_mpi(ranks, "reduce " + a);
    ASSERT_EQ(rr.code, 0) << rr.output;
    EXPECT_EQ(data_lines(a + "/deviation.csv"), dev1);
    EXPECT_EQ(data_lines(a + "/ranking.csv"), rank1);
  }
  // `fastudy plan` knows the model's tensors before any checkpoint exists (model_tensor_sizes): those
  // of the trained checkpoints, and the pairs reduce computed (4 of the 6: the diagonal ones differ in
  // both axes).
  std::int64_t values = 0;
  const auto params = read_params(checkpoint_path(a, kIds[0], 6));
  for (const auto& p : params) values += p.numel();
  const RunResult plan = run_fastudy("plan " + grid + " --ranks 2 --measure-steps 0");
  ASSERT_EQ(plan.code, 0) << plan.output;
  EXPECT_NE(plan.output.find("reduce: 4 of 6 pairs (the verdict's) x 2 steps, " + std::to_string(params.size()) +
                             " tensors and the whole model, " + std::to_string(values) + " values per run and step"),
            std::string::npos) << plan.output;
  EXPECT_EQ(dev1.size(), 1 + 2 * (params.size() + 1) * 4);  // the header, then steps x tasks x pairs
  // Identical initial weights across attention/precision make flash-vs-baseline at fp32 tiny but nonzero.
  bool found = false;
  for (const auto& l : dev1)
    if (l.rfind("6,model,baseline-fp32,flash-fp32,", 0) == 0) found = true;
  EXPECT_TRUE(found);
}

TEST(E2E, W1MatchesScipyOnCheckpointTensors) {
  if (run_command("/usr/bin/python3 -c 'import scipy, h5py'").code != 0)
    GTEST_SKIP() << "python3-scipy or python3-h5py is not installed (apt-get install python3-scipy python3-h5py)";
  TempDir dir;
  const std::string out = (dir / "o").string();
  const std::string grid = dir.file("g.toml", tiny_grid(out, 4, 4));
  ASSERT_EQ(run_fastudy("train " + grid + " -q").code, 0);
  ASSERT_EQ(run_fastudy("reduce " + out + " -q").code, 0);
  RunResult r = run_command("/usr/bin/python3 " + std::string(FASTUDY_CLI_TESTS) + "/check_w1_scipy.py " + out);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("checked"), std::string::npos) << r.output;
}

// save_outputs (docs/microbench.md "Real kernels"): OUT/microbench_outputs.h5 holds every point's inputs, golden
// value and outputs, ours and LibTorch's, such that a user recomputes every row of microbench.csv from it
// bit for bit with h5py and numpy and reproduces torch_baseline with Python's PyTorch on the saved inputs
// (check_microbench_outputs.py); written collectively, it is the same file on 1, 2 and 4 ranks.
TEST(E2E, MicrobenchSavedOutputsReproduceTheRowsOnOneTwoAndFourRanks) {
  if (run_command("/usr/bin/python3 -c 'import h5py, numpy, torch'").code != 0)
    GTEST_SKIP() << "python3-h5py or python3-torch is not installed (apt-get install python3-h5py python3-torch)";
  TempDir dir;
  auto grid = [&](const std::string& out, bool save) {
    return dir.file(fs::path(out).filename().string() + ".toml",
                    "[study]\nname = \"saved\"\nout = \"" + out + "\"\nphases = [\"microbench\"]\n\n"
                    "[microbench]\nformats = [\"bf16\"]\nseq_lens = [64]\nhead_dims = [16]\nblocks = [[16, 16]]\n"
                    "loop_orders = [\"q_outer\", \"kv_outer\"]\npasses = [\"forward\", \"backward\"]\n"
                    "trials = 1\nheads = 2\nbatch = 2\npolicies = [\"eager\", \"fa2\"]\n"
                    "framework = [\"torch_baseline\", \"torch_flash\"]\n" +
                        std::string(save ? "save_outputs = true\n" : ""));
  };
  const std::string one = (dir / "one").string();
  ASSERT_EQ(run_fastudy("microbench " + grid(one, true) + " -q").code, 0);
  const std::string checker = "/usr/bin/python3 " + std::string(FASTUDY_CLI_TESTS) + "/check_microbench_outputs.py ";
  RunResult r = run_command(checker + one);
  EXPECT_EQ(r.code, 0) << r.output;
  // 8 points (2 passes x 2 policies x 2 loop orders); the rows: flash, baseline, flash_vs_baseline on
  // each, torch_baseline on each, torch_flash at q_outer only.
  EXPECT_NE(r.output.find("ok: 8 points, 36 rows recomputed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("8 points reproduced bit for bit by Python's PyTorch"), std::string::npos) << r.output;
  for (int ranks : {2, 4}) {
    SCOPED_TRACE(ranks);
    const std::string other = (dir / ("ranks" + std::to_string(ranks))).string();
    ASSERT_EQ(run_fastudy_mpi(ranks, "microbench " + grid(other, true) + " -q").code, 0);
    r = run_command(checker + one + " " + other);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("holds the same"), std::string::npos) << r.output;
  }
  // Without save_outputs there is no such file.
  const std::string plain = (dir / "plain").string();
  ASSERT_EQ(run_fastudy("microbench " + grid(plain, false) + " -q").code, 0);
  EXPECT_FALSE(fs::exists(plain + "/microbench_outputs.h5"));
}

// Complete checkpoints of every variant of `out`, and whether a checkpoint is being written (a
// temporary file exists).
struct Progress {
  std::size_t complete = 0;
  bool writing = false;
};
Progress progress_of(const std::string& out) {
  Progress p;
  for (const char* id : kIds) {
    const std::string dir = checkpoint_dir(out, id);
    p.complete += list_checkpoint_steps(dir).size();
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename().string().find(".h5.tmp.") != std::string::npos) p.writing = true;
  }
  return p;
}

TEST(E2E, KillNineAtAnyMomentThenResumeIsBitIdentical) {
  TempDir dir;
  const std::string ref = (dir / "ref").string(), run = (dir / "run").string();
  // checkpoint_every = 1: a checkpoint is being written most of the time, so kills land inside writes.
  constexpr int kSteps = 24;
  const std::string grid = dir.file("g.toml", tiny_grid(ref, kSteps, 1));
  ASSERT_EQ(run_fastudy("train " + grid + " -q").code, 0);
  const std::size_t total = std::size(kIds) * kSteps;

  // Each attempt resumes the study and is killed once its checkpoints reach a threshold (the readiness
  // event); odd attempts wait further until a checkpoint is being written. Every threshold leaves at
  // least a quarter of the study to do, so the process is still working when the kill lands, and the
  // exit status proves it: killed by SIGKILL, not ended by itself.
  int mid_write = 0;
  const std::size_t thresholds[] = {total / 16, total / 4, total / 3, total / 2, 3 * total / 4};
  for (std::size_t attempt = 0; attempt < std::size(thresholds); ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    const std::size_t threshold = thresholds[attempt];
    const bool wait_for_write = attempt % 2 == 1;
    pid_t pid = spawn_fastudy({"train", grid, "--out", run, "--resume"});
    ASSERT_GT(pid, 0);
    int status = 0;
    bool exited = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    for (;;) {
      const Progress p = progress_of(run);
      if (p.complete >= threshold && (!wait_for_write || p.writing)) {
        mid_write += p.writing ? 1 : 0;
        break;
      }
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no progress to " << threshold << " checkpoints";
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // polling interval, not a synchronisation
    }
    ASSERT_FALSE(exited) << "the run ended (status " << status << ") before reaching " << threshold
                         << " of " << total << " checkpoints";
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the run was not killed (status " << status << "): the fault was not injected";
    EXPECT_LT(progress_of(run).complete, total) << "the kill came after the last checkpoint";
  }
  RecordProperty("kills_inside_a_write", mid_write);
  RunResult r = run_fastudy("train " + grid + " --out " + run + " --resume -q");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* id : kIds) {
    SCOPED_TRACE(id);
    EXPECT_EQ(final_state(ref, id, kSteps), final_state(run, id, kSteps));
  }
  // No temporary or partial checkpoint is ever taken for a whole one.
  for (const char* id : kIds)
    for (auto s : list_checkpoint_steps(checkpoint_dir(run, id)))
      EXPECT_FALSE(checkpoint_problem(checkpoint_path(run, id, s)).has_value()) << id << " step " << s;
}

TEST(E2E, CorruptCheckpointIsNamedAndCanBeLeftOut) {
  TempDir dir;
  const std::string out = (dir / "o").string();
  const std::string grid = dir.file("g.toml", tiny_grid(out, 4, 2));
  ASSERT_EQ(run_fastudy("train " + grid + " -q").code, 0);
  const std::string victim = checkpoint_path(out, "flash-bf16", 4);
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const auto size = static_cast<std::streamoff>(f.tellg());
    for (std::streamoff off = size / 2; off < size / 2 + 64; ++off) {  // flip bytes in the data
      f.seekp(off);
      f.put('\x5a');
    }
  }
  RunResult r = run_fastudy("reduce " + out);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("flash-bf16"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--allow-missing"), std::string::npos) << r.output;
  r = run_fastudy("reduce " + out + " --allow-missing");
  EXPECT_EQ(r.code, 0) << r.output;
  std::ifstream in(out + "/ranking.csv");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("# note: left out flash-bf16"), std::string::npos) << ss.str();
}

TEST(E2E, ChangedGridOnResumeIsRefusedUnlessForced) {
  TempDir dir;
  const std::string out = (dir / "o").string();
  const std::string grid = dir.file("g.toml", tiny_grid(out, 2, 2));
  ASSERT_EQ(run_fastudy("train " + grid + " -q").code, 0);
  RunResult r = run_fastudy("train " + grid);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("already holds a study"), std::string::npos) << r.output;
  std::string text = tiny_grid(out, 2, 2);
  text.replace(text.find("[train]\n"), 8, "[train]\nlr = 0.01\n");
  const std::string changed = dir.file("g2.toml", text);
  r = run_fastudy("train " + changed + " --resume");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("baseline-fp32"), std::string::npos) << r.output;
  r = run_fastudy("train " + changed + " --resume --force -q");
  EXPECT_EQ(r.code, 0) << r.output;
  TrainState s = read_checkpoint(checkpoint_path(out, "baseline-fp32", 2));
  EXPECT_EQ(s.step, 2);
}

// A [[grid.vary]] design of optimisations, a control and the noise axis, end to end on 2 ranks:
// variants.csv lists what was trained, recompute and repeat give bit-identical weights (W1 exactly 0),
// flash does not, and the verdict judges each optimisation per precision, never pooled.
TEST(E2E, VaryDesignRanksEachOptimisationPerCondition) {
  TempDir dir;
  const std::string out = (dir / "vary").string();
  std::ostringstream grid;
  grid << "[study]\nname = \"vary\"\nout = \"" << out << "\"\nphases = [\"train\", \"reduce\"]\n"
       << "[grid]\nprecision = [\"fp32\", \"bf16\"]\nseed = [1, 2]\n"
       << "[[grid.vary]]\nattention = [\"baseline\", \"flash\"]\n"
       << "[[grid.vary]]\nrecompute = [\"off\", \"on\"]\n"
       << "[[grid.vary]]\nrepeat = [0, 1]\n"
       << "[model]\nvocab = 32\nd_model = 16\nheads = 2\nlayers = 1\nseq_len = 16\nmlp_ratio = 2\n"
       << "[data]\nspan_len = 4\n[train]\nsteps = 4\nbatch = 4\nwarmup = 2\ncheckpoint_every = 2\n"
       << "[attention]\nblock_q = 8\nblock_kv = 8\n";
  const std::string path = dir.file("vary.toml", grid.str());
  RunResult r = run_fastudy_mpi(2, path + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  // 2 precisions x 2 seeds x (baseline, flash, recompute on, repeat 1).
  const auto variants = data_lines(out + "/variants.csv");
  ASSERT_EQ(variants.size(), 1u + 16u);
  EXPECT_EQ(variants[0], "variant,hash,precision,seed,attention,recompute,repeat");
  const auto dev = data_lines(out + "/deviation.csv");
  auto w1 = [&](const std::string& a, const std::string& b) {
    for (const auto& l : dev)
      if (l.rfind("4,model," + a + "," + b + ",", 0) == 0 || l.rfind("4,model," + b + "," + a + ",", 0) == 0)
        return std::stod(l.substr(l.find(',', l.find(',', l.find(',', l.find(',') + 1) + 1) + 1) + 1));
    return -1.0;
  };
  for (const std::string base : {"fp32-s1", "bf16-s2"}) {
    SCOPED_TRACE(base);
    EXPECT_EQ(w1(base, base + "-recompute_on"), 0.0);
    EXPECT_EQ(w1(base, base + "-r1"), 0.0);
    EXPECT_GT(w1(base, base + "-flash"), 0.0);
  }
  const auto verdict = data_lines(out + "/verdict.csv");
  int flash_fp32 = 0, flash_bf16 = 0, recompute_identical = 0;
  for (const auto& l : verdict) {
    if (l.rfind("attention,baseline,flash,precision=fp32,", 0) == 0) ++flash_fp32;
    if (l.rfind("attention,baseline,flash,precision=bf16,", 0) == 0) ++flash_bf16;
    if (l.rfind("recompute,off,on,", 0) == 0 && l.find(",bit-identical") != std::string::npos) ++recompute_identical;
  }
  EXPECT_GT(flash_fp32, 0);
  EXPECT_GT(flash_bf16, 0);
  EXPECT_GT(recompute_identical, 0);
}

// dp_width through the command line: a dp_width = 4 variant trained by one rank and by a group of two
// ranks (ranks_per_variant = 2: each computes 2 shards, the shard gradients are gathered and summed in
// the declared order on both) ends with the same weights and optimizer state, for each order.
TEST(E2E, DpWidthGivesTheSameWeightsOnOneRankAndOnAGroupOfTwo) {
  TempDir dir;
  auto grid = [&](const std::string& out, int ranks_per_variant) {
    std::ostringstream os;
    os << "[study]\nname = \"dp\"\nout = \"" << out << "\"\nphases = [\"train\"]\n"
       << "[grid]\nallreduce = [\"rank\", \"tree\"]\n"
       << "[model]\nvocab = 32\nd_model = 16\nheads = 2\nlayers = 1\nseq_len = 16\nmlp_ratio = 2\n"
       << "[data]\nspan_len = 4\n[train]\nsteps = 4\nbatch = 8\nwarmup = 2\ncheckpoint_every = 4\n"
       << "dp_width = 4\nranks_per_variant = " << ranks_per_variant << "\n"
       << "[attention]\nblock_q = 8\nblock_kv = 8\n";
    return dir.file("dp" + std::to_string(ranks_per_variant) + ".toml", os.str());
  };
  const std::string one = (dir / "one").string(), two = (dir / "two").string();
  RunResult r = run_fastudy("train " + grid(one, 1) + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_fastudy_mpi(2, "train " + grid(two, 2) + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* id : {"rank", "tree"}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(final_state(one, id, 4), final_state(two, id, 4)) << "dp_width = 4 depends on the group size";
  }
  EXPECT_NE(final_state(one, "rank", 4), final_state(one, "tree", 4)) << "the order changed nothing";
}
