// The reduce's radix sort (analysis/radix_sort.hpp) at the sizes a reduce sorts: one run's values of a
// tensor (2^22 = 4.2M, the rate `fastudy plan` times; 2^25 = 33.6M, about GPT-2's token embedding) and
// of a whole model's share (2^27 = 134M, about GPT-2 small), as weights are distributed (N(0, 0.02)),
// unsorted and as the whole-model sort gets them (the concatenation of per-tensor sorted runs). One
// thread, the scratch kept between calls as the reduce keeps it. Counter ns_per_value.
//
//   build/bench/analysis/bench_radix_sort [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "analysis/radix_sort.hpp"

namespace {

std::vector<float> weights(std::size_t n) {
  std::mt19937_64 rng(20241201);
  std::normal_distribution<float> w(0.0f, 0.02f);
  std::vector<float> x(n);
  for (auto& v : x) v = w(rng);
  return x;
}

// arg 0: log2 of the values; arg 1: sorted runs of 2^arg1 values each (0: unsorted).
void BM_RadixSort(benchmark::State& state) {
  const std::size_t n = std::size_t{1} << state.range(0);
  std::vector<float> in = weights(n);
  if (state.range(1) > 0) {
    const std::size_t run = std::size_t{1} << state.range(1);
    for (std::size_t at = 0; at < n; at += run) std::sort(in.begin() + at, in.begin() + std::min(n, at + run));
  }
  std::vector<float> out(n);
  fastudy::ValueBuffer<std::uint32_t> scratch;
  fastudy::radix_sort_into(in.data(), out.data(), n, scratch);  // the scratch's pages, once
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    fastudy::radix_sort_into(in.data(), out.data(), n, scratch);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(out.data());
  }
  if (!std::is_sorted(out.begin(), out.end())) state.SkipWithError("the output is not sorted");
  state.counters["ns_per_value"] = 1e9 * seconds / (static_cast<double>(n) * static_cast<double>(state.iterations()));
}
BENCHMARK(BM_RadixSort)->Args({22, 0})->Args({25, 0})->Args({27, 0})->Args({27, 20})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
