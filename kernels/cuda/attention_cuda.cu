// CUDA attention kernels over the shared tile math (kernels/cuda/tile_math.hpp); the host twin with
// the same loops is kernels/cuda/tile_reference.cpp. Interface: kernels/cuda/attention_cuda.hpp.
//
// B batch, H heads, N sequence, d head dim, Br/Bc block sizes (block_q/block_kv clipped to N).
// Layout of the work (one thread per query row or per key, rounding exactly as the CPU kernels):
//   load        Q, K, V (dO, O) rounded to the policy's storage steps into float workspaces (the
//               baseline's `before` placement then scales Q and rounds it again).
//   flash fwd   a block of Br threads per Q block and head; K/V tiles of Bc rows staged in shared
//               memory, each thread keeps its row's scores (Bc) and running O (d) in shared memory and
//               applies the FA-2 (q_outer) or FA-1 (kv_outer) update per tile, or, for the fa2/fa3
//               readings, the FlashAttention kernels' update with the KV tiles from the last to the first.
//   baseline    one thread per row: the whole score row in a global [N, N] workspace, softmax, P.V.
//   backward    one thread per key (dK, dV: sum over rows in order; fa2: row blocks last to first) and
//               one per row (dQ: sum over keys in order; fa2/fa3: one part per KV tile, added), P
//               recomputed from lse (flash) or from the materialised softmax (baseline): deterministic,
//               no atomics, and the same summation order as the CPU kernels.
// Only explicit fmaf() calls fuse (compiled with --fmad=false), as in the host twin.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/mma_dispatch.hpp"
#include "kernels/cuda/tile_dispatch.hpp"
#include "kernels/cuda/tile_math.hpp"

namespace fastudy::cuda {
namespace {

using namespace fastudy::cuda_tile;

constexpr int kThreads = 128;  // threads per block of the row/key kernels

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__half x) { return __half2float(x); }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) { return x; }
template <>
__device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

enum Step { kStepQ, kStepK, kStepV, kStepO, kStepGrad };

// The baseline's `before` placement: Q = q(q(Q) * scale), in place on the rounded Q.
template <class R>
__global__ void scale_q_kernel(float* q, std::int64_t n, float scale) {
  for (std::int64_t x = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; x < n;
       x += std::int64_t(gridDim.x) * blockDim.x)
    q[x] = R::q(q[x] * scale);
}

template <class T, class R, int S>
__global__ void load_kernel(const T* in, float* out, std::int64_t n) {
  for (std::int64_t x = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; x < n;
       x += std::int64_t(gridDim.x) * blockDim.x) {
    const float f = to_float(in[x]);
    if constexpr (S == kStepQ) out[x] = R::q(f);
    if constexpr (S == kStepK) out[x] = R::k(f);
    if constexpr (S == kStepV) out[x] = R::v(f);
    if constexpr (S == kStepO) out[x] = R::o(f);
    if constexpr (S == kStepGrad) out[x] = R::grad(f);
  }
}

