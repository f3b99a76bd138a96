// The one harness that checks an attention kernel against the fp64 reference: any kernel (the CPU
// kernels, one instruction-set build of them, the CUDA kernels or their host twin, LibTorch) x format
// x precision policy x shape. It holds the error metrics and the error bounds, each defined once:
// the CPU kernel tests (tests/kernels), the GPU tests (tests/gpu), the microbenchmark's error columns
// (kernels/microbench.cpp) and the benchmarks (bench/kernels: every kernel is checked before it is
// timed) all use them. Free of LibTorch, like the rest of kernels/.
//
// Use: make_reference() rounds the inputs as the kernels will store them and runs the fp64 reference
// on them; check_forward() / check_backward() run a kernel on float or double buffers and return its
// outputs, its error metrics against the reference and the bound the error must stay within.
//
// B batch, H heads, N sequence, d head dim; tensors are contiguous row-major [B, H, N, d], lse [B, H, N].
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/format.hpp"

namespace fastudy {

// ---------------------------------------------------------------------------------------------------
// The kernel variants (attention kind x loop order) every attention implementation offers, with the
// parameters of one of them: what the CPU tests, the GPU tests and the benchmarks iterate over.
struct KernelVariant {
  const char* name;
  AttentionKind attention;
  LoopOrder order;
  AttentionParams params(const PrecisionPolicy& policy, int block_q, int block_kv) const {
    return AttentionParams{attention, policy, block_q, block_kv, order};
  }
};
inline constexpr KernelVariant kKernelVariants[] = {{"baseline", AttentionKind::baseline, LoopOrder::q_outer},
                                                    {"flash_kv_outer", AttentionKind::flash, LoopOrder::kv_outer},
                                                    {"flash_q_outer", AttentionKind::flash, LoopOrder::q_outer}};

// ---------------------------------------------------------------------------------------------------
// Error metrics of a result a against a reference, over every element (the microbenchmark's columns):
//   max_abs = max |a - ref|, mean_abs = mean |a - ref|, std_abs = population standard deviation of
//   |a - ref|, rel_l2 = ||a - ref||_2 / ||ref||_2 (||a - ref||_2 when ref is all zeros),
//   rmse = sqrt(mean (a - ref)^2), mean_signed = mean (a - ref) (the bias: a rounding mode or a
//   kernel that errs in one direction shows here while max_abs cannot tell it from noise).
// One pass in element order, so the numbers are reproducible bit for bit. a is widened to double.
struct ErrorMetrics {
  double max_abs = 0, mean_abs = 0, std_abs = 0, rel_l2 = 0;
  double rmse = 0, mean_signed = 0;
};
template <class T>
ErrorMetrics error_metrics(const T* a, const double* ref, std::size_t n);
// The same on whole vectors; throws Error when the sizes differ.
template <class T>
ErrorMetrics error_metrics(const std::vector<T>& a, const std::vector<double>& ref);

// max |x_i| (0 for an empty range).
template <class T>
double max_abs(const T* x, std::size_t n);
template <class T>
double max_abs(const std::vector<T>& x) {
  return max_abs(x.data(), x.size());
}

// ---------------------------------------------------------------------------------------------------
// Error bounds, derived from the unit roundoff u of each step's format (format.hpp: fp64 2^-53, fp32
// 2^-24, tf32 and fp16 2^-11, bf16 2^-8, ...), first order. A kernel runs on buffers of a container
// type (float or double); `buffer` is its format, fp32 or fp64: a value held in a float has at most
// fp32 precision, so no step can be more precise than the buffer.

// The buffer format of the container type T: fp32 for float, fp64 for double.
template <class T>
inline constexpr Format buffer_format = std::is_same_v<T, float> ? Format::fp32 : Format::fp64;

// u of the format a step runs in, on `buffer` buffers: max(u_step, u_buffer).
double step_u(Format step, Format buffer);

// Largest scaled |score| magnitude Smag = max_ij sum_t |q_it k_jt| * scale over all heads, rows and
// keys (causal masking ignored: an upper bound). Products and sums in double.
template <class T>
double score_magnitude(const AttentionShape& shape, const T* q, const T* k);
template <class T>
double score_magnitude(const AttentionShape& shape, const std::vector<T>& q, const std::vector<T>& k) {
  return score_magnitude(shape, q.data(), k.data());
}

// Forward error bound |O - O_ref| <= bound (elementwise), derived step by step from the unit
// roundoffs of the policy (first order; the inputs are already rounded, so the reference sees the
// same Q, K, V):
//   scores: a length-d dot product rounded to accum after every add, then to s:
//           |dS| <= (d u_accum + u_s) Smag, Smag = max_ij sum_t |q_it k_jt| * scale.
//   softmax: P_ij = exp(S_ij - m_i) / l_i moves by at most 2 |dS| relative (numerator and the
//           normalising sum), plus u_p (P storage), u_stats (max and each of the N sum adds:
//           N u_stats relative on l), u_division, and 4 u_buffer for exp on the buffers (float exp is
//           within 2 ulp, the ~1 ulp Cephes expf of the CUDA kernels too; std::exp within 1). The
//           exp's argument x = S - m (|x| <= 2 Smag) rounded to softmax (baseline) or exp_arg (flash)
//           moves exp(x) by |x| u relative: 2 Smag (u_softmax + u_exp_arg); baseline's stored
//           exponentials add u_softmax.
//   P.V:    a length-N sum in accum: N u_accum relative to sum_j P_ij |v_j| <= max|v|.
//   flash:  each of the T_c = ceil(N / Bc) tiles rescales O once more: u_rescale + 2 Smag u_exp_arg
//           (alpha and its argument) + 3 u_o_running (alpha O, the tile's P.V, their sum) + u_accum +
//           u_division + 3 u_stats_running (alpha l, the tile's row sum, their sum) per tile (FA-1
//           re-normalises each tile, FA-2 rescales by alpha). Bc = block_kv, clipped to N.
//   max_offset beta (Qiu & Yao): the subtracted max is beta m or 0, so the exp arguments reach
//           (1 + beta) Smag and m_old - m_new 2 beta Smag: beta Smag replaces Smag in every exp-argument
//           term above and below, and the row sum is only >= exp(-max(beta - 1, 1) Smag) (P underflow).
//   output: u_o.
//   P underflow: P below its format's smallest normal errs by up to half the subnormal spacing in
//           absolute terms; over N keys, against a row sum >= 2^Max_offset (the row's largest P):
//           N spacing_p / 2 / 2^Max_offset (Max_offset 8 for fa3's fp8 P, else 0).
//   scale placement: `after` rounds S twice (+ u_s Smag in |dS|), `before` rounds the scaled Q
//           (+ u_q Smag).
//   fa2/fa3 kernels: P = exp2(S sl2 - m sl2) with m sl2 rounded first and sl2 = scale log2(e) rounded
//           to the buffer: the argument errs by u_exp_arg (|m| + |S - m|) <= 3 Smag u_exp_arg (one more
//           Smag u_exp_arg than the framework's 2 Smag) and, relative to S - m, by 2 Smag u_buffer;
//           O is multiplied by 1/l (one more u_division).
//   quantization (the reference sees the inputs unquantized): each of Q, K, V is rounded to its fp8
//           format after the scaling, x(1 + d) + e with |d| <= u and |e| <= c spacing / 2, c =
//           amax / largest_finite: |dS| grows by (u_q + u_k) Smag + 2 eps qk_norm, eps =
//           spacing / (2 largest_finite) (the subnormals' error relative to the block's amax, bounded
//           with qk_norm = d scale max_i ||q_i|| max_j ||k_j|| >= d scale amax_q amax_k, which also
//           bounds the amax after a Hadamard transform); O by u_v + eps_v relative. Incoherent
//           processing adds the transform's roundings: (log2 d + 2) u_buffer relative to the rows'
//           2-norms in Q and K, 2 (log2 d + 2) u_buffer qk_norm in |dS|.
// All relative to vmax = max|v|, which bounds |O|. Every u is step_u(step, buffer). A policy rounding
// toward zero or stochastically errs by up to one ulp = 2u per rounding: the bound doubles (the
// backward bound too).
double forward_bound(const PrecisionPolicy& p, const AttentionShape& shape, Format buffer, double smag, double vmax,
                     int block_kv, double qk_norm = 0);

// Bound on max |lse - lse_ref|, given the forward bound: lse = m + log(l), so |d lse| <= |dS| + N
// u_stats + u of the log on the buffers, with |lse| itself adding u_stats |lse| when it is stored;
// the forward bound (relative to vmax) scaled by 1 + max|lse_ref| covers it:
//   forward_bound / vmax * (1 + max|lse_ref|).
double lse_bound(double forward_bound, double vmax, double max_abs_lse_ref);

// Backward error bound in relative L2 (of dQ, dK, dV, each and concatenated) against the fp64
// reference backward. Each gradient is two chained dot products (dP = dO.V^T over d, then dQ = dS.K
// over N, or dV = P^T.dO over N), each rounded to accum after every add: (d + N) u_accum; dS and the
// stored gradients add u_grad each (3 u_grad), D = dO.O stored adds u_stats_running, and P carries
// the forward's softmax error
// (2 (d u_accum + u_s) Smag + u_p + (N + 1) u_stats + u_division + 4 u_buffer); the subtraction
// dP - D cancels, which can amplify relative errors by up to max|dP| / |dP - D|, a factor we allow
// as 4 on random inputs of unit variance. The baseline's `after` and `before` scale placements round
// once more in the backward (dS * scale, dQ' * scale): + u_grad. Bound: 4 * (sum of the above).
double backward_bound(const PrecisionPolicy& p, const AttentionShape& shape, Format buffer, double smag);

// ---------------------------------------------------------------------------------------------------
// The harness.

// One problem and its fp64 reference (the golden values). q, k, v, dout are the inputs exactly as the
// kernels will hold them; o and lse the reference forward on them; grad the reference backward
// dQ|dK|dV (concatenated, each [B, H, N, d]), empty when dout is; smag, vmax and qk_norm the inputs
// of the bounds: score_magnitude(shape, q, k), max|v| and d scale max_i ||q_i||_2 max_j ||k_j||_2.
struct AttentionReference {
  AttentionShape shape;
  std::vector<double> q, k, v, dout;
  std::vector<double> o, lse, grad;
  double smag = 0, vmax = 0, qk_norm = 0;
  std::size_t size() const { return q.size(); }  // elements of one [B, H, N, d] tensor
};

// The reference on the inputs as given. Normally they are already what the kernels hold (values of
// the buffer type, rounded to the policy's storage formats, or exact in them); otherwise the kernels'
// own rounding of the inputs counts as part of their error.
AttentionReference make_reference(const AttentionShape& shape, std::vector<double> q, std::vector<double> k,
                                  std::vector<double> v, std::vector<double> dout = {});
// The reference on the inputs rounded as the kernels store them: q, k, v to the policy's input
// formats of q, k, v (input_format: unrounded where the kernel quantizes them itself) and dout to its
// grad format (the kernels round on entry, so the reference must see the rounded values).
AttentionReference make_reference(const AttentionShape& shape, const PrecisionPolicy& storage, std::vector<double> q,
                                  std::vector<double> k, std::vector<double> v, std::vector<double> dout = {});

// A kernel on T buffers, as attention_forward<T> / attention_backward<T> (kernels/attention.hpp)
// take them. Any other kernel (an instruction-set build, the CUDA kernels through a copy to the
// device, LibTorch) is checked by wrapping it in a lambda of this type.
template <class T>
using ForwardKernel = std::function<AttentionStats(const AttentionShape&, const AttentionParams&, const T* q,
                                                   const T* k, const T* v, T* o, T* lse)>;
template <class T>
using BackwardKernel =
    std::function<void(const AttentionShape&, const AttentionParams&, const T* q, const T* k, const T* v, const T* o,
                       const T* lse, const T* dout, T* dq, T* dk, T* dv)>;

// A forward run against the reference: the kernel's O and lse, what it reported, the error metrics
// of O and of lse, and the bounds forward_bound(params.policy, shape, buffer_format<T>, smag, vmax,
// params.block_kv, qk_norm) and lse_bound(...). ok(): max|dO| <= bound and max|d lse| <= lse_bound.
template <class T>
struct ForwardCheck {
  std::vector<T> o, lse;
  AttentionStats stats;
  ErrorMetrics error, lse_error;
  double bound = 0, lse_bound = 0;
  bool ok() const { return error.max_abs <= bound && lse_error.max_abs <= lse_bound; }
  // "max|dO| 1.2e-07 <= 3.4e-05, max|d lse| 1.0e-07 <= 2.1e-04" (with "EXCEEDS" where a bound fails).
  std::string summary() const;
};
template <class T>
ForwardCheck<T> check_forward(const AttentionReference& ref, const AttentionParams& params,
                              const ForwardKernel<T>& kernel = attention_forward<T>);

// A backward run against the reference: the kernel's forward (O, lse), then its backward from that O
// and lse and the reference's dout; grad is dQ|dK|dV concatenated. error over the concatenation,
// dq/dk/dv_error over each gradient; bound = backward_bound(params.policy, shape, buffer_format<T>,
// smag) on rel_l2. ok(): every rel_l2 (each gradient's and the concatenation's) <= bound.
template <class T>
struct BackwardCheck {
  std::vector<T> o, lse, grad;
  ErrorMetrics error, dq_error, dk_error, dv_error;
  double bound = 0;
  bool ok() const;
  // "rel_l2 dQ|dK|dV 1.2e-07 (dQ ..., dK ..., dV ...) <= 3.4e-05"
  std::string summary() const;
};
template <class T>
BackwardCheck<T> check_backward(const AttentionReference& ref, const AttentionParams& params,
                                const ForwardKernel<T>& forward = attention_forward<T>,
                                const BackwardKernel<T>& backward = attention_backward<T>);

// "flash q_outer mixed bf16 (blocks 64x64)": the kernel and policy of a check, for messages.
std::string describe_kernel(const AttentionParams& params);

}  // namespace fastudy
