// bench_attention: the speed figures of issue 3, measured side by side in one run on one thread.
//   flash forward, B=8 H=8 N=1024 d=64, fp32 (mixed policy = every step fp32: no rounding work),
//   the same attention through LibTorch (at::matmul, at::softmax, at::matmul; at::set_num_threads(1)),
//   a measured single-core fp32 FMA peak (independent vector FMAs of the width the kernels use),
//   flash forward with the mixed fp16 and bf16 policies (emulated storage rounding), the eager
//   reading (running state stored in the format between tiles), stochastic rounding and truncation,
//   the FlashAttention kernel readings (fa2 fp16/bf16, fa3 bf16 and its FP8 path with block
//   quantization and incoherent processing), the fa2 reading under launch = "pytorch" (x_fa2: its time over
//   the fa2 reading's), and baseline.
// Times are the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), and the counters use the
// fastest iteration of each benchmark: on a shared machine both keep other load out of the figures.
// Every kernel (LibTorch's included) is checked against the fp64 reference with the check harness's
// bound (kernels/check.hpp) before it is timed, on the first batch entry of the problem (all H heads,
// the same N, d, blocks and policy: every head runs the same code); the label shows the check, and a
// kernel that fails it is skipped with the error instead of timed.
// Counters: GFLOP/s (4 B H N^2 d flops per forward), frac_peak (of the measured FMA peak),
// x_torch (LibTorch's steady-state time / this time: see run_torch), page_faults (per LibTorch call),
// x_fp32 (this time / flash fp32 time), and the memory each algorithm holds beyond its inputs and outputs (flash: O(N d) per thread;
// baseline/torch: N^2).
//
// Run: build/bench/kernels/bench_attention [--benchmark_filter=REGEX] [--benchmark_repetitions=3]
// B batch, H heads, N sequence, d head dim.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <immintrin.h>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <time.h>

#include "kernels/attention.hpp"
#include "kernels/check.hpp"

