// The one wrapper of CUDA runtime calls: FASTUDY_CUDA_CHECK(call) throws CudaError naming the call,
// the rank (like MpiError and NcclError, once the MPI runtime has set it), file:line and
// cudaGetErrorString. Plus DeviceBuffer, the RAII owner of one cudaMalloc allocation.
// Host code; include from .cu or .cpp files compiled against the CUDA toolkit headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "base/error.hpp"

namespace fastudy::cuda {

class CudaError : public Error {
 public:
  CudaError(const std::string& call, cudaError_t code, const char* file, int line)
      : Error(call + " failed" + (process_rank() >= 0 ? " on rank " + std::to_string(process_rank()) : std::string()) +
                  " (" + file + ":" + std::to_string(line) + "): " + cudaGetErrorString(code),
              "check that a CUDA device is visible (nvidia-smi, CUDA_VISIBLE_DEVICES) and the driver matches "
              "the toolkit"),
        code_(code),
        rank_(process_rank()) {}
  cudaError_t code() const { return code_; }
  int rank() const { return rank_; }  // -1: outside an MPI run

 private:
  cudaError_t code_;
  int rank_;
};

inline void check(cudaError_t code, const char* call, const char* file, int line) {
  if (code != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    throw CudaError(call, code, file, line);
  }
}

#define FASTUDY_CUDA_CHECK(call) ::fastudy::cuda::check((call), #call, __FILE__, __LINE__)

// Device memory for n elements of T, freed on destruction.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n > 0) FASTUDY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (p_) cudaFree(p_);
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace fastudy::cuda
