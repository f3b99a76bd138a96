// The CPU attention kernels (baseline and flash, forward and backward), written once over a vector
// width and compiled once per instruction set by attention_isa_*.cpp, which define
// FASTUDY_VEC_BYTES (16, 32 or 64), FASTUDY_ISA_FMA and FASTUDY_ISA_F16C, switch the target with
// `#pragma GCC target`, then include this file. Everything here has internal linkage (an anonymous
// namespace), so the per-ISA copies never meet at link time. Include kernels/detail/attention_deps.hpp
// before the pragma so the standard library stays compiled for the baseline target.
//
// B batch, H heads, N sequence, d head dim, Br/Bc the Q/KV block sizes (block_q/block_kv).
//
// Rounding: every step goes through a rounding object R (one per policy shape, chosen once per call
// in dispatch_rounding, the only place where runtime formats become template parameters). R::q(x),
// R::accum(x), ... take a scalar or a vector; an identity rounding compiles to nothing, so the fp32
// policy on float data runs the plain fp32 kernel. The rounding mode (nearest, zero, stochastic) is
// the policy's; stochastic draws its bits from one counter-based stream per head.
//
// The op decomposition. Each line below is one op of a framework-level re-implementation (one PyTorch
// call on tensors of the format): its output is rounded by the step named after it, values inside
// it by the in-op steps (accum, stats, softmax, division). Which of these roundings do anything is
// the reading's choice (kernels/attention.hpp): eager rounds op outputs and state to the format and
// keeps in-op values in fp32; mixed keeps state in fp32 too; pure rounds everything.
//   inputs      Q, K, V rounded to q, k, v on entry into per-head copies (dO and O to grad and o).
//   matmul      acc_0 = 0, acc_t = accum(acc_{t-1} + a_t b_t), in order t = 0..k-1 (the product is
//               fused into the add (FMA) where the instruction set has it, as GPU kernels do).
//   exp         a vectorised Cephes-style expf (about 1 ulp) for float, std::exp for double.
// Baseline (S materialised, one fused softmax, P.V):
//   S = s(Q K^T * scale)                                  matmul
//   P = softmax(S): m = stats(rowmax S), e = softmax(exp(softmax(S - m))), l = stats(sum e, every add),
//       P = p(division(e / l))                            one fused op; lse = stats(m + log l)
//   O = o(P V)                                            matmul
// FA-2 (q_outer; per Q block, per KV tile j; state m, l, O per row):
//   S = s(Q K_j^T * scale)                                matmul
//   m_new = stats_running(max(m, rowmax S))               running max
//   P = p(exp(exp_arg(S - m_new)))                        two ops
//   alpha = rescale(exp(exp_arg(m - m_new)))              two ops
//   l = stats_running(stats_running(alpha l) + stats_running(rowsum P))   rowsum: in-op stats
//   O = o_running(o_running(alpha O) + o_running(P V_j))  P V_j: matmul
//   end: O = o(division(O / l)), lse = stats_running(m + log l)
// FA-1 (kv_outer; Algorithm 1 of FlashAttention; per KV tile j, per Q block):
//   S = s(Q_i K_j^T * scale);  m~ = stats_running(rowmax S);  P~ = p(exp(exp_arg(S - m~)))
//   l~ = stats_running(rowsum P~)  (in-op stats);  m_new = stats_running(max(m, m~))
//   a = rescale(exp(exp_arg(m - m_new))),  b = rescale(exp(exp_arg(m~ - m_new)))
//   l_new = stats_running(stats_running(a l) + stats_running(b l~))
//   O = o_running(division(o_running(o_running(a l O) + o_running(b o_running(P~ V_j))) / l_new))
//   end: O = o(O), lse = stats_running(m + log l)
// When the running sum or O is exact in the container (stats_running / o_running at least as wide:
// mixed, as GPU kernels keep them in fp32 registers), FA-2 adds a tile's P and P.V straight into them
// (l = stats(stats(alpha l) + P_1 + P_2 ...), O = alpha O then accumulated by the P.V matmul), as
// FlashAttention-2's kernels do.
// Backward (both kinds: row by row over queries, FA-2 order for flash):
//   flash     P = p(exp(exp_arg(s(q k^T * scale) - lse))) recomputed from the saved lse,
//             D = stats_running(dO . O) (accum inside), dS = grad(P (dP - D)), dP = dO V^T (matmul)
//   baseline  P recomputed by the forward's softmax, D = accum-sum of P dP, dS = grad(P (dP - D))
//   dQ, dK, dV accumulated in accum and stored in grad.
// This models the flash backward *algorithm* run as framework ops, not autograd through the forward's
// loop (which a framework re-implementation would get if it did not write its own backward).
#pragma once

#include "kernels/detail/attention_deps.hpp"

#ifndef FASTUDY_VEC_BYTES
#error "define FASTUDY_VEC_BYTES before including kernels/detail/attention_impl.hpp"
#endif

