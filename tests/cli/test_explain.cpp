// `fastudy replay` and `fastudy bisect` end to end on a tiny trained study: a replay without --set
// repeats the original bit for bit (weights at every checkpoint, every loss), one with --set does not;
// bisect of flash against baseline first differs at the attention output; bad arguments (unknown
// variant, step without a checkpoint, axis not in the grid, value not allowed) exit 2 naming them,
// before anything is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "tests/cli/cli_util.hpp"

namespace fs = std::filesystem;
using namespace fastudy::test;

namespace {

// The rows of a CSV with a "#" header, as maps from column to cell.
std::vector<std::map<std::string, std::string>> read_rows(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> columns;
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    if (columns.empty()) {
      columns = cells;
      continue;
    }
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < columns.size() && i < cells.size(); ++i) row[columns[i]] = cells[i];
    rows.push_back(row);
  }
  return rows;
}

// The tiny grid trained once for every test of this file (8 steps, checkpoints at 4 and 8).
class Explain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    out_ = (*dir_ / "out").string();
    const std::string grid = dir_->file("grid.toml", tiny_grid(out_, 8, 4));
    const RunResult r = run_fastudy("train " + grid + " -q");
    // No assertion here: any failure in SetUpTestSuite only skips the tests; SetUp() fails each of them.
    if (r.code != 0) train_failure_ = "exit " + std::to_string(r.code) + "\n" + r.output;
  }
  void SetUp() override { ASSERT_TRUE(train_failure_.empty()) << "training the shared grid failed: " << train_failure_; }
  static inline std::string train_failure_;
  static void TearDownTestSuite() { delete dir_; }
  static TempDir* dir_;
  static std::string out_;
};
TempDir* Explain::dir_ = nullptr;
std::string Explain::out_;

TEST_F(Explain, ReplayWithoutSetIsBitIdenticalToTheOriginal) {
  const RunResult r = run_fastudy("replay " + out_ + " --variant baseline-bf16 --from 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("bit-identical to the original"), std::string::npos) << r.output;
  const auto rows = read_rows(fs::path(out_) / "replays/baseline-bf16-from4/replay.csv");
  ASSERT_EQ(rows.size(), 4u);  // steps 5 to 8
  for (const auto& row : rows) EXPECT_EQ(row.at("loss"), row.at("original_loss")) << row.at("step");
  EXPECT_EQ(rows.back().at("step"), "8");
  EXPECT_EQ(rows.back().at("max_abs"), "0");
  EXPECT_EQ(rows.back().at("w1"), "0");
  EXPECT_TRUE(fs::exists(fs::path(out_) / "replays/baseline-bf16-from4/train_log.csv"));
}

TEST_F(Explain, ReplayWithAnAxisSetPartsFromTheOriginal) {
  const RunResult r = run_fastudy("replay " + out_ + " --variant baseline-bf16 --from 4 --steps 4 --set attention=flash");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("bit-identical"), std::string::npos) << r.output;
  const auto rows = read_rows(fs::path(out_) / "replays/baseline-bf16-from4+attention=flash/replay.csv");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_GT(std::stod(rows.back().at("max_abs")), 0.0);
  // From the initial weights the first step already reads the same batch with the other kernel.
  const RunResult first = run_fastudy("replay " + out_ + " --variant baseline-fp32 --from 0 --steps 1 --set precision=bf16");
  ASSERT_EQ(first.code, 0) << first.output;
}

