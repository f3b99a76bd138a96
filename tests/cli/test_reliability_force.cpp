// Reliability of --force (suite Force): it deletes only what the job wrote, as the study's manifest lists
// it, in every job; a folder fastudy did not write, or one whose manifest is missing or damaged, is
// refused and nothing in it changes; microbench --force and train --variant V --force keep the other
// files byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/checksum.hpp"
#include "base/manifest.hpp"
#include "tests/cli/reliability_util.hpp"

using namespace fastudy;
using namespace fastudy::test;
namespace fs = std::filesystem;

namespace {

// Every regular file and symbolic link under dir (relative) with its bytes (a link: "-> target").
std::map<std::string, std::string> contents(const std::string& dir) {
  std::map<std::string, std::string> m;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    const std::string rel = e.path().lexically_relative(dir).string();
    if (e.is_symlink()) m[rel] = "-> " + fs::read_symlink(e.path()).string();
    else if (e.is_regular_file()) m[rel] = slurp(e.path().string());
  }
  return m;
}

}  // namespace

// Issue 28, item 2: --force deletes only what fastudy wrote, as the study's manifest lists it. A
// folder whose study.toml fastudy did not write (a fake, or the user's own grid with --out .), a study
// without a manifest, and one whose manifest is damaged or lists a path outside the study are refused
// (exit 2) and nothing in them changes.
TEST(Force, RefusesWhatHasNoManifestAndDeletesNothing) {
  TempDir dir;
  const std::string fake = (dir / "fake").string();
  fs::create_directories(fake + "/data");
  spit(fake + "/study.toml", "[study]\nname = \"not fastudy's\"\n");
  spit(fake + "/thesis.tex", "\\documentclass{article}");
  spit(fake + "/data/x.csv", "1,2\n");
  const std::string grid = dir.file("g.toml", tiny_grid(fake, 2, 2));
  const auto fake_before = contents(fake);
  for (const std::string& args : {"train " + grid + " --force", grid + " --force", "microbench " + grid + " --force",
                                  "slurm " + grid + " --time 00:10:00 --force"}) {
    const RunResult r = run_fastudy(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find("holds a study without fastudy.manifest"), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(contents(fake), fake_before) << args;
  }

  // `cd project && fastudy study.toml --out . --force`, the user's grid being called study.toml.
  const std::string project = (dir / "project").string();
  fs::create_directories(project + "/src");
  spit(project + "/study.toml", tiny_grid("unused", 2, 2));
  spit(project + "/README", "mine");
  spit(project + "/src/main.c", "int main() {}");
  const auto project_before = contents(project);
  RunResult r = run_command("cd " + project + " && " + FASTUDY_EXE + " study.toml --out . --force");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("holds a study without fastudy.manifest"), std::string::npos) << r.output;
  EXPECT_EQ(contents(project), project_before);

  // A real study whose manifest is missing, damaged, or lists a path outside the study.
  const std::string a = (dir / "a").string();
  const std::string real = dir.file("r.toml", tiny_grid(a, 2, 2));
  ASSERT_EQ(run_fastudy("train " + real + " -q").code, 0);
  const std::string manifest = a + "/fastudy.manifest", outside = dir.file("outside.txt", "keep me");
  const std::string text = slurp(manifest), side = slurp(checksum_path(manifest));
  struct Case {
    std::string name, message;
    std::function<void()> make;
  };
  for (const Case& c : {Case{"missing", "holds a study without fastudy.manifest", [&] { fs::remove(manifest); }},
                        Case{"damaged", "checksum mismatch", [&] { spit(manifest, flip16(text, text.size() / 2)); }},
                        Case{"outside", "not an entry fastudy writes: file train ../outside.txt",
                             [&] {
                               spit(manifest, text + "file train ../outside.txt\n");
                               write_checksum(manifest);
                             }}}) {
    SCOPED_TRACE(c.name);
    c.make();
    const auto before = contents(a);
    r = run_fastudy("train " + real + " --force");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("deletes nothing"), std::string::npos) << r.output;
    EXPECT_EQ(contents(a), before);
    EXPECT_EQ(slurp(outside), "keep me");
    spit(manifest, text);
    spit(checksum_path(manifest), side);
  }
}