namespace fastudy {
namespace {

#define FASTUDY_INLINE inline __attribute__((always_inline))

constexpr int kVecBytes = FASTUDY_VEC_BYTES;

template <class T>
struct VecOf {
  typedef T type __attribute__((vector_size(kVecBytes)));
};
template <class T>
using vec_t = typename VecOf<T>::type;
template <class T>
constexpr int kLanes = kVecBytes / static_cast<int>(sizeof(T));

template <class T>
struct UintOf;
template <>
struct UintOf<float> {
  using type = std::uint32_t;
};
template <>
struct UintOf<double> {
  using type = std::uint64_t;
};
template <class T>
using uvec_t = vec_t<typename UintOf<T>::type>;

template <class T>
FASTUDY_INLINE vec_t<T> vload(const T* p) {
  vec_t<T> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
FASTUDY_INLINE void vstore(T* p, vec_t<T> v) {
  __builtin_memcpy(p, &v, sizeof v);
}
// x in every lane (x - 0 is x for every x, -0 and NaN included: one broadcast instruction).
template <class T>
FASTUDY_INLINE vec_t<T> splat(T x) {
  return x - vec_t<T>{};
}
template <class V>
FASTUDY_INLINE V vmax(V a, V b) {
  return a > b ? a : b;
}

template <class T>
struct IsVec : std::false_type {};
template <>
struct IsVec<vec_t<float>> : std::true_type {};
template <>
struct IsVec<vec_t<double>> : std::true_type {};

// a * b + c, fused where the instruction set has FMA.
FASTUDY_INLINE float madd(float a, float b, float c) {
#if FASTUDY_ISA_FMA
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
FASTUDY_INLINE double madd(double a, double b, double c) {
#if FASTUDY_ISA_FMA
  return __builtin_fma(a, b, c);
#else
  return a * b + c;
#endif
}
template <class V, std::enable_if_t<IsVec<V>::value, int> = 0>
FASTUDY_INLINE V madd(V a, V b, V c) {
#if FASTUDY_ISA_FMA && FASTUDY_VEC_BYTES == 32
  if constexpr (std::is_same_v<V, vec_t<float>>) {
    return (V)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
  } else {
    return (V)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
  }
#elif FASTUDY_ISA_FMA && FASTUDY_VEC_BYTES == 64
  if constexpr (std::is_same_v<V, vec_t<float>>) {
    return (V)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
  } else {
    return (V)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
  }
#else
  return a * b + c;
#endif
}

// ---- rounding of whole vectors: the lane-wise twin of round_to_format (kernels/round.hpp) ----------
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
    for (int i = 0; i < kLanes<T>; ++i) idx[i] = static_cast<std::uint32_t>(offset + static_cast<std::uint32_t>(i) * stride);
    idx += counter;
    return hash_lanes(idx);
  }
  // Moves past n scalar draws (as n calls of next()).
  FASTUDY_INLINE void skip(std::uint32_t n) { counter += n; }
};

// x rounded to F in `mode`: scalars through round.hpp, vectors through round_vec / round_vec_mode.
template <Format F, class T, class X>
FASTUDY_INLINE X round_any(X x, Rounding mode, RandomStream& rng) {
  if constexpr (round_is_identity<F, T>()) {
    return x;
  } else if constexpr (IsVec<X>::value) {
    if (mode == Rounding::nearest) return round_vec<F, T>(x);
    return round_vec_mode<F, T>(x, mode, mode == Rounding::stochastic ? rng.next_vec<T>() : uvec_t<T>{});
  } else {
    if (mode == Rounding::nearest) return round_to_format<F>(x);
    if (mode == Rounding::zero) return round_to_format_mode<F, Rounding::zero>(x, 0);
    return round_to_format_mode<F, Rounding::stochastic>(x, rng.next());
  }
}

// x rounded to F lane by lane with exactly the results of kLanes scalar round_any calls on x[0],
// x[1], ... in order, when those calls would take the scalar draws offset, offset + stride, ... from
// the stream's position (stochastic); the stream does not move. Vector loops over values that the
// scalar code rounds one at a time use it, so the random bits stay those of the scalar code.
template <Format F, class T>
FASTUDY_INLINE vec_t<T> round_lanes(vec_t<T> x, Rounding mode, const RandomStream& rng, std::uint32_t offset,
                                    std::uint32_t stride) {
  if constexpr (round_is_identity<F, T>()) {
    return x;
  } else {
    if (mode == Rounding::nearest) {
      vec_t<T> r = round_vec<F, T>(x);
#if FASTUDY_ISA_F16C
      if constexpr (F == Format::fp16 && std::is_same_v<T, float>) {
        // vcvtps2ph keeps a NaN's payload; the scalar rounding gives the plain quiet NaN.
        using B = detail::RoundBits<F, T>;
        const uvec_t<T> u = (uvec_t<T>)x;
        r = x != x ? (vec_t<T>)((u & B::kSignMask) | B::kQuietNan) : r;
      }
#endif
      return r;
    }
    return round_vec_mode<F, T>(x, mode, mode == Rounding::stochastic ? rng.scalar_lanes<T>(offset, stride) : uvec_t<T>{});
  }
}

// The steps of a policy (PrecisionPolicy's members), for code that names a step as a parameter.
enum class StepId : std::uint8_t {
  q, k, v, s, p, o, grad, accum, stats, softmax, division, stats_running, rescale, o_running, exp_arg
};

// What every rounding object holds besides its formats: the mode and the random stream (mutable:
// kernels take the rounding object by const reference; each thread has its own).
struct RoundingState {
  Rounding mode = Rounding::nearest;
  // Flash's running sum / running O exact in the container (stats_running / o_running at least as
  // wide): they live in registers as in GPU kernels, and a tile's P and P.V are accumulated straight
  // into them. Otherwise they are stored between tiles, and a tile's row sum and P.V are ops of their
  // own whose rounded results are then added.
  bool exact_running_sum = false;
  bool exact_running_o = false;
  mutable RandomStream rng;
  // The stream of one head: call before the head's first rounding.
  void start_head(std::uint64_t seed, std::uint64_t global_head) const {
    if (mode == Rounding::stochastic) rng.seed(random_stream_key(seed, global_head));
  }
};

// Rounding object with compile-time formats, one per step class (PrecisionPolicy, kernels/attention.hpp):
// storage steps (q, k, v, s, p, o, grad) in S, in-op steps (accum, stats, softmax, division) in C,
// state steps (stats_running, rescale, o_running, exp_arg) in R. pure is <f, f, f>, eager <f, fp32, f>,
// mixed <f, fp32, fp32>.
template <class T, Format S, Format C, Format R>
struct StaticRounding : RoundingState {
  template <Format F, class X> FASTUDY_INLINE X round(X x) const { return round_any<F, T>(x, mode, rng); }
  template <class X> FASTUDY_INLINE X q(X x) const { return round<S>(x); }
  template <class X> FASTUDY_INLINE X k(X x) const { return round<S>(x); }
  template <class X> FASTUDY_INLINE X v(X x) const { return round<S>(x); }
  template <class X> FASTUDY_INLINE X s(X x) const { return round<S>(x); }
  template <class X> FASTUDY_INLINE X p(X x) const { return round<S>(x); }
  template <class X> FASTUDY_INLINE X o(X x) const { return round<S>(x); }
  template <class X> FASTUDY_INLINE X grad(X x) const { return round<S>(x); }
  template <class X> FASTUDY_INLINE X accum(X x) const { return round<C>(x); }
  template <class X> FASTUDY_INLINE X stats(X x) const { return round<C>(x); }
  template <class X> FASTUDY_INLINE X softmax(X x) const { return round<C>(x); }
  template <class X> FASTUDY_INLINE X division(X x) const { return round<C>(x); }
  template <class X> FASTUDY_INLINE X stats_running(X x) const { return round<R>(x); }
  template <class X> FASTUDY_INLINE X rescale(X x) const { return round<R>(x); }
  template <class X> FASTUDY_INLINE X o_running(X x) const { return round<R>(x); }
  template <class X> FASTUDY_INLINE X exp_arg(X x) const { return round<R>(x); }
  template <StepId St>
  static constexpr Format format_of() {
    if constexpr (St == StepId::q || St == StepId::k || St == StepId::v || St == StepId::s || St == StepId::p ||
                  St == StepId::o || St == StepId::grad) {
      return S;
    } else if constexpr (St == StepId::accum || St == StepId::stats || St == StepId::softmax ||
                         St == StepId::division) {
      return C;
    } else {
      return R;
    }
  }
  // Step St on a scalar (the same as q(x), k(x), ...).
  template <StepId St, class X> FASTUDY_INLINE X step(X x) const { return round<format_of<St>()>(x); }
  // Whether a scalar rounding of step St takes a random draw.
  template <StepId St> FASTUDY_INLINE bool draws() const {
    return mode == Rounding::stochastic && !round_is_identity<format_of<St>(), T>();
  }
  // Step St lane by lane, as kLanes scalar calls taking the draws offset + i * stride (round_lanes).
  template <StepId St>
  FASTUDY_INLINE vec_t<T> lanes(vec_t<T> x, std::uint32_t offset, std::uint32_t stride) const {
    return round_lanes<format_of<St>(), T>(x, mode, rng, offset, stride);
  }
};

// Rounding object for any custom policy: a runtime switch per value (slower, same results).
template <class T>
struct RuntimeRounding : RoundingState {
  PrecisionPolicy policy;
  explicit RuntimeRounding(const PrecisionPolicy& p) : policy(p) {}
  template <class X>
  X apply(Format f, X x) const {
    if constexpr (IsVec<X>::value) {
      const uvec_t<T> bits = mode == Rounding::stochastic ? rng.next_vec<T>() : uvec_t<T>{};
      for (int i = 0; i < kLanes<T>; ++i)
        x[i] = round_to(f, static_cast<T>(x[i]), mode, static_cast<std::uint32_t>(bits[i]));
      return x;
    } else {
      return round_to(f, x, mode, mode == Rounding::stochastic ? rng.next() : 0u);
    }
  }
  template <class X> X q(X x) const { return apply(policy.q, x); }
  template <class X> X k(X x) const { return apply(policy.k, x); }
  template <class X> X v(X x) const { return apply(policy.v, x); }
  template <class X> X s(X x) const { return apply(policy.s, x); }
  template <class X> X p(X x) const { return apply(policy.p, x); }
  template <class X> X o(X x) const { return apply(policy.o, x); }
  template <class X> X grad(X x) const { return apply(policy.grad, x); }
  template <class X> X accum(X x) const { return apply(policy.accum, x); }
  template <class X> X stats(X x) const { return apply(policy.stats, x); }
  template <class X> X softmax(X x) const { return apply(policy.softmax, x); }
  template <class X> X division(X x) const { return apply(policy.division, x); }
  template <class X> X stats_running(X x) const { return apply(policy.stats_running, x); }
  template <class X> X rescale(X x) const { return apply(policy.rescale, x); }
  template <class X> X o_running(X x) const { return apply(policy.o_running, x); }
  template <class X> X exp_arg(X x) const { return apply(policy.exp_arg, x); }
  template <StepId St>
  Format format_of() const {
    switch (St) {
      case StepId::q: return policy.q;
      case StepId::k: return policy.k;
      case StepId::v: return policy.v;
      case StepId::s: return policy.s;
      case StepId::p: return policy.p;
      case StepId::o: return policy.o;
      case StepId::grad: return policy.grad;
      case StepId::accum: return policy.accum;
      case StepId::stats: return policy.stats;
      case StepId::softmax: return policy.softmax;
      case StepId::division: return policy.division;
      case StepId::stats_running: return policy.stats_running;
      case StepId::rescale: return policy.rescale;
      case StepId::o_running: return policy.o_running;
      case StepId::exp_arg: return policy.exp_arg;
    }
    return policy.q;
  }
  template <StepId St, class X> X step(X x) const { return apply(format_of<St>(), x); }
  // Every rounding takes a draw in stochastic mode here (apply), whatever the format.
  template <StepId St> bool draws() const { return mode == Rounding::stochastic; }
  template <StepId St>
  vec_t<T> lanes(vec_t<T> x, std::uint32_t offset, std::uint32_t stride) const {
    const uvec_t<T> bits = mode == Rounding::stochastic ? rng.scalar_lanes<T>(offset, stride) : uvec_t<T>{};
    const Format f = format_of<St>();
    for (int i = 0; i < kLanes<T>; ++i)
      x[i] = round_to(f, static_cast<T>(x[i]), mode, static_cast<std::uint32_t>(bits[i]));
    return x;
  }
};

// ---- exp --------------------------------------------------------------------------------------
// float: Cephes expf (range reduction by ln 2 in two parts, degree-6 polynomial in Horner form with
// fused multiply-adds where the CPU has them), about 1 ulp; exp(x) = 0 below -87.3 (the fp32
// subnormal range is flushed; masked scores are -inf and give exactly 0), inf above 88.7, NaN stays.
FASTUDY_INLINE vec_t<float> vexp(vec_t<float> x) {
  using V = vec_t<float>;
  using IV = vec_t<std::int32_t>;
  const V xc = x < 88.3762626647949f ? x : (V{} + 88.3762626647949f);
  const V magic = V{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (ties to even)
  const V t = madd(xc, V{} + 1.44269504088896341f, magic);
  const V n = t - magic;
  V r = madd(n, V{} - 0.693359375f, xc);
  r = madd(n, V{} + 2.12194440e-4f, r);
  V p = madd(V{} + 1.9875691500e-4f, r, V{} + 1.3981999507e-3f);
  p = madd(p, r, V{} + 8.3334519073e-3f);
  p = madd(p, r, V{} + 4.1665795894e-2f);
  p = madd(p, r, V{} + 1.6666665459e-1f);
  p = madd(p, r, V{} + 5.0000001201e-1f);
  const V y = madd(p, r * r, r + 1.0f);
  const IV e = ((IV)t - (IV)magic + 127) << 23;  // 2^n as a float bit pattern
  V res = y * (V)e;
  res = x < -87.3365447505531f ? V{} : res;
  res = x > 88.7228391116729f ? (V{} + __builtin_inff()) : res;
  return x != x ? x : res;
}
FASTUDY_INLINE vec_t<double> vexp(vec_t<double> x) {
  for (int i = 0; i < kLanes<double>; ++i) x[i] = std::exp(x[i]);
  return x;
}
FASTUDY_INLINE float sexp(float x) { return vexp(splat(x))[0]; }
FASTUDY_INLINE double sexp(double x) { return std::exp(x); }

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// `rounded` (x rounded by some step), except where x is the -inf that marks "no key seen yet" or a
// masked score: a sentinel, not a value (fp8 e4m3 has no inf and would turn it into NaN).
template <class V>
FASTUDY_INLINE V keep_neg_inf(V x, V rounded) {
  if constexpr (IsVec<V>::value) {
    return x == kNegInf<std::remove_reference_t<decltype(x[0])>> ? x : rounded;
  } else {
    return x == kNegInf<V> ? x : rounded;
  }
}
// A row max rounded to stats (inside one op) or stats_running (flash's running max), -inf kept.
template <class R, class V>
FASTUDY_INLINE V round_max(const R& rd, V m) {
  return keep_neg_inf(m, rd.stats(m));
}
template <class R, class V>
FASTUDY_INLINE V round_running_max(const R& rd, V m) {
  return keep_neg_inf(m, rd.stats_running(m));
}
// The argument x of one of flash's exps, rounded to exp_arg (-inf kept: exp(-inf) = 0).
template <class R, class V>
FASTUDY_INLINE V round_exp_arg(const R& rd, V x) {
  return keep_neg_inf(x, rd.exp_arg(x));
}

inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// ---- tile kernels ---------------------------------------------------------------------------------
// Register blocks: kBlockRows rows x kBlockVecs vectors of accumulators (16 with 32 zmm registers,
// 8 with 16 ymm/xmm registers): enough independent FMA chains to cover the FMA latency on two ports.
constexpr int kBlockRows = 4;
constexpr int kBlockVecs = kVecBytes == 64 ? 4 : 2;

// A CB x RV block of the transposed score tile: out[cb * ldst + rv * L] for key rows cb < CB and
// query vectors rv < RV, each lane the dot product over t = 0..d-1 in order.
template <int CB, int RV, bool kAsScore, class T, class R>
FASTUDY_INLINE void score_block(const R& rd, const T* k, std::int64_t d, const T* qt, std::int64_t ldq, T scale,
                                T* out, std::int64_t ldst) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  V acc[CB][RV];
#pragma GCC unroll 16
  for (int cb = 0; cb < CB; ++cb)
#pragma GCC unroll 16
    for (int rv = 0; rv < RV; ++rv) acc[cb][rv] = V{};
  for (std::int64_t t = 0; t < d; ++t) {
    V qv[RV];
#pragma GCC unroll 16
    for (int rv = 0; rv < RV; ++rv) qv[rv] = vload(qt + t * ldq + rv * L);
#pragma GCC unroll 16
    for (int cb = 0; cb < CB; ++cb) {
      const V b = splat(k[cb * d + t]);
#pragma GCC unroll 16
      for (int rv = 0; rv < RV; ++rv) acc[cb][rv] = rd.accum(madd(b, qv[rv], acc[cb][rv]));
    }
  }
#pragma GCC unroll 16
  for (int cb = 0; cb < CB; ++cb)
#pragma GCC unroll 16
    for (int rv = 0; rv < RV; ++rv) {
      if constexpr (kAsScore) vstore(out + cb * ldst + rv * L, rd.s(acc[cb][rv] * scale));
      else vstore(out + cb * ldst + rv * L, acc[cb][rv]);
    }
}

// St[c * ldst + r] = s(scale * (K_c . Q_r)) for c < bc and r < brp (a multiple of the lane count):
// the transposed score tile. K is row-major [bc, d]; Qt is Q transposed, Qt[t * ldq + r]. With
// kAsScore false, the plain dot products K_c . Q_r (accum, no scale, no s), as the backward's dP.
template <bool kAsScore = true, class T, class R>
void score_tile(const R& rd, const T* k, std::int64_t d, const T* qt, std::int64_t ldq, std::int64_t bc,
                std::int64_t brp, T scale, T* st, std::int64_t ldst) {
  constexpr int L = kLanes<T>;
  constexpr int CB = kBlockRows, RV = kBlockVecs;
  std::int64_t c = 0;
  for (; c + CB <= bc; c += CB) {
    std::int64_t r = 0;
    for (; r + RV * L <= brp; r += RV * L)
      score_block<CB, RV, kAsScore>(rd, k + c * d, d, qt + r, ldq, scale, st + c * ldst + r, ldst);
    for (; r < brp; r += L) score_block<CB, 1, kAsScore>(rd, k + c * d, d, qt + r, ldq, scale, st + c * ldst + r, ldst);
  }
  for (; c < bc; ++c) {
    std::int64_t r = 0;
    for (; r + RV * L <= brp; r += RV * L)
      score_block<1, RV, kAsScore>(rd, k + c * d, d, qt + r, ldq, scale, st + c * ldst + r, ldst);
    for (; r < brp; r += L) score_block<1, 1, kAsScore>(rd, k + c * d, d, qt + r, ldq, scale, st + c * ldst + r, ldst);
  }
}

// An RB x TV block of Out += P.V: rows rb < RB, head-dim vectors tv < TV, the sum over c in order.
// The factor of row rb and term c is pt[c * ldp + rb], or pt[rb * ldp + c] with kRowsOfP.
template <int RB, int TV, bool kRowsOfP, class T, class R>
FASTUDY_INLINE void pv_block(const R& rd, const T* pt, std::int64_t ldp, const T* vm, std::int64_t dp,
                             std::int64_t bc, T* out, std::int64_t ldo) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  V acc[RB][TV];
#pragma GCC unroll 16
  for (int rb = 0; rb < RB; ++rb)
#pragma GCC unroll 16
    for (int tv = 0; tv < TV; ++tv) acc[rb][tv] = vload(out + rb * ldo + tv * L);
  for (std::int64_t c = 0; c < bc; ++c) {
    V vv[TV];
#pragma GCC unroll 16
    for (int tv = 0; tv < TV; ++tv) vv[tv] = vload(vm + c * dp + tv * L);
#pragma GCC unroll 16
    for (int rb = 0; rb < RB; ++rb) {
      const V b = splat(kRowsOfP ? pt[rb * ldp + c] : pt[c * ldp + rb]);
#pragma GCC unroll 16
      for (int tv = 0; tv < TV; ++tv) acc[rb][tv] = rd.accum(madd(b, vv[tv], acc[rb][tv]));
    }
  }
#pragma GCC unroll 16
  for (int rb = 0; rb < RB; ++rb)
#pragma GCC unroll 16
    for (int tv = 0; tv < TV; ++tv) vstore(out + rb * ldo + tv * L, acc[rb][tv]);
}

// Out[r * ldo + t] = accum-sequence of Out[r][t] + sum_c Pt[c * ldp + r] * Vm[c * dp + t], for r < br
// and t < dp (a multiple of the lane count), c in order. With kRowsOfP the factors are read as
// P[r * ldp + c] (the same products in the same order: no transposed copy needed).
template <bool kRowsOfP = false, class T, class R>
void pv_tile(const R& rd, const T* pt, std::int64_t ldp, const T* vm, std::int64_t dp, std::int64_t bc,
             std::int64_t br, T* out, std::int64_t ldo) {
  constexpr int L = kLanes<T>;
  constexpr int RB = kBlockRows, TV = kBlockVecs;
  const std::int64_t row_step = kRowsOfP ? ldp : 1;
  std::int64_t r = 0;
  for (; r + RB <= br; r += RB) {
    const T* a = pt + r * row_step;
    std::int64_t t = 0;
    for (; t + TV * L <= dp; t += TV * L) pv_block<RB, TV, kRowsOfP>(rd, a, ldp, vm + t, dp, bc, out + r * ldo + t, ldo);
    for (; t < dp; t += L) pv_block<RB, 1, kRowsOfP>(rd, a, ldp, vm + t, dp, bc, out + r * ldo + t, ldo);
  }
  for (; r < br; ++r) {
    const T* a = pt + r * row_step;
    std::int64_t t = 0;
    for (; t + TV * L <= dp; t += TV * L) pv_block<1, TV, kRowsOfP>(rd, a, ldp, vm + t, dp, bc, out + r * ldo + t, ldo);
    for (; t < dp; t += L) pv_block<1, 1, kRowsOfP>(rd, a, ldp, vm + t, dp, bc, out + r * ldo + t, ldo);
  }
}

// Sets St[c][r] = -inf where key j0 + c comes after query i0 + r (causal masking).
template <class T>
void mask_tile(T* st, std::int64_t ldst, std::int64_t bc, std::int64_t brp, std::int64_t j0, std::int64_t i0) {
  for (std::int64_t c = 0; c < bc; ++c) {
    const std::int64_t first_masked = std::max<std::int64_t>(0, j0 + c - i0);  // rows r < j0 + c - i0
    for (std::int64_t r = 0; r < std::min(first_masked, brp); ++r) st[c * ldst + r] = kNegInf<T>;
  }
}

// ---- per-head problem and workspace ------------------------------------------------------------

template <class T>
struct Head {
  std::int64_t n, d, dp, np;  // dp: d rounded up to the lanes; np: N plus one vector of padding
  T scale;
  bool causal;
  std::int64_t br, bc;  // block sizes clipped to N
};

template <class T>
struct Workspace {
  std::vector<T> qt, k, v, st, o, m, l, alpha, pv, tmp;
  std::vector<T> b, al, lnew, mt;  // kv_outer only: per-row factors of the current tile
};

template <class T>
Head<T> make_head(const AttentionShape& shape, const AttentionParams& params) {
  Head<T> h;
  h.n = shape.seq_len;
  h.d = shape.head_dim;
  h.dp = round_up(h.d, kLanes<T>);
  h.br = std::min<std::int64_t>(params.block_q, h.n);
  h.bc = std::min<std::int64_t>(params.block_kv, h.n);
  h.np = round_up(h.n, kLanes<T>) + round_up(h.br, kLanes<T>);
  const double scale = shape.scale != 0.0 ? shape.scale : 1.0 / std::sqrt(static_cast<double>(h.d));
  h.scale = static_cast<T>(scale);
  h.causal = shape.causal;
  return h;
}

// dst[i] = step St of src[i] for i < n, with the results and random draws of the scalar loop
// `for i: dst[i] = rd.step<St>(src[i])` (whole vectors lane by lane, the tail one by one).
template <StepId St, class T, class R>
void round_run(const R& rd, const T* src, T* dst, std::int64_t n) {
  constexpr int L = kLanes<T>;
  const std::uint32_t draws = rd.template draws<St>() ? 1 : 0;
  std::int64_t i = 0;
  for (; i + L <= n; i += L) {
    vstore(dst + i, rd.template lanes<St>(vload(src + i), 0, draws));
    rd.rng.skip(draws * L);
  }
  for (; i < n; ++i) dst[i] = rd.template step<St>(src[i]);
}

// dst[t * ldd + i] = src[i * lds + t] for i < rows, t < cols: a transpose in blocks of 8 x 8.
template <class T>
void transpose(const T* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, T* dst, std::int64_t ldd) {
  constexpr std::int64_t kB = 8;
  for (std::int64_t i0 = 0; i0 < rows; i0 += kB) {
    const std::int64_t i1 = std::min(rows, i0 + kB);
    for (std::int64_t t0 = 0; t0 < cols; t0 += kB) {
      const std::int64_t t1 = std::min(cols, t0 + kB);
      for (std::int64_t t = t0; t < t1; ++t)
        for (std::int64_t i = i0; i < i1; ++i) dst[t * ldd + i] = src[i * lds + t];
    }
  }
}

// Rounded per-head copies: Qt = q(Q)^T [d, np] (zero padded), K = k(K) [N, d], V = v(V) [N, dp];
// Q, K and V are rounded in this order, each in its memory order (Q through a buffer of 64 rows).
template <class T, class R>
void load_inputs(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, Workspace<T>& ws) {
  constexpr std::int64_t kRows = 64;
  ws.tmp.resize(std::min(h.n, kRows) * h.d);
  ws.qt.assign(h.d * h.np, T(0));
  for (std::int64_t i0 = 0; i0 < h.n; i0 += kRows) {
    const std::int64_t rows = std::min(kRows, h.n - i0);
    round_run<StepId::q>(rd, q + i0 * h.d, ws.tmp.data(), rows * h.d);
    transpose(ws.tmp.data(), h.d, rows, h.d, ws.qt.data() + i0, h.np);
  }
  ws.k.resize(h.n * h.d);
  round_run<StepId::k>(rd, k, ws.k.data(), h.n * h.d);
  ws.v.resize(h.n * h.dp);
  for (std::int64_t i = 0; i < h.n; ++i) {
    round_run<StepId::v>(rd, v + i * h.d, ws.v.data() + i * h.dp, h.d);
    std::fill(ws.v.data() + i * h.dp + h.d, ws.v.data() + (i + 1) * h.dp, T(0));
  }
}

// out[t] = o(division(acc[t] / l)) for t < d, then the row's lse = rounded lse_step(m + log l) when
// lse is not null: the results and draws of that scalar loop (lanes take the draws of both steps,
// interleaved as the scalar calls take them).
template <StepId LseStep, class T, class R>
FASTUDY_INLINE void store_row(const R& rd, const T* acc, std::int64_t d, T l, bool divide, T m, T* out, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::uint32_t d_div = divide && rd.template draws<StepId::division>() ? 1 : 0;
  const std::uint32_t stride = d_div + (rd.template draws<StepId::o>() ? 1 : 0);
  const V lv = splat(l);
  std::int64_t t = 0;
  for (; t + L <= d; t += L) {
    V x = vload(acc + t);
    if (divide) x = rd.template lanes<StepId::division>(x / lv, 0, stride);
    vstore(out + t, rd.template lanes<StepId::o>(x, d_div, stride));
    rd.rng.skip(stride * L);
  }
  for (; t < d; ++t) out[t] = divide ? rd.o(rd.division(acc[t] / l)) : rd.o(acc[t]);
  if (lse) *lse = rd.template step<LseStep>(m + std::log(l));
}

// ---- flash forward, Q-outer (FlashAttention-2): one final normalisation -------------------------
template <class T, class R>
void flash_forward_q_outer(const R& rd, const Head<T>& h, Workspace<T>& ws, T* o, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::int64_t brp_max = round_up(h.br, L);
  ws.st.resize(h.bc * brp_max);
  ws.o.resize(h.br * h.dp);
  ws.m.resize(brp_max);
  ws.l.resize(brp_max);
  ws.alpha.resize(brp_max);
  ws.pv.resize(h.br * h.dp);
  for (std::int64_t i0 = 0; i0 < h.n; i0 += h.br) {
    const std::int64_t br = std::min(h.br, h.n - i0), brp = round_up(br, L);
    std::fill(ws.m.begin(), ws.m.end(), kNegInf<T>);
    std::fill(ws.l.begin(), ws.l.end(), T(0));
    std::fill(ws.o.begin(), ws.o.end(), T(0));
    const std::int64_t j_end = h.causal ? std::min(h.n, i0 + br) : h.n;
    for (std::int64_t j0 = 0; j0 < j_end; j0 += h.bc) {
      const std::int64_t bc = std::min(h.bc, h.n - j0);
      T* st = ws.st.data();
      score_tile(rd, ws.k.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.np, bc, brp, h.scale, st, brp);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(st, brp, bc, brp, j0, i0);
      for (std::int64_t r = 0; r < brp; r += L) {
        V mt = splat(kNegInf<T>);
        for (std::int64_t c = 0; c < bc; ++c) mt = vmax(mt, vload(st + c * brp + r));
        const V m_old = vload(ws.m.data() + r);
        const V m_new = round_running_max(rd, vmax(m_old, mt));
        // Lanes with no score yet (m_new = -inf) subtract 0 instead, to keep exp(-inf) = 0, not NaN.
        const V m_safe = m_new == kNegInf<T> ? V{} : m_new;
        const V alpha = rd.rescale(vexp(round_exp_arg(rd, m_old - m_safe)));
        V lsum;
        if (rd.exact_running_sum) {
          // The running sum in registers (GPU kernels): the tile's P added straight into it.
          lsum = rd.stats(alpha * vload(ws.l.data() + r));
          for (std::int64_t c = 0; c < bc; ++c) {
            const V p = rd.p(vexp(round_exp_arg(rd, vload(st + c * brp + r) - m_safe)));
            vstore(st + c * brp + r, p);
            lsum = rd.stats(lsum + p);
          }
        } else {
          // The running sum stored between tiles: the tile's row sum is an op of its own.
          V lt{};
          for (std::int64_t c = 0; c < bc; ++c) {
            const V p = rd.p(vexp(round_exp_arg(rd, vload(st + c * brp + r) - m_safe)));
            vstore(st + c * brp + r, p);
            lt = rd.stats(lt + p);
          }
          lsum = rd.stats_running(rd.stats_running(alpha * vload(ws.l.data() + r)) + rd.stats_running(lt));
        }
        vstore(ws.l.data() + r, lsum);
        vstore(ws.m.data() + r, m_new);
        vstore(ws.alpha.data() + r, alpha);
      }
      if (j0 > 0) {
        for (std::int64_t r = 0; r < br; ++r) {
          const V a = splat(ws.alpha[r]);
          T* orow = ws.o.data() + r * h.dp;
          for (std::int64_t t = 0; t < h.dp; t += L) vstore(orow + t, rd.o_running(a * vload(orow + t)));
        }
      }
      if (rd.exact_running_o) {
        // The running O in registers (GPU kernels): P.V accumulated straight into it.
        pv_tile(rd, st, brp, ws.v.data() + j0 * h.dp, h.dp, bc, br, ws.o.data(), h.dp);
      } else {
        // The running O stored between tiles: P.V is a matmul of its own, then added.
        std::fill(ws.pv.begin(), ws.pv.begin() + br * h.dp, T(0));
        pv_tile(rd, st, brp, ws.v.data() + j0 * h.dp, h.dp, bc, br, ws.pv.data(), h.dp);
        for (std::int64_t i = 0; i < br * h.dp; i += L)
          vstore(ws.o.data() + i, rd.o_running(vload(ws.o.data() + i) + rd.o_running(vload(ws.pv.data() + i))));
      }
    }
    for (std::int64_t r = 0; r < br; ++r) {
      store_row<StepId::stats_running>(rd, ws.o.data() + r * h.dp, h.d, ws.l[r], true, ws.m[r], o + (i0 + r) * h.d,
                                       lse ? lse + i0 + r : nullptr);
    }
  }
}

// ---- flash forward, KV-outer (FlashAttention-1): O re-normalised after every tile --------------
// Per tile and row: m~ = rowmax(S), P~ = p(exp(S - m~)), l~ = rowsum(P~), m_new = max(m, m~),
// a = exp(m - m_new), b = exp(m~ - m_new), l_new = a l + b l~,
// O = (a l O + b P~V) / l_new  (FA-1 Algorithm 1, line 12).
template <class T, class R>
void flash_forward_kv_outer(const R& rd, const Head<T>& h, Workspace<T>& ws, T* o, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::int64_t brp_max = round_up(h.br, L);
  ws.st.resize(h.bc * brp_max);
  ws.o.assign(h.n * h.dp, T(0));
  ws.m.assign(h.n, kNegInf<T>);
  ws.l.assign(h.n, T(0));
  ws.pv.resize(h.br * h.dp);
  ws.b.resize(brp_max);     // b = exp(m~ - m_new)
  ws.al.resize(brp_max);    // a * l, rounded to stats
  ws.lnew.resize(brp_max);  // l_new
  ws.mt.resize(brp_max);    // m~ (-inf: the row sees no key of this tile)
  std::vector<T> m_blk(brp_max), l_blk(brp_max);
  for (std::int64_t j0 = 0; j0 < h.n; j0 += h.bc) {
    const std::int64_t bc = std::min(h.bc, h.n - j0);
    for (std::int64_t i0 = 0; i0 < h.n; i0 += h.br) {
      const std::int64_t br = std::min(h.br, h.n - i0), brp = round_up(br, L);
      if (h.causal && i0 + br - 1 < j0) continue;  // every row of the block precedes every key
      T* st = ws.st.data();
      score_tile(rd, ws.k.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.np, bc, brp, h.scale, st, brp);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(st, brp, bc, brp, j0, i0);
      std::fill(m_blk.begin(), m_blk.end(), kNegInf<T>);
      std::fill(l_blk.begin(), l_blk.end(), T(0));
      std::copy(ws.m.begin() + i0, ws.m.begin() + i0 + br, m_blk.begin());
      std::copy(ws.l.begin() + i0, ws.l.begin() + i0 + br, l_blk.begin());
      for (std::int64_t r = 0; r < brp; r += L) {
        V mt = splat(kNegInf<T>);
        for (std::int64_t c = 0; c < bc; ++c) mt = vmax(mt, vload(st + c * brp + r));
        mt = round_running_max(rd, mt);
        const V mt_safe = mt == kNegInf<T> ? V{} : mt;
        V lt{};
        for (std::int64_t c = 0; c < bc; ++c) {
          const V p = rd.p(vexp(round_exp_arg(rd, vload(st + c * brp + r) - mt_safe)));
          vstore(st + c * brp + r, p);
          lt = rd.stats(lt + p);
        }
        const V m_old = vload(m_blk.data() + r), l_old = vload(l_blk.data() + r);
        const V m_new = round_running_max(rd, vmax(m_old, mt));
        const V m_new_safe = m_new == kNegInf<T> ? V{} : m_new;
        const V a = rd.rescale(vexp(round_exp_arg(rd, m_old - m_new_safe)));
        const V b = rd.rescale(vexp(round_exp_arg(rd, mt - m_new_safe)));
        const V al = rd.stats_running(a * l_old);
        const V l_new = rd.stats_running(al + rd.stats_running(b * rd.stats_running(lt)));
        vstore(ws.b.data() + r, b);
        vstore(ws.al.data() + r, al);
        vstore(ws.lnew.data() + r, l_new);
        vstore(ws.mt.data() + r, mt);
        vstore(m_blk.data() + r, m_new);
      }
      std::fill(ws.pv.begin(), ws.pv.end(), T(0));
      pv_tile(rd, st, brp, ws.v.data() + j0 * h.dp, h.dp, bc, br, ws.pv.data(), h.dp);
      for (std::int64_t r = 0; r < br; ++r) {
        if (ws.mt[r] == kNegInf<T>) continue;  // the row sees no key of this tile: nothing to update
        const V al = splat(ws.al[r]), b = splat(ws.b[r]), ln = splat(ws.lnew[r]);
        T* orow = ws.o.data() + (i0 + r) * h.dp;
        const T* pvrow = ws.pv.data() + r * h.dp;
        for (std::int64_t t = 0; t < h.dp; t += L) {
          const V num =
              rd.o_running(rd.o_running(al * vload(orow + t)) + rd.o_running(b * rd.o_running(vload(pvrow + t))));
          vstore(orow + t, rd.o_running(rd.division(num / ln)));
        }
        ws.m[i0 + r] = m_blk[r];
        ws.l[i0 + r] = ws.lnew[r];
      }
    }
  }
  for (std::int64_t i = 0; i < h.n; ++i) {
    store_row<StepId::stats_running>(rd, ws.o.data() + i * h.dp, h.d, ws.l[i], false, ws.m[i], o + i * h.d,
                                     lse ? lse + i : nullptr);
  }
}

// ---- baseline forward: S materialised [N, N], softmax (P normalised, rounded to p), then P.V -----
template <class T, class R>
void baseline_forward(const R& rd, const Head<T>& h, Workspace<T>& ws, T* o, T* lse) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::int64_t np = round_up(h.n, L);
  ws.st.resize(h.n * np);
  T* st = ws.st.data();  // St[j][i]: S transposed, so each softmax row is a lane across j
  score_tile(rd, ws.k.data(), h.d, ws.qt.data(), h.np, h.n, np, h.scale, st, np);
  if (h.causal) mask_tile(st, np, h.n, np, std::int64_t(0), std::int64_t(0));
  ws.m.resize(np);
  ws.l.resize(np);
  for (std::int64_t r = 0; r < np; r += L) {
    V m = splat(kNegInf<T>);
    for (std::int64_t c = 0; c < h.n; ++c) m = vmax(m, vload(st + c * np + r));
    m = round_max(rd, m);
    V l{};
    for (std::int64_t c = 0; c < h.n; ++c) {
      const V x = vload(st + c * np + r) - m;
      const V e = rd.softmax(vexp(keep_neg_inf(x, rd.softmax(x))));
      vstore(st + c * np + r, e);
      l = rd.stats(l + e);
    }
    for (std::int64_t c = 0; c < h.n; ++c) vstore(st + c * np + r, rd.p(rd.division(vload(st + c * np + r) / l)));
    vstore(ws.m.data() + r, m);
    vstore(ws.l.data() + r, l);
  }
  ws.o.assign(h.n * h.dp, T(0));
  pv_tile(rd, st, np, ws.v.data(), h.dp, h.n, h.n, ws.o.data(), h.dp);
  for (std::int64_t i = 0; i < h.n; ++i) {
    store_row<StepId::stats>(rd, ws.o.data() + i * h.dp, h.d, ws.l[i], false, ws.m[i], o + i * h.d,
                             lse ? lse + i : nullptr);
  }
}

