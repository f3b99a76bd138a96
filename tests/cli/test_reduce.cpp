// `fastudy reduce` and its [reduce] options through the command line, on imported runs written by
// write_reduce_runs.py (12 runs: attention x precision x 3 seeds, steps 10 and 20, one tensor large
// enough to be sorted over all ranks): the same bits on 1, 2 and 4 ranks; pairs on demand (the
// verdict's 24 of 66 pairs by default, "all", or the verdict's plus a list) with the same ranking and
// verdict whichever pairs are computed; metrics choosing the columns; per_tensor and whole_model
// leaving out what they say; every bad value an exit 2 naming the key, before anything is written;
// `fastudy plan` printing the pairs and the reduce's estimate; and the verdict the same bits as before
// pairs on demand (reduce_golden/).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "tests/common/suite_fixture.hpp"

namespace fastudy::test {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kRuns = 12, kAllPairs = kRuns * (kRuns - 1) / 2;
// Pairs that differ in one axis: attention (2 precisions x 3 seeds), precision (2 x 3), seed (2 x 2 x 3).
constexpr std::size_t kVerdictPairs = 6 + 6 + 12;
constexpr std::size_t kTasks = 2 * 4;  // steps x (3 tensors + the whole model)

// The lines of a CSV fastudy wrote, without the provenance header (lines starting with '#').
std::vector<std::string> data_lines(const fs::path& p) {
  std::istringstream in(slurp(p.string()));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') out.push_back(line);
  return out;
}

// deviation.csv's rows by "step,tensor,a,b" -> the rest of the row; the header row under key "".
std::map<std::string, std::string> rows_by_pair(const fs::path& p) {
  std::map<std::string, std::string> out;
  for (const auto& line : data_lines(p)) {
    std::size_t at = 0;
    for (int k = 0; k < 4 && at != std::string::npos; ++k) at = line.find(',', at + 1);
    if (line.rfind("step,", 0) == 0) out[""] = line;
    else out[line.substr(0, at)] = line.substr(at + 1);
  }
  return out;
}

std::size_t count_rows(const std::map<std::string, std::string>& rows, const std::string& tensor) {
  std::size_t n = 0;
  for (const auto& [key, value] : rows)
    if (key.find("," + tensor + ",") != std::string::npos) ++n;
  return n;
}

class Reduce : public testing_fixture::SuiteFixture<Reduce> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string cmd = std::string(FASTUDY_PYTHON) + " " FASTUDY_SOURCE_DIR "/tests/cli/write_reduce_runs.py " +
                            (*dir_ / "runs").string();
    if (!run_fixture_script(cmd)) return;
  }
  static void TearDownTestSuite() { delete dir_; }

  // A grid over the runs with `reduce` as its [reduce] section; its output folder is out(name).
  static std::string grid(const std::string& name, const std::string& reduce = "") {
    std::ostringstream os;
    os << "[study]\nname = \"reduce\"\nout = \"" << out(name).string() << "\"\n"
       << "[import]\npath = \"runs/{attention}-{precision}-s{seed}/step_{step}.safetensors\"\n"
       << "[grid]\nattention = [\"math\", \"fa2\"]\nprecision = [\"fp32\", \"bf16\"]\nseed = [1, 2, 3]\n"
       << "[axes.attention]\nbaseline = \"math\"\n"
       << (reduce.empty() ? "" : "[reduce]\n" + reduce);
    return dir_->file(name + ".toml", os.str());
  }
  static fs::path out(const std::string& name) { return *dir_ / ("out-" + name); }
  // The default reduce on one rank, once: what the other tests compare with.
  static const fs::path& reference() {
    static const fs::path ref = [] {
      const RunResult r = run_fastudy("reduce " + grid("default") + " -q");
      EXPECT_EQ(r.code, 0) << r.output;
      return out("default");
    }();
    return ref;
  }

  static TempDir* dir_;
};
TempDir* Reduce::dir_ = nullptr;

