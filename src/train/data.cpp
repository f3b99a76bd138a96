// The training data stream: synthetic, text and tokens sources (see data.hpp).
#include "src/train/data.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "base/error.hpp"
#include "src/train/rng.hpp"

namespace fastudy::train {
namespace {

std::vector<char> read_file(const std::string& path, DataKind kind) {
  if (path.empty()) {
    throw Error("[data] kind = \"" + std::string(to_string(kind)) + "\" needs a file, but [data] path is empty",
                "set [data] path = \"/path/to/file\", or use kind = \"synthetic\"");
  }
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    throw Error("data file '" + path + "' is not a regular file (" +
                    (std::filesystem::is_directory(path, ec) ? "a directory" : "a device, socket or pipe") + ")",
                "set [data] path to a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error("cannot open data file '" + path + "': " + std::strerror(errno),
                "check [data] path (relative paths are taken from the working directory)");
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    throw Error("cannot read data file '" + path + "': " + std::strerror(errno), "check the file's permissions");
  }
  return bytes;
}

double entropy_of_counts(const std::vector<std::int64_t>& counts, std::int64_t total) {
  double h = 0.0;
  for (std::int64_t c : counts) {
    if (c > 0) {
      const double p = static_cast<double>(c) / static_cast<double>(total);
      h -= p * std::log(p);
    }
  }
  return h;
}

}  // namespace

DataStream::DataStream(const DataConfig& data, const ModelConfig& model)
    : kind_(data.kind), seed_(data.seed), seq_len_(model.seq_len), vocab_(model.vocab), span_len_(data.span_len) {
  if (vocab_ < 2 || seq_len_ < 1) {
    throw Error("[model] vocab = " + std::to_string(vocab_) + ", seq_len = " + std::to_string(seq_len_) +
                    ": the data stream needs vocab >= 2 and seq_len >= 1",
                "fix [model] vocab and seq_len");
  }
  const std::int64_t need = seq_len_ + 1;
  if (kind_ == DataKind::synthetic) {
    if (span_len_ < 1) {
      throw Error("[data] span_len = " + std::to_string(span_len_) + " must be >= 1", "set [data] span_len = 8");
    }
    // Every token is equally likely a priori (topics are uniform random subsets, copies preserve
    // the marginal), so the unigram entropy is log(vocab).
    topic_size_ = std::max(2, vocab_ / 16);
    unigram_entropy_ = std::log(static_cast<double>(vocab_));
    return;
  }
  if (kind_ == DataKind::text) {
    if (vocab_ < 256) {
      throw Error("[data] kind = \"text\" uses byte tokens (0..255), but [model] vocab = " + std::to_string(vocab_),
                  "set [model] vocab = 256 (or more) for text data");
    }
    const std::vector<char> bytes = read_file(data.path, kind_);
    tokens_.resize(bytes.size());
    for (std::size_t i = 0; i < bytes.size(); ++i) tokens_[i] = static_cast<unsigned char>(bytes[i]);
  } else {  // tokens
    const std::vector<char> bytes = read_file(data.path, kind_);
    const std::size_t w = data.token_bytes == 4 ? 4 : 2;
    const std::string type = w == 4 ? "uint32" : "uint16";
    if (bytes.size() % w != 0) {
      throw Error("data file '" + data.path + "' has " + std::to_string(bytes.size()) +
                      " bytes, not a whole number of " + type + " token ids",
                  "kind = \"tokens\" expects a flat little-endian file of " + type +
                      " ids ([data] token_bytes = " + std::to_string(w) + "); for raw text use kind = \"text\"");
    }
    tokens_.resize(bytes.size() / w);
    // The uint16 view of a uint32 file of ids < 65536: ids at even positions, 0 at every odd one.
    bool odd_all_zero = tokens_.size() >= 2, even_nonzero = false;
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      std::uint32_t id = 0;
      for (std::size_t b = 0; b < w; ++b) id |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[w * i + b])) << (8 * b);
      tokens_[i] = id;
      if (i % 2 == 1 && id != 0) odd_all_zero = false;
      if (i % 2 == 0 && id != 0) even_nonzero = true;
    }
    if (w == 2 && odd_all_zero && even_nonzero) {
      throw Error("data file '" + data.path + "' read as uint16 ids has 0 at every odd position: it looks like a "
                      "file of uint32 ids",
                  "set [data] token_bytes = 4 (or write the ids as uint16)");
    }
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      if (tokens_[i] >= static_cast<std::uint32_t>(vocab_)) {
        throw Error("data file '" + data.path + "': token id " + std::to_string(tokens_[i]) + " at position " +
                        std::to_string(i) + " is >= [model] vocab = " + std::to_string(vocab_),
                    "set [model] vocab to at least the tokenizer's vocabulary size (" +
                        std::to_string(tokens_[i] + 1) + " or more)");
      }
    }
  }
  if (static_cast<std::int64_t>(tokens_.size()) < need) {
    throw Error("data file '" + data.path + "' holds " + std::to_string(tokens_.size()) +
                    " tokens, fewer than one sequence (seq_len + 1 = " + std::to_string(need) + ")",
                "use a longer file or a smaller [model] seq_len");
  }
  std::vector<std::int64_t> counts(vocab_, 0);
  for (std::uint32_t t : tokens_) ++counts[t];
  unigram_entropy_ = entropy_of_counts(counts, static_cast<std::int64_t>(tokens_.size()));
}