// ---- backward -------------------------------------------------------------------------------------
// Flash: FA-2 order (outer KV tiles, inner Q blocks), on tiles with the forward's register-blocked
// products: S^T and dP^T by score_tile, P = p(exp(S - lse)) from the saved lse, D_i = dO_i . O_i,
// dS = grad(P (dP - D)), then dV_j += P^T dO_i, dK_j += dS^T Q_i, dQ_i += dS K_j by pv_tile. Every
// gradient element accumulates the same products in the same order as a row-by-row loop over queries
// i (dV, dK: i ascending; dQ: keys j ascending), masked entries adding P = 0 exactly.
// Baseline: row by row over the queries i, vectorised over the keys j (with K and V transposed) and
// over the head dim t; P recomputed in full from q and k as in the forward pass, materialised
// [N, N], D_i = sum_j P_ij dP_ij (the textbook softmax backward).
template <class T>
struct BackwardWorkspace {
  std::vector<T> q, k, dout, kt, vt, dq, dk, dv, dd, lse, p, ds, row;
  std::vector<T> qt, dot, kr, vr;  // flash: Q^T, dO^T [d, np]; K, V [N, d]
};

// Leading dimension of K^T and V^T in the backward pass: a KV tile starting anywhere reads whole
// vectors, up to round_up(Bc) keys past its start.
template <class T>
std::int64_t backward_ld(const Head<T>& h) {
  return round_up(h.n, kLanes<T>) + round_up(h.bc, kLanes<T>);
}

