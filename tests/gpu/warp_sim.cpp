// The host warp context (see warp_sim.hpp): barriers, shuffles, mma.sync and ldmatrix in lockstep.
#include "tests/gpu/warp_sim.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "kernels/cuda/tile_math.hpp"

namespace fastudy::cuda_mma {

void SimBarrier::wait(const char* what) {
  std::unique_lock<std::mutex> lock(mutex_);
  const unsigned generation = generation_;
  if (++arrived_ == count_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != generation; })) {
    std::fprintf(stderr, "warp simulation: %d of %d threads waited a minute at %s: the threads diverged at a "
                         "collective (undefined on the device)\n", arrived_, count_, what);
    std::abort();
  }
}

SimBlockShared::SimBlockShared(int threads, std::size_t smem_bytes)
    : threads(threads), barrier(threads), warps(static_cast<std::size_t>(threads / kWarpSize)), smem(smem_bytes, 0) {}

float HostWarp::shfl_xor(float v, int mask) const {
  SimWarpShared& w = shared();
  w.value[lane()] = v;
  w.barrier.wait("shfl_xor");
  const float r = w.value[lane() ^ mask];
  w.barrier.wait("shfl_xor");
  return r;
}

float HostWarp::shfl(float v, int src) const {
  SimWarpShared& w = shared();
  w.value[lane()] = v;
  w.barrier.wait("shfl");
  const float r = w.value[src & 31];
  w.barrier.wait("shfl");
  return r;
}

void HostWarp::mma_impl(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1,
                        bool bf16) const {
  SimWarpShared& w = shared();
  const int me = lane();
  std::memcpy(w.a[me], a, sizeof a);
  w.b[me][0] = b0;
  w.b[me][1] = b1;
  std::memcpy(w.c[me], d, sizeof d);
  w.barrier.wait("mma.sync");
  // The whole 16 x 16 A and 16 x 8 B from every lane's fragment (the ISA's maps), then this lane's four
  // outputs, each one MMA-model output.
  float A[16][16], B[16][8];
  for (int l = 0; l < kWarpSize; ++l) {
    for (int i = 0; i < 8; ++i) {
      const RowCol rc = a_element(l, i);
      A[rc.row][rc.col] = bf16 ? unpack_half<Format::bf16>(w.a[l][i / 2], i % 2) : unpack_half<Format::fp16>(w.a[l][i / 2], i % 2);
    }
    for (int i = 0; i < 4; ++i) {
      const RowCol rc = b_element(l, i);
      B[rc.row][rc.col] = bf16 ? unpack_half<Format::bf16>(w.b[l][i / 2], i % 2) : unpack_half<Format::fp16>(w.b[l][i / 2], i % 2);
    }
  }
  for (int i = 0; i < 4; ++i) {
    const RowCol rc = c_element(me, i);
    float col[16];
    for (int k = 0; k < 16; ++k) col[k] = B[k][rc.col];
    d[i] = bf16 ? cuda_tile::mma16<Format::bf16>(A[rc.row], col, w.c[me][i])
                : cuda_tile::mma16<Format::fp16>(A[rc.row], col, w.c[me][i]);
  }
  w.barrier.wait("mma.sync");
}

void HostWarp::ldsm_impl(std::uint32_t (&r)[4], const std::uint16_t* p, bool trans) const {
  SimWarpShared& w = shared();
  const std::ptrdiff_t offset = reinterpret_cast<const unsigned char*>(p) - block_.smem.data();
  if (offset < 0 || offset + 16 > static_cast<std::ptrdiff_t>(block_.smem.size()) || offset % 16 != 0) {
    std::fprintf(stderr, "warp simulation: ldmatrix address of lane %d (warp %d) is %s\n", lane(), warp(),
                 offset % 16 != 0 ? "not 16-byte aligned" : "outside the block's shared memory");
    std::abort();
  }
  w.address[lane()] = p;
  w.barrier.wait("ldmatrix");
  for (int j = 0; j < 4; ++j) {
    std::uint32_t reg = 0;
    for (int half = 0; half < 2; ++half) {
      const RowCol rc = ldsm_element(lane(), half, trans);
      const std::uint16_t v = w.address[8 * j + rc.row][rc.col];
      reg |= static_cast<std::uint32_t>(v) << (16 * half);
    }
    r[j] = reg;
  }
  w.barrier.wait("ldmatrix");
}

void HostWarp::cp_async16(std::uint16_t* dst, const std::uint16_t* src, bool valid) {
  const std::ptrdiff_t offset = reinterpret_cast<unsigned char*>(dst) - block_.smem.data();
  if (offset < 0 || offset + 16 > static_cast<std::ptrdiff_t>(block_.smem.size()) || offset % 16 != 0) {
    std::fprintf(stderr, "warp simulation: cp.async destination of thread %d is %s\n", thread_,
                 offset % 16 != 0 ? "not 16-byte aligned" : "outside the block's shared memory");
    std::abort();
  }
  Copy c{dst, {}};
  if (valid) std::memcpy(c.data, src, 16);
  else std::memset(c.data, 0, 16);
  open_.push_back(c);
}

void HostWarp::cp_commit() {
  groups_.push_back(std::move(open_));
  open_.clear();
}

void HostWarp::cp_wait_impl(int pending) {
  while (static_cast<int>(groups_.size()) > pending) {
    for (const Copy& c : groups_.front()) std::memcpy(c.dst, c.data, 16);
    groups_.erase(groups_.begin());
  }
}

void simulate_block(int threads, std::size_t smem_bytes, const std::function<void(HostWarp&, unsigned char*)>& body) {
  SimBlockShared block(threads, smem_bytes);
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&block, &body, t] {
      HostWarp ctx(block, t);
      body(ctx, block.smem.data());
    });
  }
  for (std::thread& th : pool) th.join();
}

}  // namespace fastudy::cuda_mma
