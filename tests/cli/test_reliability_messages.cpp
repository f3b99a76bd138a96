// Reliability of what the command line prints (suites Slurm and Quiet): the printed sbatch commands are
// shell-quoted and a quote in an output path is refused; -q never hides why a job failed.
#include <gtest/gtest.h>

#include <string>

#include "tests/cli/reliability_util.hpp"

using namespace fastudy;
using namespace fastudy::test;
namespace fs = std::filesystem;

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