template <class T, class R>
void load_backward_inputs(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, const T* dout,
                          BackwardWorkspace<T>& ws) {
  const std::int64_t np = backward_ld(h);
  ws.q.assign(h.n * h.dp, T(0));
  ws.k.assign(h.n * h.dp, T(0));
  ws.dout.assign(h.n * h.dp, T(0));
  ws.kt.assign(h.d * np, T(0));
  ws.vt.assign(h.d * np, T(0));
  // Element by element, q, k, v then grad (the scalar order of the draws): whole vectors of a row
  // lane by lane, each step's lanes taking its draws of the interleaved sequence.
  constexpr int L = kLanes<T>;
  const std::uint32_t o_k = rd.template draws<StepId::q>() ? 1 : 0;
  const std::uint32_t o_v = o_k + (rd.template draws<StepId::k>() ? 1 : 0);
  const std::uint32_t o_g = o_v + (rd.template draws<StepId::v>() ? 1 : 0);
  const std::uint32_t stride = o_g + (rd.template draws<StepId::grad>() ? 1 : 0);
  ws.row.resize(h.n * h.dp);  // V rounded, [N, dp]
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t a = i * h.d, b = i * h.dp;
    std::int64_t t = 0;
    for (; t + L <= h.d; t += L) {
      vstore(ws.q.data() + b + t, rd.template lanes<StepId::q>(vload(q + a + t), 0, stride));
      vstore(ws.k.data() + b + t, rd.template lanes<StepId::k>(vload(k + a + t), o_k, stride));
      vstore(ws.row.data() + b + t, rd.template lanes<StepId::v>(vload(v + a + t), o_v, stride));
      vstore(ws.dout.data() + b + t, rd.template lanes<StepId::grad>(vload(dout + a + t), o_g, stride));
      rd.rng.skip(stride * L);
    }
    for (; t < h.d; ++t) {
      ws.q[b + t] = rd.q(q[a + t]);
      ws.k[b + t] = rd.k(k[a + t]);
      ws.row[b + t] = rd.v(v[a + t]);
      ws.dout[b + t] = rd.grad(dout[a + t]);
    }
  }
  transpose(ws.k.data(), h.dp, h.n, h.d, ws.kt.data(), np);
  transpose(ws.row.data(), h.dp, h.n, h.d, ws.vt.data(), np);
  ws.dq.assign(h.n * h.dp, T(0));
  ws.dk.assign(h.n * h.dp, T(0));
  ws.dv.assign(h.n * h.dp, T(0));
}

