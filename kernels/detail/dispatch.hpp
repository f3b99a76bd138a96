// The one dispatch place: dispatch_rounding turns a policy's runtime formats into a rounding object
// (StaticRounding with template parameters for the presets, RuntimeRounding otherwise), and
// forward_heads / backward_heads, the functions each attention_isa_*.cpp puts in its table, run a
// range of heads through the kernel that params name.
#pragma once

#include "kernels/detail/backward.hpp"
#include "kernels/detail/forward.hpp"
#include "kernels/detail/head.hpp"
#include "kernels/detail/rounding.hpp"

namespace fastudy {
namespace {

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
