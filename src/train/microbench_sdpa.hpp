// The framework's real kernels as microbenchmark algorithms: LibTorch's scaled_dot_product_attention
// with one backend at a time (src/train/sdpa.hpp) on the inputs of a prepared point, on a CUDA device,
// in the point's format (fp16 or bf16 tensors). Part of fastudy-main only (LibTorch; fastudy-lite and
// the kernels library stay free of it). docs/microbench.md "Real kernels".
#pragma once

#include <string>
#include <vector>

#include "kernels/microbench.hpp"

namespace fastudy {

// Whether this process can run them: a LibTorch with SDPA and CUDA that sees a device; `why` says
// what is missing otherwise.
bool sdpa_device_available(std::string* why);
// The number of CUDA devices LibTorch sees (0 without a CUDA LibTorch).
int sdpa_device_count();

// The row of `backend` ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn" or "sdpa_math") on CUDA device
// `device`: the run's rounded Q, K, V (exact in the point's format) as fp16/bf16 tensors [B, H, N, d],
// softmax(q k^T / sqrt(d) [causal]) v, and on a backward point the gradients of O . dO by LibTorch's
// autograd (dO in the point's format); against the run's fp64 golden value. tiles_kv and
// rescales_per_row are 0 (the framework's tiles are its own). `values`, when given, receives the
// backend's output as the row compares it. Throws Error when the backend cannot run the point
// (LibTorch's reason) and UsageError for a format other than fp16/bf16.
MicrobenchRow microbench_sdpa_row(const MicrobenchRun& run, const std::string& backend, int device,
                                  std::vector<double>* values = nullptr);

}  // namespace fastudy