// row[j] = accum-sequence over t of a[t] * bt[t * ld + j0 + j], for j < bcp (lanes).
template <class T, class R>
FASTUDY_INLINE void row_dot(const R& rd, const T* a, const T* bt, std::int64_t ld, std::int64_t d,
                            std::int64_t j0, std::int64_t bcp, T* row) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  for (std::int64_t j = 0; j < bcp; j += L) {
    V acc{};
    for (std::int64_t t = 0; t < d; ++t) acc = rd.accum(madd(splat(a[t]), vload(bt + t * ld + j0 + j), acc));
    vstore(row + j, acc);
  }
}

// y[t] = accum(y[t] + a * x[t]) for t < dp.
template <class T, class R>
FASTUDY_INLINE void axpy(const R& rd, T a, const T* x, T* y, std::int64_t dp) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const V av = splat(a);
  for (std::int64_t t = 0; t < dp; t += L) vstore(y + t, rd.accum(madd(av, vload(x + t), vload(y + t))));
}

template <class T, class R>
void store_gradients(const R& rd, const Head<T>& h, BackwardWorkspace<T>& ws, T* dq, T* dk, T* dv) {
  // Element by element dQ, dK then dV (the scalar order of the draws), whole vectors lane by lane.
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  const std::uint32_t stride = rd.template draws<StepId::grad>() ? 3 : 0, one = stride / 3;
  const V scale = splat(h.scale);
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t a = i * h.d, b = i * h.dp;
    std::int64_t t = 0;
    for (; t + L <= h.d; t += L) {
      vstore(dq + a + t, rd.template lanes<StepId::grad>(vload(ws.dq.data() + b + t) * scale, 0, stride));
      vstore(dk + a + t, rd.template lanes<StepId::grad>(vload(ws.dk.data() + b + t) * scale, one, stride));
      vstore(dv + a + t, rd.template lanes<StepId::grad>(vload(ws.dv.data() + b + t), 2 * one, stride));
      rd.rng.skip(stride * L);
    }
    for (; t < h.d; ++t) {
      dq[a + t] = rd.grad(ws.dq[b + t] * h.scale);
      dk[a + t] = rd.grad(ws.dk[b + t] * h.scale);
      dv[a + t] = rd.grad(ws.dv[b + t]);
    }
  }
}

