// The one dispatch place: dispatch_rounding turns a policy's runtime formats into a rounding object
// (StaticRounding with template parameters for the presets, RuntimeRounding otherwise), and
// forward_heads / backward_heads, the functions each attention_isa_*.cpp puts in its table, run a
// range of heads through the kernel that params name.
#pragma once

#include "kernels/detail/backward.hpp"
#include "kernels/detail/fa2_pytorch.hpp"
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

// The readings of storage format Storage: pure <Storage, Storage, Storage>, eager and the framework
// baseline <Storage, fp32, Storage>, mixed <Storage, fp32, fp32>.
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

// The FlashAttention kernels' policies (fa2, fa3) of storage format Storage on float buffers: S, the
// in-op values and the running state in fp32, O in Storage or (fa3's FP8 path) bf16.
template <class T, Format Storage, class F>
void dispatch_kernel_classes(Format out, F&& f, const PrecisionPolicy& policy) {
  constexpr Format fp32 = Format::fp32;
  if (out == Storage) return call_with<T>(StaticRounding<T, Storage, fp32, fp32, fp32, Storage>{}, policy, f);
  if constexpr (Storage == Format::fp8_e4m3 || Storage == Format::fp8_e5m2) {
    if (out == Format::bf16) return call_with<T>(StaticRounding<T, Storage, fp32, fp32, fp32, Format::bf16>{}, policy, f);
  }
  call_with<T>(RuntimeRounding<T>{policy}, policy, f);
}

// The kernel a call runs (the one place that chooses it): the baseline, the framework loops in the
// loop order, or the FlashAttention kernel the policy names (fa2/fa3 run their own loop, whatever the
// loop order says). A rounding object is only built for the kernels it serves (StaticRounding's
// kFramework / kKernel), so dispatch_rounding below never pairs it with another.
enum class KernelChoice { baseline, kv_outer, q_outer, fa2, fa3 };
inline KernelChoice choose_kernel(const AttentionParams& params) {
  if (params.attention == AttentionKind::baseline) return KernelChoice::baseline;
  switch (params.policy.kernel) {
    case FlashKernel::fa2: return KernelChoice::fa2;
    case FlashKernel::fa3: return KernelChoice::fa3;
    case FlashKernel::framework: break;
  }
  return params.order == LoopOrder::kv_outer ? KernelChoice::kv_outer : KernelChoice::q_outer;
}

// Storage steps in one format (s and o in one each, see StaticRounding), in-op steps in one and state
// steps in one (every preset) take a compile-time rounding object built for the kernel that runs; any
// other policy the runtime one.
template <class T, class F>
void dispatch_rounding(const PrecisionPolicy& policy, KernelChoice kernel, F&& f) {
  const auto norm = [](Format x) { return normalise_for<T>(x); };
  const Format storage = norm(policy.q), in_op = norm(policy.accum), state = norm(policy.o_running);
  const Format score = norm(policy.s), out = norm(policy.o);
  // grad goes with o (FA3's FP8 path writes both in bf16; every other preset both in the storage format).
  const bool uniform = norm(policy.k) == storage && norm(policy.v) == storage && norm(policy.p) == storage &&
                       norm(policy.grad) == out && norm(policy.stats) == in_op &&
                       norm(policy.softmax) == in_op && norm(policy.division) == in_op &&
                       norm(policy.stats_running) == state && norm(policy.rescale) == state &&
                       norm(policy.exp_arg) == state;
  if (!uniform) return call_with<T>(RuntimeRounding<T>{policy}, policy, f);
  if constexpr (std::is_same_v<T, double>) {
    // Double buffers serve fp64 (the trainer's fp64 runs, the microbenchmark's fp64 points); other
    // policies on them take the runtime path, which keeps the compile time of each ISA build down.
    if (storage == Format::fp64 && in_op == Format::fp64 && state == Format::fp64 && score == Format::fp64 &&
        out == Format::fp64)
      return call_with<T>(StaticRounding<T, Format::fp64, Format::fp64, Format::fp64>{}, policy, f);
    return call_with<T>(RuntimeRounding<T>{policy}, policy, f);
  }
  const bool all_fp32 = storage == Format::fp32 && score == Format::fp32 && out == Format::fp32 &&
                        in_op == Format::fp32 && state == Format::fp32;
  if (all_fp32) return call_with<T>(StaticRounding<T, Format::fp32, Format::fp32, Format::fp32>{}, policy, f);
  if (kernel == KernelChoice::fa2 || kernel == KernelChoice::fa3) {
    if (score == Format::fp32 && in_op == Format::fp32 && state == Format::fp32) {
      switch (storage) {
        case Format::fp16: return dispatch_kernel_classes<T, Format::fp16>(out, f, policy);
        case Format::bf16: return dispatch_kernel_classes<T, Format::bf16>(out, f, policy);
        case Format::fp8_e4m3: return dispatch_kernel_classes<T, Format::fp8_e4m3>(out, f, policy);
        case Format::fp8_e5m2: return dispatch_kernel_classes<T, Format::fp8_e5m2>(out, f, policy);
        default: break;
      }
    }
    return call_with<T>(RuntimeRounding<T>{policy}, policy, f);
  }
  if (score != storage || out != storage) return call_with<T>(RuntimeRounding<T>{policy}, policy, f);
  switch (storage) {
    case Format::tf32: return dispatch_classes<T, Format::tf32>(in_op, state, f, policy);
    case Format::fp16: return dispatch_classes<T, Format::fp16>(in_op, state, f, policy);
    case Format::bf16: return dispatch_classes<T, Format::bf16>(in_op, state, f, policy);
    case Format::fp8_e4m3: return dispatch_classes<T, Format::fp8_e4m3>(in_op, state, f, policy);
    case Format::fp8_e5m2: return dispatch_classes<T, Format::fp8_e5m2>(in_op, state, f, policy);
    default: break;
  }
  call_with<T>(RuntimeRounding<T>{policy}, policy, f);
}

