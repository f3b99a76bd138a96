// Benchmark of the pairwise Wasserstein-1 matrix: V = 24 variants x n = 1,000,000 fp32 parameters, all
// 276 pairs, one thread. Measures the whole job (sort every variant once + one linear pass per pair)
// and its parts, and a streaming sum over the same bytes: the memory-bandwidth floor.
//
// Two ways to run it:
//   bench_wasserstein [Google Benchmark flags]        the usual benchmark table
//   bench_wasserstein --export DIR [--reps K]         writes the data set and the C++ results for
//       bench/analysis/compare_scipy.py, which times scipy.stats.wasserstein_distance on the same
//       arrays (bench/analysis/run_w1_vs_scipy.sh runs both). Files in DIR:
//         variants.f32  V*n float32, little-endian, variant-major (variant v at offset v*n)
//         w1.f64        V*V float64, row-major: the W1 matrix computed here
//         meta.txt      key = value lines: variants, n, seed, the timings (seconds, median of K)
//
// Data: a shared base N(0, 0.02) (like trained weights) plus a per-variant drift
// (1 + 0.25 v) * N(0, 1e-3), from std::mt19937_64(seed 20240502) and libstdc++'s normal_distribution:
// the file, not the generator, is the contract with the script.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "analysis/distance.hpp"

namespace {

constexpr std::size_t kVariants = 24;
constexpr std::size_t kParams = 1000000;
constexpr std::uint64_t kSeed = 20240502;

struct DataSet {
  std::size_t variants, n;
  std::vector<float> values;  // variant-major
  const float* variant(std::size_t v) const { return values.data() + v * n; }
  std::vector<const float*> ptrs() const {
    std::vector<const float*> p;
    for (std::size_t v = 0; v < variants; ++v) p.push_back(variant(v));
    return p;
  }
};

DataSet make_data(std::size_t variants, std::size_t n) {
  std::mt19937_64 rng(kSeed);
  std::normal_distribution<float> base(0.0f, 0.02f), drift(0.0f, 1e-3f);
  std::vector<float> b(n);
  for (auto& x : b) x = base(rng);
  DataSet d{variants, n, std::vector<float>(variants * n)};
  for (std::size_t v = 0; v < variants; ++v) {
    const float scale = 1.0f + 0.25f * static_cast<float>(v);
    for (std::size_t i = 0; i < n; ++i) d.values[v * n + i] = b[i] + scale * drift(rng);
  }
  return d;
}

const DataSet& data() {
  static const DataSet d = make_data(kVariants, kParams);
  return d;
}

fastudy::SortedSet<float> sort_all(const DataSet& d) {
  fastudy::SortedSet<float> set;
  for (std::size_t v = 0; v < d.variants; ++v) set.add({d.variant(v), d.n});
  return set;
}

fastudy::PairwisePartials w1_pairs(const fastudy::SortedSet<float>& set) {
  fastudy::PairwisePartials p(set.variants());
  fastudy::accumulate_sorted(set, 0, set.size(), p, fastudy::SortedMetrics::w1);
  return p;
}

// A streaming read of every byte of the data set: what the pairwise pass cannot beat.
double stream_sum(const DataSet& d) {
  float s[16] = {};
  const float* x = d.values.data();
  const std::size_t n = d.values.size();
  for (std::size_t i = 0; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) s[l] += x[i + l];
  double t = 0;
  for (float v : s) t += v;
  return t;
}

// ---- Google Benchmark ---------------------------------------------------------------------------

void BM_W1Matrix_SortAndPairs(benchmark::State& state) {
  const DataSet& d = data();
  for (auto _ : state) {
    const auto set = sort_all(d);
    auto p = w1_pairs(set);
    benchmark::DoNotOptimize(p.sums());
  }
  state.counters["pairs"] = static_cast<double>(kVariants * (kVariants - 1) / 2);
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(d.values.size() * sizeof(float)));
}
BENCHMARK(BM_W1Matrix_SortAndPairs)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_W1Matrix_SortOnly(benchmark::State& state) {
  const DataSet& d = data();
  for (auto _ : state) {
    const auto set = sort_all(d);
    benchmark::DoNotOptimize(set.window(0));
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(d.values.size() * sizeof(float)));
}
BENCHMARK(BM_W1Matrix_SortOnly)->Unit(benchmark::kMillisecond);

void BM_W1Matrix_PairsOnly(benchmark::State& state) {
  const DataSet& d = data();
  const auto set = sort_all(d);
  for (auto _ : state) {
    auto p = w1_pairs(set);
    benchmark::DoNotOptimize(p.sums());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(d.values.size() * sizeof(float)));
}
BENCHMARK(BM_W1Matrix_PairsOnly)->Unit(benchmark::kMillisecond);