template <class T, class R>
void flash_backward(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, const T* o, const T* lse,
                    const T* dout, BackwardWorkspace<T>& ws, T* dq, T* dk, T* dv) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  load_backward_inputs(rd, h, q, k, v, dout, ws);
  const std::int64_t ld = backward_ld(h);
  // The tiles' layouts of the rounded inputs: Q^T and dO^T [d, np] (zero padded), K and V [N, d].
  ws.qt.assign(h.d * h.np, T(0));
  ws.dot.assign(h.d * h.np, T(0));
  ws.kr.resize(h.n * h.d);
  ws.vr.resize(h.n * h.d);
  for (std::int64_t i = 0; i < h.n; ++i) {
    for (std::int64_t t = 0; t < h.d; ++t) {
      ws.qt[t * h.np + i] = ws.q[i * h.dp + t];
      ws.dot[t * h.np + i] = ws.dout[i * h.dp + t];
      ws.kr[i * h.d + t] = ws.k[i * h.dp + t];
      ws.vr[i * h.d + t] = ws.vt[t * ld + i];
    }
  }
  // lse and D per row, zero padded so a block's padding lanes read in bounds (their results are
  // never summed).
  ws.dd.assign(h.np, T(0));
  ws.lse.assign(h.np, T(0));
  // A row's o roundings first (as whole vectors) where the accumulation takes no draws between them.
  const bool o_first = !rd.template draws<StepId::accum>();
  T* orow = ws.row.data();  // free after load_backward_inputs
  for (std::int64_t i = 0; i < h.n; ++i) {
    T acc = 0;
    if (o_first) {
      round_run<StepId::o>(rd, o + i * h.d, orow, h.d);
      for (std::int64_t t = 0; t < h.d; ++t) acc = rd.accum(madd(ws.dout[i * h.dp + t], orow[t], acc));
    } else {
      for (std::int64_t t = 0; t < h.d; ++t) acc = rd.accum(madd(ws.dout[i * h.dp + t], rd.o(o[i * h.d + t]), acc));
    }
    ws.dd[i] = rd.stats_running(acc);
    ws.lse[i] = lse[i];
  }
  const std::int64_t brp_max = round_up(h.br, L);
  ws.p.resize(h.bc * brp_max);
  ws.ds.resize(h.bc * brp_max);
  for (std::int64_t j0 = 0; j0 < h.n; j0 += h.bc) {
    const std::int64_t bc = std::min(h.bc, h.n - j0);
    for (std::int64_t i0 = 0; i0 < h.n; i0 += h.br) {
      const std::int64_t br = std::min(h.br, h.n - i0), brp = round_up(br, L);
      if (h.causal && i0 + br - 1 < j0) continue;  // every row of the block precedes every key
      T* p = ws.p.data();
      T* ds = ws.ds.data();
      score_tile(rd, ws.kr.data() + j0 * h.d, h.d, ws.qt.data() + i0, h.np, bc, brp, h.scale, p, brp);
      score_tile<false>(rd, ws.vr.data() + j0 * h.d, h.d, ws.dot.data() + i0, h.np, bc, brp, T(1), ds, brp);
      if (h.causal && j0 + bc - 1 > i0) mask_tile(p, brp, bc, brp, j0, i0);
      for (std::int64_t c = 0; c < bc; ++c) {
        for (std::int64_t r = 0; r < brp; r += L) {
          const V pv = rd.p(vexp(round_exp_arg(rd, vload(p + c * brp + r) - vload(ws.lse.data() + i0 + r))));
          vstore(p + c * brp + r, pv);
          vstore(ds + c * brp + r, rd.grad(pv * (vload(ds + c * brp + r) - vload(ws.dd.data() + i0 + r))));
        }
      }
      // dV_j += P^T dO_i and dK_j += dS^T Q_i read the tiles [key][query] as rows of P and dS.
      pv_tile<true>(rd, p, brp, ws.dout.data() + i0 * h.dp, h.dp, br, bc, ws.dv.data() + j0 * h.dp, h.dp);
      pv_tile<true>(rd, ds, brp, ws.q.data() + i0 * h.dp, h.dp, br, bc, ws.dk.data() + j0 * h.dp, h.dp);
      pv_tile(rd, ds, brp, ws.k.data() + j0 * h.dp, h.dp, bc, br, ws.dq.data() + i0 * h.dp, h.dp);
    }
  }
  store_gradients(rd, h, ws, dq, dk, dv);
}

