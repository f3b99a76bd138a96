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
// Device: the current one (the caller chooses it: select_gpu or use_gpu, src/runtime/gpu.hpp). Every
// rank of the group must have its own GPU (NCCL refuses two ranks of a communicator on one GPU);
// make_reducer (reducer.hpp) checks that first (placement.hpp). No device: UsageError with a hint.
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

// Collective over group. The group communicator must outlive the reducer.
std::unique_ptr<GradientReducer> make_nccl_reducer(const mpi::Comm& group);

}  // namespace fastudy::nccl