template <class T, class R, LoopOrder Order>
__global__ void flash_forward_kernel(TileHead h, const float* q, const float* k, const float* v, T* o, float* lse) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = ks + h.bc * h.d;
  float* s = vs + h.bc * h.d + threadIdx.x * h.bc;
  float* orow = vs + h.bc * h.d + h.br * h.bc + threadIdx.x * h.d;
  const std::int64_t off = blockIdx.y * h.n * h.d;
  const std::int64_t i0 = std::int64_t(blockIdx.x) * h.br, i = i0 + threadIdx.x;
  const std::int64_t i_end = i0 + h.br < h.n ? i0 + h.br : h.n;
  const std::int64_t j_end = h.causal ? i_end : h.n;
  const bool active = i < h.n;
  for (int t = 0; t < h.d; ++t) orow[t] = 0.0f;
  RowState st{neg_inf(), 0.0f};
  for (std::int64_t j0 = 0; j0 < j_end; j0 += h.bc) {
    const int bc = static_cast<int>(h.n - j0 < h.bc ? h.n - j0 : h.bc);
    for (int x = threadIdx.x; x < bc * h.d; x += blockDim.x) {
      ks[x] = k[off + j0 * h.d + x];
      vs[x] = v[off + j0 * h.d + x];
    }
    __syncthreads();
    if (active) {
      score_row<R>(q + off + i * h.d, ks, h.d, bc, h.d, h.scale, h.causal, i, j0, s, tile_score_of(h));
      if constexpr (Order == LoopOrder::q_outer) {
        flash_q_outer_tile<R>(s, bc, vs, h.d, h.d, j0 > 0, st, orow, h);
      } else {
        flash_kv_outer_tile<R>(s, bc, vs, h.d, h.d, st, orow, h);
      }
    }
    __syncthreads();
  }
  if (!active) return;
  const float l = Order == LoopOrder::q_outer ? flash_q_outer_finish<R>(st, orow, h.d, orow)
                                              : flash_kv_outer_finish<R>(st, orow, h.d, orow);
  for (int t = 0; t < h.d; ++t) o[off + i * h.d + t] = from_float<T>(orow[t]);
  if (lse) lse[blockIdx.y * h.n + i] = l;
}

// fa2 / fa3: the same blocks and shared memory as flash_forward_kernel, KV tiles from the last to the
// first, the FlashAttention kernels' update (flash_kernel_tile).
template <class T, class R>
__global__ void kernel_forward_kernel(TileHead h, const float* q, const float* k, const float* v, T* o, float* lse) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = ks + h.bc * h.d;
  float* s = vs + h.bc * h.d + threadIdx.x * h.bc;
  float* orow = vs + h.bc * h.d + h.br * h.bc + threadIdx.x * h.d;
  const std::int64_t off = blockIdx.y * h.n * h.d;
  const std::int64_t i0 = std::int64_t(blockIdx.x) * h.br, i = i0 + threadIdx.x;
  const std::int64_t i_end = i0 + h.br < h.n ? i0 + h.br : h.n;
  const std::int64_t j_end = h.causal ? i_end : h.n;
  const std::int64_t blocks = (j_end + h.bc - 1) / h.bc;
  const float scale_log2 = scale_log2_of(h.scale);
  const bool active = i < h.n;
  for (int t = 0; t < h.d; ++t) orow[t] = 0.0f;
  KernelRowState st{neg_inf(), {0.0f, 0.0f, 0.0f, 0.0f}};
  for (std::int64_t jb = blocks - 1; jb >= 0; --jb) {
    const std::int64_t j0 = jb * h.bc;
    const int bc = static_cast<int>(h.n - j0 < h.bc ? h.n - j0 : h.bc);
    for (int x = threadIdx.x; x < bc * h.d; x += blockDim.x) {
      ks[x] = k[off + j0 * h.d + x];
      vs[x] = v[off + j0 * h.d + x];
    }
    __syncthreads();
    if (active) {
      score_row<R>(q + off + i * h.d, ks, h.d, bc, h.d, h.scale, h.causal, i, j0, s, TileScore::raw);
      flash_kernel_tile<R>(s, bc, vs, h.d, h.d, jb == blocks - 1, scale_log2, st, orow, h);
    }
    __syncthreads();
  }
  if (!active) return;
  const float l = flash_kernel_finish<R>(h.kernel, st, h.scale, scale_log2, orow, h.d, orow);
  for (int t = 0; t < h.d; ++t) o[off + i * h.d + t] = from_float<T>(orow[t]);
  if (lse) lse[blockIdx.y * h.n + i] = l;
}

