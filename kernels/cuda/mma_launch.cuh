// The __global__ wrappers and launchers of the tensor-core attention kernels (see mma_dispatch.hpp);
// included by the four instantiation files mma_attention_{forward,backward}_{fp16,bf16}.cu, each of
// which compiles one pass for one storage format (so that nvcc runs them in parallel).
//
// B batch, H heads, N sequence, d head dim. Head dims up to 64 run the kernels sized for 64 columns and
// KV tiles of up to 128 keys, up to 128 those sized for 128 columns and 64 keys (mma_d_max, mma_bc_max).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/mma_dispatch.hpp"
#include "kernels/cuda/warp_device.cuh"

namespace fastudy::cuda_mma {

template <class R, class T>
__global__ void __launch_bounds__(T::kThreads) mma_forward_kernel(ForwardArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  DeviceWarp cx;
  mma_forward_block<R, T>(cx, a, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), smem);
}

template <class R, class T>
__global__ void __launch_bounds__(T::kThreads) mma_dkdv_kernel(BackwardArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  DeviceWarp cx;
  mma_dkdv_block<R, T>(cx, a, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), smem);
}

template <class R, class T>
__global__ void __launch_bounds__(T::kThreads) mma_dq_kernel(BackwardArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  DeviceWarp cx;
  mma_dq_block<R, T>(cx, a, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), smem);
}

// Operands rounded to the storage format S (the kernels' storage steps are all S), Q scaled for the
// framework's `before` placement (q(q(Q) scale), scale != 0), as 16-bit patterns (prepared_bits).
template <Format S, class In>
__global__ void prepare_kernel(const In* in, std::uint16_t* out, std::int64_t n, float scale) {
  for (std::int64_t x = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; x < n;
       x += std::int64_t(gridDim.x) * blockDim.x) {
    if constexpr (sizeof(In) == 4) out[x] = prepared_bits<S>(in[x], scale);
    else out[x] = prepared_bits<S>(storage_value<S>(in[x]), scale);
  }
}

// D_i (and fa2/fa3's lse_i log2 e) of each row from the prepared dO and O (d <= 128): row_delta.
template <class R>
__global__ void delta_kernel(TileHead h, std::int64_t rows, const std::uint16_t* dout, const std::uint16_t* o,
                             const float* lse, float* dd, float* lse2) {
  constexpr Format S = R::kStorage;
  const std::int64_t row = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (row >= rows) return;
  float g[128], y[128];
  for (int t = 0; t < h.d; ++t) {
    g[t] = storage_value<S>(dout[row * h.d + t]);
    y[t] = storage_value<S>(o[row * h.d + t]);
  }
  float l2;
  row_delta<R>(h, g, y, lse[row], dd[row], l2);
  if constexpr (!kFramework<R>) lse2[row] = l2;
}

// The opt-in dynamic shared memory of a kernel, raised once to the largest size asked for.
template <class K>
void allow_smem(K kernel, std::size_t bytes, std::atomic<std::size_t>& allowed) {
  std::size_t have = allowed.load();
  if (bytes <= have || bytes <= 48 * 1024) return;
  int device = 0, optin = 0;
  FASTUDY_CUDA_CHECK(cudaGetDevice(&device));
  FASTUDY_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<std::size_t>(optin)) {
    throw UsageError("the tensor-core attention kernels need " + std::to_string(bytes) +
                         " bytes of shared memory per block; this device allows " + std::to_string(optin),
                     "use smaller block_kv, or a head dim up to 128");
  }
  FASTUDY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  while (have < bytes && !allowed.compare_exchange_weak(have, bytes)) {
  }
}

inline unsigned prepare_blocks(std::int64_t n) {
  const std::int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 65535 ? b : 65535);
}

template <Format S>
const std::uint16_t* prepared_operand(Format storage, const void* in, std::uint16_t* out, std::int64_t n, float scale,
                                      cudaStream_t stream) {
  if (out == nullptr) return static_cast<const std::uint16_t*>(in);
  if (storage == Format::fp32) {
    prepare_kernel<S, float><<<prepare_blocks(n), 256, 0, stream>>>(static_cast<const float*>(in), out, n, scale);
  } else {
    prepare_kernel<S, std::uint16_t><<<prepare_blocks(n), 256, 0, stream>>>(static_cast<const std::uint16_t*>(in), out, n,
                                                                            scale);
  }
  FASTUDY_CUDA_CHECK(cudaGetLastError());
  return out;
}

