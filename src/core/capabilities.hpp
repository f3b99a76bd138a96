// What a device and this build can run: the questions asked before any work starts (the preflight,
// load_study's refusal of a microbenchmark sweep, the trainer for the device it got). The answers
// read the CUDA kernels' dispatch (kernels/cuda/tile_dispatch.hpp) and the build's LibTorch
// (fastudy/version.hpp: FASTUDY_TORCH_CUDA, FASTUDY_TORCH_SDPA, FASTUDY_CUDA_KERNELS); the
// configuration itself (config.hpp) knows neither.
#pragma once

#include <optional>
#include <string>

#include "src/core/config.hpp"

namespace fastudy {

// Why variant v cannot train on `device` (cpu or cuda, resolved) in this build, or "" when it can:
// a GPU needs a CUDA LibTorch, float containers (not fp64), LibTorch's LayerNorm and, for fastudy's
// attention kinds, a policy the CUDA kernels run (kernels/cuda/tile_dispatch.hpp); native arithmetic
// leaves the emulated [numerics] (matmul, split_k, layernorm) to the emulation, and runs fp16 and tf32
// only on a GPU; shadow attention compares fastudy's two kernels, not an SDPA kind. The preflight asks
// it before any work, the trainer again for the device it got.
std::string device_problem(const Variant& v, Device device);

// What a microbenchmark sweep's real-kernel keys (devices, framework; docs/microbench.md "Real kernels") ask that
// the kernels cannot run (formats, policies, roundings; in every build), or this build cannot (no CUDA
// kernels, no LibTorch SDPA, no CUDA LibTorch): the first problem, with the key it is about, or
// nullopt. load_study refuses it at that key (prefixing the sweep's section to the message).
struct SweepProblem {
  std::string key;      // "devices", "formats", "policies", "roundings" or "framework"
  std::string message;  // "devices lists \"cuda\", and ..."
  std::string hint;
};
std::optional<SweepProblem> real_kernel_problem(const MicrobenchSweep& sw);

}  // namespace fastudy
