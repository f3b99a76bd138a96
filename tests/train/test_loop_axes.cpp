// The training-loop axes (docs/configuration.md "Training-loop axes"): dp_width, allreduce, grad_accum, repeat.
// Their effect on a tiny model is exactly the documented arithmetic: the flat gradient of the first
// step equals a reference built by hand here (per-shard gradients by LibTorch autograd on a second
// copy of the model, summed in the documented order by plain loops), bit for bit. No tolerances: the
// claims are equalities of fp32 bits (or, for "the axis is live", that some bit differs).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "src/train/data.hpp"
#include "src/train/dp_reduce.hpp"
#include "src/train/engine.hpp"
#include "src/train/model.hpp"
#include "tests/train/tiny.hpp"

namespace fastudy {
namespace {

using train_test::expect_identical;
using train_test::tiny_variant;

// A tiny fp32 variant with a global batch of 8 and no clipping, so that the step's gradient is the
// reduced one (Engine::last_gradient is clipped in place otherwise).
Variant loop_variant(int dp_width, const std::string& order, int grad_accum) {
  Variant v = tiny_variant(AttentionKind::flash, Format::fp32);
  v.train.batch = 8;
  v.train.grad_clip = 0.0;
  v.train.dp_width = dp_width;
  v.train.allreduce = *parse_reduce_order(order);
  v.train.grad_accum = grad_accum;
  return v;
}

std::vector<float> to_vector(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  EXPECT_EQ(c.scalar_type(), torch::kFloat);
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// The first step's flat gradient of a variant trained alone (one rank).
std::vector<float> engine_gradient(const Variant& v) {
  train::Engine engine(v, TrainHooks{}, nullptr);
  engine.step();
  return to_vector(engine.last_gradient());
}

// The model, data and attention settings of an Engine before its first step, built a second time:
// gradients of any rows of global batch 0 by autograd.
class Reference {
 public:
  explicit Reference(const Variant& v)
      : v_(v), emu_(train::Emulation::of(v.precision)), data_(v.data, v.model), model_(v.model, emu_.dtype) {
    configure_torch_threads();
    model_.init(v.init, v.seed);
    setup_.params = train::attention_params_of(v, at::get_num_threads());
  }

  // d(loss(rows) / divisor)/d(params), flattened in module-path order.
  std::vector<float> gradient(std::int64_t first, std::int64_t count, double divisor) {
    std::vector<std::int64_t> rows = data_.rows(0, v_.train.batch, first, count);
    const torch::Tensor tokens = torch::from_blob(rows.data(), {count, v_.model.seq_len + 1}, torch::kLong);
    setup_.params.head_offset = first * v_.model.heads;
    torch::Tensor loss = model_.loss(tokens, emu_, setup_);
    if (divisor != 1.0) loss = loss / divisor;
    std::vector<torch::Tensor> params;
    for (const auto& [name, p] : model_.params()) params.push_back(p);
    const std::vector<torch::Tensor> grads = torch::autograd::grad({loss}, params, {}, false, false, true);
    std::vector<float> flat;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const std::vector<float> g = grads[i].defined() ? to_vector(grads[i]) : std::vector<float>(params[i].numel(), 0.0f);
      flat.insert(flat.end(), g.begin(), g.end());
    }
    return flat;
  }

  // A shard's gradient: k micro-batches of its rows in order, each d(loss/k), accumulated as
  // ((g_1 + g_2) + ...) + g_k (k = 1: the shard's gradient, no division).
  std::vector<float> shard(std::int64_t first, std::int64_t count, int k) {
    const std::int64_t micro = count / k;
    std::vector<float> acc = gradient(first, micro, k);
    for (int j = 1; j < k; ++j) {
      const std::vector<float> g = gradient(first + j * micro, micro, k);
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += g[i];
    }
    return acc;
  }

 private:
  Variant v_;
  train::Emulation emu_;
  train::DataStream data_;
  train::Gpt model_;
  train::AttentionSetup setup_;
};

// The documented orders, written out for W = 4 (docs/configuration.md "Training-loop axes"), then / W.
std::vector<float> reduce_by_hand(const std::vector<std::vector<float>>& g, const std::string& order) {
  const std::size_t n = g[0].size();
  EXPECT_EQ(g.size(), 4u);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (order == "rank") out[i] = ((g[0][i] + g[1][i]) + g[2][i]) + g[3][i];
    if (order == "tree") out[i] = (g[0][i] + g[1][i]) + (g[2][i] + g[3][i]);
    if (order == "ring") {
      const std::size_t c = i < n / 4 ? 0 : i < 2 * n / 4 ? 1 : i < 3 * n / 4 ? 2 : 3;  // chunk [cn/4, (c+1)n/4)
      out[i] = ((g[(c + 1) % 4][i] + g[(c + 2) % 4][i]) + g[(c + 3) % 4][i]) + g[c][i];
    }
    out[i] /= 4.0f;
  }
  return out;
}

std::size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return d;
}

