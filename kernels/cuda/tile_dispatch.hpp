// The one place where a runtime precision policy becomes the compile-time rounding object of the
// shared tile math (kernels/cuda/tile_math.hpp), for the host twin and the CUDA launchers alike.
// Supported: storage steps (q, k, v, p, o, grad) all in S, in-op steps (accum, stats, softmax,
// division) all in C and state steps (stats_running, rescale, o_running, exp_arg) all in R, with S one
// of fp32, fp16, bf16 and (C, R) = (S, S) (pure), (fp32, S) (eager and the framework baseline) or
// (fp32, fp32) (mixed, fa2, fa3); s in S, or in fp32 with the FlashAttention kernels (fa2, fa3); no
// quantization, FrameworkOps::opmath (LibTorch 1.x's CPU semantics are the CPU kernels' only), rounding
// to nearest. Other policies throw UsageError naming the policy (the CPU kernels run every policy).
// The readings whose policies of fp32, fp16 and bf16 are all among these say so in their row
// (kReadings' .cuda, kernels/attention_common.cpp; tests/gpu/test_tile_math.cpp holds the two together).
#pragma once

#include <string>

#include "base/error.hpp"
#include "kernels/attention.hpp"
#include "kernels/cuda/tile_math.hpp"

namespace fastudy::cuda_tile {

// The storage format of a supported policy; throws UsageError for any other policy.
inline Format tile_storage_format(const PrecisionPolicy& p) {
  const Format s = p.q, c = p.accum, r = p.o_running;
  const bool uniform = p.k == s && p.v == s && p.p == s && p.o == s && p.grad == s && p.stats == c &&
                       p.softmax == c && p.division == c && p.stats_running == r && p.rescale == r &&
                       p.exp_arg == r;
  const bool storage_ok = s == Format::fp32 || s == Format::fp16 || s == Format::bf16;
  const bool kernel = p.kernel != FlashKernel::framework;
  const bool reading_ok = kernel ? (c == Format::fp32 && r == Format::fp32 && p.s == Format::fp32)
                                 : (p.s == s && ((c == s && r == s) || (c == Format::fp32 && (r == s || r == Format::fp32))));
  const bool plain = p.quantization == Quantization::none && !p.incoherent && p.framework_ops == FrameworkOps::opmath;
  if (!uniform || !storage_ok || !reading_ok || !plain || p.rounding != Rounding::nearest) {
    throw UsageError("precision policy '" + p.name + "' (storage " + std::string(to_string(s)) + ", scores " +
                         std::string(to_string(p.s)) + ", accumulator " + std::string(to_string(c)) +
                         ", running state " + std::string(to_string(r)) + ", kernel " +
                         std::string(to_string(p.kernel)) + ", quantization " +
                         std::string(to_string(p.quantization)) + ", framework ops " +
                         std::string(to_string(p.framework_ops)) + ", rounding " +
                         std::string(to_string(p.rounding)) + ") is not available in the CUDA attention kernels",
                     "the CUDA kernels run the " + cuda_reading_names() +
                         " readings of fp32, fp16 and bf16 rounding to nearest; use the CPU kernels for other "
                         "policies");
  }
  return s;
}

template <Format S, class F>
void dispatch_tile_classes(const PrecisionPolicy& p, F&& f) {
  if (p.accum == S) return f(TileRounding<S, S, S>{});
  if (p.o_running == S) return f(TileRounding<S, Format::fp32, S>{});
  if (p.s == Format::fp32) return f(TileRounding<S, Format::fp32, Format::fp32, Format::fp32>{});
  return f(TileRounding<S, Format::fp32, Format::fp32>{});
}

// f(TileRounding<S, C, R, Score>{}) for the policy's formats.
template <class F>
void dispatch_tile_rounding(const PrecisionPolicy& p, F&& f) {
  switch (tile_storage_format(p)) {
    case Format::fp16: return dispatch_tile_classes<Format::fp16>(p, f);
    case Format::bf16: return dispatch_tile_classes<Format::bf16>(p, f);
    default: return f(TileRounding<Format::fp32, Format::fp32, Format::fp32>{});
  }
}

// What a forward call did (the CPU kernels' AttentionStats rule): flash rows are rescaled once per KV
// tile after the first that they see a key of.
inline AttentionStats tile_stats(const AttentionShape& shape, const AttentionParams& params) {
  AttentionStats st;
  if (params.attention == AttentionKind::baseline) {
    st.tiles_kv = 1;
    return st;
  }
  const std::int64_t n = shape.seq_len;
  const std::int64_t bc = params.block_kv < n ? params.block_kv : n;
  st.tiles_kv = (n + bc - 1) / bc;
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) sum += static_cast<double>(shape.causal ? i / bc : st.tiles_kv - 1);
  st.rescales_per_row = sum / static_cast<double>(n);
  return st;
}

}  // namespace fastudy::cuda_tile
