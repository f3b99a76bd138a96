// Gradient averaging inside a rank group (data parallelism), behind one small interface.
//
// The trainer buckets all gradients of a step into one flat buffer and calls allreduce_mean once:
// afterwards every rank of the group holds the element-wise mean over the group's ranks. Backends:
// "mpi" (MPI_Allreduce on the group's communicator; host buffers, or device buffers on a host copy)
// and "nccl" (CUDA builds with NCCL, one GPU per rank; device buffers). The result is deterministic
// for a fixed group size and backend: the reduction order depends only on the rank count, so resumed
// runs are bit-identical.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "src/runtime/mpi.hpp"

namespace fastudy {

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // In place: data[i] <- (sum over the group's ranks of data[i]) / group size. Collective.
  virtual void allreduce_mean(float* data, std::size_t n) = 0;
  virtual void allreduce_mean(double* data, std::size_t n) = 0;
  virtual const char* name() const = 0;  // "mpi" or "nccl"
};

// backend: "auto" (nccl when this build has NCCL and every rank of the group has a GPU of its own,
// placement.hpp's choose_reducer on every rank's current device; else mpi), "mpi", or "nccl" (throws
// UsageError in a build without NCCL, on ranks without a device, or when two ranks share a GPU).
// The mpi backend takes host buffers, or device buffers of the current device, which it averages on
// a host copy (copied to the host, MPI_Allreduce, divided, copied back); the nccl backend takes host
// buffers (staged through the device) or device buffers. Both divide the sum by the group size (one
// IEEE division), so for 2 ranks they give the same bits; for more ranks the sum's order is each
// library's own. The group communicator must outlive the reducer. Collective over the group.
std::unique_ptr<GradientReducer> make_reducer(const mpi::Comm& group, const std::string& backend);

// Whether this build contains the NCCL backend.
bool have_nccl();

}  // namespace fastudy