TEST(LoopAxes, DpWidth4GradientIsTheShardGradientsSummedInEachDocumentedOrder) {
  for (const std::string order : {"rank", "ring", "tree"}) {
    SCOPED_TRACE(order);
    const Variant v = loop_variant(4, order, 1);
    const std::vector<float> got = engine_gradient(v);
    Reference ref(v);
    std::vector<std::vector<float>> shards;
    for (int s = 0; s < 4; ++s) shards.push_back(ref.shard(2 * s, 2, 1));  // shard s: rows [2s, 2s + 2) of 8
    const std::vector<float> want = reduce_by_hand(shards, order);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(differing(got, want), 0u) << "of " << got.size();
  }
}

TEST(LoopAxes, GradAccumIsTheHandAccumulatedSumOfMicroBatchGradients) {
  // One shard (dp_width unset, one rank) of 8 rows in k = 4 micro-batches of 2.
  const Variant v = loop_variant(0, "rank", 4);
  const std::vector<float> got = engine_gradient(v);
  Reference ref(v);
  const std::vector<float> want = ref.shard(0, 8, 4);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(differing(got, want), 0u) << "of " << got.size();
  // The axis is live: the same samples in one pass give other bits (a different summation order).
  EXPECT_GT(differing(got, engine_gradient(loop_variant(0, "rank", 1))), 0u);
}

TEST(LoopAxes, DpWidthAndGradAccumCompose) {
  // dp_width 2 (ring) x grad_accum 2: shard s is rows [4s, 4s + 4), micro-batches of 2.
  const Variant v = loop_variant(2, "ring", 2);
  const std::vector<float> got = engine_gradient(v);
  Reference ref(v);
  const std::vector<float> g0 = ref.shard(0, 4, 2), g1 = ref.shard(4, 4, 2);
  std::vector<float> want(g0.size());
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = (g0[i] + g1[i]) / 2.0f;
  EXPECT_EQ(differing(got, want), 0u);
}

TEST(LoopAxes, DpWidth1EqualsTheDefaultOneGradientOverTheWholeBatch) {
  // dp_width = 1 (the axis's baseline) is today's arithmetic: the same bits as dp_width unset.
  Variant unset = loop_variant(0, "rank", 1), one = loop_variant(1, "tree", 1);
  unset.train.grad_clip = one.train.grad_clip = 1.0;
  TrainState a, b;
  TrainHooks ha, hb;
  ha.save_checkpoint = [&](const TrainState& s) { a = s; };
  hb.save_checkpoint = [&](const TrainState& s) { b = s; };
  train_variant(unset, (train_test::scratch_root() / "w_unset").string(), ha, nullptr);
  train_variant(one, (train_test::scratch_root() / "w_one").string(), hb, nullptr);
  expect_identical(a, b);
}

TEST(LoopAxes, AtWidth2TheThreeOrdersAreTheSameBits) {
  // Two shards: a + b == b + a in fp arithmetic, so rank, ring and tree cannot differ.
  const std::vector<float> rank = engine_gradient(loop_variant(2, "rank", 1));
  EXPECT_EQ(differing(rank, engine_gradient(loop_variant(2, "ring", 1))), 0u);
  EXPECT_EQ(differing(rank, engine_gradient(loop_variant(2, "tree", 1))), 0u);
}

TEST(LoopAxes, AtWidth4TheOrderIsLive) {
  const std::vector<float> rank = engine_gradient(loop_variant(4, "rank", 1));
  EXPECT_GT(differing(rank, engine_gradient(loop_variant(4, "tree", 1))), 0u);
  EXPECT_GT(differing(rank, engine_gradient(loop_variant(4, "ring", 1))), 0u);
}

TEST(LoopAxes, RepeatChangesTheHashButNotOneWeight) {
  const Study st = parse_study(
      "[model]\nvocab = 16\nd_model = 16\nheads = 2\nlayers = 2\nseq_len = 16\nmlp_ratio = 2\n"
      "[data]\nspan_len = 4\n[train]\nsteps = 4\nbatch = 4\nwarmup = 2\ncheckpoint_every = 2\n"
      "[attention]\nblock_q = 8\nblock_kv = 8\n[grid]\nrepeat = [0, 1]\n",
      "repeat.toml");
  ASSERT_EQ(st.variants.size(), 2u);
  EXPECT_EQ(st.variants[0].id, "r0");
  EXPECT_EQ(st.variants[1].id, "r1");
  EXPECT_NE(st.variants[0].hash, st.variants[1].hash);
  TrainState s[2];
  for (int r = 0; r < 2; ++r) {
    TrainHooks hooks;
    hooks.save_checkpoint = [&, r](const TrainState& state) { s[r] = state; };
    train_variant(st.variants[r], (train_test::scratch_root() / st.variants[r].id).string(), hooks, nullptr);
  }
  EXPECT_EQ(s[0].step, 4);
  EXPECT_NE(s[0].attrs.at("config_hash"), s[1].attrs.at("config_hash"));
  expect_identical(s[0], s[1]);  // on the CPU the noise floor is exactly 0
}

