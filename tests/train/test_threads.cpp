// Results independent of the thread count: the fixed-order ops (src/train/fixed_order.hpp) and whole
// training steps give the same bits on 1, 2, 3 and 4 LibTorch threads, the pieces really run on
// several threads, and the ops stay within their rounding-error bounds of an fp64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "src/train/engine.hpp"
#include "src/train/fixed_order.hpp"
#include "src/train/libtorch.hpp"
#include "src/train/model.hpp"
#include "tests/train/tiny.hpp"

namespace fastudy::train {
namespace {

constexpr double kU32 = 0x1p-24;  // fp32 unit roundoff

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.contiguous(), y = b.contiguous();
  return x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<std::size_t>(x.numel()) * x.element_size()) == 0;
}

// Runs f on 1 thread, then on 2, 3 and 4, and expects the same bits every time; expects the fixed
// pieces to have run on more than one thread at 2 threads and above.
void expect_thread_invariant(const std::string& what, const std::function<std::vector<torch::Tensor>()>& f) {
  const int saved = at::get_num_threads();
  at::set_num_threads(1);
  const std::vector<torch::Tensor> one = f();
  for (int threads : {2, 3, 4}) {
    at::set_num_threads(threads);
    fixed::reset_threads_seen();
    const std::vector<torch::Tensor> many = f();
    EXPECT_GE(fixed::threads_seen(), 2) << what << " at " << threads << " threads ran on one thread";
    ASSERT_EQ(one.size(), many.size());
    for (std::size_t i = 0; i < one.size(); ++i) {
      EXPECT_TRUE(same_bits(one[i], many[i])) << what << ": output " << i << " differs at " << threads << " threads";
    }
  }
  at::set_num_threads(saved);
}

TEST(FixedOrder, MatmulTilesGiveOneThreadsBitsAndStayWithinTheFp32Bound) {
  torch::manual_seed(3);
  // The demo and paper models' products (tokens x features, and the weight gradients' features x
  // tokens), and shapes whose edge tiles are ragged.
  for (auto [M, K, N] : std::vector<std::array<std::int64_t, 3>>{
           {1024, 64, 192}, {192, 1024, 64}, {4096, 256, 768}, {256, 4096, 1024}, {300, 77, 513}, {129, 5, 257}}) {
    const torch::Tensor a = torch::randn({M, K}), b = torch::randn({K, N}), bias = torch::randn({N});
    const std::string shape = std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N);
    expect_thread_invariant("mm " + shape, [&] {
      return std::vector<torch::Tensor>{fixed::mm(a, b), fixed::addmm(bias, a, b), fixed::mm(b.t(), a.t()),
                                        fixed::column_sums(a)};
    });
    // |C - C64| <= gamma_K sum_k |a_ik| |b_kj| (+ u |C| for the bias add): fp32 accumulation over K.
    const double gamma = K * kU32 / (1.0 - K * kU32);
    const torch::Tensor a64 = a.to(torch::kDouble), b64 = b.to(torch::kDouble);
    const torch::Tensor exact = torch::addmm(bias.to(torch::kDouble), a64, b64);
    const torch::Tensor bound = gamma * torch::mm(a64.abs(), b64.abs()) + kU32 * exact.abs() + 1e-300;
    const torch::Tensor err = (fixed::addmm(bias, a, b).to(torch::kDouble) - exact).abs();
    EXPECT_TRUE((err <= bound).all().item<bool>()) << shape << ": worst error / bound "
                                                   << (err / bound).max().item<double>();
    // Column sums: gamma_M sum |a_ij|.
    const double gamma_m = M * kU32 / (1.0 - M * kU32);
    const torch::Tensor sum_err = (fixed::column_sums(a).to(torch::kDouble) - a64.sum(0)).abs();
    EXPECT_TRUE((sum_err <= gamma_m * a64.abs().sum(0) + 1e-300).all().item<bool>()) << shape;
  }
}

TEST(FixedOrder, LayerNormAndGeluGiveOneThreadsBitsAndLibTorchsValues) {
  torch::manual_seed(4);
  for (auto [R, D] : std::vector<std::array<std::int64_t, 2>>{{1024, 64}, {4096, 256}, {1000, 96}}) {
    const torch::Tensor x0 = torch::randn({R, D}), w0 = torch::randn({D}), b0 = torch::randn({D});
    const torch::Tensor dy = torch::randn({R, D});
    auto run = [&](bool ours) {
      const torch::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true),
                          b = b0.clone().requires_grad_(true);
      const torch::Tensor y = ours ? fixed::layer_norm(x, w, b, 1e-5) : torch::layer_norm(x, {D}, w, b, 1e-5);
      const auto g = torch::autograd::grad({y}, {x, w, b}, {dy});
      return std::vector<torch::Tensor>{y.detach(), g[0], g[1], g[2]};
    };
    const std::string shape = std::to_string(R) + "x" + std::to_string(D);
    expect_thread_invariant("layer_norm " + shape, [&] { return run(true); });
    at::set_num_threads(1);
    const auto ours = run(true), theirs = run(false);
    // Output and input gradient are LibTorch's row by row: the same bits.
    EXPECT_TRUE(same_bits(ours[0], theirs[0])) << shape;
    EXPECT_TRUE(same_bits(ours[1], theirs[1])) << shape;
    // dw, db: the same terms summed in blocks of rows instead of one run; each sum is within
    // gamma_R sum |term| of the exact sum, the terms within 3u of each other (LibTorch forms each as
    // dy (rstd x - rstd mean): three roundings), so the two differ by at most
    // (2 gamma_R + 3u) sum |term|.
    const double gamma = R * kU32 / (1.0 - R * kU32);
    const torch::Tensor xhat = (x0 - x0.mean(1, true)) / torch::sqrt(x0.var(1, false, true) + 1e-5);
    const torch::Tensor dw_scale = (dy * xhat).abs().sum(0), db_scale = dy.abs().sum(0);
    EXPECT_TRUE(((ours[2] - theirs[2]).abs() <= (2 * gamma + 3 * kU32) * dw_scale * 1.01).all().item<bool>()) << shape;
    EXPECT_TRUE(((ours[3] - theirs[3]).abs() <= 2 * gamma * db_scale).all().item<bool>()) << shape;

    for (const char* approximate : {"none", "tanh"}) {
      auto gelu = [&](bool fixed_order) {
        const torch::Tensor x = x0.clone().requires_grad_(true);
        const torch::Tensor y = fixed_order ? fixed::gelu(x, approximate) : torch::gelu(x, approximate);
        return std::vector<torch::Tensor>{y.detach(), torch::autograd::grad({y}, {x}, {dy})[0]};
      };
      expect_thread_invariant(std::string("gelu ") + approximate + " " + shape, [&] { return gelu(true); });
      // Blocks are multiples of every vector width: on one thread exactly LibTorch's bits.
      at::set_num_threads(1);
      const auto a = gelu(true), b = gelu(false);
      EXPECT_TRUE(same_bits(a[0], b[0]) && same_bits(a[1], b[1])) << approximate << " " << shape;
    }
  }
}