template <class T, class R>
__global__ void baseline_forward_kernel(TileHead h, const float* q, const float* k, const float* v, float* s_ws,
                                        float* acc_ws, T* o, float* lse) {
  const std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (i >= h.n) return;
  const std::int64_t head = blockIdx.y, off = head * h.n * h.d, row = head * h.n + i;
  float* s = s_ws + row * h.n;
  float* acc = acc_ws + row * h.d;
  const int n = static_cast<int>(h.n);
  score_row<R>(q + off + i * h.d, k + off, h.d, n, h.d, h.scale, h.causal, i, 0, s, tile_score_of(h));
  const float l = baseline_softmax_row<R>(s, h.n, h);
  for (int t = 0; t < h.d; ++t) acc[t] = 0.0f;
  pv_row<R>(s, v + off, h.d, n, h.d, acc);
  for (int t = 0; t < h.d; ++t) o[off + i * h.d + t] = from_float<T>(R::o(acc[t]));
  if (lse) lse[row] = l;
}

// ---- backward ----------------------------------------------------------------------------------
template <class R>
__global__ void flash_dd_kernel(TileHead h, const float* dout, const float* o, float* dd) {
  const std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (i >= h.n) return;
  const std::int64_t row = blockIdx.y * h.n + i;
  dd[row] = flash_delta<R>(dout + row * h.d, o + row * h.d, h.d, h.ops);
}

// tk, tv: each key's tile sums with h.ops ([B*H*N, d], unused otherwise).
template <class R>
__global__ void flash_dkdv_kernel(TileHead h, const float* q, const float* k, const float* v, const float* dout,
                                  const float* lse, const float* dd, float* dka, float* dva, float* tk, float* tv) {
  const std::int64_t j = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (j >= h.n) return;
  const std::int64_t base = blockIdx.y * h.n, off = base * h.d;
  flash_dkdv_key<R>(h, q + off, k + off, v + off, dout + off, lse + base, dd + base, j, dka + off + j * h.d,
                    dva + off + j * h.d, tk + off + j * h.d, tv + off + j * h.d);
}

// tq: each row's tile sum with h.ops ([B*H*N, d], unused otherwise).
template <class R>
__global__ void flash_dq_kernel(TileHead h, const float* q, const float* k, const float* v, const float* dout,
                                const float* lse, const float* dd, float* dqa, float* tq) {
  const std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (i >= h.n) return;
  const std::int64_t base = blockIdx.y * h.n, off = base * h.d;
  flash_dq_row<R>(h, q + off, k + off, v + off, dout + off, lse + base, dd + base, i, dqa + off + i * h.d,
                  tq + off + i * h.d);
}

// fa2 / fa3: D from dot_do_o and lse * log2 e per row.
template <class R>
__global__ void kernel_dd_kernel(TileHead h, const float* dout, const float* o, const float* lse, float* dd,
                                 float* lse2) {
  const std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (i >= h.n) return;
  const std::int64_t row = blockIdx.y * h.n + i;
  dd[row] = R::stats_running(dot_do_o<R>(h.kernel, dout + row * h.d, o + row * h.d, h.d));
  lse2[row] = kernel_lse_log2<R>(h.kernel, lse[row]);
}

// fa2 / fa3, one thread per key: the row blocks in the kernel's order, the rows of a block in order.
template <class R>
__global__ void kernel_dkdv_kernel(TileHead h, const float* q, const float* k, const float* v, const float* dout,
                                   const float* lse2, const float* dd, float* dka, float* dva) {
  const std::int64_t j = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (j >= h.n) return;
  const std::int64_t base = blockIdx.y * h.n, off = base * h.d;
  kernel_dkdv_key<R>(h, q + off, k + off, v + off, dout + off, lse2 + base, dd + base, j, dka + off + j * h.d,
                     dva + off + j * h.d);
}

// fa2 / fa3, one thread per row: one part of dQ per KV tile, summed from zero, then added.
template <class R>
__global__ void kernel_dq_kernel(TileHead h, const float* q, const float* k, const float* v, const float* dout,
                                 const float* lse2, const float* dd, float* part_ws, float* dqa) {
  const std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (i >= h.n) return;
  const std::int64_t base = blockIdx.y * h.n, off = base * h.d;
  kernel_dq_row<R>(h, q + off, k + off, v + off, dout + off, lse2 + base, dd + base, i, dqa + off + i * h.d,
                   part_ws + off + i * h.d);
}

