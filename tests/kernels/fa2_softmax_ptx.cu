// The expressions of FlashAttention-2's online softmax as PyTorch compiles them (aten/src/ATen/native/
// transformers/cuda/flash_attn/softmax.h, `#define UNFUSE_FMA`; utils.h), written out for one thread's
// rows, so that check_fa2_softmax_ptx.py can read in nvcc's PTX which multiplications nvcc contracts
// into an fma (its default -fmad=true) — the contractions kernels/detail/fa2_pytorch.hpp models:
//   rescale_and_sum   Softmax::softmax_rescale_o for a KV block after the first: scores_scale =
//                     exp2f((max_prev - max_cur) * scale_log2), row_sum *= scores_scale, then
//                     scale_apply_exp2 (P = exp2f(__fmul_rn(S, scale_log2) - max_scaled)) and
//                     reduce_sum<zero_init=false> (thread_reduce_: row_sum + P(0) + P(1) + ... in order).
//   normalize_lse     Softmax::normalize_softmax_lse: lse = row_max * softmax_scale + __logf(sum).
// kRows rows of kCols columns per thread: the 128 x 128 tile of the d <= 64 forward (2 rows, 32 columns).
constexpr int kRows = 2;
constexpr int kCols = 32;

extern "C" __global__ void rescale_and_sum(const float* s_in, const float* max_prev_in, const float* sum_in,
                                           float* p_out, float* sum_out, float* max_out, float scale_log2) {
  const int t = threadIdx.x;
  float s[kRows][kCols], row_max[kRows], row_sum[kRows], max_prev[kRows];
#pragma unroll
  for (int mi = 0; mi < kRows; ++mi) {
    max_prev[mi] = max_prev_in[mi * 32 + t];
    row_sum[mi] = sum_in[mi * 32 + t];
#pragma unroll
    for (int ni = 0; ni < kCols; ++ni) s[mi][ni] = s_in[(mi * kCols + ni) * 32 + t];
  }
  // reduce_max<zero_init=false> (its quad all-reduce left out: a max is exact in any order).
#pragma unroll
  for (int mi = 0; mi < kRows; ++mi) {
    row_max[mi] = max_prev[mi];
#pragma unroll
    for (int ni = 0; ni < kCols; ++ni) row_max[mi] = fmaxf(row_max[mi], s[mi][ni]);
  }
  // softmax_rescale_o, Check_inf.
#pragma unroll
  for (int mi = 0; mi < kRows; ++mi) {
    const float max_cur = row_max[mi] == -INFINITY ? 0.0f : row_max[mi];
    const float scores_scale = exp2f((max_prev[mi] - max_cur) * scale_log2);
    row_sum[mi] *= scores_scale;
  }
  // scale_apply_exp2 with UNFUSE_FMA.
#pragma unroll
  for (int mi = 0; mi < kRows; ++mi) {
    const float max_scaled = row_max[mi] == -INFINITY ? 0.0f : row_max[mi] * scale_log2;
#pragma unroll
    for (int ni = 0; ni < kCols; ++ni) s[mi][ni] = exp2f(__fmul_rn(s[mi][ni], scale_log2) - max_scaled);
  }
  // reduce_sum<zero_init=false>: thread_reduce_.
#pragma unroll
  for (int mi = 0; mi < kRows; ++mi) {
    row_sum[mi] = row_sum[mi] + s[mi][0];
#pragma unroll
    for (int ni = 1; ni < kCols; ++ni) row_sum[mi] = row_sum[mi] + s[mi][ni];
  }
#pragma unroll
  for (int mi = 0; mi < kRows; ++mi) {
    sum_out[mi * 32 + t] = row_sum[mi];
    max_out[mi * 32 + t] = row_max[mi];
#pragma unroll
    for (int ni = 0; ni < kCols; ++ni) p_out[(mi * kCols + ni) * 32 + t] = s[mi][ni];
  }
}

extern "C" __global__ void normalize_lse(const float* max_in, const float* sum_in, float* lse_out,
                                         float softmax_scale) {
  const int t = threadIdx.x;
#pragma unroll
  for (int mi = 0; mi < kRows; ++mi) {
    const float sum = sum_in[mi * 32 + t], row_max = max_in[mi * 32 + t];
    lse_out[mi * 32 + t] = (sum == 0.f || sum != sum) ? INFINITY : row_max * softmax_scale + __logf(sum);
  }
}
