// The CRC-32 of the checksums (base/checksum.hpp's crc32_update: libdeflate where the build found it)
// beside zlib's crc32() on the same 1 MiB buffer in one run (a checkpoint's sidecar, an imported file's
// check and every verified read sum their bytes with it). Run: build/bench/runner/bench_checksum
#include <benchmark/benchmark.h>
#include <zlib.h>

#include <cstdint>
#include <random>
#include <vector>

#include "base/checksum.hpp"

namespace {

std::vector<unsigned char> buffer() {
  std::vector<unsigned char> bytes(std::size_t{1} << 20);
  std::mt19937 rng(1);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  return bytes;
}

void BM_Crc32Update(benchmark::State& state) {
  const auto bytes = buffer();
  std::uint32_t crc = 0;
  for (auto _ : state) benchmark::DoNotOptimize(crc = fastudy::crc32_update(crc, bytes.data(), bytes.size()));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes.size()));
}
BENCHMARK(BM_Crc32Update);

void BM_ZlibCrc32(benchmark::State& state) {
  const auto bytes = buffer();
  uLong crc = 0;
  for (auto _ : state) benchmark::DoNotOptimize(crc = ::crc32(crc, bytes.data(), static_cast<uInt>(bytes.size())));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes.size()));
}
BENCHMARK(BM_ZlibCrc32);

}  // namespace

BENCHMARK_MAIN();
