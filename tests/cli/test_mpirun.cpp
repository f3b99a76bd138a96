// Every job under `mpirun -n N` (N = 1, 2, 4) is one job: it works, prints its results once, takes
// the study lock once and leaves it released, or refuses with one named line. The jobs that do not use
// MPI (plan, status, report, advise, replay, bisect, slurm) run on rank 0 while the other ranks wait
// for its exit code (jobs/main.cpp); run, microbench, train and reduce spread over the ranks.
// One tiny study per rank count: 4 variants of 4 steps and a 2-point microbenchmark.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/cli/cli_util.hpp"

namespace fs = std::filesystem;
using namespace fastudy::test;

namespace {

std::string grid_text(const std::string& out) {
  // The report renders once per rank count, as its own job (a render takes seconds of Python).
  return "[study]\nname = \"mpirun\"\nout = \"" + out + "\"\nphases = [\"microbench\", \"train\", \"reduce\"]\n"
         "[grid]\nattention = [\"baseline\", \"flash\"]\nprecision = [\"fp32\", \"bf16\"]\n"
         "[model]\nvocab = 32\nd_model = 16\nheads = 2\nlayers = 1\nseq_len = 16\nmlp_ratio = 2\n"
         "[data]\nspan_len = 4\n"
         "[train]\nsteps = 4\nbatch = 4\nwarmup = 2\ncheckpoint_every = 2\n"
         "[attention]\nblock_q = 8\nblock_kv = 8\n"
         "[microbench]\nformats = [\"fp32\", \"bf16\"]\npolicies = [\"mixed\"]\nseq_lens = [16]\nhead_dims = [8]\n"
         "blocks = [[8, 8]]\nloop_orders = [\"q_outer\"]\ntrials = 1\nheads = 1\n";
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

class EveryJobUnderMpirun : public ::testing::TestWithParam<int> {
 protected:
  // mpirun -n N fastudy ARGS: the exit code, and no sign of two jobs where there is one.
  RunResult job(const std::string& args) {
    RunResult r = run_fastudy_mpi(GetParam(), args);
    EXPECT_EQ(r.output.find("another fastudy job"), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("stopped by a signal"), std::string::npos) << args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out_ + "/fastudy.lock")) << "the lock outlived `" << args << "`";
    return r;
  }
  void SetUp() override {
    out_ = (dir_ / "out").string();
    grid_ = dir_.file("grid.toml", grid_text(out_));
  }
  TempDir dir_;
  std::string out_, grid_;
};

TEST_P(EveryJobUnderMpirun, WorksOnceOrRefusesWithOneLine) {
  const int n = GetParam();
  const std::string ranks = std::to_string(n);

  RunResult r = job(grid_);  // run: every phase of the grid
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "== phase reduce"), 1u) << r.output;

  r = job("plan " + grid_ + " --measure-steps 0");  // plans for the ranks it runs on, once
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "ranks: " + ranks + " -> " + ranks + " group"), 1u) << r.output;
  EXPECT_EQ(count(r.output, "# study mpirun"), 1u) << r.output;

  r = job("microbench " + grid_ + " --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out_ + "/microbench.csv"));

  r = job("train " + grid_ + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "4 already done"), 1u) << r.output;

  r = job("reduce " + out_ + " --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out_ + "/ranking.csv"));

  r = job("report " + out_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "report: " + out_ + "/report.html"), 1u) << r.output;

  r = job("status " + out_);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "4 variants: 4 done"), 1u) << r.output;

  r = job("advise " + grid_ + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out_ + "/advice.csv"));

  r = job("replay " + out_ + " --variant baseline-fp32 --from 2");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "bit-identical to the original"), 1u) << r.output;

  r = job("bisect " + out_ + " --variant flash-fp32 --against baseline-fp32 --step 2");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out_ + "/bisect"));

  r = job("slurm " + grid_ + " --ntasks-per-node 2 --time 00:10:00 --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out_ + "/fastudy.sbatch"));

  // A refusal is one line, whatever the rank count: a job that takes a study and one that trains.
  const std::string missing = (dir_ / "no-such-study").string();
  r = job("report " + missing);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(count(r.output, "error: "), 1u) << r.output;
  EXPECT_EQ(count(r.output, missing + " does not exist"), 1u) << r.output;
  r = job("train " + grid_ + " --variant no-such-variant --resume");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(count(r.output, "error: "), 1u) << r.output;
  EXPECT_EQ(count(r.output, "error: --variant no-such-variant is not a variant"), 1u) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Ranks, EveryJobUnderMpirun, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return "np" + std::to_string(p.param); });

}  // namespace
