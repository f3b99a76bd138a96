// Tensor files other programs wrote (src/io/tensor_file.hpp): safetensors written by a few lines of
// Python, a sharded index, h5py files; every value compared exactly with the float64 copy the writer
// stored in expected.h5; every damaged header refused naming the file and the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "src/io/h5.hpp"
#include "src/io/tensor_file.hpp"
#include "tests/common/suite_fixture.hpp"

namespace fastudy::io {
namespace {

namespace fs = std::filesystem;

class TensorFileTest : public testing_fixture::SuiteFixture<TensorFileTest> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((fs::temp_directory_path() / ("fastudy_tensor_file_" + std::to_string(::getpid()))).string());
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    const std::string cmd = std::string(FASTUDY_PYTHON) + " " + FASTUDY_SOURCE_DIR "/tests/io/write_tensor_files.py " + *dir_;
    if (!run_fixture_script(cmd)) return;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string at(const std::string& name) { return *dir_ + "/" + name; }

  // Every tensor under expected.h5's group `group` equals what `file` reads: exactly as double, and
  // as float the value rounded to nearest (exact for fp32, fp16 and bf16 tensors).
  static void expect_values(const TensorFile& file, const std::string& group) {
    const TensorFile expected = TensorFile::open(at("expected.h5"));
    int compared = 0;
    for (const auto& e : expected.tensors()) {
      if (e.name.rfind(group + ".", 0) != 0) continue;
      const std::string name = e.name.substr(group.size() + 1);
      const TensorEntry* t = file.find(name);
      ASSERT_NE(t, nullptr) << name;
      ASSERT_EQ(t->elements, e.elements) << name;
      std::vector<double> want(e.elements), got(t->elements);
      std::vector<float> got_float(t->elements);
      expected.read(e, want.data());
      file.read(*t, got.data());
      file.read(*t, got_float.data());
      for (std::size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i], want[i]) << name << "[" << i << "]";
        EXPECT_EQ(got_float[i], static_cast<float>(want[i])) << name << "[" << i << "]";
      }
      ++compared;
    }
    EXPECT_GT(compared, 0) << "no tensor under " << group;
  }

  static std::string error_of(const std::string& name) {
    try {
      const TensorFile f = TensorFile::open(at(name));
      for (const auto& t : f.tensors()) {
        std::vector<double> x(t.elements);
        f.read(t, x.data());
      }
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  }

  static std::string* dir_;
};
std::string* TensorFileTest::dir_ = nullptr;

TEST_F(TensorFileTest, SafetensorsEveryFloatDtypeReadsExactly) {
  const TensorFile f = TensorFile::open(at("all.safetensors"));
  std::vector<std::string> names;
  for (const auto& t : f.tensors()) names.push_back(t.name);
  // In the order of their buffers, __metadata__ left out.
  EXPECT_EQ(names, (std::vector<std::string>{"w.bf16", "scalar", "w.f64", "empty", "steps", "w.f32", "w.f16"}));
  EXPECT_EQ(f.find("w.bf16")->format, Format::bf16);
  EXPECT_EQ(f.find("w.f16")->format, Format::fp16);
  EXPECT_EQ(f.find("w.f64")->format, Format::fp64);
  EXPECT_EQ(f.find("w.bf16")->shape, (std::vector<std::int64_t>{2, 2, 2}));
  EXPECT_EQ(f.find("scalar")->shape, std::vector<std::int64_t>{});
  EXPECT_EQ(f.find("scalar")->elements, 1u);
  EXPECT_EQ(f.find("empty")->elements, 0u);
  EXPECT_FALSE(f.find("steps")->format.has_value());
  EXPECT_EQ(f.find("steps")->stored_type, "I64");
  // 8 bf16 + 1 f32 + 6 f64 + 0 + 5 i64 + 4 f32 + 6 f16
  expect_values(f, "all");
}

TEST_F(TensorFileTest, AnIntegerTensorIsListedButNotReadAsFloats) {
  const TensorFile f = TensorFile::open(at("all.safetensors"));
  std::vector<double> x(5);
  try {
    f.read(*f.find("steps"), x.data());
    FAIL() << "reading an I64 tensor as floats must be refused";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'steps'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("I64"), std::string::npos) << e.what();
  }
}

TEST_F(TensorFileTest, ShardedIndexReadsAsOneFile) {
  const TensorFile f = TensorFile::open(at("model.safetensors.index.json"));
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.files().size(), 3u);  // the index and its two shards
  EXPECT_NE(f.find("layer.1.w")->file.find("model-00002-of-00002"), std::string::npos);
  expect_values(f, "sharded");
}

