// The microbench job's CUDA preflight (docs/microbench.md "Real kernels"): before any work, every rank checks that
// it sees a CUDA device for the sweeps that need one (our kernels: devices lists "cuda"; the
// framework's: framework = [...]) and that the device holds our flash kernel's tiles at every point of
// our CUDA kernels. A failure is a UsageError (exit 2) on every rank, naming the grid file, the sweep,
// the key and the reason.
#pragma once

#include <string>
#include <vector>

#include "src/core/config.hpp"
#include "src/runtime/mpi.hpp"

namespace fastudy {

// Whether sweep `sw` runs our CUDA kernels (its devices list "cuda").
bool runs_our_cuda_kernels(const MicrobenchSweep& sw);

// The tiles of one point of our CUDA kernels, and its sweep's name (for the message).
struct CudaPointTiles {
  std::string sweep;
  int block_q = 0, block_kv = 0, head_dim = 0;
};

// Collective over `world`. Returns the device of this rank (select_gpu: the trainer's rule), made
// current; -1 when no sweep of the study needs one. `tiles`: every point of our CUDA kernels, in point
// order (the first that does not fit is named).
int microbench_cuda_preflight(const Study& st, const std::vector<CudaPointTiles>& tiles, mpi::Comm& world);

}  // namespace fastudy
