// The GPT-style decoder of the trainer and its mixed-precision emulation (LibTorch; internal to
// src/train, its tests and its benchmark; never include this from a header others use).
//
// Precision emulation follows what GPU autocast training does, with every rounding done by the
// kernels' round_inplace (round-to-nearest-even, bit-exact with hardware conversions):
//   - master weights, optimizer state, embeddings, LayerNorm, the residual stream and the loss stay in
//     the container type (fp32; fp64 for an fp64 variant, which rounds nothing);
//   - a Linear rounds its input, weight and bias to the format, multiplies with fp32 accumulation
//     (a torch fp32 matmul) and rounds its output; in backward it rounds the incoming gradient (the
//     matmul input) and rounds dX, dW, db (bf16/fp16 gradients, which the fp32 master grads then hold
//     exactly);
//   - tf32 rounds only matmul inputs (forward and backward); outputs and storage stay fp32;
//   - GELU's output and its gradient are rounded to the storage format (bf16/fp16);
//   - attention runs the kernels (attention_forward/attention_backward) on contiguous [B,H,N,d]
//     buffers with the variant's precision policy, which rounds Q/K/V/P/O and the gradients itself.
//
// The arithmetic optimisations ([numerics] and the grid axes of the same names; the defaults are the
// arithmetic above, bit for bit):
//   - matmul: the products of every linear layer (the three matmuls of each emulated_linear: forward
//     Y = X W^T, backward dX = G W and dW = G^T X). The operands are the matmul inputs after the
//     precision's rounding above (precision first, then the matmul arithmetic):
//       fp32    plain product, accumulated in the container (a torch matmul: fp32, fp64 for fp64);
//       tf32    operands rounded to tf32 (10 fraction bits), then the plain product: the GPU's TF32
//               tensor-core mode (products of tf32 values are exact in fp32; fp32 accumulation);
//       bf16    operands rounded to bf16, then the plain product (bf16 inputs, fp32 accumulation);
//       bf16x3  each operand split a = a_hi + a_lo, a_hi = bf16(a), a_lo = bf16(a - a_hi) (a - a_hi
//               is exact), and A B = (A_hi B_lo + A_lo B_hi) + A_hi B_hi: three plain products, the
//               two small terms added first (fp32 emulated on bf16 cores, as XLA's BF16_BF16_F32_X3
//               dot algorithm does).
//     With bf16/fp16 training (matmul inputs already rounded) tf32 changes nothing (a bf16 or fp16
//     value is a tf32 value), bf16 is the identity for bf16 and a second rounding of fp16 values,
//     and bf16x3 of a bf16 value has a_lo = 0. For fp64 variants the roundings apply to the double
//     operands and the products accumulate in fp64.
//   - split_k: the reduction of each of the three matmuls split into k contiguous ranges (the first
//     K mod k ranges one longer than the rest, as torch.tensor_split does; k > K is clamped to K),
//     one product per range with the matmul arithmetic, added in order ((P0 + P1) + P2) + ... as a
//     split-K GEMM's serial reduction does. K is the input features for Y, the output features for
//     dX and the tokens (rows of X) for dW. The bias is added after the reduction (the GEMM's
//     epilogue); with split_k = 1 and matmul fp32/tf32/bf16 it is the GEMM's own C (torch addmm), as
//     before. db = the column sums of G is not a matmul and is unchanged.
//   - layernorm: torch = LibTorch's kernel (on the CPU a vectorised Welford with pairwise merges of
//     16-element chunks; what the trainer always ran), its weight and bias gradients summed per block
//     of rows and the blocks added in order (fixed_order.hpp: the same bits on any thread count); two_pass = mean = (sum x_i in index order)/D,
//     then var = (sum (x_i - mean)^2 in index order)/D; welford = one pass, element by element in
//     index order: delta = x_i - m, m += delta/i (i = 1..D), M2 += delta (x_i - m), var = M2/D. Both compute in
//     the container type, rstd = 1/sqrt(var + 1e-5), y = ((x - mean) rstd) w + b; their backward is
//     the analytic one: xhat = (x - mean) rstd, dxhat = dy w, dx = rstd (dxhat - mean(dxhat) -
//     xhat mean(dxhat xhat)), dw and db summed over rows, every sum in index order.
//   - gelu: erf = 0.5 x (1 + erf(x/sqrt 2)); tanh = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//     (LibTorch's gelu with approximate = "tanh", forward and backward); the storage rounding of its
//     output and gradient is unchanged.
//   - recompute: each block's forward runs without keeping activations (only the block input and
//     its parameters are saved) and runs again inside the backward pass, with the same attention
//     rounding seeds, before its backward (activation checkpointing): the same arithmetic, so the
//     weights are bit-identical to recompute = off.
// Arithmetic ([train] arithmetic): everything above is `emulated`. `native` runs the framework's own
// formats as autocast does, with no emulated rounding: the master weights, embeddings, residual stream,
// LayerNorm and the loss in fp32; every linear layer on its inputs cast to the compute format (bf16 or
// fp16 tensors: tensor cores on a GPU, LibTorch's bf16 kernels on a CPU; tf32: fp32 tensors with TF32
// matmuls, GPU only); GELU in the compute format; attention on the compute-format Q, K, V (fastudy's
// kernels receive them widened to fp32 and apply their policy; the SDPA kinds run in the format).
// Native runs LibTorch's own ops (not fixed_order.hpp): on a CPU its bits follow the thread count.
//
// Devices: every tensor lives on the device the model was built on (Gpt's `device`). On a GPU the
// roundings use LibTorch's conversions (round_with_conversions; the same bits as round_inplace), the
// attention runs the CUDA kernels (kernels/cuda; float containers, pure/mixed policies), and
// fixed_order.hpp hands the tensors to LibTorch's CUDA ops whole.
// Shapes: B batch, H heads, N sequence, d head dim, D = H*d model width, V vocab.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/format.hpp"
#include "src/core/config.hpp"
#include "src/train/trainer.hpp"

