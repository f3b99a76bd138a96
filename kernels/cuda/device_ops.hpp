// Small device helpers for host code that is not compiled by nvcc (src/runtime/nccl_reducer.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace fastudy::cuda {

// data[i] /= divisor on the device, asynchronously on stream (division, as the mpi reducer does).
void divide_on_device(float* data, std::size_t n, float divisor, cudaStream_t stream);
void divide_on_device(double* data, std::size_t n, double divisor, cudaStream_t stream);

}  // namespace fastudy::cuda