template <class T, class R>
void baseline_backward(const R& rd, const Head<T>& h, const T* q, const T* k, const T* v, const T* dout,
                       BackwardWorkspace<T>& ws, T* dq, T* dk, T* dv) {
  constexpr int L = kLanes<T>;
  load_backward_inputs(rd, h, q, k, v, dout, ws);
  const std::int64_t ld = backward_ld(h), np = round_up(h.n, L);
  ws.p.assign(h.n * np, T(0));
  ws.ds.assign(h.n * np, T(0));
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t jn = h.causal ? i + 1 : h.n;
    T* p = ws.p.data() + i * np;
    T* ds = ws.ds.data() + i * np;
    row_dot(rd, ws.q.data() + i * h.dp, ws.kt.data(), ld, h.d, std::int64_t(0), np, p);
    row_dot(rd, ws.dout.data() + i * h.dp, ws.vt.data(), ld, h.d, std::int64_t(0), np, ds);
    T m = kNegInf<T>;
    for (std::int64_t j = 0; j < jn; ++j) {
      p[j] = rd.s(p[j] * h.scale);
      m = std::max(m, p[j]);
    }
    m = rd.stats(m);
    T l = 0;
    for (std::int64_t j = 0; j < jn; ++j) {
      const T x = p[j] - m;
      p[j] = rd.softmax(sexp(rd.softmax(x)));
      l = rd.stats(l + p[j]);
    }
    T di = 0;
    for (std::int64_t j = 0; j < jn; ++j) {
      p[j] = rd.p(rd.division(p[j] / l));
      di = rd.accum(madd(p[j], ds[j], di));
    }
    for (std::int64_t j = 0; j < np; ++j) ds[j] = j < jn ? rd.grad(p[j] * (ds[j] - di)) : T(0);
    for (std::int64_t j = jn; j < np; ++j) p[j] = 0;
  }
  for (std::int64_t i = 0; i < h.n; ++i) {
    const std::int64_t jn = h.causal ? i + 1 : h.n;
    const T* p = ws.p.data() + i * np;
    const T* ds = ws.ds.data() + i * np;
    for (std::int64_t j = 0; j < jn; ++j) {
      axpy(rd, p[j], ws.dout.data() + i * h.dp, ws.dv.data() + j * h.dp, h.dp);
      axpy(rd, ds[j], ws.q.data() + i * h.dp, ws.dk.data() + j * h.dp, h.dp);
      axpy(rd, ds[j], ws.k.data() + j * h.dp, ws.dq.data() + i * h.dp, h.dp);
    }
  }
  store_gradients(rd, h, ws, dq, dk, dv);
}