namespace fastudy::train {

class StepProfile;  // src/train/profile.hpp

// Which roundings a training precision implies, and the arithmetic of [numerics].
struct Emulation {
  Format precision = Format::fp32;
  bool round_matmul_inputs = false;  // tf32, bf16, fp16 (and fp8)
  bool round_storage = false;        // bf16, fp16 (and fp8): activations and gradients are stored in the format
  torch::Dtype dtype = torch::kFloat;  // container: kDouble for fp64, kFloat otherwise
  NumericsConfig numerics;             // matmul arithmetic, split_k, layernorm, gelu, recompute
  bool native = false;                 // [train] arithmetic = native (no roundings above)
  torch::Dtype compute = torch::kFloat;  // native: the linear layers' format (bf16, fp16; else dtype)
  StepProfile* profile = nullptr;        // --profile: the roundings are timed here (null: not timed)

  static Emulation of(Format precision, const NumericsConfig& numerics = {}, Arithmetic arithmetic = Arithmetic::emulated);
};

// A copy of t (float or double, any layout) rounded to f: contiguous, same dtype.
torch::Tensor round_copy(const torch::Tensor& t, Format f);

// Rounds a contiguous float tensor in place to bf16, fp16 or tf32 (fp32: nothing) with LibTorch's
// own operations, on any device: bf16 and fp16 by conversion to the format and back (round to
// nearest even, as the hardware converts), tf32 by integer operations on the bits (round to nearest
// even to 10 fraction bits; Inf and NaN kept). The same bits as round_inplace (tested on the CPU);
// tensors off the CPU are rounded this way. Throws fastudy::Error for fp8 and for double containers.
void round_with_conversions(torch::Tensor& t, Format f);

// y = x W^T + b with the emulation's roundings (custom autograd function). x [..., in], w [out, in],
// b [out] or undefined. x_in_format / grad_in_format: the caller guarantees that x / the incoming
// gradient already hold values of the format, so their rounding (the identity then) is skipped.
torch::Tensor emulated_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                              const Emulation& e, bool x_in_format = false, bool grad_in_format = false);

// A B for a [M, K] and b [K, N] (float or double, any strides) with a matmul arithmetic and split_k
// (see the top of this file): the forward and both backward products of emulated_linear.
torch::Tensor numerics_matmul(const torch::Tensor& a, const torch::Tensor& b, MatmulArithmetic arithmetic, int split_k);