template <class R>
__global__ void baseline_softmax_backward_kernel(TileHead h, const float* q, const float* k, const float* v,
                                                 const float* dout, float* p_ws, float* ds_ws) {
  const std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (i >= h.n) return;
  const std::int64_t off = blockIdx.y * h.n * h.d, row = blockIdx.y * h.n + i;
  const std::int64_t jn = h.causal ? i + 1 : h.n;
  float* p = p_ws + row * h.n;
  float* ds = ds_ws + row * h.n;
  for (std::int64_t j = 0; j < jn; ++j) {
    p[j] = dot<R>(q + off + i * h.d, k + off + j * h.d, 1, h.d);
    ds[j] = dot<R>(dout + off + i * h.d, v + off + j * h.d, 1, h.d);
  }
  baseline_backward_row<R>(p, ds, jn, h);
}

template <class R>
__global__ void baseline_dkdv_kernel(TileHead h, const float* q, const float* dout, const float* p_ws,
                                     const float* ds_ws, float* dka, float* dva) {
  const std::int64_t j = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (j >= h.n) return;
  const std::int64_t base = blockIdx.y * h.n, off = base * h.d;
  baseline_dkdv_key<R>(h, q + off, dout + off, p_ws + base * h.n, ds_ws + base * h.n, j, dka + off + j * h.d,
                       dva + off + j * h.d);
}

template <class R>
__global__ void baseline_dq_kernel(TileHead h, const float* k, const float* ds_ws, float* dqa) {
  const std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (i >= h.n) return;
  const std::int64_t base = blockIdx.y * h.n, off = base * h.d;
  baseline_dq_row<R>(h, k + off, ds_ws + (base + i) * h.n, i, dqa + off + i * h.d);
}

template <class T, class R>
__global__ void store_gradients_kernel(std::int64_t n, ScalePlacement placement, float scale, const float* dqa,
                                       const float* dka, const float* dva, T* dq, T* dk, T* dv) {
  for (std::int64_t x = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; x < n;
       x += std::int64_t(gridDim.x) * blockDim.x) {
    float gq, gk, gv;
    store_gradient_triple<R>(placement, scale, dqa[x], dka[x], dva[x], gq, gk, gv);
    dq[x] = from_float<T>(gq);
    dk[x] = from_float<T>(gk);
    dv[x] = from_float<T>(gv);
  }
}

// ---- launchers -----------------------------------------------------------------------------------
unsigned elementwise_blocks(std::int64_t n) {
  return static_cast<unsigned>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, 65535));
}
dim3 row_grid(const TileHead& h, std::int64_t heads) {
  return dim3(static_cast<unsigned>((h.n + kThreads - 1) / kThreads), static_cast<unsigned>(heads));
}

template <class T, class R, int S>
void load(const void* in, float* out, std::int64_t n, cudaStream_t stream) {
  load_kernel<T, R, S><<<elementwise_blocks(n), kThreads, 0, stream>>>(static_cast<const T*>(in), out, n);
  FASTUDY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

std::size_t check_flash_tiles(std::int64_t br, std::int64_t bc, std::int64_t d) {
  const std::size_t bytes = sizeof(float) * (2 * std::size_t(bc) * std::size_t(d) + std::size_t(br) * std::size_t(bc) +
                                             std::size_t(br) * std::size_t(d));
  int device = 0, optin = 0;
  FASTUDY_CUDA_CHECK(cudaGetDevice(&device));
  FASTUDY_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<std::size_t>(optin) || br > 1024) {
    throw UsageError("flash tiles Br=" + std::to_string(br) + " Bc=" + std::to_string(bc) + " d=" + std::to_string(d) +
                         " need " + std::to_string(bytes) + " bytes of shared memory and " + std::to_string(br) +
                         " threads per block; this device allows " + std::to_string(optin) + " bytes and 1024 threads",
                     "use smaller block_q/block_kv for the CUDA kernels");
  }
  return bytes;
}

