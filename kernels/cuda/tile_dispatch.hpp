// The one place where a runtime precision policy becomes the compile-time rounding object of the
// shared tile math (kernels/cuda/tile_math.hpp), for the host twin and the CUDA launchers alike.
// Supported: storage steps (q, k, v, s, p, o, grad) all in S, compute steps (accum, stats, rescale,
// division, o_running) all in C, with S one of fp32, fp16, bf16 and C = S (pure) or fp32 (mixed).
// Other policies throw UsageError naming the policy (the CPU kernels run every policy).
#pragma once

#include <string>

#include "base/error.hpp"
#include "kernels/attention.hpp"
#include "kernels/cuda/tile_math.hpp"

namespace fastudy::cuda_tile {

// The storage format of a supported policy; throws UsageError for any other policy.
inline Format tile_storage_format(const PrecisionPolicy& p) {
  const Format s = p.q, c = p.accum;
  const bool uniform = p.k == s && p.v == s && p.s == s && p.p == s && p.o == s && p.grad == s &&
                       p.stats == c && p.rescale == c && p.division == c && p.o_running == c;
  const bool storage_ok = s == Format::fp32 || s == Format::fp16 || s == Format::bf16;
  if (!uniform || !storage_ok || (c != s && c != Format::fp32)) {
    throw UsageError("precision policy '" + p.name + "' (storage " + std::string(to_string(s)) + ", accumulator " +
                         std::string(to_string(c)) + ") is not available in the CUDA attention kernels",
                     "the CUDA kernels run the pure and mixed presets of fp32, fp16 and bf16; use the CPU kernels "
                     "for other policies");
  }
  return s;
}

// f(TileRounding<S, C>{}) for the policy's formats.
template <class F>
void dispatch_tile_rounding(const PrecisionPolicy& p, F&& f) {
  const Format s = tile_storage_format(p);
  const bool mixed = p.accum != s;
  switch (s) {
    case Format::fp16:
      if (mixed) return f(TileRounding<Format::fp16, Format::fp32>{});
      return f(TileRounding<Format::fp16, Format::fp16>{});
    case Format::bf16:
      if (mixed) return f(TileRounding<Format::bf16, Format::fp32>{});
      return f(TileRounding<Format::bf16, Format::bf16>{});
    default:
      return f(TileRounding<Format::fp32, Format::fp32>{});
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
