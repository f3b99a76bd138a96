// FASTUDY_HD marks a function that both the host compiler and nvcc compile (__host__ __device__ under
// nvcc, nothing elsewhere): the per-value arithmetic the CPU kernels share with kernels/cuda.
#pragma once

#if defined(__CUDACC__)
#define FASTUDY_HD __host__ __device__
#else
#define FASTUDY_HD
#endif
