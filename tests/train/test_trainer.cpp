// The single-variant trainer: identical starts, determinism, exact resume, learning, fp16 loss
// scaling, divergence, stop requests and the logs. Tiny models: each test runs in about a second.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <unistd.h>

#include "base/error.hpp"
#include "src/train/trainer.hpp"
#include "tests/train/tiny.hpp"

namespace fastudy {
namespace {

using train_test::expect_identical;
using train_test::same_bytes;
using train_test::tiny_variant;

std::string temp_dir(const std::string& name) {
  const auto dir = train_test::scratch_root() / name;
  std::filesystem::remove_all(dir);
  return dir.string();
}

struct TrainRun {
  TrainResult result;
  std::map<std::int64_t, TrainState> checkpoints;  // by step
  std::vector<StepLog> logs;
};

TrainRun run(const Variant& v, const std::string& dir, const TrainState* resume = nullptr,
        std::int64_t stop_after = -1) {
  TrainRun r;
  TrainHooks hooks;
  hooks.save_checkpoint = [&](const TrainState& s) { r.checkpoints[s.step] = s; };
  hooks.on_step = [&](const StepLog& l) { r.logs.push_back(l); };
  if (stop_after >= 0) hooks.stop_requested = [&] { return !r.logs.empty() && r.logs.back().step >= stop_after; };
  r.result = train_variant(v, dir, hooks, resume);
  return r;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Trainer, VariantsDifferingInAttentionOrPrecisionStartIdentical) {
  const TrainState ref = initial_state(tiny_variant(AttentionKind::flash, Format::fp32));
  for (const Variant& v : {tiny_variant(AttentionKind::baseline, Format::fp32),
                           tiny_variant(AttentionKind::flash, Format::bf16),
                           tiny_variant(AttentionKind::baseline, Format::fp16),
                           tiny_variant(AttentionKind::flash, Format::tf32)}) {
    const TrainState s = initial_state(v);
    ASSERT_EQ(s.params.size(), ref.params.size());
    for (std::size_t i = 0; i < s.params.size(); ++i) EXPECT_TRUE(same_bytes(s.params[i], ref.params[i])) << v.id;
  }
  // fp64 holds the same values in double.
  const TrainState golden = initial_state(tiny_variant(AttentionKind::baseline, Format::fp64));
  for (std::size_t i = 0; i < golden.params.size(); ++i) {
    ASSERT_EQ(golden.params[i].dtype, DType::f64);
    for (std::int64_t j = 0; j < golden.params[i].numel(); ++j) {
      ASSERT_EQ(golden.params[i].as<double>()[j], static_cast<double>(ref.params[i].as<float>()[j]));
    }
  }
  // ... and a different init seed does not.
  Variant other = tiny_variant();
  other.seed = 2;
  EXPECT_FALSE(same_bytes(initial_state(other).params[4], ref.params[4]));  // blocks.0.attn.qkv.weight
}

TEST(Trainer, ParameterNamesAreModulePaths) {
  const TrainState s = initial_state(tiny_variant());
  std::vector<std::string> names;
  for (const auto& p : s.params) names.push_back(p.name);
  ASSERT_EQ(names.size(), 2u + 2 * 12 + 3);
  EXPECT_EQ(names[0], "tok_emb.weight");
  EXPECT_EQ(names[2], "blocks.0.ln1.weight");
  EXPECT_EQ(names[4], "blocks.0.attn.qkv.weight");
  EXPECT_EQ(names[10], "blocks.0.mlp.fc.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  EXPECT_EQ(s.params[4].shape, (std::vector<std::int64_t>{48, 16}));
}

TEST(Trainer, InitSchemesHaveTheirScales) {
  // Sample standard deviations over the 16x48 qkv weight (768 values) and the 16x32 MLP projection
  // (512 values): a relative tolerance of 15% is > 3 standard errors (sqrt(1/(2n)) = 3.1% for n = 512).
  auto stddev = [](const NamedArray& a) {
    double s = 0;
    for (std::int64_t j = 0; j < a.numel(); ++j) s += double(a.as<float>()[j]) * a.as<float>()[j];
    return std::sqrt(s / a.numel());
  };
  auto state = [](InitScheme init) {
    Variant v = tiny_variant();
    v.init = init;
    return initial_state(v);
  };
  const TrainState normal = state(InitScheme::normal), scaled = state(InitScheme::scaled),
                   xavier = state(InitScheme::xavier_uniform), kaiming = state(InitScheme::kaiming_normal);
  const std::size_t qkv = 4, mlp_proj = 12;  // blocks.0.attn.qkv.weight, blocks.0.mlp.proj.weight [16, 32]
  EXPECT_NEAR(stddev(normal.params[qkv]), 0.02, 0.15 * 0.02);
  EXPECT_NEAR(stddev(scaled.params[mlp_proj]), 0.02 / 2.0, 0.15 * 0.01);  // 1/sqrt(2 * 2 layers)
  EXPECT_NEAR(stddev(xavier.params[qkv]), std::sqrt(2.0 / (16 + 48)), 0.15 * std::sqrt(2.0 / 64));
  EXPECT_NEAR(stddev(kaiming.params[qkv]), std::sqrt(2.0 / 16), 0.15 * std::sqrt(2.0 / 16));
  EXPECT_EQ(normal.params[5].as<float>()[0], 0.0f);  // biases start at zero
  EXPECT_EQ(normal.params[2].as<float>()[0], 1.0f);  // LayerNorm gains at one
}

TEST(Trainer, SameVariantTwiceIsBitIdenticalAtEveryCheckpoint) {
  for (Format f : {Format::fp32, Format::bf16}) {
    const Variant v = tiny_variant(AttentionKind::flash, f);
    const TrainRun a = run(v, temp_dir("det_a")), b = run(v, temp_dir("det_b"));
    ASSERT_EQ(a.result.outcome, TrainOutcome::done);
    ASSERT_EQ(a.checkpoints.size(), 3u);  // steps 2, 4, 6
    ASSERT_EQ(b.checkpoints.size(), 3u);
    for (const auto& [step, s] : a.checkpoints) expect_identical(s, b.checkpoints.at(step));
  }
}

TEST(Trainer, ResumeFromACheckpointEqualsTheUninterruptedRun) {
  for (Format f : {Format::fp32, Format::fp16, Format::fp64}) {
    Variant v = tiny_variant(AttentionKind::flash, f);
    v.train.steps = 8;
    v.train.checkpoint_every = 3;
    v.train.loss_scale_window = 2;  // fp16: the scale grows during the run, so its state must resume too
    const TrainRun whole = run(v, temp_dir("resume_whole"));
    ASSERT_EQ(whole.result.outcome, TrainOutcome::done);
    const TrainState& at3 = whole.checkpoints.at(3);
    const TrainRun rest = run(v, temp_dir("resume_rest"), &at3);
    ASSERT_EQ(rest.result.outcome, TrainOutcome::done);
    EXPECT_EQ(rest.logs.front().step, 4);
    expect_identical(rest.checkpoints.at(8), whole.checkpoints.at(8));
    if (f == Format::fp16) {
      EXPECT_GT(whole.checkpoints.at(8).loss_scale, v.train.loss_scale);
    }
  }
}

TEST(Trainer, InitialStateIsWhereTrainingStarts) {
  // Resuming from initial_state() must be the same as starting fresh: it is step 0 of the run.
  const Variant v = tiny_variant(AttentionKind::baseline, Format::fp16);
  const TrainState start = initial_state(v);
  EXPECT_EQ(start.step, 0);
  EXPECT_EQ(start.loss_scale, v.train.loss_scale);
  const TrainRun fresh = run(v, temp_dir("init_fresh")), resumed = run(v, temp_dir("init_resumed"), &start);
  expect_identical(fresh.checkpoints.at(6), resumed.checkpoints.at(6));
}

TEST(Trainer, LossFallsWellBelowTheUnigramEntropy) {
  // Synthetic tokens are a priori uniform over the vocab (unigram entropy log 16 = 2.77 nats); only
  // attention can read the sequence's topic (2 tokens: log 2 = 0.69) and its copied spans. A model
  // that learns nothing but unigram statistics stays at 2.77; 0.6x that needs attention to work,
  // forward and backward.
  Variant v = tiny_variant(AttentionKind::flash, Format::fp32);
  v.train.steps = 200;
  v.train.batch = 16;
  v.train.warmup = 20;
  v.train.lr = 1e-2;
  v.train.checkpoint_every = 0;
  const TrainRun r = run(v, temp_dir("learn"));
  ASSERT_EQ(r.result.outcome, TrainOutcome::done);
  const double entropy = std::log(static_cast<double>(v.model.vocab));
  double tail = 0;
  for (std::size_t i = r.logs.size() - 20; i < r.logs.size(); ++i) tail += r.logs[i].loss / 20;
  EXPECT_LT(tail, 0.6 * entropy) << "mean loss of the last 20 steps vs unigram entropy " << entropy;
  EXPECT_GT(r.logs.front().loss, 0.9 * entropy);  // it starts near the uniform guess
}

// A training policy with max_offset (issue 29) reaches the attention kernels of both kinds through
// resolve_policy: it trains to the end with finite losses, and differs from the same policy without it
// (at initialisation the scaled logits are all near 0, so many tiles' maxima tie within 1e-3). The
// baseline at fp32: at bf16 its normalised P, e/l with e and l both scaled by e^-(beta-1)m in fp32,
// rounds to the same bf16 values either way.
TEST(Trainer, APolicyWithMaxOffsetTrains) {
  for (auto [kind, precision] : {std::pair{AttentionKind::flash, Format::bf16},
                                 std::pair{AttentionKind::baseline, Format::fp32}}) {
    Variant v = tiny_variant(kind, precision);
    v.attention_cfg.policy = "qy";
    v.attention_cfg.custom_policies["qy"].preset = "fa2";
    v.attention_cfg.custom_policies["qy"].both.max_offset = 2.0;
    const TrainRun with = run(v, temp_dir("max_offset_on"));
    ASSERT_EQ(with.result.outcome, TrainOutcome::done) << to_string(kind);
    ASSERT_EQ(with.logs.size(), 6u);
    for (const StepLog& l : with.logs) EXPECT_TRUE(std::isfinite(l.loss)) << to_string(kind) << " step " << l.step;
    v.attention_cfg.custom_policies["qy"].both.max_offset.reset();
    const TrainRun without = run(v, temp_dir("max_offset_off"));
    ASSERT_EQ(without.result.outcome, TrainOutcome::done);
    const TrainState& a = with.checkpoints.at(6);
    const TrainState& b = without.checkpoints.at(6);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < a.params.size(); ++i) differ += same_bytes(a.params[i], b.params[i]) ? 0 : 1;
    EXPECT_GT(differ, 0u) << to_string(kind);
  }
}

TEST(Trainer, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  Variant v = tiny_variant(AttentionKind::flash, Format::fp16);
  v.train.loss_scale = std::ldexp(1.0, 60);  // scaled gradients far beyond fp16's max 65504
  v.train.steps = 4;
  const TrainState start = initial_state(v);
  const TrainRun r = run(v, temp_dir("fp16"));
  ASSERT_EQ(r.result.outcome, TrainOutcome::done);
  ASSERT_EQ(r.logs.size(), 4u);
  EXPECT_TRUE(r.logs[0].skipped);
  EXPECT_EQ(r.logs[0].loss_scale, std::ldexp(1.0, 60));
  EXPECT_EQ(r.logs[1].loss_scale, std::ldexp(1.0, 59));
  EXPECT_FALSE(std::isfinite(r.logs[0].grad_norm));
  // A skipped step leaves the weights alone: every step so far skipped means untouched weights.
  const TrainState& at2 = r.checkpoints.at(2);
  if (r.logs[1].skipped) {
    for (std::size_t i = 0; i < at2.params.size(); ++i) EXPECT_TRUE(same_bytes(at2.params[i], start.params[i]));
  }
  ASSERT_FALSE(r.result.events.empty());
  EXPECT_EQ(r.result.events.front().first, 1);
  EXPECT_NE(r.result.events.front().second.find("step skipped"), std::string::npos);
}

TEST(Trainer, NanLossEndsTheVariantAsDivergedWithoutThrowing) {
  Variant v = tiny_variant(AttentionKind::baseline, Format::fp32);
  v.train.lr = 1e30;
  v.train.warmup = 0;
  v.train.grad_clip = 0;
  v.train.steps = 20;
  const std::string dir = temp_dir("nan");
  const TrainRun r = run(v, dir);
  EXPECT_EQ(r.result.outcome, TrainOutcome::diverged);
  EXPECT_LT(r.result.step, 20);
  EXPECT_NE(r.result.reason.find("diverged"), std::string::npos) << r.result.reason;
  EXPECT_NE(r.result.reason.find("step " + std::to_string(r.result.step + 1)), std::string::npos) << r.result.reason;
  EXPECT_EQ(lines_of(dir + "/train_log.csv").size(), static_cast<std::size_t>(r.result.step + 2));
}

TEST(Trainer, StopRequestSavesACheckpointAndReturnsStopped) {
  const Variant v = tiny_variant();
  const TrainRun r = run(v, temp_dir("stop"), nullptr, 3);
  EXPECT_EQ(r.result.outcome, TrainOutcome::stopped);
  EXPECT_EQ(r.result.step, 3);
  ASSERT_EQ(r.checkpoints.size(), 2u);  // step 2 (checkpoint_every) and step 3 (the stop)
  EXPECT_EQ(r.checkpoints.rbegin()->first, 3);
}

TEST(Trainer, TrainLogHasOneRowPerStepAndResumeCutsItBack) {
  Variant v = tiny_variant();
  v.train.shadow_attention = true;
  const std::string dir = temp_dir("logs");
  const TrainRun whole = run(v, dir);
  const auto log = lines_of(dir + "/train_log.csv");
  ASSERT_EQ(log.size(), 7u);
  EXPECT_EQ(log[0], "step,loss,grad_norm,lr,loss_scale,skipped,spike,tokens_per_s");
  EXPECT_EQ(log[1].substr(0, 2), "1,");
  // shadow.csv: one row per layer and step; flash and baseline differ only by fp32 rounding.
  const auto shadow = lines_of(dir + "/shadow.csv");
  ASSERT_EQ(shadow.size(), 1u + 6 * 2);
  EXPECT_EQ(shadow[0], "step,layer,max_abs,mean_abs");
  // Attention outputs are convex combinations of V rows (|V| < 1 here); two fp32 evaluations of a
  // 16-term softmax-weighted sum differ by at most about 2 * 16 * u32 ~ 2e-6: 1e-5 leaves headroom.
  for (std::size_t i = 1; i < shadow.size(); ++i) {
    const double max_abs = std::stod(shadow[i].substr(shadow[i].find(',', shadow[i].find(',') + 1) + 1));
    EXPECT_GE(max_abs, 0.0);
    EXPECT_LT(max_abs, 1e-5) << shadow[i];
  }
  // Resume from step 2 in the same directory: rows 3..6 are rewritten, not appended.
  run(v, dir, &whole.checkpoints.at(2));
  EXPECT_EQ(lines_of(dir + "/train_log.csv").size(), 7u);
  EXPECT_EQ(lines_of(dir + "/shadow.csv").size(), 1u + 6 * 2);
}

// The ranks of a variant's group as threads of one process, with an in-memory allreduce (the runner
// tests the MPI one): every rank contributes its buffer, all wait, each averages in rank order.
class InProcessGroup {
 public:
  explicit InProcessGroup(int world) : world_(world), slots_(world) {}

