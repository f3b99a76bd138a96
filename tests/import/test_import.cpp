// Imported studies (issue 27): the [import] and [axes.NAME] sections at load (every mistake a
// ConfigError naming the key), runs written by Python in every format reduced end to end (the same
// values in safetensors, h5py and a sharded index give the same distances; bf16 files read exactly),
// every bad input refused with exit 2 before anything is written, naming the file and the tensor, the
// user's own axes judged by the verdict, a changed file noticed by a later reduce, and the same results
// on 1 and 2 ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "src/core/config.hpp"
#include "tests/common/suite_fixture.hpp"

namespace fastudy::test {
namespace {

namespace fs = std::filesystem;

const char* const kCases[] = {"good",   "bf16", "h5",    "sharded", "missing", "truncated", "offsets", "nan",
                              "inf",    "shape", "dtype", "extra",   "twice",   "empty", "names", "nan-bf16",
                              "inf-f16", "inf-f64", "nan-h5", "nan-late"};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The data rows of a CSV fastudy wrote (its provenance header, lines starting with '#', left out: it
// names the command and the time).
std::string data_rows(const fs::path& p) {
  std::istringstream in(read_file(p));
  std::string out;
  for (std::string line; std::getline(in, line);)
    if (line.empty() || line[0] != '#') out += line + "\n";
  return out;
}

class Import : public testing_fixture::SuiteFixture<Import> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string cmd = std::string(FASTUDY_PYTHON) + " " + FASTUDY_SOURCE_DIR "/tests/import/write_import_runs.py " + dir_->str();
    for (const char* c : kCases) cmd += std::string(" ") + c;
    if (!run_fixture_script(cmd)) return;
  }
  static void TearDownTestSuite() { delete dir_; }

  // A grid over the case's runs; `pattern` relative to the case's folder ("" for the usual one).
  static std::string grid(const std::string& name, const std::string& kase, const std::string& extra = "",
                          const std::string& pattern = "") {
    const std::string path =
        pattern.empty() ? "runs/{attention}-{precision}-s{seed}/step_{step}." +
                              std::string(kase == "h5" || kase == "nan-h5" ? "h5" : "safetensors")
                        : pattern;
    std::ostringstream os;
    os << "[study]\nname = \"imported\"\nout = \"" << (*dir_ / ("out-" + name)).string() << "\"\n"
       << "[import]\npath = \"" << kase << "/" << path << "\"\nstrip_prefix = \"module.\"\nexclude = [\"counter\"]\n"
       << extra << "[grid]\nattention = [\"math\", \"fa2\"]\nprecision = [\"fp32\", \"bf16\"]\nseed = [1, 2]\n"
       << "[axes.attention]\nbaseline = \"math\"\n";
    return dir_->file(name + ".toml", os.str());
  }
  static fs::path out(const std::string& name) { return *dir_ / ("out-" + name); }

