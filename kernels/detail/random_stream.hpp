// RandomStream: the random bits of stochastic rounding, one counter-based stream per head, drawn a
// vector or one scalar at a time (how, and what the bits depend on: the comment of the struct).
#pragma once

#include "kernels/detail/vec.hpp"

namespace fastudy {
namespace {

// The random bits of stochastic rounding: one stream per head (random_stream_key of the seed and the
// head's global index), one draw per lane per rounding call, in the order the kernel makes the calls.
// The bits therefore depend on the vector width of the instruction-set build, not on threads or ranks.
// Vector draws: the counter-based hash random_bits32 (kernels/round.hpp) of (key, counter), one
// counter value per lane, each hash split into two draws (its high half, then its low half moved up):
// roundings use the top bits, so a draw carries 16 random bits, a fraction resolved to 2^-16 of an ulp
// (all of bf16's 16 dropped bits; fp16 and tf32 drop 13). Draws do not depend on each other, so
// consecutive roundings pipeline. Scalar draws: one whole hash each; a vector loop over values that
// are rounded one at a time (the inputs on entry, the final O, the gradients) reads kLanes of them at
// once (scalar_lanes), the same bits as the scalar calls would take in their order.
struct RandomStream {
  std::uint32_t key = 0;
  std::uint32_t counter = 0;
  bool have_spare = false;
  alignas(64) unsigned char spare[64] = {};
  void seed(std::uint32_t k) {
    key = k;
    counter = 0;
    have_spare = false;
  }
  // random_bits32(key, idx) lane by lane (the same operations; 64-bit lanes keep the low 32 bits).
  template <class UV>
  FASTUDY_INLINE UV hash_lanes(UV idx) const {
    UV h = ((idx * 0x9E3779B9u) & 0xFFFFFFFFu) ^ key;
    h ^= h >> 16;
    h = (h * 0x85EBCA6Bu) & 0xFFFFFFFFu;
    h ^= h >> 13;
    h = (h * 0xC2B2AE35u) & 0xFFFFFFFFu;
    h ^= h >> 16;
    return h;
  }
  template <class T>
  FASTUDY_INLINE uvec_t<T> next_vec() {
    using UV = uvec_t<T>;
    constexpr int L = kLanes<T>;
    static_assert(sizeof(UV) <= sizeof(spare), "vector wider than the spare draw");
    UV h;
    if (have_spare) {
      have_spare = false;
      __builtin_memcpy(&h, spare, sizeof h);
      return h;
    }
    UV idx;
    for (int i = 0; i < L; ++i) idx[i] = static_cast<std::uint32_t>(i);
    idx += counter;
    counter += L;
    h = hash_lanes(idx);
    const UV low = (h << 16) & 0xFFFFFFFFu;
    __builtin_memcpy(spare, &low, sizeof low);
    have_spare = true;
    return h & 0xFFFF0000u;
  }
  FASTUDY_INLINE std::uint32_t next() { return random_bits32(key, counter++); }
  // Scalar draws lane by lane: lane i holds what next() would return at counter + offset + i * stride.
  // The stream does not move (skip does), so interleaved scalar sequences can be read as lanes.
  template <class T>
  FASTUDY_INLINE uvec_t<T> scalar_lanes(std::uint32_t offset, std::uint32_t stride) const {
    using UV = uvec_t<T>;
    UV idx;
    for (int i = 0; i < kLanes<T>; ++i)
      idx[i] = static_cast<std::uint32_t>(offset + static_cast<std::uint32_t>(i) * stride);
    idx += counter;
    return hash_lanes(idx);
  }
  // Moves past n scalar draws (as n calls of next()).
  FASTUDY_INLINE void skip(std::uint32_t n) { counter += n; }
};

}  // namespace
}  // namespace fastudy
