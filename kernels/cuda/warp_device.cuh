// The device side of the warp context the tensor-core kernels (kernels/cuda/mma_attention.hpp) are
// written against: lane ids, shuffles, barriers, mma.sync m16n8k16, ldmatrix and cp.async as inline PTX
// (PTX ISA: mma, ldmatrix, cp.async). Its host twin, which runs the same kernel code on the CPU with
// 32 threads per warp and the MMA model, is tests/gpu/warp_sim.hpp. Include from .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/format.hpp"

namespace fastudy::cuda_mma {

struct DeviceWarp {
  __device__ int thread() const { return static_cast<int>(threadIdx.x); }
  __device__ int lane() const { return static_cast<int>(threadIdx.x & 31u); }
  __device__ int warp() const { return static_cast<int>(threadIdx.x >> 5); }
  __device__ float shfl_xor(float v, int mask) const { return __shfl_xor_sync(0xFFFFFFFFu, v, mask); }
  __device__ float shfl(float v, int src) const { return __shfl_sync(0xFFFFFFFFu, v, src); }
  __device__ void sync_warp() const { __syncwarp(); }
  __device__ void sync_block() const { __syncthreads(); }

  // d += A B for one m16n8k16 (A: 4 registers, B: 2), fp32 accumulators.
  template <Format S>
  __device__ void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) const {
    if constexpr (S == Format::bf16) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
      static_assert(S == Format::fp16, "mma: fp16 or bf16 operands");
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
  }

  // ldmatrix m8n8.x4 (b16) from shared memory; p: the row this lane addresses.
  __device__ void ldsm_x4(std::uint32_t (&r)[4], const std::uint16_t* p) const {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  }
  __device__ void ldsm_x4_trans(std::uint32_t (&r)[4], const std::uint16_t* p) const {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  }

  // 16 bytes global -> shared, asynchronous; zeros where !valid (src-size 0: nothing is read).
  __device__ void cp_async16(std::uint16_t* dst, const std::uint16_t* src, bool valid) const {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(bytes) : "memory");
  }
  __device__ void cp_commit() const { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
  template <int N>
  __device__ void cp_wait() const {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
  }
};

}  // namespace fastudy::cuda_mma