  static TempDir* dir_;
};
TempDir* Import::dir_ = nullptr;

TEST(ImportNames, StripRenameExclude) {
  ImportConfig ic;
  ic.strip_prefix = {"module.", "_orig_mod."};
  ic.rename = {{"lm_head.weight", "head.weight"}};
  ic.exclude = {"*.attn.bias", "step?"};
  EXPECT_EQ(ic.tensor_name("module._orig_mod.blocks.0.w"), "blocks.0.w");  // both prefixes, repeatedly
  EXPECT_EQ(ic.tensor_name("_orig_mod.module.x"), "x");
  EXPECT_EQ(ic.tensor_name("module.lm_head.weight"), "head.weight");     // renamed after the strip
  EXPECT_EQ(ic.tensor_name("module.blocks.3.attn.bias"), std::nullopt);  // excluded
  EXPECT_EQ(ic.tensor_name("steps"), std::nullopt);
  EXPECT_EQ(ic.tensor_name("step"), "step");                             // ? is one character
  EXPECT_EQ(ic.tensor_name("module."), "module.");                       // a prefix never empties a name
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(glob_match("a*b", "aXbY"));
}

TEST(ImportConfigErrors, EachMistakeIsNamedAtItsKey) {
  const std::string head = "[study]\nname = \"x\"\n";
  const std::string imp = "[import]\npath = \"runs/{attention}-s{seed}/step_{step}.safetensors\"\n";
  const std::string grid = "[grid]\nattention = [\"math\", \"fa2\"]\nseed = [1, 2]\n";
  struct Row {
    std::string toml, key, text;
  };
  const std::vector<Row> rows = {
      {head + "[import]\npath = \"runs/{attention}-{width}/step_{step}.pt\"\n" + grid, "import.path",
       "{width}, which is neither an axis of [grid] nor {step}"},
      {head + "[import]\npath = \"runs/{attention}/step_{step}.pt\"\n" + grid, "import.path",
       "lacks {seed}, so the 2 values of `seed` would read the same files"},
      {head + "[import]\npath = \"runs/{attention}-s{seed}/model.pt\"\n" + grid, "import.path", "has no {step}"},
      {head + "[import]\npath = \"runs/{attention-s{seed}/step_{step}.pt\"\n" + grid, "import.path", "is not a placeholder"},
      {head + imp + "steps = [10, 10]\n" + grid, "import.steps", "lists 10 twice"},
      {head + imp + "rename = \"x\"\n" + grid, "import.rename", "must be a table"},
      {head + imp + grid + "[axes.attention]\nrole = \"setting\"\n", "axes.attention.role", "role (optimisation) and replicate flag are fixed"},
      {head + imp + grid + "[axes.attention]\nbaseline = \"flash\"\n", "axes.attention.baseline", "is not one of its values"},
      {head + imp + grid + "[axes.tp]\nrole = \"optimisation\"\n", "axes.tp.", "declares an axis that [grid] does not list"},
      {head + imp + grid + "[axes.tp]\nrole = \"knob\"\n", "axes.tp.role", "role = \"knob\" is unknown"},
      {head + imp + grid + "[axes.tp]\nbaseline = \"1\"\n", "axes.tp.role", "needs role"},
      {head + grid + "[axes.tp]\nrole = \"setting\"\n", "axes.", "this study has no [import]"},
      {head + imp + grid + "[train]\nsteps = 10\n", "train", "configures fastudy's own training"},
      {"[study]\nname = \"x\"\nphases = [\"train\", \"reduce\"]\n" + imp + grid, "study.phases", "lists \"train\""},
      {head + imp + "[grid]\nattention = [\"math\", \"fa2\"]\nseed = [1, 2]\ntp = [1, 2]\n", "grid.tp", "unknown grid axis `tp`"},
  };
  for (const auto& row : rows) {
    try {
      parse_study(row.toml, "dir/grid.toml");
      ADD_FAILURE() << "accepted:\n" << row.toml;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key(), row.key) << e.what();
      EXPECT_NE(std::string(e.what()).find(row.text), std::string::npos) << e.what();
    }
  }
}