// Issue 28, item 2: --force means the same in every job: the files that job wrote (for `run`, every
// file fastudy wrote) are deleted, as the manifest lists them, and nothing else: notes a user put in
// the study, a symbolic link with a checkpoint's name, files of the other jobs. The study folder stays.
// After every phase, the report and the sbatch script, the manifest covers every file fastudy wrote.
TEST(Force, DeletesOnlyTheFilesTheJobWroteInEveryJob) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 4, 2));
  ASSERT_EQ(run_fastudy(grid + " -q").code, 0);  // train and reduce
  ASSERT_EQ(run_fastudy("report " + a + " -q").code, 0);
  ASSERT_EQ(run_fastudy("slurm " + grid + " --time 00:10:00 --resume -q").code, 0);
  std::map<std::string, std::map<std::string, std::string>> clean;
  for (const char* id : kIds) clean[id] = final_state(a, id, 4);

  // Every file fastudy wrote is listed (a writer that forgets to register shows up here).
  auto listed = manifest::read(a);
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(manifest::unlisted(a, *listed), std::vector<std::string>{}) << "files fastudy wrote but did not list";

  // The user's things inside the study.
  const std::string outside = dir.file("outside.h5", "not a checkpoint");
  const std::string cdir = checkpoint_dir(a, "flash-fp32");
  spit(a + "/notes.txt", "my notes");
  fs::create_directories(a + "/data");
  spit(a + "/data/x.csv", "1\n");
  spit(a + "/variants/flash-fp32/mine.txt", "mine");
  spit(cdir + "/my_step.h5", "mine");
  spit(a + "/report_files/figure_of_mine.pdf", "mine");
  fs::create_symlink(outside, cdir + "/step_0000099.h5");
  const auto theirs = [&] {
    auto all = contents(a);
    std::map<std::string, std::string> m;
    for (const auto& [rel, bytes] : all)
      if ((std::none_of(listed->begin(), listed->end(), [&](const manifest::Entry& e) { return manifest::covers(e, rel); }) &&
           rel.rfind(manifest::kName, 0) != 0) ||
          rel == "checkpoints/flash-fp32/step_0000099.h5")
        m[rel] = bytes;
    return m;
  };
  const auto user = theirs();
  ASSERT_EQ(user.size(), 6u);
  const auto of = [&](const std::string& job) {
    std::set<std::string> files;
    for (const auto& [rel, bytes] : contents(a))
      if (std::any_of(listed->begin(), listed->end(), [&](const manifest::Entry& e) { return e.job == job && manifest::covers(e, rel); }) &&
          !user.count(rel))
        files.insert(rel);
    return files;
  };

  // reduce --force: the reduce phase's files are deleted and written again; the checkpoints stay.
  const auto checkpoints_before = contents(a + "/checkpoints");
  spit(a + "/deviation.csv.tmp.dead-0", "left by a killed reduce");
  RunResult r = run_fastudy("reduce " + a + " --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--force: deleted 13 file(s) and folder(s) that `reduce` wrote"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(a + "/deviation.csv.tmp.dead-0"));
  EXPECT_TRUE(fs::exists(a + "/deviation.csv"));
  EXPECT_EQ(contents(a + "/checkpoints"), checkpoints_before);
  EXPECT_EQ(theirs(), user);

  // report --force: the plots of the report are deleted and written again; the user's pdf stays.
  r = run_fastudy("report " + a + " --force -q");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(theirs(), user);
  EXPECT_TRUE(fs::exists(a + "/report.html"));

  // train --force under MPI: the train phase's files only; reduce's, the report's and the user's stay.
  const auto reduce_files = of("reduce"), report_files = of("report");
  r = run_fastudy_mpi(2, "train " + grid + " --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("that `train` wrote"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kept 5 item(s) fastudy did not write: checkpoints/flash-fp32/my_step.h5, data, notes.txt, "
                          "report_files/figure_of_mine.pdf, variants/flash-fp32/mine.txt"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("warning: --force: kept " + cdir + "/step_0000099.h5: it is not what fastudy wrote there"),
            std::string::npos) << r.output;
  EXPECT_EQ(of("reduce"), reduce_files);
  EXPECT_EQ(of("report"), report_files);
  EXPECT_EQ(theirs(), user);
  for (const char* id : kIds) EXPECT_EQ(final_state(a, id, 4), clean[id]) << id;
  EXPECT_EQ(slurp(outside), "not a checkpoint");

  // run --force: every file fastudy wrote, and only those; the study folder itself stays.
  r = run_fastudy(grid + " --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("that `fastudy` wrote"), std::string::npos) << r.output;
  EXPECT_EQ(theirs(), user);
  EXPECT_FALSE(fs::exists(a + "/report.html")) << "run --force deletes the report of before";
  EXPECT_FALSE(fs::exists(a + "/fastudy.sbatch"));
  for (const char* id : kIds) EXPECT_EQ(final_state(a, id, 4), clean[id]) << id;
  EXPECT_EQ(slurp(outside), "not a checkpoint");
  // What the jobs wrote again is listed again: only the user's things are not.
  ASSERT_EQ(run_fastudy("report " + a + " -q").code, 0);
  listed = manifest::read(a);
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(manifest::unlisted(a, *listed),
            (std::vector<std::string>{"checkpoints/flash-fp32/my_step.h5", "data", "data/x.csv", "notes.txt",
                                      "report_files/figure_of_mine.pdf", "variants/flash-fp32/mine.txt"}));
}

