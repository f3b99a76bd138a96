// The trainer's side of `fastudy replay` and `fastudy bisect` on cases whose answers are known:
// bisect of a variant against itself is bit-identical op for op; a change planted into one op of one
// layer is named as the first op beyond the bound, with every op before it identical; flash against
// baseline first differs at the attention output (Q, K, V identical); a replay state of another
// precision holds the same weights; variant_with() sets axes and refuses what the study cannot run.
#include <gtest/gtest.h>

#include <algorithm>

#include "base/error.hpp"
#include "src/train/engine.hpp"
#include "src/train/explain.hpp"
#include "src/train/trainer.hpp"
#include "tests/train/tiny.hpp"

namespace fastudy {
namespace {

using train_test::tiny_variant;

// The state of v after `steps` of its steps (a checkpoint's content).
TrainState trained(const Variant& v, int steps) {
  train::Engine engine(v, TrainHooks{}, nullptr);
  for (int i = 0; i < steps; ++i) engine.step();
  return engine.state();
}

int index_of(const BisectResult& r, const std::string& op) {
  for (std::size_t i = 0; i < r.ops.size(); ++i)
    if (r.ops[i].op == op) return static_cast<int>(i);
  return -1;
}

TEST(Bisect, AVariantAgainstItselfIsBitIdenticalOpForOp) {
  const Variant v = tiny_variant(AttentionKind::flash, Format::bf16);
  const BisectResult r = bisect_step(v, v, trained(v, 2));
  // 2 layers x 12 ops + embed, ln_f, logits, loss; then one gradient per parameter (2 + 12 x 2 + 3).
  EXPECT_EQ(r.ops.size(), 2u * 12 + 4 + 2 + 2 * 12 + 3);
  EXPECT_EQ(r.first_differs, -1);
  EXPECT_EQ(r.first_beyond, -1);
  for (const auto& c : r.ops) EXPECT_TRUE(c.identical) << c.op;
}

TEST(Bisect, APlantedChangeInOneLayerIsTheFirstOpBeyondTheBound) {
  const Variant v = tiny_variant(AttentionKind::baseline, Format::fp32);
  const TrainState s = trained(v, 2);
  // One part in 2^10 of layer 1's MLP up-projection: 2^14 roundings of fp32, far beyond the bound of 4.
  const BisectResult r =
      bisect_step(v, v, s, [](const std::string& op) { return op == "blocks.1.mlp.fc" ? 1.0 + 1.0 / 1024 : 1.0; });
  const int planted = index_of(r, "blocks.1.mlp.fc");
  ASSERT_GE(planted, 0);
  EXPECT_EQ(r.first_beyond, planted);
  EXPECT_EQ(r.first_differs, planted);
  for (int i = 0; i < planted; ++i) EXPECT_TRUE(r.ops[static_cast<std::size_t>(i)].identical) << r.ops[static_cast<std::size_t>(i)].op;
  EXPECT_NEAR(r.ops[static_cast<std::size_t>(planted)].ulps, std::ldexp(1.0, 14), std::ldexp(1.0, 6));
  // The change reaches the loss and the gradients of the layers below it.
  EXPECT_FALSE(r.ops[static_cast<std::size_t>(index_of(r, "loss"))].identical);
  EXPECT_FALSE(r.ops[static_cast<std::size_t>(index_of(r, "grad blocks.0.attn.qkv.weight"))].identical);
}

TEST(Bisect, FlashAgainstBaselineFirstDiffersAtTheAttentionOutput) {
  const Variant a = tiny_variant(AttentionKind::baseline, Format::bf16);
  const Variant b = tiny_variant(AttentionKind::flash, Format::bf16);
  const BisectResult r = bisect_step(a, b, trained(a, 2));
  EXPECT_EQ(r.format, Format::bf16);
  for (const char* op : {"embed", "blocks.0.ln1", "blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.v"})
    EXPECT_TRUE(r.ops[static_cast<std::size_t>(index_of(r, op))].identical) << op;
  EXPECT_EQ(r.first_differs, index_of(r, "blocks.0.attn.out"));
}

TEST(Replay, AStateOfAnotherPrecisionHoldsTheSameWeights) {
  const Variant v32 = tiny_variant(AttentionKind::flash, Format::fp32);
  const TrainState s = trained(v32, 2);
  const TrainState wide = replay_state(tiny_variant(AttentionKind::flash, Format::fp64), s);
  ASSERT_EQ(wide.params.size(), s.params.size());
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    ASSERT_EQ(wide.params[i].dtype, DType::f64);
    for (std::int64_t j = 0; j < s.params[i].numel(); ++j)
      ASSERT_EQ(wide.params[i].as<double>()[j], static_cast<double>(s.params[i].as<float>()[j]));  // widening is exact
  }
  // Into fp16 the dynamic loss scale restarts at [train] loss_scale.
  Variant v16 = tiny_variant(AttentionKind::flash, Format::fp16);
  v16.train.loss_scale = 1024;
  EXPECT_EQ(replay_state(v16, s).loss_scale, 1024);
  EXPECT_EQ(replay_state(v32, s).loss_scale, s.loss_scale);
}

TEST(Replay, AdvancingAStateRepeatsTheOriginalSteps) {
  const Variant v = tiny_variant(AttentionKind::flash, Format::bf16);
  train_test::expect_identical(advance_state(v, trained(v, 2), 4), trained(v, 4));
}

Study explain_study() {
  return parse_study(
      "[model]\nvocab = 16\nd_model = 16\nheads = 2\nlayers = 2\nseq_len = 16\nmlp_ratio = 2\n"
      "[data]\nspan_len = 4\n[train]\nsteps = 4\nbatch = 4\nwarmup = 2\ncheckpoint_every = 2\n"
      "[attention]\nblock_q = 8\nblock_kv = 8\n[attention.policies.wide]\npreset = \"mixed\"\n"
      "[grid]\nattention = [\"baseline\", \"flash\"]\nprecision = [\"fp32\", \"bf16\"]\n",
      "explain.toml");
}

TEST(Replay, VariantWithSetsAxesAndKeepsTheHashWithoutThem) {
  const Study st = explain_study();
  const Variant& base = st.variants[0];
  const Variant same = variant_with(st, base, {});
  EXPECT_EQ(same.id, base.id);
  EXPECT_EQ(same.hash, base.hash);
  const Variant other = variant_with(st, base, {{"precision", "bf16"}, {"policy", "wide"}, {"lr", "0.0010"}});
  EXPECT_EQ(other.id, base.id + "+precision=bf16+policy=wide+lr=0.001");
  EXPECT_EQ(other.precision, Format::bf16);
  EXPECT_EQ(other.attention_cfg.policy, "wide");
  EXPECT_EQ(other.train.lr, 0.001);
  EXPECT_NE(other.hash, base.hash);
  EXPECT_EQ(other.axis("precision"), "bf16");
}

TEST(Replay, VariantWithRefusesWhatTheStudyCannotRun) {
  const Study st = explain_study();
  const Variant& base = st.variants[0];
  auto refused = [&](const std::string& axis, const std::string& value, const std::string& says) {
    try {
      variant_with(st, base, {{axis, value}});
      ADD_FAILURE() << axis << "=" << value << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("precision_x", "bf16", "`precision_x` is not a grid axis");
  refused("precision", "fp17", "value \"fp17\" is not allowed for precision");
  refused("policy", "narrow", "value \"narrow\" is not allowed for policy");
  refused("block_q", "17", "larger than [model] seq_len = 16");
  refused("block_q", "0", "whole number >= 1");
  refused("split_k", "x", "whole number >= 1");
  refused("lr", "0", "positive number");
  refused("dp_width", "3", "do not cut [train] batch = 4");
}

}  // namespace
}  // namespace fastudy
