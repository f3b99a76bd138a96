// The project's two small non-cryptographic hashes, written once: FNV-1a (a stable 64-bit key for a
// name or a text: content hashes of resolved configurations, random-stream keys of parameter names)
// and SplitMix64 (Steele, Lea and Flood 2014: a counter-based mixer and a tiny generator whose output
// is the same on every platform, for seeds, streams and the bootstrap). Every value they produce is
// pinned by tests (tests/config/test_config.cpp's content hashes, the trainer's init and data streams,
// the microbenchmark's inputs, the bootstrap intervals), so the constants here must never change.
// Usable from CUDA: the functions are FASTUDY_HD.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/host_device.hpp"

namespace fastudy {

// FNV-1a, 64 bits: offset basis 14695981039346656037 (0xcbf29ce484222325), prime 1099511628211.
inline constexpr std::uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;
inline constexpr std::uint64_t kFnv1aPrime = 0x100000001b3ull;

constexpr std::uint64_t fnv1a64(std::string_view s, std::uint64_t h = kFnv1aBasis) {
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= kFnv1aPrime;
  }
  return h;
}

// SplitMix64's increment (the golden ratio in 64 bits) and its output function (Stafford's mix 13).
inline constexpr std::uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ull;

FASTUDY_HD constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The output of one SplitMix64 step from state x (the state becomes x + gamma): a stateless mixer of
// a 64-bit key.
FASTUDY_HD constexpr std::uint64_t splitmix64(std::uint64_t x) { return splitmix64_mix(x + kSplitMix64Gamma); }

// The generator: state advances by gamma, each output is the mix of the new state.
struct SplitMix64 {
  std::uint64_t state = 0;
  constexpr std::uint64_t next() {
    state += kSplitMix64Gamma;
    return splitmix64_mix(state);
  }
  // Uniform in [0, n): the high 64 bits of next() * n (Lemire's multiply-shift, without rejection).
  constexpr std::uint64_t below(std::uint64_t n) {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
};

}  // namespace fastudy
