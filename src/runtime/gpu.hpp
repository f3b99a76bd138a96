// This rank's GPU: how many it sees, and which one it uses. One GPU per rank, chosen by node-local
// rank: device = local rank mod visible devices (with one visible device per rank, Slurm
// --gpus-per-task=1 or CUDA_VISIBLE_DEVICES, that is device 0). The node-local rank comes from the
// launcher (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID, PMI_LOCAL_RANK); without one,
// it is the rank's position among the group's ranks on the same host.
// Builds without the CUDA kernels (no nvcc) see no GPU.
#pragma once

#include <string>

#include "src/runtime/mpi.hpp"

namespace fastudy {

// The node-local rank from the launcher's environment, or -1 when no launcher variable is set.
int local_rank_from_env();

// Visible CUDA devices; 0 when there is none, no driver or no CUDA in this build (why says which).
int visible_gpus(std::string* why = nullptr);

// Whether this rank can train on a GPU: the build's LibTorch has CUDA (FASTUDY_TORCH_CUDA) and the rank
// sees a device (why, if given, says what is missing).
bool rank_has_gpu(std::string* why = nullptr);

// Chooses and makes current (cudaSetDevice) this rank's GPU as described above; returns its index.
// Collective over group only when the environment names no local rank (hostnames are gathered).
// Throws UsageError naming the rank when it sees no GPU.
int select_gpu(const mpi::Comm& group);

}  // namespace fastudy
