// Seeded, counter-keyed random numbers for the trainer: one independent stream per purpose.
//
// Every random quantity of a variant is drawn from a stream keyed by (seed, purpose, index): the init
// of parameter "blocks.0.attn.qkv.weight" uses key (init seed, fnv1a(name)); synthetic sequence i uses
// key (data seed, i). Streams never share state, so adding a parameter or skipping a batch changes no
// other number, and a data stream resumes from a cursor without replaying anything. The generator is
// xoshiro256** seeded through splitmix64; normals use Box-Muller in double. Everything here is
// portable (no std::*_distribution, whose output differs between standard libraries). No LibTorch.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "base/hash.hpp"

namespace fastudy::train {

class Rng {
 public:
  Rng(std::uint64_t seed, std::uint64_t stream) {
    SplitMix64 sm{seed ^ (0xD1B54A32D192ED03ull * (stream + 1))};
    for (auto& w : s_) w = sm.next();
  }

  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift with rejection: unbiased).
  std::uint64_t below(std::uint64_t n) {
    for (;;) {
      const unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
      const auto low = static_cast<std::uint64_t>(m);
      if (low >= n || low >= (0 - n) % n) return static_cast<std::uint64_t>(m >> 64);
    }
  }

  // Standard normal (Box-Muller, one value per call).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

}  // namespace fastudy::train
