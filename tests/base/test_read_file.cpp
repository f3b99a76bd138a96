// Bounded reads of the files users name (base/read_file.hpp): a regular file within the limit is read
// whole (an empty one too); a FIFO with no writer, /dev/zero, /dev/null, a directory, a missing file and
// a file over the limit are named problems, never a hang or an unbounded read.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/read_file.hpp"

namespace fastudy {
namespace {

namespace fs = std::filesystem;

struct Scratch {
  fs::path dir = fs::path(::testing::TempDir()) / ("read_file_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  }
};

// The problem of reading `path` with a limit of `max` bytes ("" when it was read).
std::string problem_of(const std::string& path, std::size_t max = 1024) {
  std::string problem;
  const auto text = read_regular_file(path, max, &problem);
  EXPECT_EQ(text.has_value(), problem.empty()) << path;
  return problem;
}

TEST(ReadRegularFile, ReadsARegularFileWithinTheLimitWhole) {
  Scratch s;
  std::string problem;
  EXPECT_EQ(read_regular_file(s.write("g.toml", "[study]\nname = \"x\"\n"), 1024, &problem), "[study]\nname = \"x\"\n");
  EXPECT_EQ(read_regular_file(s.write("empty.toml", ""), 1024, &problem), "");
  EXPECT_EQ(read_regular_file(s.write("exact", std::string(1024, 'a')), 1024, &problem)->size(), 1024u);
  fs::create_symlink(s.dir / "g.toml", s.dir / "link.toml");
  EXPECT_TRUE(read_regular_file((s.dir / "link.toml").string(), 1024, &problem).has_value()) << problem;
}

TEST(ReadRegularFile, EverythingElseIsANamedProblemWithoutAHang) {
  Scratch s;
  const std::string fifo = (s.dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(problem_of(fifo), "is a FIFO (named pipe), not a regular file");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "the open of a FIFO with no writer blocked";
  EXPECT_EQ(problem_of("/dev/zero"), "is a character device (such as /dev/null or /dev/zero), not a regular file");
  EXPECT_EQ(problem_of("/dev/null"), "is a character device (such as /dev/null or /dev/zero), not a regular file");
  EXPECT_EQ(problem_of(s.dir.string()), "is a directory, not a regular file");
  EXPECT_EQ(problem_of((s.dir / "missing").string()), "cannot be opened: No such file or directory");
  EXPECT_EQ(problem_of(s.write("big", std::string(1025, 'a'))), "is 1025 bytes, more than the 1024 it may have");
}

}  // namespace
}  // namespace fastudy