namespace {

template <class T, class R, LoopOrder Order>
void launch_flash_forward(const TileHead& h, std::int64_t heads, const float* q, const float* k, const float* v, T* o,
                          float* lse, cudaStream_t stream) {
  const auto kernel = h.kernel != FlashKernel::framework ? kernel_forward_kernel<T, R> : flash_forward_kernel<T, R, Order>;
  const std::size_t bytes = check_flash_tiles(h.br, h.bc, h.d);
  FASTUDY_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  const dim3 grid(static_cast<unsigned>((h.n + h.br - 1) / h.br), static_cast<unsigned>(heads));
  kernel<<<grid, h.br, bytes, stream>>>(h, q, k, v, o, lse);
  FASTUDY_CUDA_CHECK(cudaGetLastError());
}

// The device memory of one call, carved in order from one workspace: `base` null only measures (the
// pointers stay null and bytes() is the size to allocate).
class Carve {
 public:
  explicit Carve(unsigned char* base) : base_(base) {}
  template <class U>
  U* take(std::int64_t n) {
    offset_ = (offset_ + 255) / 256 * 256;
    U* p = base_ != nullptr ? reinterpret_cast<U*>(base_ + offset_) : nullptr;
    offset_ += static_cast<std::size_t>(n) * sizeof(U);
    return p;
  }
  std::size_t bytes() const { return offset_; }

