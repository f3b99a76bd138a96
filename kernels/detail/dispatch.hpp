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
void call_with(Rd rd, const PrecisionPolicy& policy, F&& f) {
  rd.mode = policy.rounding;
  rd.exact_running_sum = exact_in<T>(policy.stats_running);
  rd.exact_running_o = exact_in<T>(policy.o_running);
  f(rd);
}

// The three readings of storage format Storage: pure <Storage, Storage, Storage>, eager
// <Storage, fp32, Storage>, mixed <Storage, fp32, fp32>.
template <class T, Format Storage, class F>
void dispatch_classes(Format in_op, Format state, F&& f, const PrecisionPolicy& policy) {
  if (in_op == Storage && state == Storage)
    return call_with<T>(StaticRounding<T, Storage, Storage, Storage>{}, policy, f);
  if (in_op == Format::fp32 && state == Storage)
    return call_with<T>(StaticRounding<T, Storage, Format::fp32, Storage>{}, policy, f);
  if (in_op == Format::fp32 && state == Format::fp32)
    return call_with<T>(StaticRounding<T, Storage, Format::fp32, Format::fp32>{}, policy, f);
  call_with<T>(RuntimeRounding<T>{policy}, policy, f);
}

// Storage steps in one format, in-op steps in one and state steps in one (every preset) take a
// compile-time rounding object; any other policy the runtime one.
template <class T, class F>
void dispatch_rounding(const PrecisionPolicy& policy, F&& f) {
  const auto norm = [](Format x) { return normalise_for<T>(x); };
  const Format storage = norm(policy.q), in_op = norm(policy.accum), state = norm(policy.o_running);
  const bool uniform = norm(policy.k) == storage && norm(policy.v) == storage && norm(policy.s) == storage &&
                       norm(policy.p) == storage && norm(policy.o) == storage && norm(policy.grad) == storage &&
                       norm(policy.stats) == in_op && norm(policy.softmax) == in_op &&
                       norm(policy.division) == in_op && norm(policy.stats_running) == state &&
                       norm(policy.rescale) == state && norm(policy.exp_arg) == state;
  if (!uniform) return call_with<T>(RuntimeRounding<T>{policy}, policy, f);
  if constexpr (std::is_same_v<T, double>) {
    // Double buffers serve fp64 (the trainer's fp64 runs, the microbenchmark's fp64 points); other
    // policies on them take the runtime path, which keeps the compile time of each ISA build down.
    if (storage == Format::fp64 && in_op == Format::fp64 && state == Format::fp64)
      return call_with<T>(StaticRounding<T, Format::fp64, Format::fp64, Format::fp64>{}, policy, f);
    return call_with<T>(RuntimeRounding<T>{policy}, policy, f);
  }
  switch (storage) {
    case Format::fp64:
    case Format::fp32:
      if (in_op == Format::fp32 && state == Format::fp32)
        return call_with<T>(StaticRounding<T, Format::fp32, Format::fp32, Format::fp32>{}, policy, f);
      break;
    case Format::tf32: return dispatch_classes<T, Format::tf32>(in_op, state, f, policy);
    case Format::fp16: return dispatch_classes<T, Format::fp16>(in_op, state, f, policy);
    case Format::bf16: return dispatch_classes<T, Format::bf16>(in_op, state, f, policy);
    case Format::fp8_e4m3: return dispatch_classes<T, Format::fp8_e4m3>(in_op, state, f, policy);
    case Format::fp8_e5m2: return dispatch_classes<T, Format::fp8_e5m2>(in_op, state, f, policy);
  }
  call_with<T>(RuntimeRounding<T>{policy}, policy, f);
}

template <class T>
void forward_heads(const AttentionShape& shape, const AttentionParams& params, const T* q, const T* k, const T* v,
                   T* o, T* lse, std::int64_t head_begin, std::int64_t head_end) {
  const Head<T> h = make_head<T>(shape, params);
  dispatch_rounding<T>(params.policy, [&](const auto& rd) {
    Workspace<T> ws;
    for (std::int64_t head = head_begin; head < head_end; ++head) {
      const std::int64_t offset = head * h.n * h.d;
      rd.start_head(params.rounding_seed, static_cast<std::uint64_t>(params.head_offset + head));
      T* lse_head = lse ? lse + head * h.n : nullptr;
      load_inputs(rd, h, q + offset, k + offset, v + offset, ws);
      if (params.attention == AttentionKind::baseline) {
        baseline_forward(rd, h, ws, o + offset, lse_head);
      } else if (params.order == LoopOrder::kv_outer) {
        flash_forward_kv_outer(rd, h, ws, o + offset, lse_head);
      } else {
        flash_forward_q_outer(rd, h, ws, o + offset, lse_head);
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
      const std::int64_t offset = head * h.n * h.d;
      // The backward's own stream: the forward's seed with its top bit flipped.
      rd.start_head(params.rounding_seed ^ (std::uint64_t{1} << 63),
                    static_cast<std::uint64_t>(params.head_offset + head));
      if (params.attention == AttentionKind::baseline) {
        baseline_backward(rd, h, q + offset, k + offset, v + offset, dout + offset, ws, dq + offset, dk + offset,
                          dv + offset);
      } else {
        flash_backward(rd, h, q + offset, k + offset, v + offset, o + offset, lse + head * h.n, dout + offset, ws,
                       dq + offset, dk + offset, dv + offset);
      }
    }
  });
}

}  // namespace
}  // namespace fastudy