TEST(ImportConfig, UserAxesRolesAndTheResolvedStudyReadsBack) {
  const std::string text =
      "[study]\nname = \"x\"\n[import]\npath = \"runs/{opt}-tp{tp}-s{seed}/step_{step}.safetensors\"\n"
      "strip_prefix = [\"module.\"]\nrename = { \"a\" = \"b\" }\nexclude = [\"*.bias\"]\n"
      "[grid]\nopt = [\"adamw\", \"fused\"]\ntp = [1, 2]\nseed = [1, 2]\n"
      "[axes.opt]\nrole = \"optimisation\"\nbaseline = \"adamw\"\n[axes.tp]\nrole = \"reference\"\n";
  const Study st = parse_study(text, "/data/grid.toml");
  EXPECT_TRUE(st.imported());
  EXPECT_EQ(st.phases, (std::vector<std::string>{"reduce", "report"}));
  EXPECT_EQ(st.import.path, "/data/runs/{opt}-tp{tp}-s{seed}/step_{step}.safetensors");  // absolute, from the grid's folder
  ASSERT_EQ(st.variants.size(), 8u);
  EXPECT_EQ(st.variants[0].id, "adamw-tp1-s1");
  EXPECT_EQ(study_axis(st, "opt").role, AxisRole::optimisation);
  EXPECT_EQ(study_axis(st, "opt").baseline, "adamw");
  EXPECT_EQ(study_axis(st, "tp").role, AxisRole::reference);
  EXPECT_FALSE(study_axis(st, "tp").replicate);
  EXPECT_TRUE(study_axis(st, "seed").replicate);  // the table's own row
  EXPECT_EQ(st.import.path_of(st.variants[7].axes), "/data/runs/fused-tp2-s2/step_{step}.safetensors");
  // study.toml is the resolved text: it reads back to the same study (and hash) from anywhere.
  const Study again = parse_study(st.resolved_toml, "/elsewhere/study.toml");
  EXPECT_EQ(again.hash, st.hash);
  EXPECT_EQ(again.import.path, st.import.path);
  EXPECT_EQ(again.variants[3].hash, st.variants[3].hash);
}

TEST_F(Import, EveryFormatGivesTheSameDistances) {
  for (const std::string kase : {"good", "h5", "sharded", "bf16"}) {
    const std::string pattern = kase == "sharded" ? "runs/{attention}-{precision}-s{seed}/step_{step}/model.safetensors.index.json" : "";
    const RunResult r = run_fastudy("reduce " + grid(kase, kase, "", pattern) + " -q");
    ASSERT_EQ(r.code, 0) << kase << "\n" << r.output;
    EXPECT_TRUE(fs::exists(out(kase) / "verdict.csv")) << kase;
  }
  const std::string safetensors = data_rows(out("good") / "deviation.csv");
  EXPECT_NE(safetensors.find("\n20,model,"), std::string::npos) << safetensors.substr(0, 400);
  EXPECT_EQ(data_rows(out("h5") / "deviation.csv"), safetensors);
  EXPECT_EQ(data_rows(out("sharded") / "deviation.csv"), safetensors);
  // bf16 files hold the same values rounded: other distances, the same plan.
  EXPECT_NE(data_rows(out("bf16") / "deviation.csv"), safetensors);
  // The verdict on attention under each precision, against seed and precision. The runs are made so
  // that fa2 moves the weights 10x less than bf16 and far less than another seed (write_import_runs.py).
  const std::string verdict = read_file(out("good") / "verdict.csv");
  for (const std::string condition : {"precision=fp32", "precision=bf16"})
    for (const std::string reference : {"precision,fp32<->bf16", "seed,*"})
      EXPECT_NE(verdict.find("attention,math,fa2," + condition + "," + reference), std::string::npos)
          << condition << " " << reference << "\n" << verdict;
  EXPECT_EQ(verdict.find(",outside\n"), std::string::npos) << verdict;
  // Provenance: every file with its size and CRC-32, the CRC as zlib computes it over the whole file (the
  // check sums a file in the same read that checks its values).
  const std::string imported = read_file(out("good") / "imported.csv");
  EXPECT_NE(imported.find((*dir_ / "good/runs/fa2-bf16-s2/step_20.safetensors").string() + ","), std::string::npos);
  EXPECT_EQ(std::count(imported.begin(), imported.end(), '\n'), std::count(imported.begin(), imported.end(), '#') + 1 + 16);
  const auto zlib_row = [](const fs::path& file) {
    const RunResult r = run_command(std::string(FASTUDY_PYTHON) + " -c \"import os, sys, zlib; d = open(sys.argv[1], 'rb').read(); " +
                                    "print('%s,%d,%08x' % (sys.argv[1], len(d), zlib.crc32(d)))\" '" + file.string() + "'");
    EXPECT_EQ(r.code, 0) << r.output;
    return r.output;
  };
  for (const std::string kase : {"good", "sharded"}) {
    const std::string rows = read_file(out(kase) / "imported.csv");
    const fs::path run = *dir_ / kase / "runs/fa2-bf16-s2";
    const std::vector<fs::path> files =
        kase == "good" ? std::vector<fs::path>{run / "step_20.safetensors"}
                       : std::vector<fs::path>{run / "step_20/model.safetensors.index.json",
                                               run / "step_20/model-00001-of-00002.safetensors",
                                               run / "step_20/model-00002-of-00002.safetensors"};
    for (const auto& file : files) EXPECT_NE(rows.find(zlib_row(file)), std::string::npos) << zlib_row(file) << rows;
  }
}