 private:
  unsigned char* base_;
  std::size_t offset_ = 0;
};

// Which kernels run a call: the tensor-core ones (mma_attention.hpp) for the flash kind of the readings
// with tensor-core products on the shapes they support, the per-row kernels above otherwise.
bool tensor_cores(const AttentionParams& params, const TileHead& h) {
  if (params.attention != AttentionKind::flash || !cuda_mma::mma_supported(h)) return false;
  bool mma = false;
  dispatch_tile_rounding(params.policy, [&](auto rd) { mma = decltype(rd)::kMma; });
  return mma;
}

// The operands of the tensor-core kernels need a copy when they are fp32 tensors (rounded on load) or
// Q takes the `before` scale.
bool needs_prepared(Format storage, const TileHead& h) {
  return storage == Format::fp32 || (h.kernel == FlashKernel::framework && h.placement == ScalePlacement::before);
}

struct ForwardPlan {
  float *qr = nullptr, *kr = nullptr, *vr = nullptr, *s_ws = nullptr, *acc_ws = nullptr;
  std::uint16_t* prepared = nullptr;
  std::size_t bytes = 0;
};

ForwardPlan forward_plan(const AttentionParams& params, const TileHead& h, std::int64_t heads, Format storage,
                         unsigned char* base) {
  Carve c(base);
  ForwardPlan p;
  const std::int64_t total = heads * h.n * h.d;
  if (tensor_cores(params, h)) {
    if (needs_prepared(storage, h)) p.prepared = c.take<std::uint16_t>(3 * total);
  } else {
    p.qr = c.take<float>(total);
    p.kr = c.take<float>(total);
    p.vr = c.take<float>(total);
    if (params.attention == AttentionKind::baseline) {
      p.s_ws = c.take<float>(heads * h.n * h.n);
      p.acc_ws = c.take<float>(total);
    }
  }
  p.bytes = c.bytes();
  return p;
}

struct BackwardPlan {
  float *qr = nullptr, *kr = nullptr, *vr = nullptr, *dor = nullptr, *dqa = nullptr, *dka = nullptr, *dva = nullptr;
  float *p_ws = nullptr, *ds_ws = nullptr, *orr = nullptr, *dd = nullptr, *lse2 = nullptr, *part = nullptr;
  float *tk = nullptr, *tv = nullptr;
  std::uint16_t* prepared = nullptr;
  std::size_t bytes = 0;
};

BackwardPlan backward_plan(const AttentionParams& params, const TileHead& h, std::int64_t heads, Format storage,
                           unsigned char* base) {
  Carve c(base);
  BackwardPlan p;
  const std::int64_t total = heads * h.n * h.d, rows = heads * h.n;
  if (tensor_cores(params, h)) {
    if (needs_prepared(storage, h)) p.prepared = c.take<std::uint16_t>(5 * total);
    p.dd = c.take<float>(rows);
    p.lse2 = c.take<float>(rows);
  } else {
    for (float** x : {&p.qr, &p.kr, &p.vr, &p.dor, &p.dqa, &p.dka, &p.dva}) *x = c.take<float>(total);
    if (params.attention == AttentionKind::baseline) {
      p.p_ws = c.take<float>(heads * h.n * h.n);
      p.ds_ws = c.take<float>(heads * h.n * h.n);
    } else if (h.kernel != FlashKernel::framework) {
      p.orr = c.take<float>(total);
      p.dd = c.take<float>(rows);
      p.lse2 = c.take<float>(rows);
      p.part = c.take<float>(total);
    } else {
      p.orr = c.take<float>(total);
      p.dd = c.take<float>(rows);
      p.tk = c.take<float>(h.ops ? total : 1);
      p.tv = c.take<float>(h.ops ? total : 1);
    }
  }
  p.bytes = c.bytes();
  return p;
}

// Runs f(base) on the caller's workspace (asynchronously), or on a buffer of its own that is freed
// after the stream has run the call.
template <class F>
void with_workspace(void* workspace, std::size_t bytes, cudaStream_t stream, F&& f) {
  if (workspace != nullptr) {
    f(static_cast<unsigned char*>(workspace));
    return;
  }
  DeviceBuffer<unsigned char> own(bytes);
  f(own.get());
  FASTUDY_CUDA_CHECK(cudaStreamSynchronize(stream));  // before the workspace is freed
}

template <class T, class R>
void forward_impl(const AttentionShape& shape, const AttentionParams& params, Format storage, const void* q,
                  const void* k, const void* v, void* o, float* lse, cudaStream_t stream, void* workspace) {
  const TileHead h = make_tile_head(shape, params);
  const std::int64_t heads = shape.batch * shape.heads, total = heads * h.n * h.d;
  T* out = static_cast<T*>(o);
  const std::size_t bytes = forward_plan(params, h, heads, storage, nullptr).bytes;
  with_workspace(workspace, bytes, stream, [&](unsigned char* base) {
    const ForwardPlan w = forward_plan(params, h, heads, storage, base);
    if constexpr (R::kMma) {
      if (tensor_cores(params, h)) {
        const cuda_mma::MmaForwardCall call{h, params.order, heads, storage, q, k, v, o, lse, w.prepared};
        cuda_mma::mma_forward<R>(call, stream);
        return;
      }
    }
    load<T, R, kStepQ>(q, w.qr, total, stream);
    load<T, R, kStepK>(k, w.kr, total, stream);
    load<T, R, kStepV>(v, w.vr, total, stream);
    if (h.placement == ScalePlacement::before) {  // the framework kinds' `before`
      scale_q_kernel<R><<<elementwise_blocks(total), kThreads, 0, stream>>>(w.qr, total, h.scale);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
    }
    if (params.attention == AttentionKind::baseline) {
      baseline_forward_kernel<T, R><<<row_grid(h, heads), kThreads, 0, stream>>>(h, w.qr, w.kr, w.vr, w.s_ws, w.acc_ws,
                                                                                out, lse);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
    } else if (params.order == LoopOrder::q_outer) {
      launch_flash_forward<T, R, LoopOrder::q_outer>(h, heads, w.qr, w.kr, w.vr, out, lse, stream);
    } else {
      launch_flash_forward<T, R, LoopOrder::kv_outer>(h, heads, w.qr, w.kr, w.vr, out, lse, stream);
    }
  });
}

template <class T, class R>
void backward_impl(const AttentionShape& shape, const AttentionParams& params, Format storage, const void* q,
                   const void* k, const void* v, const void* o, const float* lse, const void* dout, void* dq, void* dk,
                   void* dv, cudaStream_t stream, void* workspace) {
  const TileHead h = make_tile_head(shape, params);
  const std::int64_t heads = shape.batch * shape.heads, total = heads * h.n * h.d;
  const std::size_t bytes = backward_plan(params, h, heads, storage, nullptr).bytes;
  with_workspace(workspace, bytes, stream, [&](unsigned char* base) {
    const BackwardPlan w = backward_plan(params, h, heads, storage, base);
    if constexpr (R::kMma) {
      if (tensor_cores(params, h)) {
        const cuda_mma::MmaBackwardCall call{h,  heads, storage, q,  k,  v,          o,    dout,
                                             lse, dq,   dk,      dv, w.prepared, w.dd, w.lse2};
        cuda_mma::mma_backward<R>(call, stream);
        return;
      }
    }
    load<T, R, kStepQ>(q, w.qr, total, stream);
    load<T, R, kStepK>(k, w.kr, total, stream);
    load<T, R, kStepV>(v, w.vr, total, stream);
    load<T, R, kStepGrad>(dout, w.dor, total, stream);
    for (float* a : {w.dqa, w.dka, w.dva}) FASTUDY_CUDA_CHECK(cudaMemsetAsync(a, 0, sizeof(float) * total, stream));
    const dim3 grid = row_grid(h, heads);
    if (h.placement == ScalePlacement::before) {  // the framework kinds' `before`
      scale_q_kernel<R><<<elementwise_blocks(total), kThreads, 0, stream>>>(w.qr, total, h.scale);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
    }
    if (params.attention == AttentionKind::baseline) {
      baseline_softmax_backward_kernel<R>
          <<<grid, kThreads, 0, stream>>>(h, w.qr, w.kr, w.vr, w.dor, w.p_ws, w.ds_ws);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
      baseline_dkdv_kernel<R><<<grid, kThreads, 0, stream>>>(h, w.qr, w.dor, w.p_ws, w.ds_ws, w.dka, w.dva);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
      baseline_dq_kernel<R><<<grid, kThreads, 0, stream>>>(h, w.kr, w.ds_ws, w.dqa);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
    } else if (h.kernel != FlashKernel::framework) {
      load<T, R, kStepO>(o, w.orr, total, stream);
      kernel_dd_kernel<R><<<grid, kThreads, 0, stream>>>(h, w.dor, w.orr, lse, w.dd, w.lse2);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
      kernel_dkdv_kernel<R><<<grid, kThreads, 0, stream>>>(h, w.qr, w.kr, w.vr, w.dor, w.lse2, w.dd, w.dka, w.dva);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
      kernel_dq_kernel<R><<<grid, kThreads, 0, stream>>>(h, w.qr, w.kr, w.vr, w.dor, w.lse2, w.dd, w.part, w.dqa);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
    } else {
      load<T, R, kStepO>(o, w.orr, total, stream);
      flash_dd_kernel<R><<<grid, kThreads, 0, stream>>>(h, w.dor, w.orr, w.dd);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
      flash_dkdv_kernel<R><<<grid, kThreads, 0, stream>>>(h, w.qr, w.kr, w.vr, w.dor, lse, w.dd, w.dka, w.dva, w.tk,
                                                         w.tv);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
      flash_dq_kernel<R><<<grid, kThreads, 0, stream>>>(h, w.qr, w.kr, w.vr, w.dor, lse, w.dd, w.dqa, w.tk);
      FASTUDY_CUDA_CHECK(cudaGetLastError());
    }
    store_gradients_kernel<T, R><<<elementwise_blocks(total), kThreads, 0, stream>>>(
        total, h.grad_placement, h.scale, w.dqa, w.dka, w.dva, static_cast<T*>(dq), static_cast<T*>(dk),
        static_cast<T*>(dv));
    FASTUDY_CUDA_CHECK(cudaGetLastError());
  });
}

template <class T>
constexpr Format format_of() {
  if constexpr (std::is_same_v<T, __half>) return Format::fp16;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return Format::bf16;
  return Format::fp32;
}

// The one dispatch: storage -> element type T, policy -> rounding R (only pairs that can occur).
template <class F>
void dispatch(const AttentionParams& params, Format storage, F&& f) {
  const Format s = tile_storage_format(params.policy);
  if (storage != Format::fp32 && storage != s) {
    throw UsageError("CUDA attention: " + std::string(to_string(storage)) + " tensors with the " +
                         std::string(to_string(s)) + " policy '" + params.policy.name + "'",
                     "pass tensors of the policy's storage format, or fp32 tensors (rounded on load)");
  }
  dispatch_tile_rounding(params.policy, [&](auto rd) {
    using R = decltype(rd);
    if (storage == Format::fp32) return f(float{}, rd);
    if constexpr (R::kStorage == Format::fp16) return f(__half{}, rd);
    if constexpr (R::kStorage == Format::bf16) return f(__nv_bfloat16{}, rd);
  });
}

void validate(const AttentionShape& shape, Format storage) {
  if (storage != Format::fp32 && storage != Format::fp16 && storage != Format::bf16) {
    throw UsageError("CUDA attention: storage format " + std::string(to_string(storage)) + " is not supported",
                     "use fp32, fp16 or bf16 tensors");
  }
  if (shape.seq_len < 1 || shape.head_dim < 1 || shape.batch < 1 || shape.heads < 1 ||
      shape.seq_len > (std::int64_t{1} << 30) || shape.head_dim > 1024 || shape.batch * shape.heads > 65535) {
    throw UsageError("CUDA attention: bad shape B=" + std::to_string(shape.batch) + " H=" +
                     std::to_string(shape.heads) + " N=" + std::to_string(shape.seq_len) + " d=" +
                     std::to_string(shape.head_dim));
  }
}

}  // namespace

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

