// The trainer's data streams: determinism, sharding, resumability and the error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "base/error.hpp"
#include "src/train/data.hpp"
#include "tests/train/tiny.hpp"

namespace fastudy::train {
namespace {

std::string temp_file(const std::string& name, const std::string& bytes) {
  const auto path = train_test::scratch_root() / name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path.string();
}

// The Error's message, or "" when `make` does not throw one.
template <class F>
std::string error_of(F make) {
  try {
    make();
  } catch (const Error& e) {
    return std::string(e.what()) + "\nhint: " + e.hint();
  }
  return "";
}

TEST(TrainData, SyntheticIsAPureFunctionOfSeedAndIndex) {
  const Variant v = train_test::tiny_variant();
  const DataStream a(v.data, v.model), b(v.data, v.model);
  DataConfig other = v.data;
  other.seed += 1;
  const DataStream c(other, v.model);
  const auto batch_a = a.batch(7, 4, 0, 1);
  EXPECT_EQ(batch_a, b.batch(7, 4, 0, 1));
  EXPECT_NE(batch_a, c.batch(7, 4, 0, 1));
  EXPECT_NE(batch_a, a.batch(8, 4, 0, 1));
  for (auto t : batch_a) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, v.model.vocab);
  }
}

TEST(TrainData, SyntheticRepeatsSpans) {
  // About half of the spans after the first are copies of an earlier stretch: count the spans that
  // occur earlier in their sequence. A fresh span of 8 tokens from a topic of 4 matches one of the <= 57
  // earlier stretches by chance with probability < 57 * 4^-8 ~ 1e-3, so the count estimates the
  // copies (binomial, n ~ 1400 spans, sd ~ 1.3%): expect 35-65%.
  ModelConfig m;
  m.vocab = 64;
  m.seq_len = 64;
  DataConfig d;
  d.span_len = 8;
  const DataStream s(d, m);
  std::vector<std::int64_t> seq(m.seq_len + 1);
  int spans = 0, repeated = 0;
  for (int i = 0; i < 200; ++i) {
    s.sequence(i, seq.data());
    for (int pos = d.span_len; pos + d.span_len <= m.seq_len + 1; pos += d.span_len) {
      ++spans;
      for (int src = 0; src + d.span_len <= pos; ++src) {
        if (std::equal(seq.begin() + pos, seq.begin() + pos + d.span_len, seq.begin() + src)) {
          ++repeated;
          break;
        }
      }
    }
  }
  EXPECT_GT(repeated, spans * 35 / 100);
  EXPECT_LT(repeated, spans * 65 / 100);
  EXPECT_EQ(s.unigram_entropy(), std::log(64.0));
  // Each sequence draws from its own topic of 64 / 16 = 4 tokens.
  for (int i = 0; i < 20; ++i) {
    s.sequence(i, seq.data());
    std::sort(seq.begin(), seq.end());
    EXPECT_LE(std::unique(seq.begin(), seq.end()) - seq.begin(), 4);
  }
}

TEST(TrainData, RanksTakeTheirShardOfTheSameGlobalBatch) {
  const Variant v = train_test::tiny_variant();
  const DataStream s(v.data, v.model);
  const auto whole = s.batch(3, 8, 0, 1);
  std::vector<std::int64_t> joined;
  for (int r = 0; r < 4; ++r) {
    const auto part = s.batch(3, 8, r, 4);
    EXPECT_EQ(part.size(), whole.size() / 4);
    joined.insert(joined.end(), part.begin(), part.end());
  }
  EXPECT_EQ(joined, whole);
  EXPECT_NE(error_of([&] { (void)s.batch(3, 6, 0, 4); }).find("ranks_per_variant"), std::string::npos);
}

TEST(TrainData, TextIsBytesAndNeedsVocab256) {
  Variant v = train_test::tiny_variant();
  v.data.kind = DataKind::text;
  v.data.path = temp_file("text.txt", std::string(100, 'a') + "\xff");
  EXPECT_NE(error_of([&] { DataStream(v.data, v.model); }).find("vocab = 256"), std::string::npos);
  v.model.vocab = 256;
  const DataStream s(v.data, v.model);
  std::vector<std::int64_t> seq(v.model.seq_len + 1);
  for (int i = 0; i < 50; ++i) {
    s.sequence(i, seq.data());
    for (auto t : seq) EXPECT_TRUE(t == 'a' || t == 255);
  }
}

TEST(TrainData, TokensAreLittleEndianUint16) {
  Variant v = train_test::tiny_variant();
  v.model.vocab = 300;
  v.data.kind = DataKind::tokens;
  std::string bytes;
  for (int i = 0; i < 40; ++i) bytes += std::string{static_cast<char>(0x2c), static_cast<char>(0x01)};  // 0x012c = 300
  v.data.path = temp_file("tokens_ok.bin", bytes);
  EXPECT_NE(error_of([&] { DataStream(v.data, v.model); }).find("token id 300 at position 0"), std::string::npos);
  v.model.vocab = 301;
  const DataStream s(v.data, v.model);
  std::vector<std::int64_t> seq(v.model.seq_len + 1);
  s.sequence(0, seq.data());
  for (auto t : seq) EXPECT_EQ(t, 300);
}

TEST(TrainData, ErrorsNameTheFileAndTheFix) {
  Variant v = train_test::tiny_variant();
  v.model.vocab = 256;
  v.data.kind = DataKind::tokens;
  v.data.path = "/nonexistent/dir/train.bin";
  const std::string missing = error_of([&] { DataStream(v.data, v.model); });
  EXPECT_NE(missing.find("cannot open data file '/nonexistent/dir/train.bin'"), std::string::npos) << missing;
  EXPECT_NE(missing.find("hint: check [data] path"), std::string::npos) << missing;

  v.data.path = temp_file("odd.bin", "abc");
  EXPECT_NE(error_of([&] { DataStream(v.data, v.model); }).find("not a whole number of uint16"), std::string::npos);

  v.data.path = temp_file("short.bin", std::string(8, '\0'));
  EXPECT_NE(error_of([&] { DataStream(v.data, v.model); }).find("fewer than one sequence"), std::string::npos);

  v.data.path = "";
  EXPECT_NE(error_of([&] { DataStream(v.data, v.model); }).find("[data] path is empty"), std::string::npos);
}

}  // namespace
}  // namespace fastudy::train
