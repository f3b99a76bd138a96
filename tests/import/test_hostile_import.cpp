// Untrusted imported files through the command line (docs/reliability.md, "Files from other stacks"):
// crafted safetensors, torch.save and HDF5 files, special files in their place, names and folders from
// other stacks, a damaged imported.csv, and a working directory longer than PATH_MAX. Every case runs
// `fastudy plan` or `reduce` under a time bound and asserts what it promises: exit 2 with an error line
// naming the file and the tensor and nothing written, or exit 0 with the right result; never a crash
// (a signal), a hang (the bound), an unbounded read, or a wrong number with exit 0. The runs are written
// by write_hostile_imports.py (two runs of one step each, [grid] seed = [1, 2]).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/checksum.hpp"
#include "base/quote.hpp"
#include "cli_util.hpp"
#include "tests/common/suite_fixture.hpp"

namespace fastudy::test {
namespace {

namespace fs = std::filesystem;

// A command that runs longer than this hangs (the slowest case takes a few seconds).
constexpr int kBoundSeconds = 120;

const char* const kCases[] = {
    "st_deep_shape", "st_overflow",     "st_json_range", "st_tab_name",     "st_names",    "st_many",
    "st_good",       "fifo_safetensors", "fifo_crc",     "sharded_good",    "fifo_index",  "fifo_shard",
    "pt_deep_nesting", "pt_view_past_storage", "pt_storage_lies", "pt_view_ok", "pt_self_dict", "pt_bad_version",
    "pt_odd_dict",   "pt_unknown_global", "pt_bad_utf8",     "pt_unknown_opcode", "pt_pop_below_mark", "pt_memo_gap", "h5_deep_groups",
    "h5_external_storage", "devzero_pt",      "h5_soft_cycle", "h5_hard_cycle", "h5_dag",          "h5_external", "h5_vds",
    "h5_unwritten",  "h5_truncated"};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// fastudy ARGS, killed after kBoundSeconds (exit 137: a hang).
RunResult bounded(const std::string& args) {
  return run_command("timeout -s KILL " + std::to_string(kBoundSeconds) + " " + FASTUDY_EXE + " " + args);
}

class HostileImport : public testing_fixture::SuiteFixture<HostileImport> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string cmd = std::string(FASTUDY_PYTHON) + " " FASTUDY_SOURCE_DIR "/tests/import/write_hostile_imports.py " + dir_->str();
    for (const char* c : kCases) cmd += std::string(" ") + c;
    if (!run_fixture_script(cmd)) return;
    // Special files where a checkpoint is expected: a FIFO nobody writes, /dev/zero.
    const fs::path d = dir_->str();
    for (const fs::path& f : {d / "fifo_safetensors/s2/step_10.safetensors", d / "fifo_index/s2/step_10/model.safetensors.index.json",
                              d / "fifo_shard/s2/step_10/model-00001-of-00001.safetensors"}) {
      fs::remove(f);
      if (::mkfifo(f.c_str(), 0600) != 0) return fixture_problem("mkfifo " + f.string() + " failed");
    }
    fs::remove(d / "devzero_pt/s2/step_10.pt");
    fs::create_symlink("/dev/zero", d / "devzero_pt/s2/step_10.pt");
    // A file that crashes libhdf5 1.10 itself (found by fuzzing: tests/fuzz/regressions), as run s2.
    fs::copy(d / "h5_dag", d / "h5_libhdf5_crash", fs::copy_options::recursive);
    fs::copy_file(FASTUDY_SOURCE_DIR "/tests/fuzz/regressions/hdf5/libhdf5-symbol-table-null-read.h5",
                  d / "h5_libhdf5_crash/s2/step_10.h5", fs::copy_options::overwrite_existing);
  }
  static void TearDownTestSuite() { delete dir_; }

  // A grid over the case's two runs; `pattern` relative to the case's folder.
  static std::string grid(const std::string& name, const std::string& kase, const std::string& file = "step_{step}.safetensors") {
    std::ostringstream os;
    os << "[study]\nname = \"hostile\"\nout = \"" << out(name).string() << "\"\n"
       << "[import]\npath = \"" << kase << "/s{seed}/" << file << "\"\n"
       << "[grid]\nseed = [1, 2]\n";
    return dir_->file(name + ".toml", os.str());
  }
  static fs::path out(const std::string& name) { return *dir_ / ("out-" + name); }

  static TempDir* dir_;
};
TempDir* HostileImport::dir_ = nullptr;

// Exit 2 on `plan` and `reduce`, an error line holding every text, nothing written.
void expect_refused(const std::string& name, const std::string& grid_path, const fs::path& out,
                    const std::vector<std::string>& texts) {
  for (const std::string job : {"plan", "reduce"}) {
    const RunResult r = bounded(job + " " + grid_path);
    EXPECT_EQ(r.code, 2) << name << " " << job << (r.code == 137 ? " (a hang)" : "") << "\n" << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << name << " " << job << "\n" << r.output;
    for (const auto& t : texts) EXPECT_NE(r.output.find(t), std::string::npos) << name << " " << job << ": " << t << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out)) << name << " " << job << ": nothing may be written";
  }
}

