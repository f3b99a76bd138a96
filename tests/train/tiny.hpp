// Shared helpers of the trainer tests: tiny variants (a few ms per step) and state comparison.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "src/core/config.hpp"
#include "src/core/train_state.hpp"

namespace fastudy::train_test {

// This test process's scratch folder, TempDir()/fastudy_train_<pid>, removed when the process ends.
inline std::filesystem::path scratch_root() {
  struct Root {
    std::filesystem::path path =
        std::filesystem::path(::testing::TempDir()) / ("fastudy_train_" + std::to_string(::getpid()));
    Root() { std::filesystem::create_directories(path); }
    ~Root() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Root root;
  return root.path;
}

// A 2-layer, d_model 16 model on 16-token synthetic sequences: every test trains in well under a second.
inline Variant tiny_variant(AttentionKind kind = AttentionKind::flash, Format precision = Format::fp32) {
  Variant v;
  v.attention = kind;
  v.precision = precision;
  v.id = std::string(to_string(kind)) + "-" + std::string(to_string(precision));
  v.seed = 1;
  v.init = InitScheme::normal;
  v.model.vocab = 16;
  v.model.d_model = 16;
  v.model.heads = 2;
  v.model.layers = 2;
  v.model.seq_len = 16;
  v.model.mlp_ratio = 2;
  v.data.seed = 5;
  v.data.span_len = 4;
  v.train.steps = 6;
  v.train.batch = 4;
  v.train.warmup = 2;
  v.train.checkpoint_every = 2;
  v.train.lr = 3e-3;
  v.train.min_lr = 3e-4;
  v.attention_cfg.block_q = 8;
  v.attention_cfg.block_kv = 8;
  return v;
}

inline bool same_bytes(const NamedArray& a, const NamedArray& b) {
  return a.name == b.name && a.shape == b.shape && a.dtype == b.dtype && a.data == b.data;
}

// Parameters, optimizer state and counters equal bit for bit.
inline void expect_identical(const TrainState& a, const TrainState& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.data_cursor, b.data_cursor);
  EXPECT_EQ(a.loss_scale, b.loss_scale);
  EXPECT_EQ(a.good_steps, b.good_steps);
  EXPECT_EQ(a.loss_history, b.loss_history);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (std::size_t i = 0; i < a.params.size(); ++i) EXPECT_TRUE(same_bytes(a.params[i], b.params[i])) << a.params[i].name;
  ASSERT_EQ(a.optimizer.size(), b.optimizer.size());
  for (std::size_t i = 0; i < a.optimizer.size(); ++i) {
    EXPECT_TRUE(same_bytes(a.optimizer[i], b.optimizer[i])) << a.optimizer[i].name;
  }
  ASSERT_EQ(a.extra.size(), b.extra.size());
  for (std::size_t i = 0; i < a.extra.size(); ++i) EXPECT_TRUE(same_bytes(a.extra[i], b.extra[i])) << a.extra[i].name;
}

}  // namespace fastudy::train_test
