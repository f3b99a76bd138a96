// The microbenchmark's inputs from a user's tensor file (jobs/microbench/file.hpp): fixtures written by
// h5py and a few lines of Python for safetensors (write_microbench_files.py); the values read exactly;
// every bad input refused with a UsageError that names the file and the tensor.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "jobs/microbench/file.hpp"
#include "src/io/tensor_file.hpp"
#include "tests/common/suite_fixture.hpp"

namespace fastudy {
namespace {

namespace fs = std::filesystem;

class MicrobenchFileTest : public testing_fixture::SuiteFixture<MicrobenchFileTest> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(
        (fs::temp_directory_path() / ("fastudy_microbench_file_" + std::to_string(::getpid()))).string());
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    const std::string cmd =
        std::string(FASTUDY_PYTHON) + " " + FASTUDY_SOURCE_DIR "/tests/jobs/microbench/write_microbench_files.py " + *dir_;
    if (!run_fixture_script(cmd)) return;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string at(const std::string& name) { return *dir_ + "/" + name; }

  // The message of the UsageError that reading `name` throws ("" when none is thrown).
  static std::string refusal(const std::string& name, bool backward = true) {
    try {
      read_microbench_file(at(name), backward, "[microbench] sweep 's': input_file");
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  }

  static std::string* dir_;
};
std::string* MicrobenchFileTest::dir_ = nullptr;

TEST_F(MicrobenchFileTest, ReadsSafetensorsAndH5pyExactly) {
  const io::TensorFile expected = io::TensorFile::open(at("expected.h5"));
  for (const auto& [file, group] : {std::pair<std::string, std::string>{"inputs.safetensors", "safetensors"},
                                    std::pair<std::string, std::string>{"inputs.h5", "h5"}}) {
    const FileInputs in = read_microbench_file(at(file), true, "input_file");
    EXPECT_EQ(in.batch, 1);
    EXPECT_EQ(in.heads, 2);
    EXPECT_EQ(in.seq_len, 40);
    EXPECT_EQ(in.head_dim, 16);
    const std::vector<double>* got[] = {&in.values.q, &in.values.k, &in.values.v, &in.values.dout};
    for (int i = 0; i < 4; ++i) {
      const io::TensorEntry* e = expected.find(group + "." + kFileTensors[i]);
      ASSERT_NE(e, nullptr);
      std::vector<double> want(e->elements);
      expected.read(*e, want.data());
      EXPECT_EQ(*got[i], want) << file << " " << kFileTensors[i];
    }
  }
  EXPECT_EQ(read_microbench_file(at("inputs.h5"), true, "input_file").stored_types.at("do"), "float16");
}

TEST_F(MicrobenchFileTest, DoIsNeededForTheBackwardPassOnly) {
  const FileInputs in = read_microbench_file(at("forward_only.safetensors"), false, "input_file");
  EXPECT_TRUE(in.values.dout.empty());
  EXPECT_EQ(in.values.q.size(), 1u * 2 * 40 * 16);
  const std::string msg = refusal("forward_only.safetensors");
  EXPECT_NE(msg.find("no tensor 'do' (the backward pass needs do"), std::string::npos) << msg;
}

// Each bad file: the message names the key, the file and the tensor, and says what is wrong.
TEST_F(MicrobenchFileTest, EveryBadInputIsRefusedNamingTheFileAndTheTensor) {
  struct Case {
    const char* file;
    const char* tensor;  // "tensor 'x'" is in the message
    const char* what;
  };
  const Case cases[] = {
      {"missing_v.safetensors", "no tensor 'v'", "the file holds do, k, q"},
      {"rank3.safetensors", "tensor 'q'", "has shape [2, 40, 16] (rank 3)"},
      {"shape_mismatch.safetensors", "tensor 'k'", "has shape [1, 2, 41, 16], q has [1, 2, 40, 16]"},
      {"empty_dim.safetensors", "tensor 'q'", "a dimension is 0"},
      {"nan.safetensors", "tensor 'v'", "holds NaN at [0, 1, 7, 3]"},
      {"inf.h5", "tensor 'q'", "holds an infinity at [0, 0, 2, 5]"},
      {"int_dtype.safetensors", "tensor 'k'", "holds I32 values"},
      {"fp8_dtype.safetensors", "tensor 'k'", "holds F8_E4M3 values"},
      {"truncated.safetensors", "tensor 'v'", "truncated or damaged file"},
      {"offsets_lie.safetensors", "tensor 'do'", "data_offsets [0, 9999999]"},
  };
  for (const Case& c : cases) {
    const std::string msg = refusal(c.file);
    EXPECT_EQ(msg.rfind("[microbench] sweep 's': input_file: '" + at(c.file) + "': ", 0), 0u) << c.file << ": " << msg;
    EXPECT_NE(msg.find(c.tensor), std::string::npos) << c.file << ": " << msg;
    EXPECT_NE(msg.find(c.what), std::string::npos) << c.file << ": " << msg;
  }
  // A truncated HDF5 file is refused as a file (HDF5 cannot tell which dataset the lost bytes held).
  const std::string msg = refusal("truncated.h5");
  EXPECT_NE(msg.find(at("truncated.h5")), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated file"), std::string::npos) << msg;  // HDF5's own words
  EXPECT_NE(refusal("no_such_file.safetensors").find("no_such_file.safetensors"), std::string::npos);
  EXPECT_EQ(refusal("inputs.safetensors"), "");
}

}  // namespace
}  // namespace fastudy