TEST_F(Import, BadInputExitsTwoNamingFileAndTensorAndWritesNothing) {
  const std::string faulty = "runs/fa2-bf16-s2/step_20.safetensors";
  struct Row {
    std::string kase;
    std::vector<std::string> texts;
  };
  const std::vector<Row> rows = {
      {"missing", {faulty, "does not exist", "has no file for step 20"}},
      {"truncated", {faulty, "'module.w'", "truncated"}},
      {"offsets", {faulty, "'module.w'", "point outside"}},
      {"nan", {faulty, "'module.w' holds NaN (element 53 of 128)"}},
      {"inf", {faulty, "'module.b' holds Inf (element 7 of 16)"}},
      // The same check in every stored format, through the reader (h5py) and past the first MiB of a file.
      {"nan-bf16", {faulty, "'module.w' holds NaN (element 53 of 128)"}},
      {"inf-f16", {faulty, "'module.b' holds Inf (element 7 of 16)"}},
      {"inf-f64", {faulty, "'module.b' holds Inf (element 7 of 16)"}},
      {"nan-h5", {"runs/fa2-bf16-s2/step_20.h5", "'module.w' holds NaN (element 53 of 128)"}},
      {"nan-late", {faulty, "'module.big' holds NaN (element 400000 of 600000)"}},
      {"shape", {faulty, "tensor 'b' has shape [16]", "and [15] in run fa2-bf16-s2 at step 20"}},
      {"dtype", {faulty, "tensor 'w' is F32", "and F64 in run fa2-bf16-s2"}},
      {"extra", {faulty, "tensor 'extra' is in run fa2-bf16-s2 at step 20", "exclude it"}},
      {"twice", {"step_020.safetensors", "step_20.safetensors", "two files map to imported run fa2-bf16-s2 at step 20"}},
      {"empty", {"[import] path matches no file"}},
  };
  for (const auto& row : rows) {
    // `run` takes the same path as reduce (its first phase), so one case of it is enough.
    const std::vector<std::string> jobs = row.kase == "nan" ? std::vector<std::string>{"plan", "reduce", "run"}
                                                            : std::vector<std::string>{"plan", "reduce"};
    for (const auto& job : jobs) {
      const RunResult r = run_fastudy(job + " " + grid(row.kase, row.kase));
      EXPECT_EQ(r.code, 2) << row.kase << " " << job << "\n" << r.output;
      for (const auto& text : row.texts) EXPECT_NE(r.output.find(text), std::string::npos) << row.kase << ": " << text << "\n" << r.output;
      EXPECT_FALSE(fs::exists(out(row.kase))) << row.kase << " " << job << ": nothing may be written";
    }
  }
}

TEST_F(Import, TrainAndMicrobenchRefuseAnImportedStudy) {
  for (const std::string job : {"train", "microbench"}) {
    const RunResult r = run_fastudy(job + " " + grid("own-model", "good"));
    EXPECT_EQ(r.code, 2) << job << "\n" << r.output;
    EXPECT_NE(r.output.find("imports its runs ([import])"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out("own-model"))) << job;
  }
}

