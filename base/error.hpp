// Errors a user can act on. Library code throws; only main() decides the exit code and, on an MPI
// run, ends the whole job. Exit codes: 0 success, 1 runtime failure, 2 usage or configuration error.
#pragma once

#include <stdexcept>
#include <string>

namespace fastudy {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// A runtime failure with an optional hint (printed as "hint: ..."). Wrappers of C APIs (HDF5, MPI,
// NCCL, CUDA) derive from it and put the call, the rank and file:line into the message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string hint = {})
      : std::runtime_error(message), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

// This process's rank in the job (MPI_COMM_WORLD), for the messages of layers below the MPI runtime
// (the CUDA kernels): -1 until the runtime sets it, which mpi::MpiSession does right after MPI_Init.
int process_rank();
void set_process_rank(int rank);

// A usage error (bad command line, impossible rank layout): exit code 2, nothing written.
class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace fastudy
