// The tensor-core attention forward of the fp16 readings (fa2/fa3, mixed, eager): the explicit
// instantiations of mma_forward<R> (kernels/cuda/mma_dispatch.hpp), one file per pass and format so
// that nvcc compiles them in parallel.
#include "kernels/cuda/mma_launch.cuh"

namespace fastudy::cuda_mma {

#define FASTUDY_MMA_INSTANTIATE(R) template void mma_forward<R>(const MmaForwardCall&, cudaStream_t);
FASTUDY_MMA_ROUNDINGS(FASTUDY_MMA_INSTANTIATE, Format::fp16)
#undef FASTUDY_MMA_INSTANTIATE

}  // namespace fastudy::cuda_mma
