// GPU tests of the CUDA attention kernels: device results against the fp64 reference through the
// check harness (kernels/check.hpp, the same unit-roundoff bounds as every other kernel), against the
// host twin (the same tile math on the CPU, so equal bit for bit except lse, whose logf may differ in
// the last bit between host and device) and against the CPU kernels of kernels/attention.hpp within
// the harness's bound. The tensor-core kernels (kernels/cuda/mma_attention.hpp) on the shapes they
// take; a difference from the twin names its first element with the block, warp, lane and register
// fragment that wrote it (tests/gpu/mismatch.hpp).
// Every test skips with "no CUDA device: <reason>" where no device is visible (as on CI machines).
//
// B batch, H heads, N sequence, d head dim.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/check.hpp"
#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/tile_reference.hpp"
#include "tests/gpu/common.hpp"
#include "tests/gpu/mismatch.hpp"

namespace fastudy {
namespace {

using namespace gpu_test;

class CudaAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

std::size_t element_bytes(Format storage) { return storage == Format::fp32 ? 4 : 2; }

// Host floats (already representable in storage) to the device's storage type, and back.
std::vector<unsigned char> encode(const std::vector<float>& x, Format storage) {
  std::vector<unsigned char> out(x.size() * element_bytes(storage));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (storage == Format::fp16) {
      const __half h = __float2half_rn(x[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else if (storage == Format::bf16) {
      const __nv_bfloat16 b = __float2bfloat16_rn(x[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    }
  }
  return out;
}
std::vector<float> decode(const std::vector<unsigned char>& bytes, Format storage) {
  const std::size_t n = bytes.size() / element_bytes(storage);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (storage == Format::fp16) {
      __half h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      x[i] = __half2float(h);
    } else if (storage == Format::bf16) {
      __nv_bfloat16 b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      x[i] = __bfloat162float(b);
    } else {
      std::memcpy(&x[i], bytes.data() + 4 * i, 4);
    }
  }
  return x;
}

struct DeviceTensor {
  DeviceTensor(std::size_t n, Format storage) : storage(storage), buf(n * element_bytes(storage)) {}
  DeviceTensor(const std::vector<float>& x, Format storage) : DeviceTensor(x.size(), storage) {
    const auto bytes = encode(x, storage);
    FASTUDY_CUDA_CHECK(cudaMemcpy(buf.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  }
  std::vector<float> host() const {
    std::vector<unsigned char> bytes(buf.size());
    FASTUDY_CUDA_CHECK(cudaMemcpy(bytes.data(), buf.get(), bytes.size(), cudaMemcpyDeviceToHost));
    return decode(bytes, storage);
  }
  Format storage;
  cuda::DeviceBuffer<unsigned char> buf;
};

std::vector<float> to_host(const cuda::DeviceBuffer<float>& b) {
  std::vector<float> x(b.size());
  FASTUDY_CUDA_CHECK(cudaMemcpy(x.data(), b.get(), b.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return x;
}

std::size_t elements(const AttentionShape& s) {
  return static_cast<std::size_t>(s.batch * s.heads * s.seq_len * s.head_dim);
}

// The device kernels as harness kernels on float buffers: the host values (representable in the
// storage format) go to the device in `storage`, the results come back as floats.
ForwardKernel<float> device_forward(Format storage) {
  return [storage](const AttentionShape& shape, const AttentionParams& params, const float* q, const float* k,
                   const float* v, float* o, float* lse) {
    const std::size_t size = elements(shape), rows = size / static_cast<std::size_t>(shape.head_dim);
    DeviceTensor dq(std::vector<float>(q, q + size), storage), dk(std::vector<float>(k, k + size), storage);
    DeviceTensor dv(std::vector<float>(v, v + size), storage), d_o(size, storage);
    cuda::DeviceBuffer<float> d_lse(rows);
    const AttentionStats st = cuda::attention_forward_cuda(shape, params, storage, dq.buf.get(), dk.buf.get(),
                                                           dv.buf.get(), d_o.buf.get(), d_lse.get());
    const std::vector<float> ho = d_o.host(), hl = to_host(d_lse);
    std::copy(ho.begin(), ho.end(), o);
    std::copy(hl.begin(), hl.end(), lse);
    return st;
  };
}
BackwardKernel<float> device_backward(Format storage) {
  return [storage](const AttentionShape& shape, const AttentionParams& params, const float* q, const float* k,
                   const float* v, const float* o, const float* lse, const float* dout, float* dq, float* dk,
                   float* dv) {
    const std::size_t size = elements(shape), rows = size / static_cast<std::size_t>(shape.head_dim);
    DeviceTensor d_q(std::vector<float>(q, q + size), storage), d_k(std::vector<float>(k, k + size), storage);
    DeviceTensor d_v(std::vector<float>(v, v + size), storage), d_o(std::vector<float>(o, o + size), storage);
    DeviceTensor d_g(std::vector<float>(dout, dout + size), storage);
    DeviceTensor d_dq(size, storage), d_dk(size, storage), d_dv(size, storage);
    cuda::DeviceBuffer<float> d_lse(rows);
    FASTUDY_CUDA_CHECK(cudaMemcpy(d_lse.get(), lse, rows * sizeof(float), cudaMemcpyHostToDevice));
    cuda::attention_backward_cuda(shape, params, storage, d_q.buf.get(), d_k.buf.get(), d_v.buf.get(), d_o.buf.get(),
                                  d_lse.get(), d_g.buf.get(), d_dq.buf.get(), d_dk.buf.get(), d_dv.buf.get());
    const std::vector<float> hq = d_dq.host(), hk = d_dk.host(), hv = d_dv.host();
    std::copy(hq.begin(), hq.end(), dq);
    std::copy(hk.begin(), hk.end(), dk);
    std::copy(hv.begin(), hv.end(), dv);
  };
}

// One storage/policy/variant case: forward and backward on the device against the fp64 reference (the
// harness's bounds on float buffers), the host twin and the CPU kernels.
void check_case(const AttentionShape& shape, const Variant& var, Format storage, const PrecisionPolicy& policy,
                int block_q, int block_kv) {
  const std::size_t size = elements(shape);
  const std::size_t rows = size / static_cast<std::size_t>(shape.head_dim);
  const Format f = policy.q;
  // Q, K, V and dO rounded to f (the policy's storage and grad formats), as the kernels hold them.
  const AttentionReference ref = make_reference(shape, policy, widen(random_normal(size, 41)),
                                                widen(random_normal(size, 42)), widen(random_normal(size, 43)),
                                                widen(random_normal(size, 44)));
  const std::vector<float> q = narrow(ref.q), k = narrow(ref.k), v = narrow(ref.v), g = narrow(ref.dout);
  const AttentionParams params = var.params(policy, block_q, block_kv);
  const std::string what = std::string(var.name) + " " + policy.name + " " + std::string(to_string(f)) +
                           " storage " + std::string(to_string(storage)) + (shape.causal ? " causal" : "");

  const ForwardCheck<float> dev = check_forward<float>(ref, params, device_forward(storage));
  EXPECT_LE(dev.error.max_abs, dev.bound) << what << ": device O vs the fp64 reference";
  EXPECT_LE(dev.lse_error.max_abs, dev.lse_bound) << what << ": device lse vs the fp64 reference";
  const std::vector<float>& o = dev.o;
  const std::vector<float>& lse = dev.lse;

  std::vector<float> o_twin(size), lse_twin(rows);
  cuda_tile::attention_forward_host(shape, params, q.data(), k.data(), v.data(), o_twin.data(), lse_twin.data());
  EXPECT_EQ(first_mismatch("O", o, o_twin, shape.seq_len, shape.head_dim), "") << what << " ("
                                                                                << cuda::attention_cuda_path(shape, params)
                                                                                << "): device O vs the host twin";
  // lse = stats(m + logf(l)): host and device logf are each within 1 ulp; 2 ulp of fp32 relative
  // (2^-22), or of the stats format when it is coarser.
  const double lse_tol = 2.0 * std::max(unit_roundoff(policy.stats), unit_roundoff(Format::fp32)) * 2.0;
  for (std::size_t r = 0; r < rows; ++r)
    EXPECT_LE(std::fabs(lse[r] - lse_twin[r]), lse_tol * std::max(1.0f, std::fabs(lse_twin[r]))) << what << " row " << r;

  const ForwardCheck<float> cpu = check_forward<float>(ref, params);
  EXPECT_LE(error_metrics(o, widen(cpu.o)).max_abs, dev.bound) << what << ": device vs CPU kernels";

  // Backward from the device's own O and lse, on both sides.
  const BackwardCheck<float> back =
      check_backward<float>(ref, params, device_forward(storage), device_backward(storage));
  EXPECT_LE(back.dq_error.rel_l2, back.bound) << what << ": device dQ vs the fp64 reference";
  EXPECT_LE(back.dk_error.rel_l2, back.bound) << what << ": device dK vs the fp64 reference";
  EXPECT_LE(back.dv_error.rel_l2, back.bound) << what << ": device dV vs the fp64 reference";
  std::vector<float> dq(size), dk(size), dv(size);
  cuda_tile::attention_backward_host(shape, params, q.data(), k.data(), v.data(), back.o.data(), back.lse.data(),
                                     g.data(), dq.data(), dk.data(), dv.data());
  const char* names[3] = {"dQ", "dK", "dV"};
  const std::vector<float>* twin[3] = {&dq, &dk, &dv};
  for (int x = 0; x < 3; ++x) {
    const std::vector<float> device(back.grad.begin() + static_cast<std::ptrdiff_t>(x * size),
                                    back.grad.begin() + static_cast<std::ptrdiff_t>((x + 1) * size));
    EXPECT_EQ(first_mismatch(names[x], device, *twin[x], shape.seq_len, shape.head_dim), "")
        << what << " (" << cuda::attention_cuda_path(shape, params) << "): device vs the host twin";
  }
}

TEST_F(CudaAttention, EveryVariantFormatAndPolicyMatchesHostTwin) {
  for (bool causal : {false, true}) {
    AttentionShape shape;
    shape.batch = 2;
    shape.heads = 3;
    shape.seq_len = 77;
    shape.head_dim = 24;
    shape.causal = causal;
    for (const Variant& var : kVariants)
      for (Format f : kCudaFormats)
        for (const auto& reading : kReadings) {
          if (!reading.cuda) continue;
          const PrecisionPolicy policy = make_policy(reading.name, f, var.attention);
          check_case(shape, var, f, policy, 16, 20);
          if (f != Format::fp32) check_case(shape, var, Format::fp32, policy, 16, 20);  // fp32 tensors, rounded on load
        }
  }
}

TEST_F(CudaAttention, LargeTilesUseOptInSharedMemory) {
  AttentionShape shape;
  shape.seq_len = 300;
  shape.head_dim = 128;
  check_case(shape, kVariants[1], Format::bf16, make_policy("mixed", Format::bf16, AttentionKind::flash), 64, 64);
  check_case(shape, kVariants[2], Format::bf16, make_policy("fa2", Format::bf16, AttentionKind::flash), 64, 64);
}

// The tensor-core kernels: every reading with tensor-core products, both loop orders of the framework
// loops, fp16 and bf16, causal and not, N not a multiple of the 64-row blocks, d 64 (KV tiles up to 128)
// and 128 (up to 64), fp16/bf16 tensors and fp32 tensors rounded on load; bit for bit with the twin.
TEST_F(CudaAttention, TensorCoreReadingsMatchHostTwin) {
  struct Tiles {
    std::int64_t n, d;
    int block_q, block_kv;
  };
  const Tiles tiles[] = {{100, 64, 64, 128}, {130, 128, 64, 64}, {96, 64, 32, 16}};
  for (const Tiles& t : tiles)
    for (bool causal : {true, false}) {
      AttentionShape shape;
      shape.batch = 1;
      shape.heads = 2;
      shape.seq_len = t.n;
      shape.head_dim = t.d;
      shape.causal = causal;
      for (const Variant& var : kVariants) {
        if (var.attention != AttentionKind::flash) continue;
        for (Format f : {Format::bf16, Format::fp16})
          for (const char* reading : {"fa2", "fa3", "mixed", "eager"}) {
            const bool kernel = std::string(reading) == "fa2" || std::string(reading) == "fa3";
            if (kernel && var.order == LoopOrder::kv_outer) continue;  // the kernels have one order
            const PrecisionPolicy policy = make_policy(reading, f, var.attention);
            const AttentionParams params = var.params(policy, t.block_q, t.block_kv);
            EXPECT_STREQ(cuda::attention_cuda_path(shape, params), "tensor cores") << reading;
            check_case(shape, var, f, policy, t.block_q, t.block_kv);
          }
      }
      check_case(shape, kVariants[2], Format::fp32, make_policy("fa2", Format::bf16, AttentionKind::flash),
                 t.block_q, t.block_kv);
    }
}

// Checked before any CUDA call: runs without a device too.
TEST(CudaAttentionApi, MismatchedStorageIsAUsageError) {
  AttentionShape shape;
  shape.seq_len = 4;
  shape.head_dim = 2;
  AttentionParams params;
  params.policy = make_policy("mixed", Format::bf16, AttentionKind::flash);
  EXPECT_THROW(cuda::attention_forward_cuda(shape, params, Format::fp16, nullptr, nullptr, nullptr, nullptr, nullptr),
               UsageError);
}

}  // namespace
}  // namespace fastudy
