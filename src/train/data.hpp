// The training data stream of a variant: synthetic (embedded), text (byte tokens) or tokens (uint16/32).
//
// A batch is a pure function of (data seed, cursor): global sequence i of the stream (i = cursor *
// batch + row) is drawn from its own random stream keyed by (data seed, i). So the stream resumes from
// TrainState::data_cursor without replaying anything, variants with the same data seed see identical
// batches in identical order, and each rank of a data-parallel group takes its rows of the same global
// batch. Each sequence has seq_len + 1 tokens: inputs are [0, seq_len), targets [1, seq_len].
//
// synthetic: each sequence has a topic, max(2, vocab/16) distinct tokens drawn at random from the
//   vocab, and is built span by span (span_len tokens): a span is, with probability 1/2, a copy of
//   an earlier stretch of the same sequence, otherwise fresh tokens drawn uniformly from the topic.
//   Every token is a priori uniform over the vocab (unigram entropy log(vocab)); what makes it
//   predictable is in the context only: the topic (read by attending over the sequence, learnt
//   quickly: loss -> about log(topic size)) and the copies (induction: a previous-token head plus a
//   match, learnt later). So the loss falls well below the unigram entropy only through attention.
// text: every byte of a file is a token (vocab must be >= 256); a sequence starts at a random offset.
// tokens: a flat file of little-endian token ids, [data] token_bytes = 2 (uint16, nanoGPT's train.bin,
//   the default) or 4 (uint32), random offsets. A uint32 file read as uint16 (every second id 0) is
//   refused with a hint rather than trained on.
// No LibTorch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/core/config.hpp"

namespace fastudy::train {

class DataStream {
 public:
  // Loads and validates the source. Throws fastudy::Error (naming the file, with a hint) when a file
  // is missing, unreadable, too short, or holds token ids >= vocab.
  DataStream(const DataConfig& data, const ModelConfig& model);

  // Tokens of global sequence `index`: seq_len + 1 values in [0, vocab).
  void sequence(std::int64_t index, std::int64_t* out) const;

  // Rows [rank * b, (rank + 1) * b) of global batch `cursor`, b = global_batch / world, as
  // b * (seq_len + 1) tokens, row-major. Throws when global_batch is not a multiple of world.
  std::vector<std::int64_t> batch(std::int64_t cursor, int global_batch, int rank, int world) const;
  // Rows [first, first + count) of global batch `cursor` (a data-parallel shard or one of its
  // micro-batches), count * (seq_len + 1) tokens. Throws when the rows are not inside the batch.
  std::vector<std::int64_t> rows(std::int64_t cursor, int global_batch, std::int64_t first, std::int64_t count) const;

  // Entropy (nats) of the stream's unigram distribution: the loss of the best model that ignores
  // context. log(vocab) for synthetic, measured over the whole file otherwise.
  double unigram_entropy() const { return unigram_entropy_; }

  std::int64_t seq_len() const { return seq_len_; }
  // Tokens in the file (text, tokens); 0 for synthetic.
  std::int64_t file_tokens() const { return static_cast<std::int64_t>(tokens_.size()); }

 private:
  void synthetic_sequence(std::int64_t index, std::int64_t* out) const;

  DataKind kind_;
  std::uint64_t seed_;
  std::int64_t seq_len_;
  int vocab_;
  int span_len_;
  int topic_size_ = 0;                 // synthetic
  std::vector<std::uint32_t> tokens_;  // text and tokens
  double unigram_entropy_ = 0.0;
};

}  // namespace fastudy::train
