// The points of a grid's [[microbench.sweeps]]: `fastudy microbench` runs them (microbench.cpp, which
// expands them), `fastudy advise` runs the precision advisor on those it can advise on (advise.cpp).
#pragma once

#include <string>
#include <vector>

#include "kernels/microbench.hpp"
#include "src/core/config.hpp"

namespace fastudy {

struct SweepPoint {
  std::string sweep;
  MicrobenchPoint point;
  const MicrobenchSweep* source = nullptr;  // the sweep it came from (captured inputs: where they are)
  bool cuda = false;                        // also our CUDA kernels (devices lists "cuda")
  std::vector<std::string> framework;       // a framework point (policy "native"): these SDPA backends
  std::vector<std::string> torch_cpu;       // also these LibTorch CPU algorithms (microbench_torch.hpp)
  // A framework point: the tiles of the kernel of the reading that claims to model a backend (kRealCode),
  // which its rows are compared with: the sweep's first tiles at the point's head dim.
  int reading_block_q = 0, reading_block_kv = 0;
};

// Every point of every sweep, in order: per sweep pass, format, policy, rounding, N, d, tiles, loop order,
// causal, trial; a sweep with `framework` adds its points of policy "native". A captured sweep takes the
// model's shape (UsageError when its variant or layer is not the study's).
std::vector<SweepPoint> expand_points(const Study& st);

}  // namespace fastudy
