// The NCCL gradient-averaging backend: a GradientReducer (src/runtime/reducer.hpp) that sums with
// ncclAllReduce over a rank group and divides by the group size. Rank 0 of the group makes the
// ncclUniqueId and broadcasts it over the group's MPI communicator; every rank then joins with
// ncclCommInitRank on its own device.
//
// Buffers: allreduce_mean takes host or device pointers. Host buffers (the trainer's gradients with
// the CPU LibTorch) are staged through a device buffer: copy in, allreduce, copy out, divide on the
// host. Device buffers (a CUDA LibTorch build, gradients on the current device) are reduced in place
// and divided on the device. The kind is asked from cudaPointerGetAttributes.
//
// Device selection: one GPU per rank by local rank (the node-local rank from the launcher:
// OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID or PMI_LOCAL_RANK; without any, the rank's
// position among the group's ranks on the same host), device = local rank mod visible device count.
// With one visible device per rank (Slurm --gpus-per-task=1, CUDA_VISIBLE_DEVICES) that is device 0.
// No device: UsageError with a hint (use the mpi backend).
//
// Link target fastudy_nccl (built in CUDA builds when nccl.h and libnccl are found; defines
// FASTUDY_HAVE_NCCL for its users).
#pragma once

#include <memory>
#include <string>

#include "base/error.hpp"
#include "src/runtime/mpi.hpp"
#include "src/runtime/reducer.hpp"

namespace fastudy::nccl {

// A failed NCCL call: "ncclCommInitRank failed on rank 3 (file:line): <ncclGetErrorString>".
class NcclError : public Error {
 public:
  NcclError(const std::string& call, int rank, const std::string& what, const char* file, int line);
};

// The node-local rank from the launcher's environment, or -1 when no launcher variable is set.
int local_rank_from_env();

// Chooses and sets (cudaSetDevice) this rank's device as described above; returns its index.
// Collective over group only when the environment names no local rank (hostnames are gathered).
int select_device(const mpi::Comm& group);

// Collective over group. The group communicator must outlive the reducer.
std::unique_ptr<GradientReducer> make_nccl_reducer(const mpi::Comm& group);

}  // namespace fastudy::nccl
