// The framework's own attention: LibTorch's scaled_dot_product_attention with exactly one backend
// allowed (flash, memory-efficient, cuDNN or math), for the SDPA attention kinds of the trainer and the
// real-kernel algorithms of the microbenchmark (LibTorch; internal to src/train, jobs and their tests).
//
// Builds whose LibTorch has no SDPA (Debian's 1.13; FASTUDY_TORCH_SDPA = 0 in fastudy/version.hpp)
// compile this file too: sdpa_attention then throws fastudy::Error naming the LibTorch version, and
// load_study already refuses the kinds with exit 2 (src/core/grid.cpp, the `attention` axis).
#pragma once

#include <ATen/core/Tensor.h>

#include "src/core/config.hpp"

namespace fastudy::train {

// softmax(q k^T / sqrt(d) [+ causal mask]) v for q, k, v [B, H, N, d] of one dtype on one device,
// differentiable (LibTorch's autograd). Only `backend` is allowed while it runs; the previous backend
// switches are restored afterwards. Throws fastudy::Error when the backend cannot run these inputs
// (LibTorch's reason: dtype, device, head dim) or the build has no SDPA.
at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             SdpaBackend backend, bool causal);

}  // namespace fastudy::train