TEST_F(Reduce, OneTwoAndFourRanksGiveTheSameBits) {
  const fs::path one = reference();
  const auto rows = rows_by_pair(one / "deviation.csv");
  EXPECT_EQ(rows.at(""), "step,tensor,variant_a,variant_b,w1,max_abs,mean_abs,rel_l2");
  EXPECT_EQ(rows.size(), 1 + kTasks * kVerdictPairs);
  for (int ranks : {2, 4}) {
    SCOPED_TRACE(ranks);
    const std::string name = "ranks" + std::to_string(ranks);
    const RunResult r = run_fastudy_mpi(ranks, "reduce " + grid(name) + " -q");
    ASSERT_EQ(r.code, 0) << r.output;
    for (const char* file : {"deviation.csv", "ranking.csv", "verdict.csv", "twins.csv"})
      EXPECT_EQ(data_lines(out(name) / file), data_lines(one / file)) << file;
  }
}

// The ranking, the verdict (its intervals included) and the twins are the bits fastudy wrote before it
// computed pairs on demand and sorted the whole model over the ranks (reduce_golden/, recorded then on
// these runs); numbers are compared as written, 17 significant digits.
TEST_F(Reduce, TheVerdictIsTodaysBitForBit) {
  const fs::path one = reference();
  for (const char* file : {"ranking.csv", "verdict.csv", "twins.csv"})
    EXPECT_EQ(data_lines(one / file), data_lines(fs::path(FASTUDY_SOURCE_DIR "/tests/cli/reduce_golden") / file)) << file;
}

