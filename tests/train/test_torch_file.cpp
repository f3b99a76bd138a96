// torch.save files through LibTorch's reader (src/train/torch_file.hpp): files written by PyTorch
// itself (Debian's python3-torch), values compared exactly with the float64 copies the writer stored;
// what LibTorch 1.13 cannot read (a state_dict() saved as is, the legacy format) refused with a hint.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "base/error.hpp"
#include "src/io/tensor_file.hpp"
#include "src/train/torch_file.hpp"

namespace fastudy::train {
namespace {

namespace fs = std::filesystem;

class TorchFileTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    register_torch_save_reader();
    dir_ = new std::string((fs::temp_directory_path() / ("fastudy_torch_file_" + std::to_string(::getpid()))).string());
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    const std::string cmd = std::string(FASTUDY_PYTHON) + " " FASTUDY_SOURCE_DIR "/tests/train/write_torch_files.py " + *dir_;
    const int status = std::system(cmd.c_str());
    have_torch_ = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    const bool no_torch = WIFEXITED(status) && WEXITSTATUS(status) == 3;
    // No assertion here: any failure in SetUpTestSuite only skips the tests; SetUp() fails each of them.
    if (!no_torch && !have_torch_) failed_command_ = cmd;
  }
  static inline std::string failed_command_;
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    ASSERT_TRUE(failed_command_.empty()) << "the fixture script failed: " << failed_command_;
    if (!have_torch_) GTEST_SKIP() << FASTUDY_PYTHON << " cannot import torch (apt-get install python3-torch; scripts/test.sh does)";
  }
  static std::string at(const std::string& name) { return *dir_ + "/" + name; }
  static void expect_values(const io::TensorFile& f, const std::string& prefix) {
    const io::TensorFile expected = io::TensorFile::open(at("expected.h5"));
    ASSERT_GE(expected.tensors().size(), 7u);
    for (const auto& e : expected.tensors()) {
      const io::TensorEntry* t = f.find(prefix + e.name);
      ASSERT_NE(t, nullptr) << prefix + e.name;
      std::vector<double> want(e.elements), got(t->elements);
      ASSERT_EQ(t->elements, e.elements);
      expected.read(e, want.data());
      f.read(*t, got.data());
      EXPECT_EQ(got, want) << e.name;
    }
  }
  static std::string* dir_;
  static bool have_torch_;
};
std::string* TorchFileTest::dir_ = nullptr;
bool TorchFileTest::have_torch_ = false;

TEST_F(TorchFileTest, APlainDictOfTensorsReadsExactly) {
  const io::TensorFile f = io::TensorFile::open(at("plain.pt"));
  EXPECT_EQ(f.find("bf")->format, Format::bf16);
  EXPECT_EQ(f.find("half")->format, Format::fp16);
  EXPECT_EQ(f.find("wide")->format, Format::fp64);
  EXPECT_EQ(f.find("0.weight")->shape, (std::vector<std::int64_t>{4, 3}));
  EXPECT_FALSE(f.find("steps")->format.has_value());
  expect_values(f, "");
}

TEST_F(TorchFileTest, NestedDictsBecomeNamePrefixesAndOtherValuesAreLeftOut) {
  const io::TensorFile f = io::TensorFile::open(at("nested.pt"));
  EXPECT_EQ(f.find("step"), nullptr);
  expect_values(f, "model.");
}

TEST_F(TorchFileTest, WhatLibTorchCannotReadIsRefusedWithAHint) {
  for (const char* name : {"state_dict.pt", "legacy.pt"}) {
    try {
      io::TensorFile::open(at(name));
      ADD_FAILURE() << name << " was read";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("dict(model.state_dict())"), std::string::npos) << e.hint();
    }
  }
  try {
    io::TensorFile::open(at("state_dict.pt"));
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("OrderedDict"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fastudy::train