// The [begin, end) ranges split_k cuts a reduction of length k_len into (k clamped to [1, k_len]).
std::vector<std::pair<std::int64_t, std::int64_t>> split_ranges(std::int64_t k_len, int split_k);

// LayerNorm over the last dimension (eps 1e-5) with the algorithm's statistics, forward and backward.
torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                         LayerNormAlgorithm algorithm);

// GELU, exact (erf) or the tanh approximation, forward and backward (no rounding).
torch::Tensor gelu(const torch::Tensor& x, GeluApproximation approximation);

// x rounded to the storage format, and its gradient too (identity without storage rounding).
torch::Tensor round_activation(const torch::Tensor& x, const Emulation& e);

// Shadow attention: one record per attention call (layer) of the last forward.
struct ShadowRecord {
  int layer;
  double max_abs, mean_abs;  // |O_kind - O_other| over the whole output
};

// The outputs of a forward pass, op by op (fastudy bisect): each op appends a detached copy of its
// output under its name, in forward order: "embed"; per block "blocks.<i>." + ln1, attn.q, attn.k,
// attn.v, attn.out (the attention kernel's output), attn.proj, ln2, mlp.fc, mlp.gelu, mlp.proj, out
// (the residual stream after the block); then "ln_f", "logits", "loss". `factor`, when set, is a
// planted change (tests): the op's output is multiplied by factor(name) before it goes on (1: none;
// not applied to attn.q/k/v, which are views of one product, attn.qkv).
struct OpTrace {
  std::vector<std::pair<std::string, torch::Tensor>> outputs;
  std::function<double(const std::string&)> factor;
};

struct AttentionSetup {
  AttentionParams params;         // the variant's kind, policy, blocks and loop order
  SdpaBackend sdpa = SdpaBackend::none;  // set: LibTorch's SDPA with this backend instead of the kernels
  bool shadow = false;            // also run the other kind on every call and record the difference
  std::vector<ShadowRecord>* shadow_sink = nullptr;
  // When set, the forward of layer capture_layer copies its Q, K, V here (see capture_attention_inputs).
  CapturedAttention* capture = nullptr;
  int capture_layer = -1;
  OpTrace* trace = nullptr;  // when set, every op of the forward pass records its output here
  StepProfile* profile = nullptr;  // --profile: the attention calls are timed here (null: not timed)
};

// `t`, recorded in setup.trace under `name` (and multiplied by its planted factor) when there is one.
torch::Tensor traced(const AttentionSetup& setup, const std::string& name, torch::Tensor t);

// Causal multi-head attention of a fused projection: qkv [B, N, 3D] (q | k | v, heads contiguous
// inside each) -> [B, N, D], forward and backward through the kernels (custom autograd function,
// float or double). `setup` must outlive the backward pass.
torch::Tensor kernel_attention(const torch::Tensor& qkv, int heads, const AttentionSetup& setup, int layer);

class Gpt {
 public:
  Gpt(const ModelConfig& config, torch::Dtype dtype, torch::Device device = torch::kCPU);

  // Fill every parameter from the init seed with `scheme`: biases 0, LayerNorm gains 1, embeddings
  // N(0, 0.02^2); the other weights N(0, 0.02^2) (normal; scaled: the residual projections times
  // 1/sqrt(2 layers)), U(-a, a) with a = sqrt(6 / (fan_in + fan_out)) (xavier_uniform), or
  // N(0, 2 / fan_in) (kaiming_normal). Values are drawn in double, rounded to float (so fp32 and fp64
  // variants start equal), and stored in the container type.
  void init(InitScheme scheme, std::uint64_t seed);

  // Mean next-token cross-entropy of tokens [b, N+1] (int64): inputs [:, :N], targets [:, 1:].
  // `e` and `attention` must outlive the backward pass (recompute and the attention kernels use them).
  torch::Tensor loss(const torch::Tensor& tokens, const Emulation& e, const AttentionSetup& attention) const;

  std::vector<std::pair<std::string, torch::Tensor>>& params() { return params_; }
  const std::vector<std::pair<std::string, torch::Tensor>>& params() const { return params_; }
  const ModelConfig& config() const { return config_; }

 private:
  const torch::Tensor& p(std::size_t i) const { return params_[i].second; }

  ModelConfig config_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;  // module-path order
};

}  // namespace fastudy::train