TEST_F(Reduce, PairsAllComputesEveryPairAndChangesNoVerdict) {
  const fs::path ref = reference();
  const RunResult r = run_fastudy_mpi(2, "reduce " + grid("all", "pairs = \"all\"\n") + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto all = rows_by_pair(out("all") / "deviation.csv"), verdict = rows_by_pair(ref / "deviation.csv");
  EXPECT_EQ(all.size(), 1 + kTasks * kAllPairs);
  for (const auto& [key, row] : verdict) EXPECT_EQ(all.at(key), row) << key;  // the same bits for the same pair
  EXPECT_EQ(all.count("20,model,math-fp32-s1,fa2-bf16-s2"), 1u);              // differs in all three axes
  EXPECT_EQ(verdict.count("20,model,math-fp32-s1,fa2-bf16-s2"), 0u);
  for (const char* file : {"ranking.csv", "verdict.csv", "twins.csv"})
    EXPECT_EQ(data_lines(out("all") / file), data_lines(ref / file)) << file;

  // A list adds its pairs to the verdict's (in either order of the two ids).
  const RunResult listed =
      run_fastudy("reduce " + grid("listed", "pairs = [[\"fa2-bf16-s2\", \"math-fp32-s1\"], [\"math-fp32-s1\", \"math-fp32-s2\"]]\n") + " -q");
  ASSERT_EQ(listed.code, 0) << listed.output;
  const auto extra = rows_by_pair(out("listed") / "deviation.csv");
  EXPECT_EQ(extra.size(), 1 + kTasks * (kVerdictPairs + 1));  // the second pair is a seed pair already
  EXPECT_EQ(extra.at("20,big,math-fp32-s1,fa2-bf16-s2"), all.at("20,big,math-fp32-s1,fa2-bf16-s2"));
  EXPECT_EQ(data_lines(out("listed") / "verdict.csv"), data_lines(ref / "verdict.csv"));
}

TEST_F(Reduce, MetricsChooseTheColumnsAndTheDatasets) {
  const fs::path ref = reference();
  ASSERT_EQ(run_fastudy("reduce " + grid("w1", "metrics = [\"w1\"]\n") + " -q").code, 0);
  ASSERT_EQ(run_fastudy_mpi(2, "reduce " + grid("w2", "metrics = [\"w1\", \"w2\", \"max_abs\"]\n") + " -q").code, 0);
  const auto w1 = rows_by_pair(out("w1") / "deviation.csv"), w2 = rows_by_pair(out("w2") / "deviation.csv"),
             all = rows_by_pair(ref / "deviation.csv");
  EXPECT_EQ(w1.at(""), "step,tensor,variant_a,variant_b,w1");
  EXPECT_EQ(w2.at(""), "step,tensor,variant_a,variant_b,w1,w2,max_abs");
  for (const auto& [key, row] : all) {
    if (key.empty()) continue;
    const std::string w1_value = row.substr(0, row.find(','));
    EXPECT_EQ(w1.at(key), w1_value) << key;
    EXPECT_EQ(w2.at(key).substr(0, w2.at(key).find(',')), w1_value) << key;
  }
  const std::string some = w2.at("20,model,math-fp32-s1,math-bf16-s1");
  EXPECT_GT(std::stod(some.substr(some.find(',') + 1)), 0.0) << some;  // W2 computed
  // deviation.h5 holds the listed metrics only.
  const std::string py = std::string(FASTUDY_PYTHON) +
                         " -c 'import h5py,sys; f=h5py.File(sys.argv[1]); g=f[\"steps\"][\"20\"]; "
                         "print(f.attrs[\"metrics\"], sorted({m for t in g.values() for m in t.keys()}))' ";
  const RunResult h5 = run_command(py + (out("w2") / "deviation.h5").string());
  ASSERT_EQ(h5.code, 0) << h5.output;
  EXPECT_NE(h5.output.find("w1,w2,max_abs ['max_abs', 'w1', 'w2']"), std::string::npos) << h5.output;
  // The ranking keeps W1; without max_abs its max |dW| column is empty (nan).
  const auto ranking = data_lines(out("w1") / "ranking.csv"), ranking_all = data_lines(ref / "ranking.csv");
  ASSERT_EQ(ranking.size(), ranking_all.size());
  EXPECT_NE(ranking[1].find(",nan,"), std::string::npos) << ranking[1];
  EXPECT_EQ(data_lines(out("w1") / "verdict.csv"), data_lines(ref / "verdict.csv"));
}

TEST_F(Reduce, PerTensorFalseWritesTheWholeModelOnly) {
  const fs::path ref = reference();
  for (int ranks : {1, 2}) {
    SCOPED_TRACE(ranks);
    const std::string name = "model-only" + std::to_string(ranks);
    const RunResult r = run_fastudy_mpi(ranks, "reduce " + grid(name, "per_tensor = false\n") + " -q");
    ASSERT_EQ(r.code, 0) << r.output;
    const auto rows = rows_by_pair(out(name) / "deviation.csv"), all = rows_by_pair(ref / "deviation.csv");
    EXPECT_EQ(rows.size(), 1 + 2 * kVerdictPairs);
    EXPECT_EQ(count_rows(rows, "model"), 2 * kVerdictPairs);
    for (const auto& [key, row] : rows) EXPECT_EQ(row, all.at(key)) << key;
    EXPECT_EQ(data_lines(out(name) / "verdict.csv"), data_lines(ref / "verdict.csv"));
  }
  // The report has the verdict and the whole model's figures, and says the tensors were left out.
  const RunResult report = run_fastudy("report " + out("model-only1").string() + " -q");
  ASSERT_EQ(report.code, 0) << report.output;
  const std::string md = slurp((out("model-only1") / "report.md").string());
  EXPECT_NE(md.find("Per-tensor distances were not computed ([reduce] per_tensor = false)"), std::string::npos) << md.substr(0, 3000);
  EXPECT_EQ(md.find("No verdict"), std::string::npos);
}

TEST_F(Reduce, WholeModelFalseWritesTheTensorsAndNoVerdict) {
  const fs::path ref = reference();
  const RunResult r = run_fastudy_mpi(2, "reduce " + grid("tensors-only", "whole_model = false\n"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rows = rows_by_pair(out("tensors-only") / "deviation.csv"), all = rows_by_pair(ref / "deviation.csv");
  EXPECT_EQ(count_rows(rows, "model"), 0u);
  EXPECT_EQ(rows.size(), 1 + 2 * 3 * kVerdictPairs);
  for (const auto& [key, row] : rows) EXPECT_EQ(row, all.at(key)) << key;
  const std::string ranking = slurp((out("tensors-only") / "ranking.csv").string());
  EXPECT_NE(ranking.find("# note: [reduce] whole_model = false: the ranking and the verdict rest on the whole-model "
                         "distances, which were not computed"), std::string::npos) << ranking;
  EXPECT_EQ(data_lines(out("tensors-only") / "verdict.csv").size(), 1u);  // the header only
  EXPECT_NE(r.output.find("whole_model = false"), std::string::npos) << r.output;
  // The report says why there is no verdict and shows the tensors.
  const RunResult report = run_fastudy("report " + out("tensors-only").string() + " -q");
  ASSERT_EQ(report.code, 0) << report.output;
  const std::string md = slurp((out("tensors-only") / "report.md").string());
  EXPECT_NE(md.find("No verdict: [reduce] whole_model = false"), std::string::npos) << md.substr(0, 3000);
  EXPECT_NE(md.find("The whole model's distances were not computed ([reduce] whole_model = false)"), std::string::npos);
  EXPECT_NE(md.find("The tensors that move most"), std::string::npos);
}

TEST_F(Reduce, BadReduceOptionsExitTwoBeforeAnythingIsWritten) {
  const struct {
    std::string reduce;
    std::vector<std::string> texts;
  } rows[] = {
      {"pairs = \"some\"\n", {"[reduce] pairs", "must be \"verdict\"", "(got \"some\")"}},
      {"pairs = 3\n", {"[reduce] pairs", "(got an integer)"}},
      {"pairs = []\n", {"[reduce] pairs", "empty list"}},
      {"pairs = [[\"math-fp32-s1\"]]\n", {"[reduce] pairs", "a pair of variant ids"}},
      {"pairs = [[\"math-fp32-s1\", \"math-fp32-s1\"]]\n", {"[reduce] pairs", "with itself"}},
      {"pairs = [[\"math-fp32-s1\", \"flash-fp32-s1\"]]\n", {"[reduce] pairs", "\"flash-fp32-s1\", which the grid does not have"}},
      {"metrics = [\"w2\"]\n", {"[reduce] metrics", "must include \"w1\""}},
      {"metrics = [\"w1\", \"w3\"]\n", {"reduce.metrics", "w3"}},
      {"per_tensor = false\nwhole_model = false\n", {"cannot both be false"}},
      {"whole_model = \"yes\"\n", {"reduce.whole_model"}},
  };
  int k = 0;
  for (const auto& row : rows) {
    const std::string name = "bad" + std::to_string(k++);
    for (const std::string job : {"reduce", "plan"}) {
      const RunResult r = run_fastudy(job + " " + grid(name, row.reduce));
      EXPECT_EQ(r.code, 2) << row.reduce << job << "\n" << r.output;
      for (const auto& text : row.texts) EXPECT_NE(r.output.find(text), std::string::npos) << row.reduce << text << "\n" << r.output;
      EXPECT_FALSE(fs::exists(out(name))) << row.reduce;
    }
  }
}

TEST_F(Reduce, PlanPrintsThePairsAndTheEstimate) {
  RunResult r = run_fastudy("plan " + grid("plan") + " --ranks 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("reduce: 24 of 66 pairs (the verdict's) x 2 steps, 3 tensors and the whole model, 304112 values "
                          "per run and step, compared as fp32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("reduce estimate on 4 ranks, a core each: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" per step, "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("peak memory "), std::string::npos) << r.output;
  // The rates behind the estimate, as measured here (the partition's for the 4 ranks asked for).
  EXPECT_NE(r.output.find("(rates measured here: fp32 values, 4194304 per timing: sort "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" ns (of 16777216), partition into 4 ranges "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" GB/s"), std::string::npos) << r.output;
  // The first write of the buffers' pages (once) and the reads of the study's own files.
  EXPECT_NE(r.output.find("; once: fresh pages "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", fresh pages "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("; reads "), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out("plan")));
  r = run_fastudy("plan " + grid("plan-all", "pairs = \"all\"\nper_tensor = false\n"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("reduce: 66 of 66 pairs (all) x 2 steps, no tensor and the whole model"), std::string::npos) << r.output;
  // A study fastudy trains: the demo-sized CI grid (2 x 2 x 2 variants; attention, precision and seed
  // pairs 4 each), its checkpoint steps 10 and 20.
  r = run_fastudy("plan " FASTUDY_SOURCE_DIR "/configs/ci.toml --ranks 2 --measure-steps 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("reduce: 12 of 28 pairs (the verdict's) x 2 steps, "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("reduce estimate on 2 ranks, a core each: "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace fastudy::test
