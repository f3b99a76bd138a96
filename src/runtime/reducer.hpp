// Gradient averaging inside a rank group (data parallelism), behind one small interface.
//
// The trainer buckets all gradients of a step into one flat buffer and calls allreduce_mean once:
// afterwards every rank of the group holds the element-wise mean over the group's ranks. Backends:
// "mpi" (MPI_Allreduce on the group's communicator, CPU buffers) and "nccl" (CUDA builds with NCCL;
// device buffers). The result is deterministic for a fixed group size and backend: the reduction
// order depends only on the rank count, so resumed runs are bit-identical.
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

// backend: "auto" (nccl when this build has NCCL and every rank of the group sees a CUDA device, else
// mpi), "mpi", or "nccl" (throws UsageError in a build without NCCL or on ranks without a device).
// The mpi backend takes host buffers; the nccl backend takes host buffers (staged through the device) or device buffers of the current device. The group communicator must outlive the
// reducer. Collective over the group (NCCL exchanges its unique id over the group's communicator).
std::unique_ptr<GradientReducer> make_reducer(const mpi::Comm& group, const std::string& backend);

// Whether this build contains the NCCL backend.
bool have_nccl();

}  // namespace fastudy