// ---- the one dispatch place: policy formats -> template parameters --------------------------------
template <class T>
Format normalise_for(Format f) {
  // Rounding a float to fp64 or to fp32 is the identity either way: one instantiation serves both.
  if (std::is_same_v<T, float> && f == Format::fp64) return Format::fp32;
  return f;
}

template <class T>
bool exact_in(Format f) {
  return normalise_for<T>(f) == (std::is_same_v<T, float> ? Format::fp32 : Format::fp64);
}

// f(rounding object) with the object's mode and flags set from the policy.
template <class T, class Rd, class F>
void call_with(Rd rd, const PrecisionPolicy& p, F&& f) {
  rd.mode = p.rounding;
  rd.exact_running_sum = exact_in<T>(p.stats_running);
  rd.exact_running_o = exact_in<T>(p.o_running);
  f(rd);
}

// The three readings of storage format S: pure <S, S, S>, eager <S, fp32, S>, mixed <S, fp32, fp32>.
template <class T, Format S, class F>
void dispatch_classes(Format c, Format r, F&& f, const PrecisionPolicy& p) {
  if (c == S && r == S) return call_with<T>(StaticRounding<T, S, S, S>{}, p, f);
  if (c == Format::fp32 && r == S) return call_with<T>(StaticRounding<T, S, Format::fp32, S>{}, p, f);
  if (c == Format::fp32 && r == Format::fp32) return call_with<T>(StaticRounding<T, S, Format::fp32, Format::fp32>{}, p, f);
  call_with<T>(RuntimeRounding<T>{p}, p, f);
}

// Storage steps uniform in S, in-op steps uniform in C and state steps uniform in R (every preset) take
// a compile-time rounding object; any other policy the runtime one.
template <class T, class F>
void dispatch_rounding(const PrecisionPolicy& p, F&& f) {
  const auto n = [](Format x) { return normalise_for<T>(x); };
  const Format s = n(p.q), c = n(p.accum), r = n(p.o_running);
  const bool uniform = n(p.k) == s && n(p.v) == s && n(p.s) == s && n(p.p) == s && n(p.o) == s &&
                       n(p.grad) == s && n(p.stats) == c && n(p.softmax) == c && n(p.division) == c &&
                       n(p.stats_running) == r && n(p.rescale) == r && n(p.exp_arg) == r;
  if (!uniform) return call_with<T>(RuntimeRounding<T>{p}, p, f);
  if constexpr (std::is_same_v<T, double>) {
    // Double buffers serve fp64 (the trainer's fp64 runs, the microbenchmark's fp64 points); other
    // policies on them take the runtime path, which keeps the compile time of each ISA build down.
    if (s == Format::fp64 && c == Format::fp64 && r == Format::fp64)
      return call_with<T>(StaticRounding<T, Format::fp64, Format::fp64, Format::fp64>{}, p, f);
    return call_with<T>(RuntimeRounding<T>{p}, p, f);
  }
  switch (s) {
    case Format::fp64:
    case Format::fp32:
      if (c == Format::fp32 && r == Format::fp32)
        return call_with<T>(StaticRounding<T, Format::fp32, Format::fp32, Format::fp32>{}, p, f);
      break;
    case Format::tf32: return dispatch_classes<T, Format::tf32>(c, r, f, p);
    case Format::fp16: return dispatch_classes<T, Format::fp16>(c, r, f, p);
    case Format::bf16: return dispatch_classes<T, Format::bf16>(c, r, f, p);
    case Format::fp8_e4m3: return dispatch_classes<T, Format::fp8_e4m3>(c, r, f, p);
    case Format::fp8_e5m2: return dispatch_classes<T, Format::fp8_e5m2>(c, r, f, p);
  }
  call_with<T>(RuntimeRounding<T>{p}, p, f);
}

template <class T>
void forward_heads(const AttentionShape& shape, const AttentionParams& params, const T* q, const T* k, const T* v,
                   T* o, T* lse, std::int64_t head_begin, std::int64_t head_end) {
  const Head<T> h = make_head<T>(shape, params);
  dispatch_rounding<T>(params.policy, [&](const auto& rd) {
    Workspace<T> ws;
    for (std::int64_t head = head_begin; head < head_end; ++head) {
      const std::int64_t off = head * h.n * h.d;
      rd.start_head(params.rounding_seed, static_cast<std::uint64_t>(params.head_offset + head));
      T* lse_head = lse ? lse + head * h.n : nullptr;
      load_inputs(rd, h, q + off, k + off, v + off, ws);
      if (params.attention == AttentionKind::baseline) {
        baseline_forward(rd, h, ws, o + off, lse_head);
      } else if (params.order == LoopOrder::kv_outer) {
        flash_forward_kv_outer(rd, h, ws, o + off, lse_head);
      } else {
        flash_forward_q_outer(rd, h, ws, o + off, lse_head);
      }
    }
  });
}

template <class T>
void backward_heads(const AttentionShape& shape, const AttentionParams& params, const T* q, const T* k, const T* v,
                    const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv, std::int64_t head_begin,
                    std::int64_t head_end) {
  const Head<T> h = make_head<T>(shape, params);
  dispatch_rounding<T>(params.policy, [&](const auto& rd) {
    BackwardWorkspace<T> ws;
    for (std::int64_t head = head_begin; head < head_end; ++head) {
      const std::int64_t off = head * h.n * h.d;
      // The backward's own stream: the forward's seed with its top bit flipped.
      rd.start_head(params.rounding_seed ^ (std::uint64_t{1} << 63), static_cast<std::uint64_t>(params.head_offset + head));
      if (params.attention == AttentionKind::baseline) {
        baseline_backward(rd, h, q + off, k + off, v + off, dout + off, ws, dq + off, dk + off, dv + off);
      } else {
        flash_backward(rd, h, q + off, k + off, v + off, o + off, lse + head * h.n, dout + off, ws, dq + off,
                       dk + off, dv + off);
      }
    }
  });
}

}  // namespace
}  // namespace fastudy
