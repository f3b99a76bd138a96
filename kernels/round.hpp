// Per-value rounding into the emulated number formats (to nearest even, toward zero, stochastic), as
// inline templates on the format so hot loops pay no call and no switch. format.cpp's round_to() is a
// switch over these.
// Usable from CUDA later: every function is FASTUDY_HD (__host__ __device__ under nvcc).
//
// Method (same for float and double sources): inf/NaN first (NaN stays NaN, quiet, sign kept; inf
// stays inf, except fp8 e4m3 "fn" which has no inf and gives NaN). Values in the target's normal
// range are rounded on the bit pattern: add half an ulp minus one plus the lowest kept bit (ties to
// even), clear the dropped bits; a carry into the exponent is the correct result. Anything above the
// largest finite value afterwards overflowed: inf (IEEE formats) or NaN (e4m3, OCP "saturate to
// NaN" mode: max 448). Values below the target's smallest normal round to the fixed subnormal quantum
// 2^(emin - p) by adding and subtracting a magic constant 2^(emin - p + source mantissa bits), which
// the hardware rounds ties-to-even. Signed zero is kept.
#pragma once

#include <cstdint>
#include <cstring>

#include "base/hash.hpp"
#include "base/host_device.hpp"
#include "kernels/format.hpp"


namespace fastudy {

// p explicit mantissa bits, emin/emax the exponents of the smallest and largest normal binade,
// max_mantissa the fraction bits (p wide) of the largest finite value, nan_on_overflow for e4m3.
template <Format F>
struct FormatTraits;
template <>
struct FormatTraits<Format::fp64> {
  static constexpr int p = 52, emin = -1022, emax = 1023;
  static constexpr bool nan_on_overflow = false;
};
template <>
struct FormatTraits<Format::fp32> {
  static constexpr int p = 23, emin = -126, emax = 127;
  static constexpr bool nan_on_overflow = false;
};
template <>
struct FormatTraits<Format::tf32> {
  static constexpr int p = 10, emin = -126, emax = 127;
  static constexpr bool nan_on_overflow = false;
};
template <>
struct FormatTraits<Format::fp16> {
  static constexpr int p = 10, emin = -14, emax = 15;
  static constexpr bool nan_on_overflow = false;
};
template <>
struct FormatTraits<Format::bf16> {
  static constexpr int p = 7, emin = -126, emax = 127;
  static constexpr bool nan_on_overflow = false;
};
template <>
struct FormatTraits<Format::fp8_e4m3> {
  // 0x7F / 0xFF (exponent 1111, mantissa 111) is the only NaN, so 1.110b * 2^8 = 448 is the max.
  static constexpr int p = 3, emin = -6, emax = 8;
  static constexpr bool nan_on_overflow = true;
};
template <>
struct FormatTraits<Format::fp8_e5m2> {
  static constexpr int p = 2, emin = -14, emax = 15;
  static constexpr bool nan_on_overflow = false;
};

namespace detail {

template <class To, class From>
FASTUDY_HD inline To bits_as(From x) {
  static_assert(sizeof(To) == sizeof(From), "bit cast between different sizes");
  To t;
  std::memcpy(&t, &x, sizeof(To));
  return t;
}

// The bit layout of the source type.
template <class T>
struct SourceBits;
template <>
struct SourceBits<float> {
  using U = std::uint32_t;
  static constexpr int p = 23, bias = 127;
};
template <>
struct SourceBits<double> {
  using U = std::uint64_t;
  static constexpr int p = 52, bias = 1023;
};

// The bit patterns of format F inside the source type T (float or double), shared by every rounding
// (scalar here, lane-wise in the CPU kernels): the dropped bits, sign, inf/NaN, the largest finite
// value of F (exponent emax, fraction all ones; e4m3: all ones but the last bit), the smallest normal,
// and for F's subnormal range the magic constant 2^(emin - p + source mantissa bits) and the quantum
// 2^(emin - p).
template <Format F, class T>
struct RoundBits {
  using Tr = FormatTraits<F>;
  using S = SourceBits<T>;
  using U = typename S::U;
  static constexpr int kShift = S::p - Tr::p;
  static constexpr U kOne = 1;
  static constexpr U kSignMask = kOne << (8 * sizeof(U) - 1);
  static constexpr U kExpMask = ~kSignMask & ~((kOne << S::p) - 1);  // also the bits of +inf
  static constexpr U kQuietNan = kExpMask | (kOne << (S::p - 1));
  static constexpr U kMaxFraction = ((kOne << Tr::p) - 1) - (Tr::nan_on_overflow ? 1 : 0);
  static constexpr U kMaxBits = (U(Tr::emax + S::bias) << S::p) | (kMaxFraction << kShift);
  static constexpr U kMinNormalBits = U(Tr::emin + S::bias) << S::p;
  static constexpr U kMagicBits = U(Tr::emin - Tr::p + S::p + S::bias) << S::p;
  static constexpr U quantum_bits() { return U(Tr::emin - Tr::p + S::bias) << S::p; }
  // F has T's exponent range (bf16, tf32 from float): rounding works on the bits alone.
  static constexpr bool kSameRange = Tr::emin == 1 - S::bias && Tr::emax == S::bias && !Tr::nan_on_overflow;
};

}  // namespace detail

// True when rounding a T into F can change nothing (F at least as wide as T in every respect).
template <Format F, class T>
constexpr bool round_is_identity() {
  using Tr = FormatTraits<F>;
  using S = detail::SourceBits<T>;
  return Tr::p >= S::p && Tr::emin <= 1 - S::bias && !Tr::nan_on_overflow && Tr::emax >= S::bias;
}

// x rounded into F in mode M (Rounding in kernels/format.hpp); `random` is 32 uniform random bits
// (stochastic only). Special values first: NaN stays NaN (quiet, sign kept), inf stays inf (e4m3:
// NaN); signed zero is kept.
//   nearest     normal range: add half an ulp minus one plus the lowest kept bit (ties to even) and
//               clear the dropped bits; subnormal range of F: the hardware's ties-to-even on the fixed
//               quantum 2^(emin - p) by adding and subtracting a magic constant; above the largest
//               finite value: inf (e4m3: NaN).
//   zero        clear the dropped bits; subnormal range: |x| floored to a multiple of the quantum;
//               above the largest finite value: that value (truncation never overflows).
//   stochastic  add the top kShift bits of `random` to the bits to be dropped (a carry happens with
//               probability equal to the dropped fraction), then clear them; subnormal range: |x| +
//               random * 2^-32 quantum, floored; above the largest finite value: inf (e4m3: NaN).
// A carry into the exponent is the correct result in every mode.
template <Format F, Rounding M, class T>
FASTUDY_HD inline T round_to_format_mode(T x, std::uint32_t random) {
  if constexpr (round_is_identity<F, T>()) {
    return x;
  } else {
    using Tr = FormatTraits<F>;
    using S = detail::SourceBits<T>;
    using B = detail::RoundBits<F, T>;
    using U = typename B::U;

    const U u = detail::bits_as<U>(x);
    const U sign = u & B::kSignMask;
    U a = u ^ sign;
    if (a >= B::kExpMask) {  // inf or NaN
      if (a > B::kExpMask || Tr::nan_on_overflow) return detail::bits_as<T>(sign | B::kQuietNan);
      return x;
    }
    if (Tr::emin > 1 - S::bias && a < B::kMinNormalBits) {
      const T magic = detail::bits_as<T>(B::kMagicBits);
      T v = detail::bits_as<T>(a);
      if constexpr (M == Rounding::stochastic)
        v += detail::bits_as<T>(B::quantum_bits()) * (static_cast<T>(random) * static_cast<T>(0x1p-32));
      T r = (v + magic) - magic;  // the nearest multiple of the quantum, ties to even
      if constexpr (M != Rounding::nearest)
        if (r > v) r -= detail::bits_as<T>(B::quantum_bits());  // floor
      return detail::bits_as<T>(detail::bits_as<U>(r) | sign);
    }
    if constexpr (B::kShift > 0) {
      if constexpr (M == Rounding::nearest) {
        a += ((B::kOne << (B::kShift - 1)) - 1) + ((a >> B::kShift) & 1);
      } else if constexpr (M == Rounding::stochastic) {
        if constexpr (B::kShift <= 32) a += U(random >> (32 - B::kShift));
        else a += U(random) << (B::kShift - 32);
      }
      a &= ~((B::kOne << B::kShift) - 1);
    }
    if (a > B::kMaxBits) {
      if constexpr (M == Rounding::zero) a = B::kMaxBits;
      else a = Tr::nan_on_overflow ? B::kQuietNan : B::kExpMask;
    }
    return detail::bits_as<T>(a | sign);
  }
}

// Round to nearest, ties to even (see round_to_format_mode).
template <Format F, class T>
FASTUDY_HD inline T round_to_format(T x) {
  return round_to_format_mode<F, Rounding::nearest>(x, 0u);
}

// 32 random bits for draw `counter` of the stream `key`: murmur3's 32-bit finaliser over a Weyl
// sequence, a bijection of the counter for each key (streams repeat after 2^32 draws).
FASTUDY_HD inline std::uint32_t random_bits32(std::uint32_t key, std::uint32_t counter) {
  std::uint32_t h = (counter * 0x9E3779B9u) ^ key;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// The key of a head's stream: a 64-bit mix (splitmix64's finaliser) of the seed and the global head
// index, folded to 32 bits.
FASTUDY_HD inline std::uint32_t random_stream_key(std::uint64_t seed, std::uint64_t head) {
  const std::uint64_t z = splitmix64_mix(seed + kSplitMix64Gamma * (head + 1));
  return static_cast<std::uint32_t>(z ^ (z >> 32));
}

}  // namespace fastudy