void BM_AllMetricsMatrix(benchmark::State& state) {
  const DataSet& d = data();
  const auto set = sort_all(d);
  for (auto _ : state) {
    fastudy::PairwisePartials p(d.variants);
    fastudy::accumulate_sorted(set, 0, d.n, p);
    fastudy::accumulate_elementwise(d.ptrs(), 0, d.n, p);
    benchmark::DoNotOptimize(p.sums());
  }
}
BENCHMARK(BM_AllMetricsMatrix)->Unit(benchmark::kMillisecond);

void BM_StreamSum(benchmark::State& state) {
  const DataSet& d = data();
  for (auto _ : state) benchmark::DoNotOptimize(stream_sum(d));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(d.values.size() * sizeof(float)));
}
BENCHMARK(BM_StreamSum)->Unit(benchmark::kMillisecond);

// ---- export mode --------------------------------------------------------------------------------

struct Timing {
  double wall = 0;  // seconds, steady clock
  double cpu = 0;   // seconds of this process's CPU time: less sensitive to other jobs on the machine
};

double cpu_now() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Median over reps (the figure compared with scipy's mean over pairs: neither side takes its best).
template <class F>
Timing median_seconds(int reps, F&& f) {
  std::vector<double> wall, cpu;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    f();
    cpu.push_back(cpu_now() - c0);
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

int export_mode(const std::string& dir, int reps) {
  const DataSet& d = data();
  {
    std::ofstream f(dir + "/variants.f32", std::ios::binary);
    f.write(reinterpret_cast<const char*>(d.values.data()),
            static_cast<std::streamsize>(d.values.size() * sizeof(float)));
    if (!f) {
      std::cerr << "bench_wasserstein: cannot write " << dir << "/variants.f32\n";
      return 1;
    }
  }
  fastudy::PairwiseMatrix m;
  const Timing total = median_seconds(reps, [&] {
    const auto set = sort_all(d);
    m = w1_pairs(set).finalize();
  });
  fastudy::SortedSet<float> set;
  const Timing sort = median_seconds(reps, [&] { set = sort_all(d); });
  const Timing pairs = median_seconds(reps, [&] { benchmark::DoNotOptimize(w1_pairs(set).sums()); });
  // The bandwidth floor: the best of several streaming reads (the floor is what the memory can do).
  double sink = 0, stream = 1e300;
  for (int r = 0; r < 10; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    sink += stream_sum(d);
    stream = std::min(stream, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  benchmark::DoNotOptimize(sink);

  std::vector<double> w1(d.variants * d.variants);
  for (std::size_t i = 0; i < d.variants; ++i)
    for (std::size_t j = 0; j < d.variants; ++j) w1[i * d.variants + j] = m.at(i, j).w1;
  std::ofstream wf(dir + "/w1.f64", std::ios::binary);
  wf.write(reinterpret_cast<const char*>(w1.data()), static_cast<std::streamsize>(w1.size() * sizeof(double)));

  const double bytes = static_cast<double>(d.values.size() * sizeof(float));
  std::ofstream meta(dir + "/meta.txt");
  meta.precision(9);
  meta << "variants = " << d.variants << "\nn = " << d.n << "\nseed = " << kSeed << "\nreps = " << reps
       << "\ncpp_total_seconds = " << total.wall << "\ncpp_total_cpu_seconds = " << total.cpu
       << "\ncpp_sort_seconds = " << sort.wall << "\ncpp_pairs_seconds = " << pairs.wall
       << "\nstream_seconds = " << stream << "\nstream_bytes = " << bytes
       << "\nstream_gbps = " << bytes / stream / 1e9 << "\n";
  std::printf("C++ (one thread, median of %d): sort %zu x %zu + %zu W1 pairs: %.3f s wall, %.3f s CPU "
              "(sort %.3f s, pairs %.3f s); streaming read of the %.0f MB: %.4f s (%.1f GB/s)\n",
              reps, d.variants, d.n, d.variants * (d.variants - 1) / 2, total.wall, total.cpu, sort.wall,
              pairs.wall, bytes / 1e6, stream, bytes / stream / 1e9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string export_dir;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--export") == 0 && has_value) {
      export_dir = argv[++i];
    } else if (std::strcmp(argv[i], "--reps") == 0 && has_value) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--export") == 0 || std::strcmp(argv[i], "--reps") == 0) {
      std::cerr << "usage: bench_wasserstein --export DIR [--reps K]   (or Google Benchmark flags)\n";
      return 2;
    }
  }
  if (!export_dir.empty()) return export_mode(export_dir, reps);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
