// GPU tests of the CUDA attention kernels: device results against the host twin (the same tile math
// on the CPU, so equal bit for bit except lse, whose logf may differ in the last bit between host and
// device) and against the CPU kernels of kernels/attention.hpp within the unit-roundoff bound.
// Every test skips with "no CUDA device: <reason>" where no device is visible (as on CI machines).
//
// B batch, H heads, N sequence, d head dim.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/tile_reference.hpp"
#include "tests/gpu/common.hpp"

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

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One storage/policy/variant case: forward and backward on the device, on the host twin and on the
// CPU kernels.
void check_case(const AttentionShape& shape, const Variant& var, Format storage, const PrecisionPolicy& policy,
                int block_q, int block_kv) {
  const std::size_t size = static_cast<std::size_t>(shape.batch * shape.heads * shape.seq_len * shape.head_dim);
  const std::size_t rows = size / static_cast<std::size_t>(shape.head_dim);
  const Format f = policy.q;
  const std::vector<float> q = rounded(random_normal(size, 41), f), k = rounded(random_normal(size, 42), f);
  const std::vector<float> v = rounded(random_normal(size, 43), f), g = rounded(random_normal(size, 44), f);
  AttentionParams params;
  params.kind = var.kind;
  params.order = var.order;
  params.policy = policy;
  params.block_q = block_q;
  params.block_kv = block_kv;
  const std::string what = std::string(var.name) + " " + policy.name + " " + std::string(to_string(f)) +
                           " storage " + std::string(to_string(storage)) + (shape.causal ? " causal" : "");

  DeviceTensor dq_in(q, storage), dk_in(k, storage), dv_in(v, storage), dg(g, storage);
  DeviceTensor d_o(size, storage), d_dq(size, storage), d_dk(size, storage), d_dv(size, storage);
  cuda::DeviceBuffer<float> d_lse(rows);
  cuda::attention_forward_cuda(shape, params, storage, dq_in.buf.get(), dk_in.buf.get(), dv_in.buf.get(),
                               d_o.buf.get(), d_lse.get());
  const std::vector<float> o = d_o.host(), lse = to_host(d_lse);

  std::vector<float> o_twin(size), lse_twin(rows);
  cuda_tile::attention_forward_host(shape, params, q.data(), k.data(), v.data(), o_twin.data(), lse_twin.data());
  EXPECT_TRUE(bit_equal(o, o_twin)) << what << ": device O differs from the host twin";
  // lse = stats(m + logf(l)): host and device logf are each within 1 ulp; 2 ulp of fp32 relative
  // (2^-22), or of the stats format when it is coarser.
  const double lse_tol = 2.0 * std::max(unit_roundoff(policy.stats), unit_roundoff(Format::fp32)) * 2.0;
  for (std::size_t r = 0; r < rows; ++r)
    EXPECT_LE(std::fabs(lse[r] - lse_twin[r]), lse_tol * std::max(1.0f, std::fabs(lse_twin[r]))) << what << " row " << r;

  std::vector<float> o_cpu(size), lse_cpu(rows);
  attention_forward<float>(shape, params, q.data(), k.data(), v.data(), o_cpu.data(), lse_cpu.data());
  EXPECT_LE(max_abs_diff(o, widen(o_cpu)),
            forward_bound(policy, shape, score_magnitude(shape, q, k), max_abs(v), block_kv))
      << what << ": device vs CPU kernels";

  // Backward from the device's own O and lse, on both sides.
  cuda::attention_backward_cuda(shape, params, storage, dq_in.buf.get(), dk_in.buf.get(), dv_in.buf.get(),
                                d_o.buf.get(), d_lse.get(), dg.buf.get(), d_dq.buf.get(), d_dk.buf.get(),
                                d_dv.buf.get());
  std::vector<float> dq(size), dk(size), dv(size);
  cuda_tile::attention_backward_host(shape, params, q.data(), k.data(), v.data(), o.data(), lse.data(), g.data(),
                                     dq.data(), dk.data(), dv.data());
  EXPECT_TRUE(bit_equal(d_dq.host(), dq)) << what << ": device dQ differs from the host twin";
  EXPECT_TRUE(bit_equal(d_dk.host(), dk)) << what << ": device dK differs from the host twin";
  EXPECT_TRUE(bit_equal(d_dv.host(), dv)) << what << ": device dV differs from the host twin";
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
        for (const char* preset : {"pure", "mixed"}) {
          const PrecisionPolicy policy = make_policy(preset, f);
          check_case(shape, var, f, policy, 16, 20);
          if (f != Format::fp32) check_case(shape, var, Format::fp32, policy, 16, 20);  // fp32 tensors, rounded on load
        }
  }
}

TEST_F(CudaAttention, LargeTilesUseOptInSharedMemory) {
  AttentionShape shape;
  shape.seq_len = 300;
  shape.head_dim = 128;
  check_case(shape, kVariants[1], Format::bf16, make_policy("mixed", Format::bf16), 64, 64);
}

// Checked before any CUDA call: runs without a device too.
TEST(CudaAttentionApi, MismatchedStorageIsAUsageError) {
  AttentionShape shape;
  shape.seq_len = 4;
  shape.head_dim = 2;
  AttentionParams params;
  params.policy = make_policy("mixed", Format::bf16);
  EXPECT_THROW(cuda::attention_forward_cuda(shape, params, Format::fp16, nullptr, nullptr, nullptr, nullptr, nullptr),
               UsageError);
}

}  // namespace
}  // namespace fastudy
