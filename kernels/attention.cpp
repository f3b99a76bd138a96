// Entry points of the CPU attention kernels: argument checks, the per-call statistics, the choice of
// the instruction-set build (kernels/detail/attention_isa.hpp) and the split of the B*H heads over
// OpenMP threads. Each head runs whole on one thread, so results do not depend on the thread count.
//
// B batch, H heads, N sequence, d head dim; tensors are contiguous [B, H, N, d], lse is [B, H, N].
#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/error.hpp"
#include "base/cpu.hpp"
#include "kernels/attention.hpp"
#include "kernels/detail/attention_isa.hpp"
#include "kernels/fa2_launch.hpp"

namespace fastudy {
namespace {

// The variant for base's cpu_isa() (the one ISA decision of the project); a variant this build did not
// compile (null) falls back to the next narrower one.
const detail::AttentionIsa& select_isa() {
  static const detail::AttentionIsa* isa = [] {
    const Isa cpu = cpu_isa();
    if (cpu == Isa::avx512)
      if (const detail::AttentionIsa* p = detail::attention_isa_avx512()) return p;
    if (cpu == Isa::avx512 || cpu == Isa::avx2)
      if (const detail::AttentionIsa* p = detail::attention_isa_avx2()) return p;
    return detail::attention_isa_generic();
  }();
  return *isa;
}

// Whether a call runs PyTorch's FlashAttention-2 launch (kernels/detail/fa2_pytorch.hpp): the flash kind
// of a policy whose kernel is fa2, under Launch::pytorch.
bool pytorch_launch(const AttentionParams& params) {
  return params.launch == Launch::pytorch && params.attention == AttentionKind::flash &&
         params.policy.kernel == FlashKernel::fa2;
}

// Launch::pytorch models one kernel: the fa2 preset's policy at fp16 or bf16 (the formats FlashAttention-2
// runs), rounding to nearest, no max_offset, a head dim it instantiates and at least one SM.
void check_pytorch_launch(const AttentionShape& shape, const AttentionParams& params, const std::string& where) {
  if (!pytorch_launch(params)) return;
  const PrecisionPolicy& p = params.policy;
  const Format f = p.q;
  if (f != Format::fp16 && f != Format::bf16)
    throw Error(where + "launch = pytorch runs PyTorch's FlashAttention-2 kernel, which takes fp16 or bf16, not " +
                    std::string(to_string(f)),
                "use the formats fp16 and bf16 with launch = pytorch, or launch = blocks");
  const PrecisionPolicy preset = make_policy("fa2", f, AttentionKind::flash);
  for (const PolicyStep& step : kPolicySteps)
    if (p.*step.member != preset.*step.member)
      throw Error(where + "launch = pytorch models the fa2 reading's kernel, and policy '" + p.name + "' stores " +
                      std::string(step.name) + " in " + std::string(to_string(p.*step.member)) + ", not " +
                      std::string(to_string(preset.*step.member)),
                  "use policy fa2 with launch = pytorch");
  if (p.rounding != Rounding::nearest || p.max_offset != 0.0 || p.quantization != Quantization::none || p.incoherent)
    throw Error(where + "launch = pytorch models the fa2 kernel, which rounds to nearest without max_offset or "
                        "quantization (policy '" + p.name + "')",
                "use policy fa2 with launch = pytorch");
  if (shape.head_dim > kFa2MaxHeadDim)
    throw Error(where + "PyTorch's FlashAttention-2 runs head dims up to " + std::to_string(kFa2MaxHeadDim) + ", not " +
                    std::to_string(shape.head_dim),
                "use launch = blocks for larger head dims");
  if (params.sm_count < 1)
    throw Error(where + "sm_count must be at least 1, not " + std::to_string(params.sm_count),
                "an H100 SXM or H200 has 132");
}

void check_arguments(const AttentionShape& shape, const AttentionParams& params, const void* q, const void* k,
                     const void* v, const char* call) {
  const std::string where = std::string(call) + ": ";
  if (shape.batch < 1 || shape.heads < 1 || shape.seq_len < 1 || shape.head_dim < 1) {
    throw Error(where + "every dimension must be at least 1 (batch " + std::to_string(shape.batch) + ", heads " +
                std::to_string(shape.heads) + ", seq_len " + std::to_string(shape.seq_len) + ", head_dim " +
                std::to_string(shape.head_dim) + ")");
  }
  if (params.block_q < 1 || params.block_kv < 1) {
    throw Error(where + "block sizes must be at least 1 (block_q " + std::to_string(params.block_q) + ", block_kv " +
                    std::to_string(params.block_kv) + ")",
                "set block_q and block_kv to positive sizes; they are clipped to seq_len");
  }
  if (!q || !k || !v) throw Error(where + "null input tensor");
  const std::int64_t d = shape.head_dim;
  if (params.policy.incoherent && (d & (d - 1)) != 0) {
    throw Error(where + "incoherent processing (policy '" + params.policy.name + "') needs a head_dim that is a power "
                    "of two (the Hadamard transform), not " + std::to_string(d),
                "use head_dim 64, 128, ... or set incoherent_processing = false in the policy");
  }
  check_pytorch_launch(shape, params, where);
  const double beta = params.policy.max_offset;
  if (beta != 0.0 && !(beta > 1.0 && std::isfinite(beta))) {
    throw Error(where + "max_offset = " + std::to_string(beta) + " (policy '" + params.policy.name +
                    "') must be a finite number > 1, or 0 for off",
                "Qiu & Yao use beta = 2; remove max_offset to subtract the plain row max");
  }
}

// Runs fn(head_begin, head_end) over contiguous ranges of the heads, one range per thread.
template <class Fn>
void over_heads(std::int64_t heads, int threads, Fn fn) {
  int n = threads;
#ifdef _OPENMP
  if (n <= 0) n = omp_get_max_threads();
#endif
  n = static_cast<int>(std::clamp<std::int64_t>(n, 1, heads));
  if (n == 1) return fn(std::int64_t(0), heads);
  std::exception_ptr error;
#ifdef _OPENMP
#pragma omp parallel num_threads(n)
  {
    const std::int64_t tid = omp_get_thread_num(), nt = omp_get_num_threads();
    try {
      fn(heads * tid / nt, heads * (tid + 1) / nt);
    } catch (...) {
#pragma omp critical(fastudy_attention_error)
      error = std::current_exception();
    }
  }
#else
  fn(std::int64_t(0), heads);
#endif
  if (error) std::rethrow_exception(error);
}

AttentionStats forward_stats(const AttentionShape& shape, const AttentionParams& params) {
  AttentionStats st;
  if (params.attention == AttentionKind::baseline) {
    st.tiles_kv = 1;
    return st;
  }
  if (pytorch_launch(params)) {
    // Each split rescales a row once per block it visits after its first (within the causal limit).
    const Fa2ForwardLaunch l = fa2_forward_launch(shape, params.sm_count);
    const std::int64_t n = shape.seq_len, blocks = (n + l.block_n - 1) / l.block_n;
    const std::int64_t per_split = l.num_splits > 1 ? l.blocks_per_split : blocks;
    st.tiles_kv = blocks;
    std::int64_t total = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t m_block = i / l.block_m;
      const std::int64_t limit = shape.causal ? std::min(blocks, ((m_block + 1) * l.block_m + l.block_n - 1) / l.block_n) : blocks;
      for (std::int64_t lo = 0; lo < limit; lo += per_split) total += std::min(limit, lo + per_split) - lo - 1;
    }
    st.rescales_per_row = static_cast<double>(total) / static_cast<double>(n);
    return st;
  }
  const std::int64_t n = shape.seq_len, bc = std::min<std::int64_t>(params.block_kv, n);
  st.tiles_kv = (n + bc - 1) / bc;
  if (!shape.causal) {
    st.rescales_per_row = static_cast<double>(st.tiles_kv - 1);
  } else {
    std::int64_t total = 0;  // row i sees keys 0..i, in floor(i / Bc) + 1 tiles
    for (std::int64_t i = 0; i < n; ++i) total += i / bc;
    st.rescales_per_row = static_cast<double>(total) / static_cast<double>(n);
  }
  return st;
}

template <class T>
detail::ForwardFn<T> forward_fn(const detail::AttentionIsa& isa);
template <>
detail::ForwardFn<float> forward_fn<float>(const detail::AttentionIsa& isa) {
  return isa.forward_f32;
}
template <>
detail::ForwardFn<double> forward_fn<double>(const detail::AttentionIsa& isa) {
  return isa.forward_f64;
}
template <class T>
detail::BackwardFn<T> backward_fn(const detail::AttentionIsa& isa);
template <>
detail::BackwardFn<float> backward_fn<float>(const detail::AttentionIsa& isa) {
  return isa.backward_f32;
}
template <>
detail::BackwardFn<double> backward_fn<double>(const detail::AttentionIsa& isa) {
  return isa.backward_f64;
}

}  // namespace