TEST_F(Import, ATensorNamedModelMustBeRenamedAndEmptyTensorsAreLeftOut) {
  const RunResult refused = run_fastudy("reduce " + grid("names", "names") + " -q");
  EXPECT_EQ(refused.code, 2) << refused.output;
  EXPECT_NE(refused.output.find("tensor 'module.model' is named 'model'"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("rename = { \"model\" = \"model_\" }"), std::string::npos) << refused.output;
  const RunResult r = run_fastudy("reduce " + grid("renamed", "names", "rename = { \"model\" = \"model_\" }\n") + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string rows = data_rows(out("renamed") / "deviation.csv");
  EXPECT_NE(rows.find("\n20,model_,"), std::string::npos);
  EXPECT_NE(rows.find("\n20,model,"), std::string::npos);
  EXPECT_EQ(rows.find(",none,"), std::string::npos);
}

TEST_F(Import, UserAxesAreJudgedByTheSameRules) {
  // The same runs, their attention values read as an axis of the user's ("impl"), with precision as a
  // setting of the user's: impl is judged against seed only, once per precision.
  const std::string text = "[study]\nname = \"own\"\nout = \"" + out("own").string() + "\"\n[import]\npath = \"good/runs/{impl}-{prec}-s{seed}/step_{step}.safetensors\"\n"
                           "strip_prefix = \"module.\"\nexclude = [\"counter\"]\n"
                           "[grid]\nimpl = [\"math\", \"fa2\"]\nprec = [\"fp32\", \"bf16\"]\nseed = [1, 2]\n"
                           "[axes.impl]\nrole = \"optimisation\"\nbaseline = \"math\"\n[axes.prec]\nrole = \"setting\"\n";
  const RunResult r = run_fastudy("reduce " + dir_->file("own.toml", text) + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string verdict = read_file(out("own") / "verdict.csv");
  EXPECT_NE(verdict.find("impl,math,fa2,prec=fp32,seed,*"), std::string::npos) << verdict;
  EXPECT_NE(verdict.find("impl,math,fa2,prec=bf16,seed,*"), std::string::npos) << verdict;
  EXPECT_EQ(verdict.find(",prec,"), std::string::npos) << "a setting is no reference\n" << verdict;
  const std::string axes = read_file(out("own") / "axes.csv");
  EXPECT_NE(axes.find("impl,optimisation,math"), std::string::npos) << axes;
}

TEST_F(Import, AChangedFileIsNoticedByTheNextReduce) {
  const std::string g = grid("changed", "good");
  ASSERT_EQ(run_fastudy("reduce " + g + " -q").code, 0);
  // Another run's checkpoint copied over one file: the same size, other bytes.
  const fs::path victim = *dir_ / "good/runs/math-fp32-s2/step_20.safetensors";
  const fs::path saved = *dir_ / "saved.safetensors";
  fs::copy_file(victim, saved);
  fs::copy_file(*dir_ / "good/runs/math-fp32-s1/step_20.safetensors", victim, fs::copy_options::overwrite_existing);
  const RunResult again = run_fastudy("reduce " + out("changed").string());
  fs::copy_file(saved, victim, fs::copy_options::overwrite_existing);
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("imported file '" + victim.string() + "' changed since the study's last reduce"), std::string::npos)
      << again.output;
  EXPECT_EQ(again.output.find("math-fp32-s1/step_20.safetensors changed"), std::string::npos) << again.output;
  // `run` on the same folder without --resume is refused as for any study; with --resume it goes on.
  EXPECT_EQ(run_fastudy("run " + g + " -q").code, 2);
  EXPECT_EQ(run_fastudy("run " + g + " --resume -q").code, 0);
  const RunResult status = run_fastudy("status " + out("changed").string());
  EXPECT_EQ(status.code, 0) << status.output;
  EXPECT_NE(status.output.find("imported study: 8 runs"), std::string::npos) << status.output;
  EXPECT_NE(status.output.find("reduce: done"), std::string::npos) << status.output;
}

TEST_F(Import, TwoRanksGiveTheSameResultsAsOne) {
  ASSERT_EQ(run_fastudy("reduce " + grid("one", "good") + " -q").code, 0);
  const RunResult r = run_fastudy_mpi(2, "reduce " + grid("two", "good") + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(data_rows(out("two") / "deviation.csv"), data_rows(out("one") / "deviation.csv"));
  EXPECT_EQ(data_rows(out("two") / "verdict.csv"), data_rows(out("one") / "verdict.csv"));
  // Bad input found by rank 1 (it checks every second file) still exits 2 on every rank.
  const RunResult bad = run_fastudy_mpi(2, "reduce " + grid("nan2", "nan") + " -q");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("holds NaN"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace fastudy::test

namespace fastudy::test {
namespace {

// examples/pytorch end to end: train.py (Debian's python3-torch) trains 2 attention implementations x
// 2 precisions x 3 seeds (60 steps here, checkpoints every 20), `fastudy run import.toml` reads its
// torch.save files and reports a verdict for the attention implementation under each precision,
// against seed and precision; the h5py copies of the same weights give the same distances.
TEST(PytorchExample, TrainsAndGetsAVerdictForAttentionPerPrecision) {
  if (std::system((std::string(FASTUDY_PYTHON) + " -c 'import torch' 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << FASTUDY_PYTHON << " cannot import torch (apt-get install python3-torch; scripts/test.sh does)";
  TempDir dir;
  const std::string train = std::string(FASTUDY_PYTHON) + " " FASTUDY_SOURCE_DIR "/examples/pytorch/train.py --out " +
                            (dir / "runs").string() + " --steps 60 --save-every 20 --threads 1";
  const RunResult trained = run_command(train);
  ASSERT_EQ(trained.code, 0) << trained.output;
  EXPECT_NE(trained.output.find("flash2-bf16-s3: loss"), std::string::npos) << trained.output;
  // The example's grid beside the runs (its path is relative to the grid's folder).
  fs::copy_file(FASTUDY_SOURCE_DIR "/examples/pytorch/import.toml", dir / "import.toml");
  const RunResult r = run_fastudy("run " + (dir / "import.toml").string() + " --out " + (dir / "out").string() + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string verdict = read_file(dir / "out/verdict.csv");
  for (const std::string condition : {"precision=fp32", "precision=bf16"})
    for (const std::string reference : {"precision,fp32<->bf16", "seed,*"}) {
      const std::string row = "attention,math,flash2," + condition + "," + reference + ",";
      const auto at = verdict.find(row);
      ASSERT_NE(at, std::string::npos) << row << "\n" << verdict;
      const std::string line = verdict.substr(at, verdict.find('\n', at) - at);
      const std::string last = line.substr(line.rfind(',') + 1);
      EXPECT_TRUE(last == "within" || last == "outside" || last == "undecided") << line;
    }
  const std::string report = read_file(dir / "out/report.md");
  EXPECT_NE(report.find("attention: flash2 vs math | precision bf16"), std::string::npos) << report.substr(0, 2000);
  // The same weights from the h5py files.
  std::string grid = read_file(dir / "import.toml");
  grid.replace(grid.find("step_{step}.pt"), 14, "step_{step}.h5");
  grid.replace(grid.find("out/pytorch"), 11, (dir / "out-h5").string());
  std::ofstream(dir / "import-h5.toml") << grid;
  const RunResult h5 = run_fastudy("reduce " + (dir / "import-h5.toml").string() + " -q");
  ASSERT_EQ(h5.code, 0) << h5.output;
  // h5py lists the tensors by name and torch.save in the model's order: the same rows, in another
  // order (the whole model's sums are exact, so its rows are equal too).
  auto sorted_rows = [](const fs::path& p) {
    std::istringstream in(data_rows(p));
    std::vector<std::string> rows;
    for (std::string line; std::getline(in, line);) rows.push_back(line);
    std::sort(rows.begin(), rows.end());
    return rows;
  };
  EXPECT_EQ(sorted_rows(dir / "out-h5/deviation.csv"), sorted_rows(dir / "out/deviation.csv"));
}

}  // namespace
}  // namespace fastudy::test