void DataStream::synthetic_sequence(std::int64_t index, std::int64_t* out) const {
  Rng rng(seed_, static_cast<std::uint64_t>(index));
  // The sequence's topic: topic_size distinct tokens (a partial Fisher-Yates shuffle of the vocab).
  std::vector<std::int64_t> vocab(static_cast<std::size_t>(vocab_));
  for (int t = 0; t < vocab_; ++t) vocab[t] = t;
  for (int i = 0; i < topic_size_; ++i) {
    std::swap(vocab[i], vocab[i + rng.below(static_cast<std::uint64_t>(vocab_ - i))]);
  }
  const std::int64_t n = seq_len_ + 1;
  for (std::int64_t pos = 0; pos < n; pos += span_len_) {
    const std::int64_t len = std::min<std::int64_t>(span_len_, n - pos);
    const bool copy = pos >= span_len_ && rng.uniform() < 0.5;
    if (copy) {
      const auto src = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(pos - span_len_ + 1)));
      for (std::int64_t j = 0; j < len; ++j) out[pos + j] = out[src + j];
    } else {
      for (std::int64_t j = 0; j < len; ++j) out[pos + j] = vocab[rng.below(static_cast<std::uint64_t>(topic_size_))];
    }
  }
}

void DataStream::sequence(std::int64_t index, std::int64_t* out) const {
  if (kind_ == DataKind::synthetic) {
    synthetic_sequence(index, out);
    return;
  }
  Rng rng(seed_, static_cast<std::uint64_t>(index));
  const std::int64_t n = seq_len_ + 1;
  const auto start = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(tokens_.size() - n + 1)));
  for (std::int64_t j = 0; j < n; ++j) out[j] = tokens_[start + j];
}

std::vector<std::int64_t> DataStream::batch(std::int64_t cursor, int global_batch, int rank, int world) const {
  if (world < 1 || rank < 0 || rank >= world || global_batch % world != 0) {
    std::ostringstream msg;
    msg << "[train] batch = " << global_batch << " cannot be split evenly over " << world
        << " ranks of a variant (rank " << rank << ")";
    throw Error(msg.str(), "make [train] batch a multiple of [train] ranks_per_variant");
  }
  const std::int64_t local = global_batch / world;
  return rows(cursor, global_batch, rank * local, local);
}

std::vector<std::int64_t> DataStream::rows(std::int64_t cursor, int global_batch, std::int64_t first,
                                           std::int64_t count) const {
  if (first < 0 || count < 1 || first + count > global_batch) {
    throw Error("rows [" + std::to_string(first) + ", " + std::to_string(first + count) + ") are not inside a batch of " +
                std::to_string(global_batch) + " sequences");
  }
  const std::int64_t n = seq_len_ + 1;
  std::vector<std::int64_t> out(static_cast<std::size_t>(count * n));
  for (std::int64_t r = 0; r < count; ++r) {
    sequence(cursor * global_batch + first + r, out.data() + r * n);
  }
  return out;
}

}  // namespace fastudy::train
