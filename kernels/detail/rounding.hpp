// The rounding objects every kernel takes as `rd`: one method per step of the policy (rd.q(x),
// rd.accum(x), ... on a scalar or a vector; the names are kPolicySteps', kernels/attention.hpp).
// StaticRounding has its formats as template parameters (the presets; an identity rounding compiles
// to nothing), RuntimeRounding reads any custom policy per value. Also: round_any (one value, any
// mode), round_lanes / round_run (vector loops with the draws of the scalar loop they replace), and
// the roundings of maxima and exp arguments that keep the -inf sentinel.
#pragma once

#include "kernels/detail/random_stream.hpp"
#include "kernels/detail/round_vec.hpp"
#include "kernels/detail/vec.hpp"

namespace fastudy {
namespace {

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
    return round_vec_mode<F, T>(x, mode,
                                mode == Rounding::stochastic ? rng.scalar_lanes<T>(offset, stride) : uvec_t<T>{});
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
// storage steps (q, k, v, p, grad) in Storage, s in Score and o in Out (both Storage unless a kernel
// keeps S in registers or writes O in another type), in-op steps (accum, stats, softmax, division) in
// InOp, state steps (stats_running, rescale, o_running, exp_arg) in State. pure is <f, f, f>, eager
// and the framework baseline <f, fp32, f>, mixed <f, fp32, fp32>, fa2/fa3 <f, fp32, fp32, fp32>,
// fa3's FP8 flash <fp8, fp32, fp32, fp32, bf16>.
template <class T, Format Storage, Format InOp, Format State, Format Score = Storage, Format Out = Storage>
struct StaticRounding : RoundingState {
  // The kernels this object is built for (the dispatch pairs it with no other): the framework
  // kernels store S and O as their other tensors; the FlashAttention kernels keep S, the in-op values
  // and the running state in the registers' precision (the buffer's).
  static constexpr bool kFramework = Score == Storage && Out == Storage;
  static constexpr bool kKernel =
      round_is_identity<Score, T>() && round_is_identity<InOp, T>() && round_is_identity<State, T>();
  template <Format F, class X> FASTUDY_INLINE X round(X x) const { return round_any<F, T>(x, mode, rng); }
  template <class X> FASTUDY_INLINE X q(X x) const { return round<Storage>(x); }
  template <class X> FASTUDY_INLINE X k(X x) const { return round<Storage>(x); }
  template <class X> FASTUDY_INLINE X v(X x) const { return round<Storage>(x); }
  template <class X> FASTUDY_INLINE X s(X x) const { return round<Score>(x); }
  template <class X> FASTUDY_INLINE X p(X x) const { return round<Storage>(x); }
  template <class X> FASTUDY_INLINE X o(X x) const { return round<Out>(x); }
  template <class X> FASTUDY_INLINE X grad(X x) const { return round<Storage>(x); }
  template <class X> FASTUDY_INLINE X accum(X x) const { return round<InOp>(x); }
  template <class X> FASTUDY_INLINE X stats(X x) const { return round<InOp>(x); }
  template <class X> FASTUDY_INLINE X softmax(X x) const { return round<InOp>(x); }
  template <class X> FASTUDY_INLINE X division(X x) const { return round<InOp>(x); }
  template <class X> FASTUDY_INLINE X stats_running(X x) const { return round<State>(x); }
  template <class X> FASTUDY_INLINE X rescale(X x) const { return round<State>(x); }
  template <class X> FASTUDY_INLINE X o_running(X x) const { return round<State>(x); }
  template <class X> FASTUDY_INLINE X exp_arg(X x) const { return round<State>(x); }
  template <StepId Step>
  static constexpr Format format_of() {
    if constexpr (Step == StepId::s) {
      return Score;
    } else if constexpr (Step == StepId::o) {
      return Out;
    } else if constexpr (Step == StepId::q || Step == StepId::k || Step == StepId::v || Step == StepId::p ||
                         Step == StepId::grad) {
      return Storage;
    } else if constexpr (Step == StepId::accum || Step == StepId::stats || Step == StepId::softmax ||
                         Step == StepId::division) {
      return InOp;
    } else {
      return State;
    }
  }
  // Step `Step` on a scalar (the same as q(x), k(x), ...).
  template <StepId Step, class X> FASTUDY_INLINE X step(X x) const { return round<format_of<Step>()>(x); }
  // Whether a scalar rounding of step `Step` takes a random draw.
  template <StepId Step> FASTUDY_INLINE bool draws() const {
    return mode == Rounding::stochastic && !round_is_identity<format_of<Step>(), T>();
  }
  // Step `Step` lane by lane, as kLanes scalar calls taking the draws offset + i * stride (round_lanes).
  template <StepId Step>
  FASTUDY_INLINE vec_t<T> lanes(vec_t<T> x, std::uint32_t offset, std::uint32_t stride) const {
    return round_lanes<format_of<Step>(), T>(x, mode, rng, offset, stride);
  }
};

// Rounding object for any custom policy: a runtime switch per value (slower, same results).
template <class T>
struct RuntimeRounding : RoundingState {
  static constexpr bool kFramework = true;
  static constexpr bool kKernel = true;
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
  template <StepId Step>
  Format format_of() const {
    switch (Step) {
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
  template <StepId Step, class X> X step(X x) const { return apply(format_of<Step>(), x); }
  // Every rounding takes a draw in stochastic mode here (apply), whatever the format.
  template <StepId Step> bool draws() const { return mode == Rounding::stochastic; }
  template <StepId Step>
  vec_t<T> lanes(vec_t<T> x, std::uint32_t offset, std::uint32_t stride) const {
    const uvec_t<T> bits = mode == Rounding::stochastic ? rng.scalar_lanes<T>(offset, stride) : uvec_t<T>{};
    const Format f = format_of<Step>();
    for (int i = 0; i < kLanes<T>; ++i)
      x[i] = round_to(f, static_cast<T>(x[i]), mode, static_cast<std::uint32_t>(bits[i]));
    return x;
  }
};

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

// dst[i] = step `Step` of src[i] for i < n, with the results and random draws of the scalar loop
// `for i: dst[i] = rd.step<Step>(src[i])` (whole vectors lane by lane, the tail one by one).
template <StepId Step, class T, class R>
void round_run(const R& rd, const T* src, T* dst, std::int64_t n) {
  constexpr int L = kLanes<T>;
  const std::uint32_t draws = rd.template draws<Step>() ? 1 : 0;
  std::int64_t i = 0;
  for (; i + L <= n; i += L) {
    vstore(dst + i, rd.template lanes<Step>(vload(src + i), 0, draws));
    rd.rng.skip(draws * L);
  }
  for (; i < n; ++i) dst[i] = rd.template step<Step>(src[i]);
}

}  // namespace
}  // namespace fastudy