namespace fastudy {
namespace {

// CPU time of the calling thread: every timed call here runs on one thread, and on a shared machine
// this leaves out the time the thread waited for a core (wall time would count it).
// Minor page faults of the process so far (a first touch of freshly mapped memory is one each 4 KiB).
long minor_page_faults() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

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

AttentionParams flash_params(Format f, const char* preset = "mixed", Rounding rounding = Rounding::nearest) {
  AttentionParams params;
  params.attention = AttentionKind::flash;
  params.order = LoopOrder::q_outer;
  params.policy = make_policy(preset, f, AttentionKind::flash);
  params.policy.rounding = rounding;
  params.rounding_seed = 1;
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

// LibTorch's inputs and, for the steady-state anchor, its output buffers (scores S, probabilities P,
// output O) allocated once.
struct TorchInputs {
  at::Tensor q, k, v, s, p, o;
  TorchInputs() {
    const Problem& p = problem();
    auto opts = at::TensorOptions().dtype(at::kFloat);
    q = at::from_blob(const_cast<float*>(p.q.data()), {kB, kH, kN, kD}, opts).clone();
    k = at::from_blob(const_cast<float*>(p.k.data()), {kB, kH, kN, kD}, opts).clone();
    v = at::from_blob(const_cast<float*>(p.v.data()), {kB, kH, kN, kD}, opts).clone();
    s = at::empty({kB, kH, kN, kN}, opts);
    this->p = at::empty({kB, kH, kN, kN}, opts);
    o = at::empty({kB, kH, kN, kD}, opts);
  }
};

// LibTorch's attention on float buffers, as a harness kernel (lse from at::logsumexp of the scores).
AttentionStats torch_forward(const AttentionShape& shape, const AttentionParams&, const float* q, const float* k,
                             const float* v, float* o, float* lse) {
  const std::vector<std::int64_t> dims = {shape.batch, shape.heads, shape.seq_len, shape.head_dim};
  auto opts = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor tq = at::from_blob(const_cast<float*>(q), dims, opts);
  const at::Tensor tk = at::from_blob(const_cast<float*>(k), dims, opts);
  const at::Tensor tv = at::from_blob(const_cast<float*>(v), dims, opts);
  const at::Tensor s = at::matmul(tq, tk.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
  const at::Tensor to = at::matmul(at::softmax(s, -1), tv).contiguous();
  const at::Tensor tl = at::logsumexp(s, -1).contiguous();
  std::memcpy(o, to.data_ptr<float>(), static_cast<std::size_t>(to.numel()) * sizeof(float));
  std::memcpy(lse, tl.data_ptr<float>(), static_cast<std::size_t>(tl.numel()) * sizeof(float));
  AttentionStats st;
  st.tiles_kv = 1;
  return st;
}

// The LibTorch anchor, two ways. `fresh`: as the attention is usually written (at::matmul,
// at::softmax, at::matmul), each call allocating its 256 MiB S and P anew; glibc maps such blocks
// fresh from the kernel and returns them on free, so every call takes 131072 page faults (65536 per
// tensor), which on this machine cost ~12 us each: 1.6 s of the ~1.9 s. `steady` (the anchor the
// ratios use): the same three operations into buffers allocated once (at::matmul_out,
// at::_softmax_out), as a training loop reaches with a caching allocator: no page faults.
double run_torch(TorchInputs& t, bool fresh) {
  at::set_num_threads(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  const double t0 = thread_seconds();
  if (fresh) {
    at::Tensor s = at::matmul(t.q, t.k.transpose(-2, -1)).mul_(scale);
    at::Tensor o = at::matmul(at::softmax(s, -1), t.v);
    benchmark::DoNotOptimize(o.data_ptr<float>());
  } else {
    at::matmul_out(t.s, t.q, t.k.transpose(-2, -1)).mul_(scale);
    at::_softmax_out(t.p, t.s, -1, false);
    at::matmul_out(t.o, t.p, t.v);
    benchmark::DoNotOptimize(t.o.data_ptr<float>());
  }
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

// The check of a kernel before it is timed (once per kernel, whatever the number of runs), against
// the fp64 reference of the first batch entry, its inputs rounded to the policy's storage format.
struct Checked {
  bool ok = false;
  std::string summary;  // "vs fp64: max|dO| ... <= ..., max|d lse| ... <= ..."
};

// One reference per storage format (the policies here store Q, K and V in one format, policy.q).
const AttentionReference& reference(const PrecisionPolicy& policy) {
  static std::map<Format, AttentionReference> refs;
  auto it = refs.find(policy.q);
  if (it == refs.end()) {
    const Problem& p = problem();
    AttentionShape shape = p.shape;
    shape.batch = 1;
    const std::size_t n = static_cast<std::size_t>(kH * kN * kD);
    auto head = [n](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.begin() + n); };
    it = refs.emplace(policy.q, make_reference(shape, policy, head(p.q), head(p.k), head(p.v))).first;
  }
  return it->second;
}

const Checked& check(const std::string& name, const AttentionParams& params, const ForwardKernel<float>& kernel) {
  static std::map<std::string, Checked> done;
  auto it = done.find(name);
  if (it == done.end()) {
    const ForwardCheck<float> c = check_forward<float>(reference(params.policy), params, kernel);
    it = done.emplace(name, Checked{c.ok(), "vs fp64: " + c.summary()}).first;
  }
  return it->second;
}

// LibTorch is checked as a pure fp32 computation without tiles (block_kv = N: one tile).
AttentionParams torch_params() {
  AttentionParams params;
  params.attention = AttentionKind::baseline;
  params.policy = make_policy("pure", Format::fp32, AttentionKind::baseline);
  params.block_q = static_cast<int>(kN);
  params.block_kv = static_cast<int>(kN);
  return params;
}
const Checked& torch_checked() { return check("torch", torch_params(), torch_forward); }
const Checked& flash_checked(Format f, const char* preset = "mixed", Rounding rounding = Rounding::nearest) {
  const AttentionParams params = flash_params(f, preset, rounding);
  return check(describe_kernel(params), params, attention_forward<float>);
}

// False, with the benchmark skipped and the check's numbers as the reason, when the check failed.
bool passed(benchmark::State& state, const std::string& what, const Checked& c) {
  if (!c.ok) state.SkipWithError((what + " fails its check against the fp64 reference: " + c.summary).c_str());
  return c.ok;
}

// Reference times measured once (fastest of 5 after a warm-up, like the benchmark loops) so every
// benchmark can report ratios to them.
double torch_seconds() {
  static const double t = [] {
    TorchInputs in;
    run_torch(in, false);
    double best = 1e30;
    for (int r = 0; r < 5; ++r) best = std::min(best, run_torch(in, false));
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

// The ratios to LibTorch and to flash fp32 appear only when those kernels passed their checks (a
// kernel is never timed unchecked).
void report(benchmark::State& state, double seconds_per_iter, double extra_bytes) {
  const double gflops = kFlops / seconds_per_iter * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  if (fma_peak() > 0) state.counters["frac_peak"] = gflops / (fma_peak() * 1e-9);
  if (torch_checked().ok) state.counters["x_torch"] = torch_seconds() / seconds_per_iter;
  if (flash_checked(Format::fp32).ok) state.counters["x_fp32"] = seconds_per_iter / flash_fp32_seconds();
  state.counters["extra_MiB"] = extra_bytes / (1024.0 * 1024.0);
}

// Flash holds per thread: rounded copies of Q^T, K, V for one head (3 N d) plus a Bc x Br score
// tile and a Br x d running O: O(N d). Baseline and LibTorch hold the N x N scores (per head for
// baseline, for all B H heads at once for LibTorch).
double flash_extra_bytes() { return 4.0 * (3 * kN * kD + 64 * 64 + 64 * kD); }

void BM_flash_forward(benchmark::State& state, Format f, const char* preset, Rounding rounding) {
  const AttentionParams params = flash_params(f, preset, rounding);
  const Checked& checked = flash_checked(f, preset, rounding);
  if (!passed(state, describe_kernel(params), checked)) return;
  double best = 1e30;
  for (auto _ : state) best = std::min(best, run_flash(params));
  report(state, best, flash_extra_bytes());
  state.SetLabel(std::string(attention_isa_name()) + " " + preset + " " + std::string(to_string(f)) + " " +
                 std::string(to_string(rounding)) + "; " + checked.summary);
}

// The fa2 reading under launch = "pytorch" (PyTorch's FlashAttention-2 launch for 132 SMs, its tensor cores'
// arithmetic emulated, kernels/detail/fa2_pytorch.hpp) beside today's fa2 reading (launch = "blocks",
// 64 x 64 tiles, FMA dot products) on the same problem: x_fa2 = this time / the fa2 forward's time, both
// measured in this run (fastest of 3 for the reference).
double fa2_blocks_seconds(Format f) {
  static std::map<Format, double> done;
  auto it = done.find(f);
  if (it == done.end()) {
    const AttentionParams params = flash_params(f, "fa2");
    run_flash(params);
    double best = 1e30;
    for (int r = 0; r < 3; ++r) best = std::min(best, run_flash(params));
    it = done.emplace(f, best).first;
  }
  return it->second;
}

void BM_fa2_pytorch_forward(benchmark::State& state, Format f) {
  AttentionParams params = flash_params(f, "fa2");
  params.launch = Launch::pytorch;
  const Checked& checked = check(describe_kernel(params) + " launch pytorch", params, attention_forward<float>);
  if (!passed(state, describe_kernel(params) + " launch pytorch", checked)) return;
  double best = 1e30;
  for (auto _ : state) best = std::min(best, run_flash(params));
  report(state, best, flash_extra_bytes());
  state.counters["x_fa2"] = best / fa2_blocks_seconds(f);
  state.SetLabel(std::string(attention_isa_name()) + " fa2 launch=pytorch " + std::string(to_string(f)) + "; " +
                 checked.summary);
}

// The backward pass: dQ, dK, dV from the forward's O and lse and a fixed dO, checked against the fp64
// reference backward (its rel_l2 bound) first. Counters: GFLOP/s at 10 B H N^2 d flops (2.5x the
// forward's, FlashAttention-2's count: five N x N x d products), x_forward = this time / the same
// policy's forward time, x_fp32 = this time / the fp32 backward time.
struct BackwardProblem {
  std::vector<float> dout, dq, dk, dv;
  BackwardProblem() {
    const std::size_t n = kB * kH * kN * kD;
    std::mt19937 rng(2);
    std::normal_distribution<float> dist;
    dout.resize(n);
    for (float& e : dout) e = dist(rng);
    dq.resize(n);
    dk.resize(n);
    dv.resize(n);
  }
};

double run_backward(const AttentionParams& params, BackwardProblem& b) {
  Problem& p = const_cast<Problem&>(problem());
  attention_forward<float>(p.shape, params, p.q.data(), p.k.data(), p.v.data(), p.o.data(), p.lse.data());
  const double t0 = thread_seconds();
  attention_backward<float>(p.shape, params, p.q.data(), p.k.data(), p.v.data(), p.o.data(), p.lse.data(),
                            b.dout.data(), b.dq.data(), b.dk.data(), b.dv.data());
  return thread_seconds() - t0;
}

const Checked& backward_checked(const AttentionParams& params) {
  static std::map<std::string, Checked> done;
  const std::string name = describe_kernel(params);
  auto it = done.find(name);
  if (it == done.end()) {
    const Problem& p = problem();
    static const BackwardProblem grads;
    AttentionShape shape = p.shape;
    shape.batch = 1;
    const std::size_t n = static_cast<std::size_t>(kH * kN * kD);
    auto head = [n](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.begin() + n); };
    const AttentionReference ref =
        make_reference(shape, params.policy, head(p.q), head(p.k), head(p.v), head(grads.dout));
    const BackwardCheck<float> c = check_backward<float>(ref, params);
    it = done.emplace(name, Checked{c.ok(), "vs fp64: " + c.summary()}).first;
  }
  return it->second;
}

double backward_fp32_seconds() {
  static const double t = [] {
    BackwardProblem b;
    double best = 1e30;
    for (int r = 0; r < 3; ++r) best = std::min(best, run_backward(flash_params(Format::fp32), b));
    return best;
  }();
  return t;
}

void BM_flash_backward(benchmark::State& state, Format f, const char* preset) {
  const AttentionParams params = flash_params(f, preset);
  const Checked& checked = backward_checked(params);
  if (!passed(state, describe_kernel(params) + " backward", checked)) return;
  BackwardProblem b;
  double best = 1e30;
  for (auto _ : state) best = std::min(best, run_backward(params, b));
  double forward = 1e30;
  for (int r = 0; r < 3; ++r) forward = std::min(forward, run_flash(params));
  state.counters["GFLOP/s"] = 2.5 * kFlops / best * 1e-9;
  state.counters["x_forward"] = best / forward;
  if (backward_checked(flash_params(Format::fp32)).ok) state.counters["x_fp32"] = best / backward_fp32_seconds();
  state.SetLabel(std::string(attention_isa_name()) + " " + preset + " " + std::string(to_string(f)) + "; " +
                 checked.summary);
}

void BM_baseline_forward(benchmark::State& state) {
  AttentionParams params = flash_params(Format::fp32);
  params.attention = AttentionKind::baseline;
  const Checked& checked = check(describe_kernel(params), params, attention_forward<float>);
  if (!passed(state, describe_kernel(params), checked)) return;
  double best = 1e30;
  for (auto _ : state) best = std::min(best, run_flash(params));
  report(state, best, 4.0 * (kN * kN + 3 * kN * kD));
  state.SetLabel(checked.summary);
}

void BM_torch_forward(benchmark::State& state, bool fresh) {
  const Checked& checked = torch_checked();
  if (!passed(state, "LibTorch attention", checked)) return;
  TorchInputs in;
  run_torch(in, fresh);
  double best = 1e30;
  const long faults0 = minor_page_faults();
  for (auto _ : state) best = std::min(best, run_torch(in, fresh));
  report(state, best, 4.0 * kB * kH * kN * kN * 2);  // scores and probabilities
  state.counters["page_faults"] = static_cast<double>(minor_page_faults() - faults0) /
                                  static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  state.SetLabel(std::string(fresh ? "at::matmul + at::softmax, fresh outputs (page faults)"
                                   : "at::matmul_out + at::_softmax_out into buffers allocated once") +
                 ", 1 thread; " + checked.summary);
}

void BM_fma_peak(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(fma_peak());
  state.counters["GFLOP/s"] = fma_peak() * 1e-9;
  state.SetLabel(attention_isa_name() == "avx512" ? "512-bit FMA" : "256-bit FMA");
}

BENCHMARK(BM_fma_peak)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_torch_forward, steady, false)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_torch_forward, fresh, true)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, fp32, Format::fp32, "mixed", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, fp16, Format::fp16, "mixed", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, bf16, Format::bf16, "mixed", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
// The readings and rounding modes of issue 12 (aim: eager and stochastic bf16 within 1.5x of fp32).
BENCHMARK_CAPTURE(BM_flash_forward, eager_bf16, Format::bf16, "eager", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, eager_fp16, Format::fp16, "eager", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, mixed_bf16_stochastic, Format::bf16, "mixed", Rounding::stochastic)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, eager_bf16_stochastic, Format::bf16, "eager", Rounding::stochastic)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, eager_bf16_zero, Format::bf16, "eager", Rounding::zero)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, fp8_e4m3, Format::fp8_e4m3, "mixed", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, fp8_e5m2, Format::fp8_e5m2, "mixed", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, pure_bf16, Format::bf16, "pure", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
// The readings of the FlashAttention kernels (issue 26; aim: each within 1.5x of fp32).
BENCHMARK_CAPTURE(BM_flash_forward, fa2_fp16, Format::fp16, "fa2", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, fa2_bf16, Format::bf16, "fa2", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, fa3_bf16, Format::bf16, "fa3", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_forward, fa3_fp8_e4m3, Format::fp8_e4m3, "fa3", Rounding::nearest)
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);
// launch = "pytorch" beside fa2 (x_fa2; the aim is within 2x: see docs/ for where it stands).
BENCHMARK_CAPTURE(BM_fa2_pytorch_forward, fp16, Format::fp16)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_fa2_pytorch_forward, bf16, Format::bf16)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_baseline_forward)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_backward, fp32, Format::fp32, "mixed")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_backward, bf16, Format::bf16, "mixed")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_backward, fp16, Format::fp16, "mixed")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_backward, eager_bf16, Format::bf16, "eager")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_flash_backward, fa2_bf16, Format::bf16, "fa2")->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
}  // namespace fastudy

BENCHMARK_MAIN();
