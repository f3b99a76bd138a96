// Rounding of whole vectors: round_vec (to nearest, with vcvtps2ph for fp16 where the build has F16C)
// and round_vec_mode (toward zero or stochastically), the lane-wise twins of round_to_format and
// round_to_format_mode (kernels/round.hpp), with the same results lane by lane.
#pragma once

#include "kernels/detail/vec.hpp"

namespace fastudy {
namespace {

template <Format F, class T>
FASTUDY_INLINE vec_t<T> round_vec(vec_t<T> x) {
  if constexpr (round_is_identity<F, T>()) {
    return x;
  } else {
#if FASTUDY_ISA_F16C && FASTUDY_VEC_BYTES == 32
    if constexpr (F == Format::fp16 && std::is_same_v<T, float>) {
      return (vec_t<T>)_mm256_cvtph_ps(_mm256_cvtps_ph((__m256)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#elif FASTUDY_ISA_F16C && FASTUDY_VEC_BYTES == 64
    if constexpr (F == Format::fp16 && std::is_same_v<T, float>) {
      // The maskz forms: the plain ones trip GCC 12's -Wmaybe-uninitialized inside its own header.
      const __m256i h = _mm512_maskz_cvtps_ph(0xFFFF, (__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      return (vec_t<T>)_mm512_maskz_cvtph_ps(0xFFFF, h);
    }
#endif
    using Tr = FormatTraits<F>;
    using S = detail::SourceBits<T>;
    using B = detail::RoundBits<F, T>;
    using U = typename B::U;
    using UV = uvec_t<T>;
    using V = vec_t<T>;
    if constexpr (B::kSameRange) {
      // Same exponent range as the source (bf16, tf32 from float): RNE on the bits alone, as
      // c10::BFloat16 does. A carry out of the largest binade gives exactly the inf pattern; only
      // NaN needs a select (its payload could carry into the sign).
      const UV u = (UV)x;
      UV r = u + (((B::kOne << (B::kShift - 1)) - 1) + ((u >> B::kShift) & 1));
      r &= ~((B::kOne << B::kShift) - 1);
      r = x != x ? ((u & B::kSignMask) | B::kQuietNan) : r;
      return (V)r;
    }
    constexpr U kOverflowBits = Tr::nan_on_overflow ? B::kQuietNan : B::kExpMask;

    const UV u = (UV)x;
    const UV sign = u & B::kSignMask;
    const UV a = u ^ sign;
    UV r = a;
    if constexpr (B::kShift > 0) {
      r = a + (((B::kOne << (B::kShift - 1)) - 1) + ((a >> B::kShift) & 1));
      r &= ~((B::kOne << B::kShift) - 1);
    }
    r = r > B::kMaxBits ? (UV{} + kOverflowBits) : r;
    if constexpr (Tr::emin > 1 - S::bias) {
      const V magic = (V)(UV{} + B::kMagicBits);
      const UV sub = (UV)(((V)a + magic) - magic);
      r = a < B::kMinNormalBits ? sub : r;
    }
    UV special = UV{} + B::kQuietNan;  // NaN stays NaN; e4m3 has no inf, so inf becomes NaN too
    if constexpr (!Tr::nan_on_overflow) special = a > B::kExpMask ? special : a;
    r = a >= B::kExpMask ? special : r;
    return (V)(r | sign);
  }
}

// Rounding toward zero or stochastically (see round_to_format_mode in kernels/round.hpp, whose
// lane-wise twin this is); `random` holds 32 random bits per lane (stochastic only).
template <Format F, class T>
FASTUDY_INLINE vec_t<T> round_vec_mode(vec_t<T> x, Rounding mode, uvec_t<T> random) {
  using Tr = FormatTraits<F>;
  using S = detail::SourceBits<T>;
  using B = detail::RoundBits<F, T>;
  using U = typename B::U;
  using UV = uvec_t<T>;
  using V = vec_t<T>;
  const bool stochastic = mode == Rounding::stochastic;
  const UV u = (UV)x;
  if constexpr (B::kSameRange) {
    // Same exponent range as the source (bf16, tf32 from float): on the bits alone, as round_vec
    // does. A carry out of the largest binade gives exactly inf (stochastic's overflow); truncation
    // never carries. Only NaN needs a select (truncating its payload could leave inf).
    UV r = u;
    if (stochastic) r += random >> (32 - B::kShift);
    r &= ~((B::kOne << B::kShift) - 1);
    return (V)(x != x ? ((u & B::kSignMask) | B::kQuietNan) : r);
  }
  const UV sign = u & B::kSignMask;
  const UV a = u ^ sign;
  UV r = a;
  if (stochastic) {
    if constexpr (B::kShift > 32) r += random << (B::kShift - 32);
    else if constexpr (B::kShift > 0) r += random >> (32 - B::kShift);
  }
  r &= ~((B::kOne << B::kShift) - 1);
  const U overflow = mode == Rounding::zero ? B::kMaxBits : (Tr::nan_on_overflow ? B::kQuietNan : B::kExpMask);
  r = r > B::kMaxBits ? (UV{} + overflow) : r;
  if constexpr (Tr::emin > 1 - S::bias) {
    const V magic = (V)(UV{} + B::kMagicBits), quantum = (V)(UV{} + B::quantum_bits());
    V v = (V)a;
    if (stochastic) v += quantum * (__builtin_convertvector(random, V) * T(0x1p-32));
    V t = (v + magic) - magic;
    t = t > v ? t - quantum : t;
    r = a < B::kMinNormalBits ? (UV)t : r;
  }
  UV special = UV{} + B::kQuietNan;
  if constexpr (!Tr::nan_on_overflow) special = a > B::kExpMask ? special : a;
  r = a >= B::kExpMask ? special : r;
  return (V)(r | sign);
}

}  // namespace
}  // namespace fastudy
