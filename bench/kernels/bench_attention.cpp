// bench_attention: the speed figures of issue 3, measured side by side in one run on one thread.
//   flash forward, B=8 H=8 N=1024 d=64, fp32 (mixed policy = every step fp32: no rounding work),
//   the same attention through LibTorch (at::matmul, at::softmax, at::matmul; at::set_num_threads(1)),
//   a measured single-core fp32 FMA peak (independent vector FMAs of the width the kernels use),
//   flash forward with the mixed fp16 and bf16 policies (emulated storage rounding), and baseline.
// Times are the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), and the counters use the
// fastest iteration of each benchmark: on a shared machine both keep other load out of the figures.
// Counters: GFLOP/s (4 B H N^2 d flops per forward), frac_peak (of the measured FMA peak),
// x_torch (LibTorch time / this time), x_fp32 (this time / flash fp32 time), and the memory each
// algorithm holds beyond its inputs and outputs (flash: O(N d) per thread; baseline/torch: N^2).
//
// Run: build-kernels/bench/kernels/bench_attention [--benchmark_repetitions=3]
// B batch, H heads, N sequence, d head dim.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <immintrin.h>
#include <random>
#include <vector>

#include <time.h>

#include "kernels/attention.hpp"

namespace fastudy {
namespace {

// CPU time of the calling thread: every timed call here runs on one thread, and on a shared machine
// this leaves out the time the thread waited for a core (wall time would count it).
double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

constexpr std::int64_t kB = 8, kH = 8, kN = 1024, kD = 64;
constexpr double kFlops = 4.0 * kB * kH * kN * kN * kD;  // QK^T and P.V, 2 flops per multiply-add

struct Problem {
  AttentionShape shape;
  std::vector<float> q, k, v, o, lse;
  Problem() {
    shape.batch = kB;
    shape.heads = kH;
    shape.seq_len = kN;
    shape.head_dim = kD;
    const std::size_t n = kB * kH * kN * kD;
    std::mt19937 rng(1);
    std::normal_distribution<float> dist;
    for (auto* x : {&q, &k, &v}) {
      x->resize(n);
      for (float& e : *x) e = dist(rng);
    }
    o.resize(n);
    lse.resize(kB * kH * kN);
  }
};

const Problem& problem() {
  static const Problem p;
  return p;
}

AttentionParams flash_params(Format f) {
  AttentionParams params;
  params.kind = AttentionKind::flash;
  params.order = LoopOrder::q_outer;
  params.policy = make_policy("mixed", f);
  params.block_q = 64;
  params.block_kv = 64;
  params.threads = 1;
  return params;
}

double run_flash(const AttentionParams& params) {
  Problem& p = const_cast<Problem&>(problem());
  const double t0 = thread_seconds();
  attention_forward<float>(p.shape, params, p.q.data(), p.k.data(), p.v.data(), p.o.data(), p.lse.data());
  return thread_seconds() - t0;
}

struct TorchInputs {
  at::Tensor q, k, v;
  TorchInputs() {
    const Problem& p = problem();
    auto opts = at::TensorOptions().dtype(at::kFloat);
    q = at::from_blob(const_cast<float*>(p.q.data()), {kB, kH, kN, kD}, opts).clone();
    k = at::from_blob(const_cast<float*>(p.k.data()), {kB, kH, kN, kD}, opts).clone();
    v = at::from_blob(const_cast<float*>(p.v.data()), {kB, kH, kN, kD}, opts).clone();
  }
};

double run_torch(const TorchInputs& t) {
  at::set_num_threads(1);
  const double t0 = thread_seconds();
  at::Tensor s = at::matmul(t.q, t.k.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(kD)));
  at::Tensor o = at::matmul(at::softmax(s, -1), t.v);
  benchmark::DoNotOptimize(o.data_ptr<float>());
  return thread_seconds() - t0;
}

// FLOP/s of `iters` rounds of 12 independent FMA chains (enough to cover latency x ports).
__attribute__((target("avx2,fma"))) double fma_peak_avx2(std::int64_t iters) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  const double t0 = thread_seconds();
  for (std::int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
  const double s = thread_seconds() - t0;
  for (int i = 0; i < 12; ++i) benchmark::DoNotOptimize(a[i]);
  return 12.0 * 8 * 2 * iters / s;
}
__attribute__((target("avx512f"))) double fma_peak_avx512(std::int64_t iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  const double t0 = thread_seconds();
  for (std::int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  const double s = thread_seconds() - t0;
  for (int i = 0; i < 12; ++i) benchmark::DoNotOptimize(a[i]);
  return 12.0 * 16 * 2 * iters / s;
}

// Peak FLOP/s for the vector width the kernels run with on this CPU (best of 5 short runs).
double fma_peak() {
  static const double peak = [] {
    const bool wide = attention_isa_name() == "avx512";
    double best = 0;
    for (int r = 0; r < 5; ++r) {
      if (wide) best = std::max(best, fma_peak_avx512(20'000'000));
      else if (__builtin_cpu_supports("fma")) best = std::max(best, fma_peak_avx2(20'000'000));
    }
    return best;
  }();
  return peak;
}

// Reference times measured once (fastest of 5 after a warm-up, like the benchmark loops) so every
// benchmark can report ratios to them.
double torch_seconds() {
  static const double t = [] {
    const TorchInputs in;
    run_torch(in);
    double best = 1e30;
    for (int r = 0; r < 5; ++r) best = std::min(best, run_torch(in));
    return best;
  }();
  return t;
}
double flash_fp32_seconds() {
  static const double t = [] {
    run_flash(flash_params(Format::fp32));
    double best = 1e30;
    for (int r = 0; r < 5; ++r) best = std::min(best, run_flash(flash_params(Format::fp32)));
    return best;
  }();
  return t;
}

void report(benchmark::State& state, double seconds_per_iter, double extra_bytes) {
  const double gflops = kFlops / seconds_per_iter * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  if (fma_peak() > 0) state.counters["frac_peak"] = gflops / (fma_peak() * 1e-9);
  state.counters["x_torch"] = torch_seconds() / seconds_per_iter;
  state.counters["x_fp32"] = seconds_per_iter / flash_fp32_seconds();
  state.counters["extra_MiB"] = extra_bytes / (1024.0 * 1024.0);
}

// Flash holds per thread: rounded copies of Q^T, K, V for one head (3 N d) plus a Bc x Br score
// tile and a Br x d running O: O(N d). Baseline and LibTorch hold the N x N scores (per head for
// baseline, for all B H heads at once for LibTorch).
double flash_extra_bytes() { return 4.0 * (3 * kN * kD + 64 * 64 + 64 * kD); }

void BM_flash_forward(benchmark::State& state, Format f) {
  const AttentionParams params = flash_params(f);
  double best = 1e30;
  for (auto _ : state) best = std::min(best, run_flash(params));
  report(state, best, flash_extra_bytes());
  state.SetLabel(std::string(attention_isa_name()) + " mixed " + std::string(to_string(f)));
}

void BM_baseline_forward(benchmark::State& state) {
  AttentionParams params = flash_params(Format::fp32);
  params.kind = AttentionKind::baseline;
  double best = 1e30;
  for (auto _ : state) best = std::min(best, run_flash(params));
  report(state, best, 4.0 * (kN * kN + 3 * kN * kD));
}

void BM_torch_forward(benchmark::State& state) {
  const TorchInputs in;
  run_torch(in);
  double best = 1e30;
  for (auto _ : state) best = std::min(best, run_torch(in));
  report(state, best, 4.0 * kB * kH * kN * kN * 2);  // scores and probabilities
  state.SetLabel("at::matmul + at::softmax, 1 thread");
}

void BM_fma_peak(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(fma_peak());
  state.counters["GFLOP/s"] = fma_peak() * 1e-9;
  state.SetLabel(attention_isa_name() == "avx512" ? "512-bit FMA" : "256-bit FMA");
}

BENCHMARK(BM_fma_peak)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_torch_forward)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, fp32, Format::fp32)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, fp16, Format::fp16)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, bf16, Format::bf16)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_baseline_forward)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
}  // namespace fastudy

BENCHMARK_MAIN();