  template <class T>
  void allreduce_mean(int rank, T* x, std::size_t n) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      slots_[rank].assign(x, x + n);
    }
    barrier();
    for (std::size_t i = 0; i < n; ++i) {
      T sum = 0;
      for (int r = 0; r < world_; ++r) sum += static_cast<T>(slots_[r][i]);
      x[i] = sum / static_cast<T>(world_);
    }
    barrier();
  }

 private:
  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int generation = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation != generation_; });
    }
  }

  int world_;
  std::vector<std::vector<double>> slots_;  // doubles hold float and double buffers exactly
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0, generation_ = 0;
};

TEST(Trainer, DataParallelRanksShareOneStateAndMatchOneRank) {
  const Variant v = tiny_variant(AttentionKind::flash, Format::fp32);
  const TrainRun single = run(v, temp_dir("dp_single"));
  InProcessGroup group(2);
  TrainRun ranks[2];
  const std::string dirs[2] = {temp_dir("dp_rank0"), temp_dir("dp_rank1")};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      TrainHooks hooks;
      hooks.rank = r;
      hooks.world = 2;
      hooks.allreduce_mean_f32 = [&, r](float* x, std::size_t n) { group.allreduce_mean(r, x, n); };
      hooks.allreduce_mean_f64 = [&, r](double* x, std::size_t n) { group.allreduce_mean(r, x, n); };
      hooks.save_checkpoint = [&, r](const TrainState& s) { ranks[r].checkpoints[s.step] = s; };
      hooks.on_step = [&, r](const StepLog& l) { ranks[r].logs.push_back(l); };
      ranks[r].result = train_variant(v, dirs[r], hooks, nullptr);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(ranks[0].result.outcome, TrainOutcome::done);
  ASSERT_EQ(ranks[1].result.outcome, TrainOutcome::done);
  for (const auto& [step, s] : ranks[0].checkpoints) expect_identical(s, ranks[1].checkpoints.at(step));
  EXPECT_TRUE(std::filesystem::exists(dirs[0] + "/train_log.csv"));
  EXPECT_FALSE(std::filesystem::exists(dirs[1] + "/train_log.csv"));  // rank 0 of the group writes the logs
  // Step 1 starts from the same weights on the same global batch: the 2-rank loss (mean of two
  // 32-token means) and the 1-rank loss (one 64-token mean) differ only by summation order, at most
  // 64 * u32 relative. Gradient elements are such sums too; the norm, dominated by large elements,
  // moves by the same order: 1e-4 relative leaves room for a cancellation factor of ~25.
  const double u32 = std::ldexp(1.0, -24);
  EXPECT_NEAR(ranks[0].logs[0].loss, single.logs[0].loss, 64 * u32 * single.logs[0].loss);
  EXPECT_NEAR(ranks[0].logs[0].grad_norm, single.logs[0].grad_norm, 1e-4 * single.logs[0].grad_norm);
}

TEST(Trainer, ResumeRejectsAStateOfAnotherModel) {
  Variant v = tiny_variant();
  const TrainState s = initial_state(v);
  v.model.d_model = 32;
  EXPECT_THROW(run(v, temp_dir("reject"), &s), Error);
}

}  // namespace
}  // namespace fastudy