// The fa2 reading under launch = "pytorch" (attention.cpp checked the policy: the fa2 preset at fp16 or
// bf16, which runs on float buffers) takes its own path: it rounds nothing by policy, it is one kernel.
inline bool runs_pytorch_launch(const AttentionParams& params) {
  return params.launch == Launch::pytorch && choose_kernel(params) == KernelChoice::fa2;
}

template <class T>
void forward_heads(const AttentionShape& shape, const AttentionParams& params, const T* q, const T* k, const T* v,
                   T* o, T* lse, std::int64_t head_begin, std::int64_t head_end) {
  if (runs_pytorch_launch(params)) {
    if constexpr (std::is_same_v<T, float>) return fa2_pytorch_forward_heads(shape, params, q, k, v, o, lse, head_begin, head_end);
    else throw std::logic_error("launch = pytorch on double buffers");
  }
  const Head<T> h = make_head<T>(shape, params);
  const KernelChoice kernel = choose_kernel(params);
  dispatch_rounding<T>(params.policy, kernel, [&](const auto& rd) {
    using R = std::decay_t<decltype(rd)>;
    Workspace<T> ws;
    for (std::int64_t head = head_begin; head < head_end; ++head) {
      const std::int64_t offset = head * h.n * h.d;
      rd.start_head(params.rounding_seed, static_cast<std::uint64_t>(params.head_offset + head));
      T* lse_head = lse ? lse + head * h.n : nullptr;
      load_inputs(rd, h, q + offset, k + offset, v + offset, ws);
      if constexpr (R::kFramework) {
        if (kernel == KernelChoice::baseline) baseline_forward(rd, h, ws, o + offset, lse_head);
        if (kernel == KernelChoice::kv_outer) flash_forward_kv_outer(rd, h, ws, o + offset, lse_head);
        if (kernel == KernelChoice::q_outer) flash_forward_q_outer(rd, h, ws, o + offset, lse_head);
      }
      if constexpr (R::kKernel) {
        if (kernel == KernelChoice::fa2) flash_forward_kernel<FlashKernel::fa2>(rd, h, ws, o + offset, lse_head);
        if (kernel == KernelChoice::fa3) flash_forward_kernel<FlashKernel::fa3>(rd, h, ws, o + offset, lse_head);
      }
    }
  });
}

template <class T>
void backward_heads(const AttentionShape& shape, const AttentionParams& params, const T* q, const T* k, const T* v,
                    const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv, std::int64_t head_begin,
                    std::int64_t head_end) {
  if (runs_pytorch_launch(params)) {
    if constexpr (std::is_same_v<T, float>)
      return fa2_pytorch_backward_heads(shape, params, q, k, v, o, lse, dout, dq, dk, dv, head_begin, head_end);
    else throw std::logic_error("launch = pytorch on double buffers");
  }
  const Head<T> h = make_head<T>(shape, params);
  const KernelChoice kernel = choose_kernel(params);
  dispatch_rounding<T>(params.policy, kernel, [&](const auto& rd) {
    using R = std::decay_t<decltype(rd)>;
    BackwardWorkspace<T> ws;
    for (std::int64_t head = head_begin; head < head_end; ++head) {
      const std::int64_t offset = head * h.n * h.d;
      // The backward's own stream: the forward's seed with its top bit flipped.
      rd.start_head(params.rounding_seed ^ (std::uint64_t{1} << 63),
                    static_cast<std::uint64_t>(params.head_offset + head));
      const T* lse_head = lse ? lse + head * h.n : nullptr;
      if constexpr (R::kFramework) {
        if (kernel == KernelChoice::baseline)
          baseline_backward(rd, h, q + offset, k + offset, v + offset, dout + offset, ws, dq + offset, dk + offset,
                            dv + offset);
        if (kernel == KernelChoice::kv_outer || kernel == KernelChoice::q_outer)
          flash_backward(rd, h, q + offset, k + offset, v + offset, o + offset, lse_head, dout + offset, ws,
                         dq + offset, dk + offset, dv + offset);
      }
      if constexpr (R::kKernel) {
        if (kernel == KernelChoice::fa2)
          flash_backward_kernel<FlashKernel::fa2>(rd, h, q + offset, k + offset, v + offset, o + offset, lse_head,
                                                  dout + offset, ws, dq + offset, dk + offset, dv + offset);
        if (kernel == KernelChoice::fa3)
          flash_backward_kernel<FlashKernel::fa3>(rd, h, q + offset, k + offset, v + offset, o + offset, lse_head,
                                                  dout + offset, ws, dq + offset, dk + offset, dv + offset);
      }
    }
  });
}

}  // namespace
}  // namespace fastudy
