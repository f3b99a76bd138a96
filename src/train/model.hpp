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
// Shapes: B batch, H heads, N sequence, d head dim, D = H*d model width, V vocab.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/format.hpp"
#include "src/core/config.hpp"
#include "src/train/trainer.hpp"

namespace fastudy::train {

// Which roundings a training precision implies.
struct Emulation {
  Format precision = Format::fp32;
  bool round_matmul_inputs = false;  // tf32, bf16, fp16 (and fp8)
  bool round_storage = false;        // bf16, fp16 (and fp8): activations and gradients are stored in the format
  torch::Dtype dtype = torch::kFloat;  // container: kDouble for fp64, kFloat otherwise

  static Emulation of(Format precision);
};

// A copy of t (float or double, any layout) rounded to f: contiguous, same dtype.
torch::Tensor round_copy(const torch::Tensor& t, Format f);

// y = x W^T + b with the emulation's roundings (custom autograd function). x [..., in], w [out, in],
// b [out] or undefined. x_in_format / grad_in_format: the caller guarantees that x / the incoming
// gradient already hold values of the format, so their rounding (the identity then) is skipped.
torch::Tensor emulated_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                              const Emulation& e, bool x_in_format = false, bool grad_in_format = false);

// x rounded to the storage format, and its gradient too (identity without storage rounding).
torch::Tensor round_activation(const torch::Tensor& x, const Emulation& e);

// Shadow attention: one record per attention call (layer) of the last forward.
struct ShadowRecord {
  int layer;
  double max_abs, mean_abs;  // |O_kind - O_other| over the whole output
};

struct AttentionSetup {
  AttentionParams params;         // the variant's kind, policy, blocks and loop order
  bool shadow = false;            // also run the other kind on every call and record the difference
  std::vector<ShadowRecord>* shadow_sink = nullptr;
  // When set, the forward of layer capture_layer copies its Q, K, V here (see capture_attention_inputs).
  CapturedAttention* capture = nullptr;
  int capture_layer = -1;
};

// Causal multi-head attention of a fused projection: qkv [B, N, 3D] (q | k | v, heads contiguous
// inside each) -> [B, N, D], forward and backward through the kernels (custom autograd function,
// float or double). `setup` must outlive the backward pass.
torch::Tensor kernel_attention(const torch::Tensor& qkv, int heads, const AttentionSetup& setup, int layer);

class Gpt {
 public:
  Gpt(const ModelConfig& config, torch::Dtype dtype);

  // Fill every parameter from the init seed with `scheme` (normal, xavier_uniform, kaiming_normal,
  // scaled). Values are drawn in double, rounded to float (so fp32 and fp64 variants start equal), and
  // stored in the container type. Throws fastudy::Error for an unknown scheme.
  void init(const std::string& scheme, std::uint64_t seed);

  // Mean next-token cross-entropy of tokens [b, N+1] (int64): inputs [:, :N], targets [:, 1:].
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
