// Reliability of the command line, verify before parse (suites Integrity and Resume): byte flips and
// attribute tampering in checkpoints, deviation.h5, status.csv and study.toml are named errors and
// --resume repairs damaged checkpoints to the clean result; a status.csv that cannot be read back is set
// aside, never deleted, and rebuilt.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <map>
#include <string>

#include "base/checksum.hpp"
#include "tests/cli/reliability_util.hpp"

using namespace fastudy;
using namespace fastudy::test;
namespace fs = std::filesystem;

TEST(Integrity, ByteFlipsAndTamperingAreNamedAndResumeRepairs) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 4, 2));
  ASSERT_EQ(run_fastudy(grid + " --out " + a + " -q").code, 0);  // train and reduce
  std::map<std::string, std::map<std::string, std::string>> clean;
  for (const char* id : kIds) clean[id] = final_state(a, id, 4);
  const std::string clean_deviation = slurp(a + "/deviation.csv");

  // status.csv, deviation.h5 and study.toml with 16 bytes flipped (at two offsets, one for
  // study.toml; bench/reliability/byte_flips.py flips at 40+ offsets per file), and a damaged
  // sidecar, are named errors of the jobs that read them.
  struct Case {
    std::string file, command;
    int code;
  };
  for (const Case& c : {Case{"status.csv", "status " + a, 1}, Case{"deviation.h5", "report " + a, 1},
                        Case{"study.toml", "status " + a, 1}}) {
    const std::string path = a + "/" + c.file;
    const std::string bytes = slurp(path), side = slurp(checksum_path(path));
    for (std::size_t at : {bytes.size() / 3, bytes.size()}) {
      if (c.file == "study.toml" && at != bytes.size()) continue;  // one case: the suite stays quick
      SCOPED_TRACE(c.file + " at " + std::to_string(at));
      spit(path, flip16(bytes, at));
      ASSERT_NE(slurp(path), bytes);
      const RunResult r = run_fastudy(c.command);
      EXPECT_EQ(r.code, c.code) << r.output;
      EXPECT_NE(r.output.find(path + "': checksum mismatch"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("hint: "), std::string::npos) << r.output;
    }
    spit(path, bytes);
    if (c.file != "status.csv") continue;
    spit(checksum_path(path), flip16(side, 4));
    const RunResult r = run_fastudy(c.command);
    EXPECT_EQ(r.code, c.code) << r.output;
    EXPECT_NE(r.output.find("is damaged"), std::string::npos) << r.output;
    spit(checksum_path(path), side);
  }

  // A damaged status.csv on --resume is set aside and rebuilt from the checkpoints.
  const std::string status = slurp(a + "/status.csv");
  spit(a + "/status.csv", flip16(status, status.size() / 2));
  RunResult r = run_fastudy("train " + grid + " --out " + a + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("set aside as " + a + "/status.csv.set-aside-1"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(a + "/status.csv.set-aside-1"));
  r = run_fastudy("status " + a);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("4 variants: 4 done"), std::string::npos) << r.output;

  // An intermediate checkpoint with flipped bytes: reduce names it and a command that repairs it,
  // status no longer says done, --resume retrains from the last good checkpoint before it.
  const std::string mid = checkpoint_path(a, "flash-bf16", 2);
  const std::string mid_bytes = slurp(mid);
  spit(mid, flip16(mid_bytes, mid_bytes.size() / 2));
  r = run_fastudy("reduce " + a);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(mid), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fastudy train '"), std::string::npos) << r.output;
  r = run_fastudy("status " + a);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("3 done, 1 failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("repair: fastudy train '"), std::string::npos) << r.output;
  // Root attribute tampering (data_cursor, not covered by any dataset's crc32) in a final checkpoint.
  const std::string last = checkpoint_path(a, "baseline-fp32", 4);
  {
    const hid_t f = H5Fopen(last.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const hid_t attr = H5Aopen(f, "data_cursor", H5P_DEFAULT);
    ASSERT_GE(attr, 0);
    const std::int64_t cursor = 3;
    EXPECT_GE(H5Awrite(attr, H5T_NATIVE_INT64, &cursor), 0);
    H5Aclose(attr);
    H5Fclose(f);
  }
  EXPECT_TRUE(checkpoint_problem(last).has_value());
  r = run_fastudy("train " + grid + " --out " + a + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("requeue flash-bf16: checkpoint of step 2 was damaged"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("requeue baseline-fp32: checkpoint of step 4 was damaged"), std::string::npos) << r.output;
  for (const char* id : kIds) {
    SCOPED_TRACE(id);
    EXPECT_EQ(final_state(a, id, 4), clean[id]);
    for (auto s : list_checkpoint_steps(checkpoint_dir(a, id)))
      EXPECT_FALSE(checkpoint_problem(checkpoint_path(a, id, s)).has_value()) << s;
  }
  EXPECT_EQ(run_fastudy("status " + a).code, 0);
  ASSERT_EQ(run_fastudy("reduce " + a + " -q").code, 0);
  // The same distances as before the damage (the provenance header names another command).
  const std::string repaired = slurp(a + "/deviation.csv");
  EXPECT_TRUE(repaired.substr(repaired.find("\nstep")) == clean_deviation.substr(clean_deviation.find("\nstep")));
}

// Issue 28, item 10: a status.csv that cannot be read back (a directory in its place, malformed
// rows under a valid checksum) is set aside, never deleted, and --resume rebuilds it, under MPI too.
TEST(Resume, StatusCsvReplacedByADirectoryIsSetAsideAndRebuilt) {
  TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string grid = dir.file("g.toml", tiny_grid(a, 2, 2));
  ASSERT_EQ(run_fastudy("train " + grid + " -q").code, 0);
  const std::string status = a + "/status.csv";
  fs::remove(status);
  fs::create_directories(status);
  spit(status + "/note.txt", "mine");
  RunResult r = run_fastudy_mpi(2, "train " + grid + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(status + ": not a regular file; set aside as " + status + ".set-aside-1"), std::string::npos) << r.output;
  EXPECT_EQ(slurp(status + ".set-aside-1/note.txt"), "mine");
  EXPECT_TRUE(fs::exists(status + ".set-aside-1.crc"));  // the sidecar went with it
  EXPECT_FALSE(checksum_problem(status).has_value());
  r = run_fastudy("status " + a);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("4 variants: 4 done"), std::string::npos) << r.output;

  // Malformed rows with a checksum that matches them: read back, refused, set aside, rebuilt.
  spit(status, "variant,state,step,loss,wall_time_s,reason\nbaseline-fp32,done\n");
  write_checksum(status);
  r = run_fastudy("status " + a);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("expected 6 fields"), std::string::npos) << r.output;
  r = run_fastudy("train " + grid + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("set aside as " + status + ".set-aside-2"), std::string::npos) << r.output;
  EXPECT_EQ(run_fastudy("status " + a).code, 0);
}