std::string_view attention_isa_name() { return select_isa().name; }

template <class T>
AttentionStats attention_forward(const AttentionShape& shape, const AttentionParams& params, const T* q, const T* k,
                                 const T* v, T* o, T* lse) {
  check_arguments(shape, params, q, k, v, "attention_forward");
  if (!o) throw Error("attention_forward: null output tensor");
  if (std::is_same_v<T, double> && pytorch_launch(params))
    throw Error("attention_forward: launch = pytorch runs on float buffers (its formats are fp16 and bf16)");
  const detail::ForwardFn<T> fn = forward_fn<T>(select_isa());
  over_heads(shape.batch * shape.heads, params.threads, [&](std::int64_t begin, std::int64_t end) {
    fn(shape, params, q, k, v, o, lse, begin, end);
  });
  return forward_stats(shape, params);
}

template <class T>
void attention_backward(const AttentionShape& shape, const AttentionParams& params, const T* q, const T* k,
                        const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv) {
  check_arguments(shape, params, q, k, v, "attention_backward");
  if (!dout || !dq || !dk || !dv) throw Error("attention_backward: null gradient tensor");
  if (std::is_same_v<T, double> && pytorch_launch(params))
    throw Error("attention_backward: launch = pytorch runs on float buffers (its formats are fp16 and bf16)");
  if (params.policy.quantization != Quantization::none || params.policy.incoherent) {
    throw Error("attention_backward: policy '" + params.policy.name +
                    "' quantizes Q, K, V (FlashAttention-3's FP8 path), which has no backward pass",
                "run the backward pass in fp16 or bf16");
  }
  if (params.attention == AttentionKind::flash && (!o || !lse)) {
    throw Error("attention_backward: the flash backward needs the forward's o and lse",
                "pass the lse buffer to attention_forward and keep it for the backward call");
  }
  const detail::BackwardFn<T> fn = backward_fn<T>(select_isa());
  over_heads(shape.batch * shape.heads, params.threads, [&](std::int64_t begin, std::int64_t end) {
    fn(shape, params, q, k, v, o, lse, dout, dq, dk, dv, begin, end);
  });
}

template AttentionStats attention_forward<float>(const AttentionShape&, const AttentionParams&, const float*,
                                                 const float*, const float*, float*, float*);
template AttentionStats attention_forward<double>(const AttentionShape&, const AttentionParams&, const double*,
                                                  const double*, const double*, double*, double*);
template void attention_backward<float>(const AttentionShape&, const AttentionParams&, const float*, const float*,
                                        const float*, const float*, const float*, const float*, float*, float*,
                                        float*);
template void attention_backward<double>(const AttentionShape&, const AttentionParams&, const double*,
                                         const double*, const double*, const double*, const double*, const double*,
                                         double*, double*, double*);

}  // namespace fastudy