bool device_available(std::string* why) { return device_count(why) > 0; }

std::size_t attention_workspace_bytes(const AttentionShape& shape, const AttentionParams& params, Format storage,
                                      bool backward) {
  validate(shape, storage);
  tile_storage_format(params.policy);  // the policy's refusal, as the calls give it
  const TileHead h = make_tile_head(shape, params);
  const std::int64_t heads = shape.batch * shape.heads;
  return backward ? backward_plan(params, h, heads, storage, nullptr).bytes
                  : forward_plan(params, h, heads, storage, nullptr).bytes;
}

const char* attention_cuda_path(const AttentionShape& shape, const AttentionParams& params) {
  return tensor_cores(params, make_tile_head(shape, params)) ? "tensor cores" : "CUDA cores";
}

AttentionStats attention_forward_cuda(const AttentionShape& shape, const AttentionParams& params, Format storage,
                                      const void* q, const void* k, const void* v, void* o, float* lse,
                                      cudaStream_t stream, void* workspace) {
  validate(shape, storage);
  dispatch(params, storage, [&](auto t, auto rd) {
    forward_impl<decltype(t), decltype(rd)>(shape, params, storage, q, k, v, o, lse, stream, workspace);
  });
  return tile_stats(shape, params);
}

void attention_backward_cuda(const AttentionShape& shape, const AttentionParams& params, Format storage,
                             const void* q, const void* k, const void* v, const void* o, const float* lse,
                             const void* dout, void* dq, void* dk, void* dv, cudaStream_t stream, void* workspace) {
  validate(shape, storage);
  if (params.attention == AttentionKind::flash && (o == nullptr || lse == nullptr)) {
    throw UsageError("CUDA flash attention backward needs the forward's o and lse",
                     "pass the o and lse written by attention_forward_cuda in the same policy");
  }
  dispatch(params, storage, [&](auto t, auto rd) {
    backward_impl<decltype(t), decltype(rd)>(shape, params, storage, q, k, v, o, lse, dout, dq, dk, dv, stream,
                                             workspace);
  });
}

}  // namespace fastudy::cuda