template <class R, int DMax>
void forward_with(const ForwardArgs& a, std::int64_t heads, cudaStream_t stream) {
  using T = MmaTraits<DMax, DMax == 64 ? 128 : 64>;
  static std::atomic<std::size_t> allowed{0};
  const std::size_t bytes = forward_smem_bytes(a.h.d, a.h.bc, kFramework<R>);
  allow_smem(mma_forward_kernel<R, T>, bytes, allowed);
  const dim3 grid(static_cast<unsigned>((a.h.n + T::kBlockRows - 1) / T::kBlockRows), static_cast<unsigned>(heads));
  mma_forward_kernel<R, T><<<grid, T::kThreads, bytes, stream>>>(a);
  FASTUDY_CUDA_CHECK(cudaGetLastError());
}

template <class R, int DMax>
void backward_with(const BackwardArgs& a, std::int64_t heads, cudaStream_t stream) {
  using T = MmaTraits<DMax, DMax == 64 ? 128 : 64>;
  static std::atomic<std::size_t> allowed_dkdv{0}, allowed_dq{0};
  const std::size_t dkdv_bytes = dkdv_smem_bytes(a.h.d, kFramework<R> && a.h.ops), dq_bytes = dq_smem_bytes(a.h.d);
  allow_smem(mma_dkdv_kernel<R, T>, dkdv_bytes, allowed_dkdv);
  allow_smem(mma_dq_kernel<R, T>, dq_bytes, allowed_dq);
  const dim3 grid(static_cast<unsigned>((a.h.n + 63) / 64), static_cast<unsigned>(heads));
  mma_dkdv_kernel<R, T><<<grid, T::kThreads, dkdv_bytes, stream>>>(a);
  FASTUDY_CUDA_CHECK(cudaGetLastError());
  mma_dq_kernel<R, T><<<grid, T::kThreads, dq_bytes, stream>>>(a);
  FASTUDY_CUDA_CHECK(cudaGetLastError());
}

template <class R>
void mma_forward(const MmaForwardCall& c, cudaStream_t stream) {
  constexpr Format S = R::kStorage;
  const std::int64_t total = c.heads * c.h.n * c.h.d;
  const float q_scale = c.h.placement == ScalePlacement::before && kFramework<R> ? c.h.scale : 0.0f;
  std::uint16_t* ws = c.prepared;
  ForwardArgs a;
  a.h = c.h;
  a.order = c.order;
  a.q = prepared_operand<S>(c.storage, c.q, ws, total, q_scale, stream);
  a.k = prepared_operand<S>(c.storage, c.k, ws ? ws + total : nullptr, total, 0.0f, stream);
  a.v = prepared_operand<S>(c.storage, c.v, ws ? ws + 2 * total : nullptr, total, 0.0f, stream);
  a.o = c.o;
  a.o_float = c.storage == Format::fp32;
  a.lse = c.lse;
  if (mma_d_max(c.h.d) == 64) forward_with<R, 64>(a, c.heads, stream);
  else forward_with<R, 128>(a, c.heads, stream);
}

template <class R>
void mma_backward(const MmaBackwardCall& c, cudaStream_t stream) {
  constexpr Format S = R::kStorage;
  const std::int64_t total = c.heads * c.h.n * c.h.d, rows = c.heads * c.h.n;
  const float q_scale = c.h.placement == ScalePlacement::before && kFramework<R> ? c.h.scale : 0.0f;
  std::uint16_t* ws = c.prepared;
  BackwardArgs a;
  a.h = c.h;
  a.q = prepared_operand<S>(c.storage, c.q, ws, total, q_scale, stream);
  a.k = prepared_operand<S>(c.storage, c.k, ws ? ws + total : nullptr, total, 0.0f, stream);
  a.v = prepared_operand<S>(c.storage, c.v, ws ? ws + 2 * total : nullptr, total, 0.0f, stream);
  a.dout = prepared_operand<S>(c.storage, c.dout, ws ? ws + 3 * total : nullptr, total, 0.0f, stream);
  const std::uint16_t* o = prepared_operand<S>(c.storage, c.o, ws ? ws + 4 * total : nullptr, total, 0.0f, stream);
  delta_kernel<R><<<static_cast<unsigned>((rows + 127) / 128), 128, 0, stream>>>(c.h, rows, a.dout, o, c.lse, c.dd,
                                                                                 c.lse2);
  FASTUDY_CUDA_CHECK(cudaGetLastError());
  a.lse = kFramework<R> ? c.lse : c.lse2;
  a.dd = c.dd;
  a.dq = c.dq;
  a.dk = c.dk;
  a.dv = c.dv;
  a.grad_float = c.storage == Format::fp32;
  if (mma_d_max(c.h.d) == 64) backward_with<R, 64>(a, c.heads, stream);
  else backward_with<R, 128>(a, c.heads, stream);
}

}  // namespace fastudy::cuda_mma