TEST_F(TensorFileTest, H5pyGroupsBecomeNamePrefixes) {
  const TensorFile f = TensorFile::open(at("h5py.h5"));
  ASSERT_NE(f.find("blocks.0.attn.weight"), nullptr);
  EXPECT_EQ(f.find("blocks.0.ln.bias")->format, Format::fp16);
  EXPECT_EQ(f.find("blocks.0.attn.weight")->format, Format::fp64);
  EXPECT_FALSE(f.find("count")->format.has_value());
  expect_values(f, "h5py");
}

// Each damaged file is refused with a message that names it (and the tensor where one is at fault).
// A range of a tensor equals the same slice of the whole tensor: by positioned reads of the range for
// safetensors (every float dtype, so the byte offset of each element width is exercised), by the rows
// that hold it for h5py files; a range past the end is an error naming the tensor.
TEST_F(TensorFileTest, RangesEqualSlicesOfTheWholeTensor) {
  for (const std::string name : {"all.safetensors", "h5py.h5", "model.safetensors.index.json"}) {
    const TensorFile f = TensorFile::open(at(name));
    int ranges = 0;
    for (const auto& t : f.tensors()) {
      if (!t.format || t.elements < 3) continue;
      std::vector<double> whole(t.elements);
      std::vector<float> whole_float(t.elements);
      f.read(t, whole.data());
      f.read(t, whole_float.data());
      for (std::uint64_t begin : {std::uint64_t{0}, std::uint64_t{1}, t.elements - 2}) {
        const std::uint64_t count = std::min<std::uint64_t>(2, t.elements - begin);
        std::vector<double> part(count);
        std::vector<float> part_float(count);
        f.read_range(t, begin, count, part.data());
        f.read_range(t, begin, count, part_float.data());
        for (std::uint64_t i = 0; i < count; ++i) {
          EXPECT_EQ(part[i], whole[begin + i]) << name << " " << t.name << "[" << begin + i << "]";
          EXPECT_EQ(part_float[i], whole_float[begin + i]) << name << " " << t.name << "[" << begin + i << "]";
        }
        ++ranges;
      }
      std::vector<float> past(2);
      try {
        f.read_range(t, t.elements - 1, 2, past.data());
        ADD_FAILURE() << name << " " << t.name << ": a range past the end was read";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(t.name), std::string::npos) << e.what();
      }
    }
    EXPECT_GT(ranges, 0) << name;
  }
}

// A file truncated after it was opened (its header checked) is read by positioned reads: the short read
// is a UsageError naming the file and the tensor, where a mapping would have been a SIGBUS.
TEST_F(TensorFileTest, AFileTruncatedWhileOpenIsANamedErrorNotASignal) {
  const std::string copy = at("truncated_later.safetensors");
  fs::copy_file(at("all.safetensors"), copy, fs::copy_options::overwrite_existing);
  const TensorFile f = TensorFile::open(copy);
  const TensorEntry& last = f.tensors().back();
  fs::resize_file(copy, fs::file_size(copy) - 4);
  std::vector<double> values(last.elements);
  try {
    f.read(last, values.data());
    ADD_FAILURE() << "a truncated file was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(copy + "': tensor '" + last.name + "': it changed while it was read"), std::string::npos)
        << e.what();
  }
}

TEST_F(TensorFileTest, DamagedFilesAreRefusedNamingFileAndTensor) {
  struct Case {
    const char* file;
    const char* says;
  };
  const Case cases[] = {
      {"truncated.safetensors", "'w.f16'"},  // the last buffer in the file is cut short
      {"short.safetensors", "too short"},
      {"header_past_end.safetensors", "truncated"},
      {"not_json.safetensors", "not valid JSON"},
      {"offsets_past_end.safetensors", "'w.f32': data_offsets"},
      {"size_mismatch.safetensors", "'w.f32': data_offsets span 16 bytes"},
      {"overlap.safetensors", "overlap"},
      {"unknown_dtype.safetensors", "unknown dtype 'F31'"},
      {"escape.safetensors.index.json", "is not the name of a .safetensors file beside the index"},
      {"missing.safetensors.index.json", "'layer.9.w' is missing"},
      {"not_hdf5.h5", "not an HDF5 file"},
      {"no_such_file.safetensors", "cannot be opened: No such file or directory"},
      {"weights.npz", "unknown tensor file type"},
  };
  for (const auto& c : cases) {
    const std::string message = error_of(c.file);
    EXPECT_NE(message.find(c.file), std::string::npos) << c.file << ": " << message;
    EXPECT_NE(message.find(c.says), std::string::npos) << c.file << ": " << message;
  }
}

}  // namespace
}  // namespace fastudy::io
