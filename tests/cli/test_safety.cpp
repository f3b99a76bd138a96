// Issue 28, phase 2, through the command line: nothing changes the verdict silently. A checkpoint
// copied or moved into another place with its valid sidecar (another step of the same variant, another
// variant's), or trained with another configuration than study.toml's, is caught by every reader
// (status, reduce, report, the microbenchmark's captured inputs) and repaired by --resume to the
// clean run's result.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "base/quote.hpp"
#include "src/io/checkpoint.hpp"
#include "tests/cli/checkpoint_util.hpp"
#include "tests/cli/cli_util.hpp"

using namespace fastudy;
using namespace fastudy::test;
namespace fs = std::filesystem;

namespace {

// The rows of a CSV without its provenance header (which names the command).
std::string data_rows(const std::string& path) {
  std::istringstream in(slurp(path));
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind('#', 0) != 0) out += line + "\n";
  return out;
}

// Copies a checkpoint and its sidecar over another place: a whole, sealed file in the wrong place.
void copy_checkpoint(const std::string& from, const std::string& to) {
  for (const char* suffix : {"", ".crc"})
    fs::copy_file(from + suffix, to + suffix, fs::copy_options::overwrite_existing);
}

struct Study {
  TempDir dir;
  std::string out, grid;
  std::string verdict;                                // verdict.csv's rows of the clean run
  std::map<std::string, std::map<std::string, std::string>> final_states;  // the final checkpoint of every variant
  Study() {
    out = (dir / "a").string();
    grid = dir.file("g.toml", tiny_grid(out, 4, 2));
    const RunResult r = run_fastudy(grid + " -q");
    EXPECT_EQ(r.code, 0) << r.output;
    verdict = data_rows(out + "/verdict.csv");
    for (const char* id : kIds) final_states[id] = final_state(out, id, 4);
  }
  // status, reduce and report each exit 1 with an error line naming `path` and `what`.
  void readers_refuse(const std::string& path, const std::string& what) const {
    for (const char* job : {"status", "reduce", "report"}) {
      ::setenv("FASTUDY_PYTHON", "/bin/true", 1);
      const RunResult r = run_fastudy(std::string(job) + " " + out);
      ::unsetenv("FASTUDY_PYTHON");
      EXPECT_EQ(r.code, 1) << job << ": " << r.output;
      EXPECT_NE(r.output.find(path), std::string::npos) << job << ": " << r.output;
      EXPECT_NE(r.output.find(what), std::string::npos) << job << ": " << r.output;
    }
  }
  // --resume repairs the study: every final checkpoint and the verdict equal the clean run's.
  void resume_repairs(const std::string& requeued) const {
    RunResult r = run_fastudy("train " + grid + " --resume");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("requeue " + requeued + ": checkpoint of step"), std::string::npos) << r.output;
    for (const char* id : kIds) EXPECT_TRUE(final_state(out, id, 4) == final_states.at(id)) << id;
    r = run_fastudy("reduce " + out + " -q");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(data_rows(out + "/verdict.csv"), verdict);
    EXPECT_EQ(run_fastudy("status " + out + " -q").code, 0);
  }
};

}  // namespace

TEST(CheckpointIdentity, AnEarlierStepCopiedOverALaterOneIsCaughtAndRepaired) {
  Study s;
  const std::string last = checkpoint_path(s.out, "flash-fp32", 4);
  copy_checkpoint(checkpoint_path(s.out, "flash-fp32", 2), last);
  s.readers_refuse(last, "at step 2, not variant 'flash-fp32' at step 4");
  s.resume_repairs("flash-fp32");
}

TEST(CheckpointIdentity, AnotherVariantsCheckpointIsCaughtAndTheVerdictStaysTheCleanOne) {
  Study s;
  const std::string last = checkpoint_path(s.out, "flash-bf16", 4);
  copy_checkpoint(checkpoint_path(s.out, "baseline-fp32", 4), last);
  s.readers_refuse(last, "variant 'baseline-fp32' at step 4, not variant 'flash-bf16'");
  s.resume_repairs("flash-bf16");
}

TEST(CheckpointIdentity, ACheckpointOfAnotherConfigurationAmongTheGridsIsCaughtAndRepaired) {
  Study s;
  const std::string mid = checkpoint_path(s.out, "baseline-bf16", 2);
  retag(mid, "config_hash", "00000000deadbeef");
  s.readers_refuse(mid, "trained with configuration hash 00000000deadbeef");
  s.resume_repairs("baseline-bf16");
}

// Every checkpoint of a variant trained with another configuration: --resume does not delete them
// (the configuration changed; --force retrains), the variant fails naming the reason.
TEST(CheckpointIdentity, AVariantWhoseCheckpointsAllHaveAnotherConfigurationFailsUnlessForced) {
  Study s;
  for (std::int64_t step : {2, 4}) retag(checkpoint_path(s.out, "flash-fp32", step), "config_hash", "00000000deadbeef");
  const std::string before = slurp(checkpoint_path(s.out, "flash-fp32", 2));
  RunResult r = run_fastudy("train " + s.grid + " --resume -q");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("flash-fp32 failed at step 0: checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was written with another configuration"), std::string::npos) << r.output;
  EXPECT_EQ(slurp(checkpoint_path(s.out, "flash-fp32", 2)), before);
  r = run_fastudy("train " + s.grid + " --resume --force -q");
  EXPECT_EQ(r.code, 0) << r.output;
  for (const char* id : kIds) EXPECT_TRUE(final_state(s.out, id, 4) == s.final_states.at(id)) << id;
}