TEST_F(HostileImport, CraftedFilesAreRefusedNamingTheFileAndTheTensor) {
  struct Row {
    std::string kase, file;
    std::vector<std::string> texts;
  };
  const std::string s2st = "s2/step_10.safetensors", s2pt = "s2/step_10.pt", s2h5 = "s2/step_10.h5";
  const std::vector<Row> rows = {
      // class 1: a crash before
      {"st_deep_shape", "step_{step}.safetensors", {"s1/step_10.safetensors", "nests JSON more than 64 levels deep"}},
      {"pt_deep_nesting", "step_{step}.pt", {"s1/step_10.pt", "its pickle (data.pkl) nests containers more than 64 levels deep"}},
      {"pt_self_dict", "step_{step}.pt", {"s1/step_10.pt", "builds a container that holds itself"}},
      {"pt_odd_dict", "step_{step}.pt", {"s1/step_10.pt", "from an odd number of items"}},
      {"pt_unknown_opcode", "step_{step}.pt", {"s1/step_10.pt", "holds opcode 0x95 at byte 2, which LibTorch's unpickler does not read"}},
      {"pt_pop_below_mark", "step_{step}.pt", {"s1/step_10.pt", "pops 3 item(s) at byte", "above the last MARK"}},
      {"pt_memo_gap", "step_{step}.pt", {"s1/step_10.pt", "stores memo entry 4294967295 at byte 3 while the memo holds 0"}},
      {"h5_deep_groups", "step_{step}.h5", {"s1/step_10.h5", "groups nest more than 64 levels deep"}},
      // class 1 and 2: a view past its storage (a crash, or numbers from the heap with exit 0)
      {"pt_view_past_storage", "step_{step}.pt",
       {"s1/step_10.pt", "tensor 'w' is a view (sizes [64], strides [1], offset 0) that reaches past the 16 bytes its storage holds"}},
      {"pt_storage_lies", "step_{step}.pt", {"s1/step_10.pt", "tensor 'w'", "past the 16 bytes its storage holds"}},
      // class 3: special files, no hang, no unbounded read
      {"fifo_safetensors", "step_{step}.safetensors", {s2st, "is a FIFO (named pipe), not a regular file"}},
      {"fifo_index", "step_{step}/model.safetensors.index.json", {"s2/step_10/model.safetensors.index.json", "is a FIFO"}},
      {"fifo_shard", "step_{step}/model.safetensors.index.json", {"s2/step_10/model-00001-of-00001.safetensors", "is a FIFO"}},
      {"devzero_pt", "step_{step}.pt", {s2pt, "is a character device"}},
      // class 4: exit 2 naming the file where an internal error was
      {"st_overflow", "step_{step}.safetensors", {"s1/step_10.safetensors", "tensor 'w'", "needs more than 2^64"}},
      {"st_json_range", "step_{step}.safetensors", {"s1/step_10.safetensors", "is not valid JSON", "number overflow"}},
      {"st_tab_name", "step_{step}.safetensors", {"s1/step_10.safetensors", "tensor 'a\\tb'", "holds a control character"}},
      {"pt_bad_utf8", "step_{step}.pt", {"s1/step_10.pt", "tensor 'a\\xffb'", "is not valid UTF-8"}},
      {"pt_bad_version", "step_{step}.pt", {"s1/step_10.pt", "cannot read this torch.save file"}},
      {"pt_unknown_global", "step_{step}.pt", {"s1/step_10.pt", "cannot read this torch.save file", "os.system"}},
      {"h5_unwritten", "step_{step}.h5", {"s1/step_10.h5", "tensor 'w'", "not every element was ever written"}},
      // class 10: nothing outside the file is read
      {"h5_external", "step_{step}.h5", {"s1/step_10.h5", "'/e' is an external link to", "outside-1.h5"}},
      {"h5_vds", "step_{step}.h5", {"s1/step_10.h5", "tensor 'w' is a virtual dataset"}},
      {"h5_external_storage", "step_{step}.h5", {"s1/step_10.h5", "tensor 'w' keeps its data in external files"}},
      // class 11: HDF5's own refusal is bad input too
      {"h5_truncated", "step_{step}.h5", {"s1/step_10.h5", "HDF5 cannot open it"}},
      // class 1: a crash of libhdf5 itself ends its reader process, not fastudy
      {"h5_libhdf5_crash", "step_{step}.h5", {s2h5, "HDF5 crashed reading it (signal 11: Segmentation fault)"}},
  };
  for (const auto& row : rows) expect_refused(row.kase, grid(row.kase, row.kase, row.file), out(row.kase), row.texts);
  // On 2 ranks the crashing file is rank 1's to check: every rank exits 2, rank 0 names it.
  const RunResult r = run_fastudy_mpi(2, "reduce " + grid("crash2", "h5_libhdf5_crash", "step_{step}.h5"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("s2/step_10.h5': HDF5 crashed reading it"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out("crash2")));
}

// The values of imported.csv-free facts: the whole model's W1 between the two runs, from deviation.csv.
std::string model_w1(const fs::path& out) {
  const std::string csv = read_file(out / "deviation.csv");
  const auto at = csv.find("\n10,model,");
  if (at == std::string::npos) return "";
  const std::string line = csv.substr(at + 1, csv.find('\n', at + 1) - at - 1);
  std::size_t pos = 0;
  std::vector<std::string> f = csv_split_record(line, pos);
  return f.size() > 4 ? f[4] : "";
}

TEST_F(HostileImport, LinkCyclesAndDagsAreWalkedOnceAndAValidViewReadsItsElements) {
  // Every object once (by its address): the cycle and the 2^40 paths of the DAG hold one tensor each.
  for (const auto& [kase, tensor] : {std::pair<std::string, std::string>{"h5_soft_cycle", "w"}, {"h5_hard_cycle", "g.w"},
                                      {"h5_dag", "g0.w"}}) {
    const RunResult r = bounded("reduce " + grid(kase, kase, "step_{step}.h5") + " -q");
    ASSERT_EQ(r.code, 0) << kase << (r.code == 137 ? " (a hang)" : "") << "\n" << r.output;
    const std::string csv = read_file(out(kase) / "deviation.csv");
    std::size_t rows = 0;
    for (auto at = csv.find("\n10,"); at != std::string::npos; at = csv.find("\n10,", at + 1)) ++rows;
    EXPECT_EQ(rows, 2u) << kase << ": one tensor and the whole model, each object once\n" << csv;
    EXPECT_NE(csv.find("\n10," + tensor + ","), std::string::npos) << kase << "\n" << csv;
  }
  // W1 between s1 = w + 0.01 and s2 = w + 0.02 at elements 1 and 3 of w: 0.01 (fp32 of 0.26 + 0.01 etc.).
  const RunResult ok = bounded("reduce " + grid("pt_view_ok", "pt_view_ok", "step_{step}.pt") + " -q");
  ASSERT_EQ(ok.code, 0) << ok.output;
  const double w1 = std::stod(model_w1(out("pt_view_ok")));
  // The runs differ by 0.01 in every element, as fp32 values: |(0.26f + 0.02f) - (0.26f + 0.01f)| is 0.01
  // within 2 roundings of fp32 at 0.3 (2^-24 * 2 * 0.3 < 4e-8).
  EXPECT_NEAR(w1, 0.01, 4e-8) << model_w1(out("pt_view_ok"));
}

TEST_F(HostileImport, NamesFromOtherStacksAreNeverPathsMarkupOrMathtext) {
  const RunResult r = bounded("reduce " + grid("names", "st_names") + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  // deviation.h5: every tensor's group by index, its name an attribute (h5py reads them back).
  const std::string check = std::string(FASTUDY_PYTHON) + " -c \"import h5py,sys; f=h5py.File(sys.argv[1]); "
                            "print(sorted(g.attrs['name'] for g in f['steps/10'].values()))\" " + (out("names") / "deviation.h5").string();
  const RunResult names = run_command(check);
  ASSERT_EQ(names.code, 0) << names.output;
  EXPECT_EQ(names.output, "['$\\\\alpha_{x$', '<b>x</b>|y\\\\', 'enc/layer0/w', 'model']\n");
  const RunResult report = bounded("report " + out("names").string() + " -q");
  ASSERT_EQ(report.code, 0) << report.output;
  const std::string md = read_file(out("names") / "report.md");
  EXPECT_EQ(md.find("could not be rendered"), std::string::npos) << md;
  EXPECT_EQ(md.find("<b>x</b>"), std::string::npos) << "raw HTML from a name in report.md";
  EXPECT_NE(md.find("&lt;b>x&lt;/b>\\|y\\\\"), std::string::npos) << md;
  EXPECT_EQ(read_file(out("names") / "report.html").find("<b>x</b>"), std::string::npos);
}

TEST_F(HostileImport, EachFileIsOpenedOncePerRankAndStep) {
  // 300 tensors per file: every task reads its tensor from the file opened at the step's first read.
  const RunResult r = bounded("reduce " + grid("many", "st_many") + " -v");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const std::string run : {"s1", "s2"}) {
    const std::string line = "reduce: opened " + (*dir_ / "st_many" / run / "step_10.safetensors").string();
    std::size_t n = 0;
    for (auto at = r.output.find(line); at != std::string::npos; at = r.output.find(line, at + 1)) ++n;
    EXPECT_EQ(n, 1u) << run << "\n" << r.output.substr(0, 3000);
  }
}

TEST_F(HostileImport, AFolderOfAnyNameTravelsWholeAndImportedCsvIsQuotedAndVerified) {
  // A folder with a tab, a newline, a comma and a quote, on 2 ranks (the facts and the plan travel
  // between ranks).
  const std::string odd = "imp\tx\ny,\"q";
  fs::copy(*dir_ / "st_good", *dir_ / odd, fs::copy_options::recursive);
  const std::string g = grid("odd", "imp\\tx\\ny,\\\"q");  // the folder's name as a TOML string holds it
  const RunResult r = run_fastudy_mpi(2, "reduce " + g + " -q");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string csv = read_file(out("odd") / "imported.csv");
  std::size_t at = 0, rows = 0;
  while (at < csv.size()) {
    if (csv[at] == '#' || csv.compare(at, 5, "path,") == 0) {
      at = csv.find('\n', at) + 1;
      continue;
    }
    const std::vector<std::string> f = csv_split_record(csv, at);
    ASSERT_EQ(f.size(), 3u) << csv;
    EXPECT_EQ(f[0], escaped((*dir_ / odd / ("s" + std::to_string(++rows)) / "step_10.safetensors").string())) << csv;
  }
  EXPECT_EQ(rows, 2u) << csv;
  // A flipped byte: named as not matching its checksum, no false "changed" warning, the reduce goes on.
  const fs::path imported = out("odd") / "imported.csv";
  std::string bytes = read_file(imported);
  bytes[bytes.size() - 3] ^= 0x01;
  spit(imported.string(), bytes);
  const RunResult flipped = run_fastudy("reduce " + out("odd").string());
  EXPECT_EQ(flipped.code, 0) << flipped.output;
  EXPECT_NE(flipped.output.find("the imported.csv of the study's last reduce cannot be read (checksum mismatch"), std::string::npos)
      << flipped.output;
  EXPECT_EQ(flipped.output.find("changed since"), std::string::npos) << flipped.output;
  // Garbage, resealed: named as malformed, not parsed.
  spit(imported.string(), "path,bytes,crc32\nnot,a,number\n");
  write_checksum(imported.string());
  const RunResult garbage = run_fastudy("reduce " + out("odd").string());
  EXPECT_EQ(garbage.code, 0) << garbage.output;
  EXPECT_NE(garbage.output.find("is not path,bytes,crc32"), std::string::npos) << garbage.output;
}

TEST_F(HostileImport, AFifoInPlaceOfAStudysFilesIsNamedNotWaitedFor) {
  ASSERT_EQ(bounded("reduce " + grid("crc", "fifo_crc") + " -q").code, 0);
  // imported.csv: named in a warning, not compared, written anew.
  const fs::path imported = out("crc") / "imported.csv";
  fs::remove(imported);
  ASSERT_EQ(::mkfifo(imported.c_str(), 0600), 0);
  const RunResult again = bounded("reduce " + out("crc").string());
  EXPECT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("the imported.csv of the study's last reduce cannot be read (not a regular file)"), std::string::npos)
      << again.output;
  EXPECT_TRUE(fs::is_regular_file(imported));
  // study.toml's sidecar: the study cannot be read, named, no hang.
  const fs::path crc = out("crc") / "study.toml.crc";
  fs::remove(crc);
  ASSERT_EQ(::mkfifo(crc.c_str(), 0600), 0);
  const RunResult r = bounded("status " + out("crc").string());
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.code, 137) << "a hang";
  EXPECT_NE(r.output.find("study.toml"), std::string::npos) << r.output;
}

TEST_F(HostileImport, AWorkingDirectoryLongerThanPathMaxIsRefusedBeforeTheLock) {
  // 25 folders of 200 characters: a working directory of 5,000 characters, more than PATH_MAX (4096).
  // bash enters it a folder at a time (dash's cd fails on a path that long).
  const std::string part(200, 'd');
  std::string cd = "cd " + dir_->str();
  for (int i = 0; i < 25; ++i) cd += " && mkdir " + part + " && cd " + part;
  const RunResult r = run_command("bash -c '" + cd + " && exec timeout -s KILL " + std::to_string(kBoundSeconds) + " " +
                                  FASTUDY_EXE + " reduce " + grid("deep", "st_good") + " --out rel'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("longer than PATH_MAX"), std::string::npos) << r.output;
  const RunResult left = run_command(cd.substr(0, cd.find(" && mkdir")) + " && find . -name 'rel' -o -name 'fastudy.lock' | wc -l");
  EXPECT_EQ(left.output, "0\n") << "a study or lock was left behind";
}

}  // namespace
}  // namespace fastudy::test
