// Issue 28, phase 2, through the command line: nothing changes the verdict silently. A checkpoint
// copied or moved into another place with its valid sidecar (another step of the same variant, another
// variant's), or trained with another configuration than study.toml's, is caught by every reader
// (status, reduce, report, the microbenchmark's captured inputs) and repaired by --resume to the
// clean run's result.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "src/io/checkpoint.hpp"
#include "tests/cli/checkpoint_util.hpp"
#include "tests/cli/cli_util.hpp"

using namespace fastudy;
using namespace fastudy::test;
namespace fs = std::filesystem;

namespace {

const char* kIds[] = {"baseline-fp32", "baseline-bf16", "flash-fp32", "flash-bf16"};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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

// A variant's final checkpoint as its tensors' bytes and its data cursor (the file's bytes differ
// between runs: HDF5 metadata).
using State = std::map<std::string, std::string>;
State final_state(const std::string& out, const std::string& id) {
  const TrainState s = read_checkpoint(checkpoint_path(out, id, 4));
  State m;
  for (const auto* group : {&s.params, &s.optimizer})
    for (const auto& a : *group) m[a.name] = std::string(reinterpret_cast<const char*>(a.data.data()), a.data.size());
  m["#data_cursor"] = std::to_string(s.data_cursor);
  return m;
}

struct Study {
  TempDir dir;
  std::string out, grid;
  std::string verdict;                                // verdict.csv's rows of the clean run
  std::map<std::string, State> final_states;          // the final checkpoint of every variant
  Study() {
    out = (dir / "a").string();
    grid = dir.file("g.toml", tiny_grid(out, 4, 2));
    const RunResult r = run_fastudy(grid + " -q");
    EXPECT_EQ(r.code, 0) << r.output;
    verdict = data_rows(out + "/verdict.csv");
    for (const char* id : kIds) final_states[id] = final_state(out, id);
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
    for (const char* id : kIds) EXPECT_TRUE(final_state(out, id) == final_states.at(id)) << id;
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
  for (const char* id : kIds) EXPECT_TRUE(final_state(s.out, id) == s.final_states.at(id)) << id;
}