// Issue 28, item 9: a grid path with a newline (and a comma and a quote) leaves every CSV fastudy
// writes readable: its provenance lines stay one line each, every row has the header's fields.
TEST(CsvFiles, AGridPathWithANewlineLeavesEveryCsvReadable) {
  TempDir dir;
  const std::string gdir = (dir / "g\nx,\"y").string(), out = (dir / "out").string();
  fs::create_directories(gdir);
  const std::string grid = gdir + "/grid.toml";
  spit(grid, tiny_grid(out, 2, 2));
  const std::string log = (dir / "log").string();
  const pid_t pid = spawn_logged({FASTUDY_EXE, grid, "-q"}, log);  // no shell: the path as it is
  int status = -1;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(log);
  int files = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.path().extension() != ".csv") continue;
    ++files;
    const std::string text = slurp(e.path().string());
    std::size_t at = 0, header = 0;
    int grid_lines = 0;
    while (at < text.size()) {
      const std::size_t eol = text.find('\n', at);
      const std::string line = text.substr(at, eol - at);
      if (line.rfind('#', 0) == 0) {
        EXPECT_TRUE(line.rfind("# fastudy ", 0) == 0 || line.find(": ") != std::string::npos) << e.path() << ": " << line;
        grid_lines += line.rfind("# grid: ", 0) == 0;
        at = eol + 1;
        continue;
      }
      const std::size_t fields = csv_split_record(text, at).size();
      if (header == 0) header = fields;
      EXPECT_EQ(fields, header) << e.path() << ": " << line;
    }
    if (e.path().filename() != "status.csv" && e.path().filename() != "variants.csv") {
      EXPECT_EQ(grid_lines, 1) << e.path();
    }
  }
  EXPECT_GE(files, 7);
  const RunResult r = run_fastudy("status " + out);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(slurp(out + "/verdict.csv").find("# grid: " + shell_word(grid) + "\n"), std::string::npos);
}

// Issue 28, item 8 (readers): the report shows only results computed for the study as study.toml
// describes it: an output whose recorded configuration hash is another (a stale verdict, deviation.h5 of
// another configuration) is named, and nothing is rendered.
TEST(CheckpointIdentity, TheReportRefusesResultsOfAnotherConfiguration) {
  Study s;
  ::setenv("FASTUDY_PYTHON", "/bin/true", 1);
  const std::string verdict = s.out + "/verdict.csv", text = slurp(verdict);
  const std::size_t at = text.find("# config_hash: ") + 15;
  spit(verdict, text.substr(0, at) + "00000000deadbeef" + text.substr(text.find('\n', at)));
  write_checksum(verdict);
  RunResult r = run_fastudy("report " + s.out);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(verdict + " was written for configuration 00000000deadbeef"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("hint: compute it again: fastudy reduce"), std::string::npos) << r.output;
  spit(verdict, text);
  write_checksum(verdict);
  retag(s.out + "/deviation.h5", "config_hash", "00000000deadbeef");
  r = run_fastudy("report " + s.out);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("deviation.h5 was written for configuration 00000000deadbeef"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(s.out + "/report.html"));
  ::unsetenv("FASTUDY_PYTHON");
}

// Careless states and arguments around a trained study, each named as what it is: a variant recorded as
// running while no job holds the study (its job ended without recording how) is shown failed with the
// repair; `--from -1` is no step (not a missing option); an --out that is a symbolic link loop is a
// usage error naming it, nothing written.
TEST(CarelessUse, RunningWithoutAJobNegativeStepsAndOutLoopsAreNamed) {
  Study s;
  const std::string status = s.out + "/status.csv", text = slurp(status);
  const std::size_t at = text.find(",done,");
  ASSERT_NE(at, std::string::npos) << text;
  spit(status, text.substr(0, at) + ",running," + text.substr(at + 6));
  write_checksum(status);
  RunResult r = run_fastudy("status " + s.out);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("but no job runs the study: the job that trained it ended without recording its end"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--resume"), std::string::npos) << r.output;
  spit(status, text);
  write_checksum(status);

  r = run_fastudy("replay " + s.out + " --variant flash-fp32 --from -1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--from -1 is not a step"), std::string::npos) << r.output;
  r = run_fastudy("replay " + s.out + " --variant flash-fp32");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--from is required"), std::string::npos) << r.output;

  const fs::path loop = s.dir / "loop";
  fs::create_symlink(loop, loop);
  r = run_fastudy("train " + s.grid + " --out " + loop.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("'" + loop.string() + "' cannot be the study's output directory: Too many levels of symbolic links"),
            std::string::npos)
      << r.output;
}