TEST(LoopAxes, ResumeWithShardsAndMicroBatchesEqualsTheUninterruptedRun) {
  Variant v = loop_variant(4, "tree", 2);
  v.train.grad_clip = 1.0;
  std::map<std::int64_t, TrainState> whole, resumed;
  TrainHooks hw, hr;
  hw.save_checkpoint = [&](const TrainState& s) { whole[s.step] = s; };
  hr.save_checkpoint = [&](const TrainState& s) { resumed[s.step] = s; };
  train_variant(v, (train_test::scratch_root() / "resume_whole").string(), hw, nullptr);
  ASSERT_TRUE(whole.count(2) && whole.count(6));
  train_variant(v, (train_test::scratch_root() / "resume_part").string(), hr, &whole.at(2));
  expect_identical(resumed.at(6), whole.at(6));
}

// reduce_shards alone, for widths the model tests do not reach: random values of spread magnitudes,
// so that different bracketings round differently, against the documented expressions.
std::vector<float> random_shards(int width, std::size_t n) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<float> g(static_cast<std::size_t>(width) * n);
  for (float& x : g) x = std::ldexp(normal(gen), exponent(gen));
  return g;
}

std::vector<float> reduced(ReduceOrder order, const std::vector<float>& g, int width, std::size_t n) {
  std::vector<float> out(n);
  reduce_shards(order, g.data(), width, n, out.data());
  return out;
}

TEST(ReduceShards, TreeFoldsTheFirstPairsOfANonPowerOfTwoThenAddsAdjacentPartials) {
  const std::size_t n = 1000;
  for (int width : {3, 5, 6, 8}) {
    SCOPED_TRACE(width);
    const std::vector<float> g = random_shards(width, n);
    auto x = [&](int s, std::size_t i) { return g[static_cast<std::size_t>(s) * n + i]; };
    std::vector<float> want(n);
    for (std::size_t i = 0; i < n; ++i) {
      float sum = 0;
      if (width == 3) sum = (x(0, i) + x(1, i)) + x(2, i);
      if (width == 5) sum = ((x(0, i) + x(1, i)) + x(2, i)) + (x(3, i) + x(4, i));
      if (width == 6) sum = ((x(0, i) + x(1, i)) + (x(2, i) + x(3, i))) + (x(4, i) + x(5, i));
      if (width == 8)
        sum = ((x(0, i) + x(1, i)) + (x(2, i) + x(3, i))) + ((x(4, i) + x(5, i)) + (x(6, i) + x(7, i)));
      want[i] = sum / static_cast<float>(width);
    }
    const std::vector<float> tree = reduced(ReduceOrder::tree, g, width, n);
    EXPECT_EQ(differing(tree, want), 0u);
    // W = 3: the tree is the rank order; beyond, the bracketing shows in the bits.
    const std::size_t vs_rank = differing(tree, reduced(ReduceOrder::rank, g, width, n));
    if (width == 3) EXPECT_EQ(vs_rank, 0u);
    else EXPECT_GT(vs_rank, 0u);
  }
}

TEST(ReduceShards, RingChunksAreFloorBoundariesAndEachStartsOneRankAfterItsOwner) {
  // n = 10 over W = 4: chunks [0, 2), [2, 5), [5, 7), [7, 10).
  const int width = 4;
  const std::size_t n = 10;
  const std::vector<float> g = random_shards(width, n);
  auto x = [&](std::size_t s, std::size_t i) { return g[s * n + i]; };
  const std::size_t chunk_of[n] = {0, 0, 1, 1, 1, 2, 2, 3, 3, 3};
  std::vector<float> want(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t c = chunk_of[i];
    want[i] = (((x((c + 1) % 4, i) + x((c + 2) % 4, i)) + x((c + 3) % 4, i)) + x(c, i)) / 4.0f;
  }
  EXPECT_EQ(differing(reduced(ReduceOrder::ring, g, width, n), want), 0u);
}

TEST(ReduceShards, OneShardIsCopiedAndOrdersAreNamedAsInTheGrid) {
  const std::vector<float> g = random_shards(1, 5);
  for (ReduceOrder order : {ReduceOrder::rank, ReduceOrder::ring, ReduceOrder::tree}) {
    EXPECT_EQ(differing(reduced(order, g, 1, 5), g), 0u);
    EXPECT_EQ(parse_reduce_order(to_string(order)), order);
  }
  EXPECT_FALSE(parse_reduce_order("butterfly").has_value());
}

}  // namespace
}  // namespace fastudy