TEST_F(Explain, BisectOfFlashAgainstBaselineFirstDiffersAtTheAttentionOutput) {
  const RunResult r = run_fastudy("bisect " + out_ + " --variant baseline-bf16 --against flash-bf16 --step 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("blocks.0.attn.out"), std::string::npos) << r.output;
  const auto rows = read_rows(fs::path(out_) / "bisect/baseline-bf16--flash-bf16-step4.csv");
  ASSERT_FALSE(rows.empty());
  std::size_t i = 0;
  for (; i < rows.size() && rows[i].at("op") != "blocks.0.attn.out"; ++i) EXPECT_EQ(rows[i].at("identical"), "1") << rows[i].at("op");
  ASSERT_LT(i, rows.size());
  EXPECT_EQ(rows[i].at("identical"), "0");
  EXPECT_EQ(rows[i].at("layer"), "0");
  EXPECT_EQ(rows.back().at("op"), "grad tok_emb.weight");
}

TEST_F(Explain, BadArgumentsExitTwoNamingThem) {
  struct Case {
    std::string args, says;
  };
  const Case cases[] = {
      {"replay OUT --variant nope --from 4", "--variant nope: no variant of that id"},
      {"replay OUT --variant baseline-bf16 --from 3", "has no checkpoint at step 3"},
      {"replay OUT --variant baseline-bf16 --from 12", "trains 8 steps"},
      {"replay OUT --variant baseline-bf16 --from 4 --set colour=red", "`colour` is not a grid axis"},
      {"replay OUT --variant baseline-bf16 --from 4 --set precision=fp12", "value \"fp12\" is not allowed for precision"},
      {"replay OUT --variant baseline-bf16 --from 4 --set attention", "expected AXIS=VALUE"},
      {"replay OUT --variant baseline-bf16 --from 4 --steps 5", "--steps 5: the original trained to step 8"},
      {"replay OUT --variant baseline-bf16", "--from is required"},
      {"bisect OUT --variant baseline-bf16 --against nope --step 4", "--against nope: no variant of that id"},
      {"bisect OUT --variant baseline-bf16 --against flash-bf16 --step 9", "trains 8 steps"},
      {"bisect OUT --against flash-bf16 --step 4", "--variant is required"},
  };
  for (const Case& c : cases) {
    std::string args = c.args;
    args.replace(args.find("OUT"), 3, out_ + "/");
    const RunResult r = run_fastudy(args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(fs::path(out_) / "replays/nope-from4"));
}

}  // namespace

namespace {

// docs/explain.md's walkthrough of configs/explain.toml: fp16 diverges at step 42 because attention scores
// overflow fp16; bisect names the attention output of layer 0 (the first op beyond its bound, its Q,
// K, V within theirs); replay from step 40 with the scores in fp32, or in bf16, runs to the end.
TEST(ExplainDemo, BisectNamesTheOverflowAndReplayWithTheFixRunsToTheEnd) {
  TempDir dir;
  const std::string grid = std::string(FASTUDY_CLI_TESTS) + "/../../configs/explain.toml";
  const std::string out = (dir / "out").string();
  const RunResult train = run_fastudy(grid + " --out " + out + " -q");
  EXPECT_EQ(train.code, 1) << train.output;  // a variant diverged
  EXPECT_NE(train.output.find("fp16 diverged at step 41: diverged: training loss is -nan at step 42"), std::string::npos)
      << train.output;

  const RunResult bisect = run_fastudy("bisect " + out + " --variant fp16 --against bf16 --step 41");
  ASSERT_EQ(bisect.code, 0) << bisect.output;
  EXPECT_NE(bisect.output.find("the first op beyond it is blocks.0.attn.out (inf"), std::string::npos) << bisect.output;

  const RunResult again = run_fastudy("replay " + out + " --variant fp16 --from 40");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("diverged at step 42 in steps 41-48, replay: 0 spike(s), diverged -> it comes back"),
            std::string::npos) << again.output;
  for (const std::string fix : {"policy=s_fp32", "precision=bf16"}) {
    const RunResult fixed = run_fastudy("replay " + out + " --variant fp16 --from 40 --set " + fix);
    ASSERT_EQ(fixed.code, 0) << fixed.output;
    EXPECT_NE(fixed.output.find("replay: ran to step 48; original: 0 loss spike(s), diverged at step 42"), std::string::npos)
        << fix << "\n" << fixed.output;
    EXPECT_NE(fixed.output.find("-> it does not come back"), std::string::npos) << fix << "\n" << fixed.output;
  }
}

}  // namespace

namespace {

// fastudy advise on a grid whose answer is known: a custom policy that is mixed but for flash's running
// O stored in bf16 needs exactly that step back in fp32; mixed needs none. Bad arguments exit 2.
TEST(Advise, TheMinimalSetOfAPlantedPolicyIsItsOneBf16Step) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file(
      "advise.toml",
      "[study]\nname = \"advise\"\nout = \"" + out + "\"\nphases = [\"microbench\"]\n"
      "[attention.policies.mixed_o]\npreset = \"mixed\"\no_running = \"bf16\"\n"
      "[microbench]\nformats = [\"fp32\", \"bf16\"]\npolicies = [\"mixed\", \"mixed_o\"]\nseq_lens = [128]\n"
      "head_dims = [16]\nblocks = [[8, 8]]\nloop_orders = [\"q_outer\"]\ntrials = 1\nheads = 2\n");
  const RunResult r = run_fastudy("advise " + grid);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Under mixed_o at bf16 (forward, N 128, d 16, 16 KV tiles): flash's error is"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("keeping o_running in fp32 brings it to"), std::string::npos) << r.output;
  std::map<std::string, std::string> order;  // policy/step -> order
  for (const auto& row : read_rows(fs::path(out) / "advice.csv")) {
    EXPECT_EQ(row.at("format"), "bf16");  // fp32 points have nothing to keep in fp32
    if (row.at("order") != "0") order[row.at("policy") + "/" + row.at("step")] = row.at("order");
  }
  EXPECT_EQ(order, (std::map<std::string, std::string>{{"mixed_o/o_running", "1"}}));

  const RunResult negative = run_fastudy("advise " + grid + " --out " + (dir / "b").string() + " --target-ulps -1");
  EXPECT_EQ(negative.code, 2) << negative.output;
  EXPECT_NE(negative.output.find("--target-ulps must be > 0"), std::string::npos) << negative.output;
  const std::string fp32_only = dir.file("fp32.toml", "[microbench]\nformats = [\"fp32\"]\n");
  const RunResult none = run_fastudy("advise " + fp32_only + " --out " + (dir / "c").string());
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("has no point in a format narrower than fp32"), std::string::npos) << none.output;
  EXPECT_FALSE(fs::exists(dir / "c"));
}

}  // namespace