TEST(FixedOrder, AnExceptionInAPieceReachesTheCallerOnEveryThreadCount) {
  for (int threads : {1, 2, 4}) {
    at::set_num_threads(threads);
    EXPECT_THROW(fixed::for_each_piece(8, [](std::int64_t i) {
                   if (i == 5) throw std::runtime_error("piece 5");
                 }),
                 std::runtime_error)
        << threads;
  }
  at::set_num_threads(1);
}

// The trainer's steps: a demo-sized model (1024 tokens a step, so every op is cut into several
// pieces) trained for two steps on each thread count from FASTUDY_TORCH_THREADS.
TEST(Threads, TrainingStepsGiveTheSameWeightsOnOneToFourThreads) {
  struct Case {
    AttentionKind kind;
    Format precision;
    const char* gelu;
    bool shadow;
  };
  for (const Case& c : {Case{AttentionKind::baseline, Format::fp32, "erf", false},
                        Case{AttentionKind::flash, Format::bf16, "tanh", true},
                        Case{AttentionKind::flash, Format::fp16, "erf", false}}) {
    Variant v = train_test::tiny_variant(c.kind, c.precision);
    v.model.vocab = 64;
    v.model.d_model = 64;
    v.model.heads = 4;
    v.model.layers = 2;
    v.model.seq_len = 64;
    v.model.mlp_ratio = 4;
    v.train.batch = 16;
    v.train.steps = 2;
    v.train.warmup = 1;
    v.train.shadow_attention = c.shadow;
    v.numerics.gelu = std::string(c.gelu) == "tanh" ? GeluApproximation::tanh : GeluApproximation::erf;
    v.attention_cfg.block_q = 16;
    v.attention_cfg.block_kv = 16;
    std::vector<TrainState> states;
    for (const char* threads : {"1", "2", "3", "4"}) {
      ASSERT_EQ(::setenv("FASTUDY_TORCH_THREADS", threads, 1), 0);
      fixed::reset_threads_seen();
      const TrainHooks hooks;
      Engine engine(v, hooks, nullptr);
      EXPECT_EQ(at::get_num_threads(), std::atoi(threads));
      for (int s = 0; s < 2; ++s) engine.step();
      if (std::string(threads) != "1") {
        EXPECT_GE(fixed::threads_seen(), 2) << v.id << " at " << threads << " threads";
      }
      states.push_back(engine.state());
    }
    ::unsetenv("FASTUDY_TORCH_THREADS");
    for (std::size_t i = 1; i < states.size(); ++i) {
      SCOPED_TRACE(v.id + " on " + std::to_string(i + 1) + " threads vs 1");
      train_test::expect_identical(states[0], states[i]);
    }
  }
  at::set_num_threads(1);
}

TEST(Threads, DefaultIsTheRanksShareOfItsCpus) {
  EXPECT_EQ(default_torch_threads(2, 2, 1), 2);    // one rank, unbound: both cores
  EXPECT_EQ(default_torch_threads(1, 2, 1), 1);    // bound to one core (mpirun -n 1 binds to a core)
  EXPECT_EQ(default_torch_threads(2, 2, 2), 1);    // two unbound ranks share two cores
  EXPECT_EQ(default_torch_threads(2, 2, 4), 1);    // oversubscribed: never below 1
  EXPECT_EQ(default_torch_threads(8, 16, 4), 4);   // bound to a socket of 8 with 4 ranks on the node
  EXPECT_EQ(default_torch_threads(4, 64, 4), 4);   // a Slurm allocation of 4 CPUs per task
  EXPECT_EQ(default_torch_threads(0, 0, 0), 1);
}

TEST(Threads, ABadThreadCountIsRejectedNamingTheVariable) {
  ASSERT_EQ(::setenv("FASTUDY_TORCH_THREADS", "two", 1), 0);
  try {
    configure_torch_threads();
    ADD_FAILURE() << "FASTUDY_TORCH_THREADS=two was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("FASTUDY_TORCH_THREADS"), std::string::npos) << e.what();
  }
  ::unsetenv("FASTUDY_TORCH_THREADS");
}

}  // namespace
}  // namespace fastudy::train
