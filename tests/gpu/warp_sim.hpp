// The host side of the warp context of the tensor-core kernels (kernels/cuda/mma_attention.hpp): one
// thread block run on the CPU with one std::thread per CUDA thread, the warp's collective operations
// (shuffles, mma.sync, ldmatrix) done in lockstep at a barrier of its 32 threads, __syncthreads a
// barrier of the block, cp.async copies held back until the cp.async.wait_group that covers them. The
// data movement follows the PTX ISA's maps (kernels/cuda/mma_layout.hpp, checked against the ISA's
// tables by tests/gpu/test_mma_sim.cpp) and each MMA output is the MMA model's (cuda_tile::mma16),
// so the kernel code the GPU runs is run here, on the same inputs, bit for bit. For tests: slow
// (a barrier per collective), small shapes only.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "kernels/cuda/mma_layout.hpp"
#include "kernels/format.hpp"

namespace fastudy::cuda_mma {

// A reusable barrier of `count` threads; a thread left waiting for more than a minute means the code
// under test diverged at a collective (undefined behaviour on the device): the process aborts, naming it.
class SimBarrier {
 public:
  explicit SimBarrier(int count) : count_(count) {}
  void wait(const char* what);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_, arrived_ = 0;
  unsigned generation_ = 0;
};

struct SimWarpShared {
  SimBarrier barrier{kWarpSize};
  float value[kWarpSize];
  std::uint32_t a[kWarpSize][4], b[kWarpSize][2];
  float c[kWarpSize][4];
  const std::uint16_t* address[kWarpSize];
};

struct SimBlockShared {
  explicit SimBlockShared(int threads, std::size_t smem_bytes);
  int threads;
  SimBarrier barrier;
  std::vector<SimWarpShared> warps;
  std::vector<unsigned char> smem;  // the block's shared memory (zeroed: the device's is not)
};

class HostWarp {
 public:
  HostWarp(SimBlockShared& block, int thread) : block_(block), thread_(thread) {}
  int thread() const { return thread_; }
  int lane() const { return thread_ & 31; }
  int warp() const { return thread_ >> 5; }
  float shfl_xor(float v, int mask) const;
  float shfl(float v, int src) const;
  void sync_warp() const { shared().barrier.wait("__syncwarp"); }
  void sync_block() const { block_.barrier.wait("__syncthreads"); }

  template <Format S>
  void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) const {
    mma_impl(d, a, b0, b1, S == Format::bf16);
  }
  void ldsm_x4(std::uint32_t (&r)[4], const std::uint16_t* p) const { ldsm_impl(r, p, false); }
  void ldsm_x4_trans(std::uint32_t (&r)[4], const std::uint16_t* p) const { ldsm_impl(r, p, true); }
  void cp_async16(std::uint16_t* dst, const std::uint16_t* src, bool valid);
  void cp_commit();
  template <int N>
  void cp_wait() {
    cp_wait_impl(N);
  }

 private:
  SimWarpShared& shared() const { return block_.warps[static_cast<std::size_t>(warp())]; }
  void mma_impl(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1, bool bf16) const;
  void ldsm_impl(std::uint32_t (&r)[4], const std::uint16_t* p, bool trans) const;
  void cp_wait_impl(int pending);

  struct Copy {
    std::uint16_t* dst;
    std::uint16_t data[8];
  };
  SimBlockShared& block_;
  int thread_;
  std::vector<std::vector<Copy>> groups_;  // committed groups, oldest first
  std::vector<Copy> open_;                 // copies since the last commit
};

// Runs body(ctx, smem) for every thread of one block of `threads` threads (a multiple of 32) with
// `smem_bytes` of shared memory, each thread on its own std::thread; returns when all have finished.
void simulate_block(int threads, std::size_t smem_bytes, const std::function<void(HostWarp&, unsigned char*)>& body);

}  // namespace fastudy::cuda_mma