// Issue 28, item 2: microbench --force redoes the microbench (only its two files), never the
// checkpoints; its "already complete" line names exactly what --force replaces.
TEST(Force, MicrobenchForceKeepsTheCheckpoints) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("g.toml", grid_with(out, "kind = \"synthetic\"\n"));
  ASSERT_EQ(run_fastudy(grid + " -q").code, 0);
  const auto checkpoints = contents(out + "/checkpoints");
  ASSERT_FALSE(checkpoints.empty());
  RunResult r = run_fastudy("microbench " + grid + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("replacing only microbench.csv and microbench.h5"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--force reruns it"), std::string::npos) << r.output;
  const std::string before = slurp(out + "/microbench.csv");
  r = run_fastudy("microbench " + grid + " --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--force: deleted 4 file(s) and folder(s) that `microbench` wrote"), std::string::npos) << r.output;
  EXPECT_EQ(contents(out + "/checkpoints"), checkpoints);
  EXPECT_TRUE(fs::exists(out + "/status.csv"));
  EXPECT_NE(slurp(out + "/microbench.csv"), before);  // written again (its header names the new command)
}

// Issue 28, item 2: `train --variant V --force` redoes V only: its files go, the other variants'
// checkpoints stay byte for byte (they are not trained again), and the study goes on.
TEST(Force, TrainOneVariantForceKeepsTheOthers) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 4, 2));
  ASSERT_EQ(run_fastudy("train " + grid + " -q").code, 0);
  const auto clean = final_state(a, "flash-fp32", 4);
  std::map<std::string, std::map<std::string, std::string>> others;
  for (const char* id : {"baseline-fp32", "baseline-bf16", "flash-bf16"}) others[id] = contents(checkpoint_dir(a, id));
  spit(checkpoint_dir(a, "flash-fp32") + "/mine.txt", "mine");
  const RunResult r = run_fastudy("train " + grid + " --variant flash-fp32 --force");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--force: deleted 6 file(s) and folder(s) that `train --variant flash-fp32` wrote"), std::string::npos)
      << r.output;
  for (const auto& [id, files] : others) EXPECT_EQ(contents(checkpoint_dir(a, id)), files) << id;
  EXPECT_EQ(final_state(a, "flash-fp32", 4), clean);
  EXPECT_EQ(slurp(checkpoint_dir(a, "flash-fp32") + "/mine.txt"), "mine");
  const RunResult s = run_fastudy("status " + a);
  EXPECT_EQ(s.code, 0) << s.output;
  EXPECT_NE(s.output.find("4 variants: 4 done"), std::string::npos) << s.output;
}
