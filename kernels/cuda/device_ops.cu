// Small device helpers (see device_ops.hpp).
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_ops.hpp"

namespace fastudy::cuda {
namespace {

template <class T>
__global__ void divide_kernel(T* data, std::size_t n, T divisor) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    data[i] /= divisor;
}

template <class T>
void divide(T* data, std::size_t n, T divisor, cudaStream_t stream) {
  if (n == 0) return;
  constexpr unsigned kThreads = 256;
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  divide_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(data, n, divisor);
  FASTUDY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void divide_on_device(float* data, std::size_t n, float divisor, cudaStream_t stream) {
  divide(data, n, divisor, stream);
}
void divide_on_device(double* data, std::size_t n, double divisor, cudaStream_t stream) {
  divide(data, n, divisor, stream);
}

}  // namespace fastudy::cuda
