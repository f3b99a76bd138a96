// Tests of the readings that model real kernels (kernels/attention.hpp): what each reading's policy
// of each kind materialises; the FlashAttention-2/-3 kernels' structure, pinned on constructed inputs
// with known answers (KV blocks last to first, per-lane row sums with the quad all-reduce, S never
// rounded, the row sum of the unrounded P, the scale folded into exp2, FA3's lse and Max_offset) and
// against a scalar transcription of the kernels' source (forward and backward, bit for bit where the
// CPU kernels fuse their multiply-adds); the framework baseline's scale placements; the FP8 path's
// switches; and every new reading against the fp64 reference within the unit-roundoff bounds of
// kernels/check.hpp, forward and backward.
//
// B batch, H heads, N sequence, d head dim; tensors are [B, H, N, d].
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/check.hpp"
#include "kernels/cuda/tile_math.hpp"
#include "kernels/format.hpp"

namespace fastudy {
namespace {

constexpr float kNegInfF = -std::numeric_limits<float>::infinity();

std::vector<double> random_normal(std::size_t n, std::uint64_t seed, double sigma = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<double> x(n);
  for (double& v : x) v = dist(rng);
  return x;
}

AttentionShape make_shape(std::int64_t heads, std::int64_t n, std::int64_t d, bool causal, double scale = 0.0) {
  AttentionShape s;
  s.heads = heads;
  s.seq_len = n;
  s.head_dim = d;
  s.causal = causal;
  s.scale = scale;
  return s;
}

AttentionParams params_of(const PrecisionPolicy& policy, AttentionKind kind, int block_q, int block_kv) {
  AttentionParams p;
  p.attention = kind;
  p.policy = policy;
  p.block_q = block_q;
  p.block_kv = block_kv;
  p.threads = 1;
  return p;
}

struct Forward {
  std::vector<float> o, lse;
};
Forward forward(const AttentionShape& shape, const AttentionParams& params, const std::vector<float>& q,
                const std::vector<float>& k, const std::vector<float>& v) {
  Forward f;
  f.o.resize(q.size());
  f.lse.resize(static_cast<std::size_t>(shape.batch * shape.heads * shape.seq_len));
  attention_forward<float>(shape, params, q.data(), k.data(), v.data(), f.o.data(), f.lse.data());
  return f;
}

std::vector<float> narrow(const std::vector<double>& x, Format f) {
  std::vector<float> r(x.begin(), x.end());
  round_inplace(f, r.data(), r.size());
  return r;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The CPU kernels fuse their multiply-adds (as the GPU and the transcriptions below do) on the AVX2 and
// AVX-512 builds; on the generic build a * b + c rounds twice, so bit-level answers differ there.
bool kernels_fuse() { return attention_isa_name() != "generic"; }

// ---------------------------------------------------------------------------------------------------
// Scalar transcriptions of the FlashAttention kernels' arithmetic, step by step from their source (the
// steps are listed at flash_forward_kernel / flash_backward_kernel in kernels/detail/), one query row at
// a time, for policies whose in-op and state steps are fp32 (the fa2/fa3 presets): every value a float,
// Q, K, V, P (the P.V operand), O and the gradients rounded to the policy's formats. The switches
// rebuild what the readings before this one did differently, to show that each choice is visible.
struct KernelModel {
  FlashKernel kernel = FlashKernel::fa2;
  bool reverse_kv = true;        // KV blocks last to first (flash_fwd_kernel.h); false: first to last
  bool sum_rounded_p = false;    // the row sum adds p(P) instead of the unrounded fp32 P
  bool lane_sums = true;         // per-MMA-lane partial sums (c % 8) / 2, all-reduced at the end
};

float scale_log2_of(float scale) { return static_cast<float>(static_cast<double>(scale) * 1.44269504088896340736); }
float scale_of(const AttentionShape& s) {
  return static_cast<float>(s.scale != 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(s.head_dim)));
}

Forward kernel_model_forward(const AttentionShape& shape, const PrecisionPolicy& pol, int block_q, int block_kv,
                             const KernelModel& km, const std::vector<float>& q0, const std::vector<float>& k0,
                             const std::vector<float>& v0) {
  const std::int64_t n = shape.seq_len, d = shape.head_dim, heads = shape.batch * shape.heads;
  const std::int64_t br = std::min<std::int64_t>(block_q, n), bc = std::min<std::int64_t>(block_kv, n);
  const float scale = scale_of(shape), sl2 = scale_log2_of(scale);
  const bool fp8_p = pol.p == Format::fp8_e4m3 || pol.p == Format::fp8_e5m2;
  const float max_offset = km.kernel == FlashKernel::fa3 && fp8_p ? 8.0f : 0.0f;
  Forward out;
  out.o.resize(q0.size());
  out.lse.resize(static_cast<std::size_t>(heads * n));
  std::vector<float> s(bc), o(d);
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* q = q0.data() + h * n * d;
    const float* k = k0.data() + h * n * d;
    const float* v = v0.data() + h * n * d;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t i0 = i / br * br;
      const std::int64_t j_end = shape.causal ? std::min(n, i0 + br) : n;
      const std::int64_t blocks = (j_end + bc - 1) / bc;
      float m = kNegInfF, l[4] = {0, 0, 0, 0};
      std::fill(o.begin(), o.end(), 0.0f);
      for (std::int64_t step = 0; step < blocks; ++step) {
        const std::int64_t jb = km.reverse_kv ? blocks - 1 - step : step, j0 = jb * bc;
        const std::int64_t cols = std::min(bc, n - j0);
        const bool first = step == 0;
        for (std::int64_t c = 0; c < cols; ++c) {  // acc_s: fp32 MMA, unscaled
          float acc = 0;
          for (std::int64_t t = 0; t < d; ++t)
            acc = std::fma(round_to(pol.q, q[i * d + t]), round_to(pol.k, k[(j0 + c) * d + t]), acc);
          s[c] = shape.causal && j0 + c > i ? kNegInfF : round_to(pol.s, acc);
        }
        float m_tile = kNegInfF;
        for (std::int64_t c = 0; c < cols; ++c) m_tile = std::max(m_tile, s[c]);
        const float m_new = std::max(m, m_tile), m_use = m_new == kNegInfF ? 0.0f : m_new;
        const float alpha = first ? 1.0f : cuda_tile::exp2_f32((m - m_use) * sl2);
        if (!first)
          for (float& x : l) x *= alpha;
        const float max_scaled = m_new == kNegInfF ? 0.0f : m_use * sl2 - max_offset;
        for (std::int64_t c = 0; c < cols; ++c) {
          const float p = cuda_tile::exp2_f32(std::fma(s[c], sl2, -max_scaled));
          s[c] = round_to(pol.p, p);
          l[km.lane_sums ? (c % 8) / 2 : 0] += km.sum_rounded_p ? s[c] : p;
        }
        m = m_new;
        for (std::int64_t t = 0; t < d; ++t) {
          float acc = first ? o[t] : alpha * o[t];
          for (std::int64_t c = 0; c < cols; ++c) acc = std::fma(s[c], round_to(pol.v, v[(j0 + c) * d + t]), acc);
          o[t] = acc;
        }
      }
      const float sum = (l[0] + l[2]) + (l[1] + l[3]);
      const bool empty = sum == 0.0f || sum != sum;
      const float inv = empty ? (km.kernel == FlashKernel::fa2 ? 1.0f : 0.0f) : 1.0f / sum;
      for (std::int64_t t = 0; t < d; ++t) out.o[(h * n + i) * d + t] = round_to(pol.o, o[t] * inv);
      const float lse_scale = km.kernel == FlashKernel::fa2 ? scale : sl2 * static_cast<float>(0.693147180559945309417);
      out.lse[h * n + i] = empty ? (km.kernel == FlashKernel::fa2 ? std::numeric_limits<float>::infinity() : kNegInfF)
                                 : std::fma(m, lse_scale, std::log(sum * std::exp2(-max_offset)));
    }
  }
  return out;
}

// flash_bwd_preprocess_kernel.h dot_do_o: T threads per row, each summing its 8-column chunks (page
// width 8T) in order, product then FMAs, then the butterfly Allreduce<T>.
float dot_do_o_model(FlashKernel kernel, const float* dout, const float* o, std::int64_t d) {
  const std::int64_t padded = (d + 31) / 32 * 32;
  const std::int64_t threads = (kernel == FlashKernel::fa3 && padded % 128 == 0 ? 128 : padded % 64 == 0 ? 64 : 32) / 8;
  std::vector<float> part(threads, 0.0f);
  for (std::int64_t r = 0; r < threads; ++r) {
    bool started = false;
    for (std::int64_t p0 = 0; p0 < d; p0 += 8 * threads)
      for (std::int64_t t = p0 + 8 * r; t < std::min(d, p0 + 8 * r + 8); ++t) {
        part[r] = started ? std::fma(dout[t], o[t], part[r]) : dout[t] * o[t];
        started = true;
      }
  }
  for (std::int64_t off = threads / 2; off >= 1; off /= 2)
    for (std::int64_t r = 0; r < off; ++r) part[r] = part[r] + part[r + off];
  return part[0];
}

// The backward of flash_bwd_kernel.h (fa2) / mainloop_bwd_sm90 (fa3) from the kernel's own O and lse;
// returns dQ|dK|dV.
std::vector<float> kernel_model_backward(const AttentionShape& shape, const PrecisionPolicy& pol, int block_q,
                                         int block_kv, FlashKernel kernel, const std::vector<float>& q0,
                                         const std::vector<float>& k0, const std::vector<float>& v0,
                                         const std::vector<float>& o0, const std::vector<float>& lse0,
                                         const std::vector<float>& dout0) {
  const std::int64_t n = shape.seq_len, d = shape.head_dim, heads = shape.batch * shape.heads, size = heads * n * d;
  const std::int64_t br = std::min<std::int64_t>(block_q, n), bc = std::min<std::int64_t>(block_kv, n);
  const float scale = scale_of(shape), sl2 = scale_log2_of(scale), log2e = 1.44269504088896340736f;
  std::vector<float> grads(3 * size, 0.0f);
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::int64_t off = h * n * d;
    auto rq = [&](std::int64_t i, std::int64_t t) { return round_to(pol.q, q0[off + i * d + t]); };
    auto rk = [&](std::int64_t j, std::int64_t t) { return round_to(pol.k, k0[off + j * d + t]); };
    auto rv = [&](std::int64_t j, std::int64_t t) { return round_to(pol.v, v0[off + j * d + t]); };
    auto rdo = [&](std::int64_t i, std::int64_t t) { return round_to(pol.grad, dout0[off + i * d + t]); };
    std::vector<float> delta(n), lse2(n), row_do(d), row_o(d);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t t = 0; t < d; ++t) {
        row_do[t] = rdo(i, t);
        row_o[t] = round_to(pol.o, o0[off + i * d + t]);
      }
      delta[i] = dot_do_o_model(kernel, row_do.data(), row_o.data(), d);
      const float l = lse0[h * n + i];
      lse2[i] = kernel == FlashKernel::fa3 && l == kNegInfF ? 0.0f : l * log2e;
    }
    // P_ij (unrounded) and dS_ij = grad(P (dP - D)).
    auto entry = [&](std::int64_t i, std::int64_t j, float& p, float& ds) {
      float s = 0, dp = 0;
      for (std::int64_t t = 0; t < d; ++t) s = std::fma(rq(i, t), rk(j, t), s);
      for (std::int64_t t = 0; t < d; ++t) dp = std::fma(rdo(i, t), rv(j, t), dp);
      p = shape.causal && j > i ? 0.0f : cuda_tile::exp2_f32(std::fma(s, sl2, -lse2[i]));
      ds = round_to(pol.grad, p * (dp - delta[i]));
    };
    float* dq = grads.data() + off;
    float* dk = grads.data() + size + off;
    float* dv = grads.data() + 2 * size + off;
    const std::int64_t row_blocks = (n + br - 1) / br;
    for (std::int64_t j0 = 0; j0 < n; j0 += bc) {
      const std::int64_t cols = std::min(bc, n - j0);
      for (std::int64_t step = 0; step < row_blocks; ++step) {
        const std::int64_t i0 = (kernel == FlashKernel::fa2 ? row_blocks - 1 - step : step) * br;
        const std::int64_t rows = std::min(br, n - i0);
        if (shape.causal && i0 + rows - 1 < j0) continue;
        for (std::int64_t j = j0; j < j0 + cols; ++j)  // dV_j += p(P)^T dO, dK_j += dS^T Q: rows in order
          for (std::int64_t i = i0; i < i0 + rows; ++i) {
            float p, ds;
            entry(i, j, p, ds);
            for (std::int64_t t = 0; t < d; ++t) {
              dv[j * d + t] = std::fma(round_to(pol.p, p), rdo(i, t), dv[j * d + t]);
              dk[j * d + t] = std::fma(ds, rq(i, t), dk[j * d + t]);
            }
          }
        for (std::int64_t i = i0; i < i0 + rows; ++i)  // a fresh dQ part per (KV block, row block), added
          for (std::int64_t t = 0; t < d; ++t) {
            float part = 0;
            for (std::int64_t j = j0; j < j0 + cols; ++j) {
              float p, ds;
              entry(i, j, p, ds);
              part = std::fma(ds, rk(j, t), part);
            }
            dq[i * d + t] = dq[i * d + t] + part;
          }
      }
    }
    for (std::int64_t x = 0; x < n * d; ++x) {
      dq[x] = round_to(pol.grad, dq[x] * scale);
      dk[x] = round_to(pol.grad, dk[x] * scale);
      dv[x] = round_to(pol.grad, dv[x]);
    }
  }
  return grads;
}

// ---------------------------------------------------------------------------------------------------
TEST(Readings, EachKindMaterialisesWhatItsCodeStores) {
  const Format fp16 = Format::fp16, fp32 = Format::fp32, bf16 = Format::bf16;
  // fa2: the kernel keeps S in fp32 registers and rounds P only as the P.V operand; its baseline is
  // the framework's: S and P stored in the format, the scale applied after the matmul.
  const PrecisionPolicy fa2 = make_policy("fa2", fp16, AttentionKind::flash);
  EXPECT_EQ(fa2.kernel, FlashKernel::fa2);
  EXPECT_EQ(fa2.s, fp32);
  EXPECT_EQ(fa2.p, fp16);
  EXPECT_EQ(fa2.o, fp16);
  for (PolicyMember m : {&PrecisionPolicy::accum, &PrecisionPolicy::stats, &PrecisionPolicy::stats_running,
                         &PrecisionPolicy::o_running, &PrecisionPolicy::rescale, &PrecisionPolicy::exp_arg,
                         &PrecisionPolicy::division})
    EXPECT_EQ(fa2.*m, fp32);
  for (const char* reading : {"eager", "fa2", "fa3", "mixed"}) {
    const PrecisionPolicy base = make_policy(reading, bf16, AttentionKind::baseline);
    EXPECT_EQ(base.kernel, FlashKernel::framework) << reading;
    EXPECT_EQ(base.scale, ScalePlacement::after) << reading;
    EXPECT_EQ(base.s, bf16) << reading;
    EXPECT_EQ(base.p, bf16) << reading;
    EXPECT_EQ(base.accum, fp32) << reading;
    EXPECT_EQ(base.softmax, fp32) << reading;
  }
  // pure: both kinds every step in the format, the scale inside the matmul (as before this reading).
  EXPECT_EQ(make_policy("pure", bf16, AttentionKind::baseline).scale, ScalePlacement::fused);
  EXPECT_EQ(make_policy("pure", bf16, AttentionKind::baseline).accum, bf16);
  // eager's flash is FA-2 written as framework ops; mixed, the hypothetical reading, stores S too.
  EXPECT_EQ(make_policy("eager", bf16, AttentionKind::flash).kernel, FlashKernel::framework);
  EXPECT_EQ(make_policy("eager", bf16, AttentionKind::flash).o_running, bf16);
  EXPECT_EQ(make_policy("mixed", bf16, AttentionKind::flash).kernel, FlashKernel::framework);
  EXPECT_EQ(make_policy("mixed", bf16, AttentionKind::flash).s, bf16);
  EXPECT_EQ(make_policy("fa2", Format::fp64, AttentionKind::flash).s, Format::fp64);
  // fa3 at fp16 is fa2's storage with FA3's kernel; at e4m3 its FP8 path, against standard FP8 attention.
  EXPECT_EQ(make_policy("fa3", fp16, AttentionKind::flash).kernel, FlashKernel::fa3);
  EXPECT_EQ(make_policy("fa3", fp16, AttentionKind::flash).quantization, Quantization::none);
  const PrecisionPolicy fp8 = make_policy("fa3", Format::fp8_e4m3, AttentionKind::flash);
  EXPECT_EQ(fp8.quantization, Quantization::block);
  EXPECT_TRUE(fp8.incoherent);
  EXPECT_EQ(fp8.p, Format::fp8_e4m3);
  EXPECT_EQ(fp8.o, bf16);
  EXPECT_EQ(input_format(fp8, fp8.q), fp32);  // the kernel quantizes Q, K, V itself
  const PrecisionPolicy fp8_base = make_policy("fa3", Format::fp8_e4m3, AttentionKind::baseline);
  EXPECT_EQ(fp8_base.quantization, Quantization::head);
  EXPECT_FALSE(fp8_base.incoherent);
  EXPECT_EQ(fp8_base.s, fp16);
  EXPECT_EQ(fp8_base.p, fp16);
  EXPECT_EQ(input_format(fa2, fa2.q), fp16);
  EXPECT_EQ(policy_preset_names(), "pure, eager, fa2, fa3, mixed");
  EXPECT_EQ(make_reading("fa2", fp16).of(AttentionKind::baseline).scale, ScalePlacement::after);
}

// KV blocks last to first, on a constructed row with a known answer. One query, four keys of one block
// each (block_kv 1), d = 1, fp32, scale = ln 2 so that scale_log2 = fl(fl(ln 2) log2 e) = 1 exactly and
// every exp2 argument is an integer (exp2 exact). Scores (0, -25, -25, -25), V (0, 1, 1, 1).
//   last to first: keys 3, 2, 1 give P = 1 each (l = 3, O = 3); key 0 raises the max by 25: alpha =
//   2^-25, l = fl(1 + 3 2^-25) = 1 + 2^-23 (1 + 0.75 ulp rounds up), O = 3 2^-25; O / l = fl(3 2^-25
//   fl(1 / (1 + 2^-23))) = fl(3 2^-25 (1 - 2^-23)), a tie between 2 and 1 ulp below 3 2^-25, to even: 2;
//   lse = log(1 + 2^-23).
//   first to last: l = 1 + 2^-25 rounds back to 1 three times, O = 3 2^-25 exactly, lse = 0.
TEST(Fa2Structure, KvBlocksRunLastToFirst) {
  const AttentionShape shape = make_shape(1, 4, 1, false, 0.69314718055994530942);
  const std::vector<float> q{1.0f}, k{0.0f, -25.0f, -25.0f, -25.0f}, v{0.0f, 1.0f, 1.0f, 1.0f};
  std::vector<float> q4(4, 0.0f);
  q4[0] = 1.0f;  // row 0 is the constructed one; rows 1-3 (q = 0) only fill the head
  const PrecisionPolicy fa2 = make_policy("fa2", Format::fp32, AttentionKind::flash);
  const Forward f = forward(shape, params_of(fa2, AttentionKind::flash, 4, 1), q4, k, v);
  const float three = std::ldexp(3.0f, -25);
  const float expected_o = std::ldexp(3.0f * 4194304.0f - 2.0f, -47);  // 3 2^-25 - 2^-46
  EXPECT_EQ(f.o[0], expected_o);
  EXPECT_EQ(f.lse[0], std::log(1.0f + std::ldexp(1.0f, -23)));
  // The first-to-last order (the framework loops' order) gives the other answer.
  KernelModel forward_order;
  forward_order.reverse_kv = false;
  const Forward g = kernel_model_forward(shape, fa2, 4, 1, forward_order, q4, k, v);
  EXPECT_EQ(g.o[0], three);
  EXPECT_EQ(g.lse[0], 0.0f);
  const Forward m = kernel_model_forward(shape, fa2, 4, 1, KernelModel{}, q4, k, v);
  EXPECT_EQ(m.o[0], expected_o);
}

// The row sum as the MMA fragment holds it: lane q of the quad sums columns 8v + 2q and 8v + 2q + 1,
// and the four partial sums meet at the end as (l0 + l2) + (l1 + l3). One block of 8 keys, scale ln 2
// (exp2 exact), P = (1, 0, 2^-24, 2^-24, 0, 0, 0, 0) (scores 0, -200, -24, -24, -200, ...; 2^-200 is
// flushed to 0): lane 1 holds 2^-23 exactly and l = 1 + 2^-23, while one running sum in key order
// rounds 1 + 2^-24 back to 1 twice (ties to even). lse = log(l) tells them apart.
TEST(Fa2Structure, RowSumIsPerMmaLaneWithTheQuadAllReduceAtTheEnd) {
  const AttentionShape shape = make_shape(1, 8, 1, false, 0.69314718055994530942);
  std::vector<float> q(8, 0.0f), v(8, 1.0f);
  q[0] = 1.0f;
  const std::vector<float> k{0.0f, -200.0f, -24.0f, -24.0f, -200.0f, -200.0f, -200.0f, -200.0f};
  for (const char* reading : {"fa2", "fa3"}) {
    const PrecisionPolicy pol = make_policy(reading, Format::fp32, AttentionKind::flash);
    const Forward f = forward(shape, params_of(pol, AttentionKind::flash, 8, 8), q, k, v);
    EXPECT_EQ(f.lse[0], std::log(1.0f + std::ldexp(1.0f, -23))) << reading;
    KernelModel one_sum;
    one_sum.kernel = pol.kernel;
    one_sum.lane_sums = false;
    EXPECT_EQ(kernel_model_forward(shape, pol, 8, 8, one_sum, q, k, v).lse[0], 0.0f) << reading;
  }
}

// S stays an fp32 register tile and the scale goes into exp2's FMA. One key, scale ln 2 (scale_log2 = 1,
// so S * scale_log2 - fl(S * scale_log2) = 0 and P = exp2(0) = 1, l = 1): the lse is m * scale + log 1 =
// fl(S * scale) with S the unrounded dot product. q = (1, 1), k = (1, 2^-10) (both exact in bf16):
// S = 1 + 2^-10, which bf16 cannot hold. The framework loops round it (mixed: S = bf16(S * scale)).
TEST(Fa2Structure, ScoresAreNeverRounded) {
  const AttentionShape shape = make_shape(1, 1, 2, false, 0.69314718055994530942);
  const std::vector<float> q{1.0f, 1.0f}, k{1.0f, std::ldexp(1.0f, -10)}, v{0.5f, 2.0f};
  const float s = 1.0f + std::ldexp(1.0f, -10), scale = scale_of(shape);
  for (const char* reading : {"fa2", "fa3"}) {
    const PrecisionPolicy pol = make_policy(reading, Format::bf16, AttentionKind::flash);
    const Forward f = forward(shape, params_of(pol, AttentionKind::flash, 1, 1), q, k, v);
    EXPECT_EQ(f.lse[0], s * scale) << reading;
    EXPECT_EQ(f.o, v) << reading;
  }
  const PrecisionPolicy mixed = make_policy("mixed", Format::bf16, AttentionKind::flash);
  const Forward g = forward(shape, params_of(mixed, AttentionKind::flash, 1, 1), q, k, v);
  EXPECT_EQ(g.lse[0], round_to(Format::bf16, s * scale));
  EXPECT_NE(g.lse[0], s * scale);
}

// The row sum adds the unrounded fp32 P; only the P.V operand is rounded. Scores (0, -0.5) in one
// block (scale ln 2: exp2 arguments exactly 0 and -0.5), V (0, 1), fp16 with O kept in fp32 (a custom
// policy) to see the bits: O = fl(fp16(P1) * fl(1 / fl(1 + P1))) with P1 = exp2(-0.5) as the kernels
// compute it (cuda_tile::exp2_f32, the same function as theirs where they fuse).
TEST(Fa2Structure, RowSumAddsTheUnroundedP) {
  if (!kernels_fuse()) GTEST_SKIP() << "exp2 and the FMAs round differently on the generic build";
  const AttentionShape shape = make_shape(1, 2, 1, false, 0.69314718055994530942);
  const std::vector<float> q{1.0f, 0.0f}, k{0.0f, -0.5f}, v{0.0f, 1.0f};
  PrecisionPolicy pol = make_policy("fa2", Format::fp16, AttentionKind::flash);
  pol.o = Format::fp32;
  const Forward f = forward(shape, params_of(pol, AttentionKind::flash, 2, 2), q, k, v);
  const float p1 = cuda_tile::exp2_f32(-0.5f), p1_16 = round_to(Format::fp16, p1);
  ASSERT_NE(p1, p1_16);
  const float l = 1.0f + p1;
  EXPECT_EQ(f.o[0], p1_16 * (1.0f / l));
  EXPECT_NE(f.o[0], p1_16 * (1.0f / (1.0f + p1_16)));  // what a row sum of the rounded P would give
}

// FA3's lse is m * (scale_log2 * ln 2) + log l, FA2's m * scale + log l (hopper/softmax.h finalize,
// softmax.h normalize_softmax_lse); at d = 5 fl(fl(scale log2 e) ln 2) is not fl(scale). One key with
// S = q.k = 2 (a power of two: 2 scale_log2 is exact, so P = exp2(0) = 1 and l = 1): lse = fl(2 * that
// scale).
TEST(Fa3Structure, LseUsesScaleLog2TimesLn2) {
  const AttentionShape shape = make_shape(1, 1, 5, false);
  const std::vector<float> q{1.0f, 1.0f, 0.0f, 0.0f, 0.0f}, k{1.0f, 1.0f, 0.0f, 0.0f, 0.0f}, v(5, 1.0f);
  const float scale = scale_of(shape), fa3_scale = scale_log2_of(scale) * 0.693147180559945309417f;
  ASSERT_NE(scale, fa3_scale);
  const PrecisionPolicy fa2 = make_policy("fa2", Format::fp16, AttentionKind::flash);
  const PrecisionPolicy fa3 = make_policy("fa3", Format::fp16, AttentionKind::flash);
  EXPECT_EQ(forward(shape, params_of(fa2, AttentionKind::flash, 1, 1), q, k, v).lse[0], 2.0f * scale);
  EXPECT_EQ(forward(shape, params_of(fa3, AttentionKind::flash, 1, 1), q, k, v).lse[0], 2.0f * fa3_scale);
}

// FA3's FP8 P: exp2(S sl2 - (m sl2 - 8)) in [0, 256], so a P of 2^-10 relative to the row's largest
// is 2^-2 in e4m3 rather than 2^-10, which e4m3 (subnormal spacing 2^-9) would round to 0. Keys with
// scores (0, -10) (scale ln 2), V (0, 1), Q, K, V exact in e4m3 and not quantized: O = fl(0.25 *
// fl(1 / 256.25)) in bf16; the lse removes the offset again: log(256.25 / 256).
TEST(Fa3Fp8, MaxOffsetKeepsSmallProbabilitiesInRange) {
  const AttentionShape shape = make_shape(1, 2, 1, false, 0.69314718055994530942);
  const std::vector<float> q{1.0f, 0.0f}, k{0.0f, -10.0f}, v{0.0f, 1.0f};
  PrecisionPolicy pol = make_policy("fa3", Format::fp8_e4m3, AttentionKind::flash);
  pol.quantization = Quantization::none;
  pol.incoherent = false;
  const Forward f = forward(shape, params_of(pol, AttentionKind::flash, 2, 2), q, k, v);
  EXPECT_EQ(f.o[0], round_to(Format::bf16, 0.25f * (1.0f / 256.25f)));
  EXPECT_EQ(f.lse[0], std::log(256.25f * std::exp2(-8.0f)));
  PrecisionPolicy no_offset = pol;
  no_offset.kernel = FlashKernel::fa2;  // the same arithmetic without Max_offset: P = 2^-10 -> 0
  EXPECT_EQ(forward(shape, params_of(no_offset, AttentionKind::flash, 2, 2), q, k, v).o[0], 0.0f);
}

// Against the transcriptions: random inputs, both kinds of masking, ragged blocks, fp16 and bf16; the
// CPU kernel must equal the transcription of its source bit for bit, and each structural choice the
// older readings made differently (KV order, the row sum of rounded P, one running sum) changes bits.
TEST(Fa2Structure, ForwardIsTheKernelsArithmeticBitForBit) {
  if (!kernels_fuse()) GTEST_SKIP() << "exp2 and the FMAs round differently on the generic build";
  for (bool causal : {false, true}) {
    const AttentionShape shape = make_shape(2, 45, 16, causal);
    const std::size_t size = static_cast<std::size_t>(2 * 45 * 16);
    for (Format fmt : {Format::fp16, Format::bf16}) {
      const std::vector<float> q = narrow(random_normal(size, 1), fmt), k = narrow(random_normal(size, 2), fmt);
      const std::vector<float> v = narrow(random_normal(size, 3), fmt);
      for (FlashKernel kernel : {FlashKernel::fa2, FlashKernel::fa3}) {
        const char* reading = kernel == FlashKernel::fa2 ? "fa2" : "fa3";
        const PrecisionPolicy pol = make_policy(reading, fmt, AttentionKind::flash);
        const Forward f = forward(shape, params_of(pol, AttentionKind::flash, 8, 12), q, k, v);
        KernelModel km;
        km.kernel = kernel;
        const Forward m = kernel_model_forward(shape, pol, 8, 12, km, q, k, v);
        const std::string what = std::string(reading) + " " + std::string(to_string(fmt)) + (causal ? " causal" : "");
        EXPECT_TRUE(bit_equal(f.o, m.o)) << what;
        EXPECT_TRUE(bit_equal(f.lse, m.lse)) << what;
        for (int change = 0; change < 3; ++change) {
          KernelModel other = km;
          if (change == 0) other.reverse_kv = false;
          if (change == 1) other.sum_rounded_p = true;
          if (change == 2) other.lane_sums = false;
          const Forward g = kernel_model_forward(shape, pol, 8, 12, other, q, k, v);
          EXPECT_FALSE(bit_equal(f.o, g.o) && bit_equal(f.lse, g.lse)) << what << " change " << change;
        }
      }
    }
  }
}

TEST(Fa2Structure, BackwardIsTheKernelsArithmeticBitForBit) {
  if (!kernels_fuse()) GTEST_SKIP() << "exp2 and the FMAs round differently on the generic build";
  for (bool causal : {false, true}) {
    for (std::int64_t d : {16, 40}) {  // 40: dot_do_o as for 64 columns, threads 5-7 holding only padding
      const AttentionShape shape = make_shape(1, 37, d, causal);
      const std::size_t size = static_cast<std::size_t>(37 * d);
      const Format fmt = Format::bf16;
      const std::vector<float> q = narrow(random_normal(size, 11), fmt), k = narrow(random_normal(size, 12), fmt);
      const std::vector<float> v = narrow(random_normal(size, 13), fmt), g = narrow(random_normal(size, 14), fmt);
      // The presets, and (to see the fp32 accumulators' bits) the same with dS and the gradients in fp32.
      for (bool grad_fp32 : {false, true}) {
        std::vector<float> fa2_grads;
        for (FlashKernel kernel : {FlashKernel::fa2, FlashKernel::fa3}) {
          PrecisionPolicy pol = make_policy(kernel == FlashKernel::fa2 ? "fa2" : "fa3", fmt, AttentionKind::flash);
          if (grad_fp32) pol.grad = Format::fp32;
          const AttentionParams params = params_of(pol, AttentionKind::flash, 8, 10);
          const Forward f = forward(shape, params, q, k, v);
          std::vector<float> grads(3 * size);
          attention_backward<float>(shape, params, q.data(), k.data(), v.data(), f.o.data(), f.lse.data(), g.data(),
                                    grads.data(), grads.data() + size, grads.data() + 2 * size);
          const std::vector<float> model = kernel_model_backward(shape, pol, 8, 10, kernel, q, k, v, f.o, f.lse, g);
          const std::string what = std::string(to_string(kernel)) + " d " + std::to_string(d) +
                                   (causal ? " causal" : "") + (grad_fp32 ? " grad fp32" : "");
          EXPECT_TRUE(bit_equal(grads, model)) << what;
          if (kernel == FlashKernel::fa2) {
            fa2_grads = grads;
          } else if (grad_fp32) {
            EXPECT_FALSE(bit_equal(grads, fa2_grads)) << what << ": fa3 visits the row blocks first to last";
          }
        }
      }
    }
  }
}

// The baseline's scale placements, on one key (P = 1, l = 1, so lse = m + log 1 = the stored score):
// fused s(qk scale), after s(s(qk) scale), before s(q(q scale) k). d = 3 (scale = 1/sqrt(3) is not a
// power of two), q = (1.875, 1, 2^-7), k = (1, 1, 1): q.k = 2.8828125, which bf16 (8 bits) rounds to
// 2.875; the three placements store 1.6640625, 1.65625 and 1.671875.
TEST(BaselineScale, EachPlacementRoundsWhereItsOpsDo) {
  const AttentionShape shape = make_shape(1, 1, 3, false);
  const std::vector<float> q{1.875f, 1.0f, std::ldexp(1.0f, -7)}, k{1.0f, 1.0f, 1.0f}, v{1.0f, 2.0f, 3.0f};
  const float scale = scale_of(shape), dot = 2.8828125f;
  const Format b = Format::bf16;
  PrecisionPolicy pol = make_policy("fa2", b, AttentionKind::baseline);
  const auto lse_of = [&](ScalePlacement placement) {
    pol.scale = placement;
    return forward(shape, params_of(pol, AttentionKind::baseline, 1, 1), q, k, v).lse[0];
  };
  const float fused = lse_of(ScalePlacement::fused), after = lse_of(ScalePlacement::after);
  const float before = lse_of(ScalePlacement::before);
  EXPECT_EQ(fused, round_to(b, dot * scale));
  EXPECT_EQ(after, round_to(b, round_to(b, dot) * scale));
  float q_scaled_dot = 0;
  for (int t = 0; t < 3; ++t) q_scaled_dot = std::fma(round_to(b, q[t] * scale), k[t], q_scaled_dot);
  EXPECT_EQ(before, round_to(b, q_scaled_dot));
  EXPECT_EQ(fused, 1.6640625f);
  EXPECT_EQ(after, 1.65625f);
  EXPECT_EQ(before, 1.671875f);
}

// The scale placements differentiate as autograd does: against fp64 within the backward bound, and
// the three give different gradients.
TEST(BaselineScale, BackwardOfEachPlacementWithinBound) {
  const AttentionShape shape = make_shape(2, 21, 12, true);
  const std::size_t size = static_cast<std::size_t>(2 * 21 * 12);
  std::vector<std::vector<float>> grads;
  for (ScalePlacement placement : {ScalePlacement::fused, ScalePlacement::after, ScalePlacement::before}) {
    PrecisionPolicy pol = make_policy("eager", Format::bf16, AttentionKind::baseline);
    pol.scale = placement;
    const AttentionReference ref =
        make_reference(shape, pol, random_normal(size, 21), random_normal(size, 22), random_normal(size, 23),
                       random_normal(size, 24));
    const BackwardCheck<float> c = check_backward<float>(ref, params_of(pol, AttentionKind::baseline, 8, 8));
    EXPECT_LE(c.error.rel_l2, c.bound) << to_string(placement);
    const ForwardCheck<float> fc = check_forward<float>(ref, params_of(pol, AttentionKind::baseline, 8, 8));
    EXPECT_LE(fc.error.max_abs, fc.bound) << to_string(placement);
    grads.push_back(c.grad);
  }
  EXPECT_FALSE(bit_equal(grads[0], grads[1]));
  EXPECT_FALSE(bit_equal(grads[0], grads[2]));
}

// Every reading and kind against fp64: forward on float and double buffers, backward on float
// buffers, within forward_bound / backward_bound (derived in kernels/check.hpp from the unit roundoff
// of each step, the FlashAttention kernels' exp2 and reciprocal included).
TEST(Readings, ForwardAndBackwardWithinUnitRoundoffBounds) {
  for (bool causal : {false, true}) {
    const AttentionShape shape = make_shape(2, 41, 16, causal);
    const std::size_t size = static_cast<std::size_t>(2 * 41 * 16);
    const std::vector<double> q = random_normal(size, 31), k = random_normal(size, 32), v = random_normal(size, 33);
    const std::vector<double> g = random_normal(size, 34);
    for (const char* reading : {"fa2", "fa3"}) {
      for (Format fmt : {Format::fp64, Format::fp32, Format::fp16, Format::bf16}) {
        for (AttentionKind kind : {AttentionKind::flash, AttentionKind::baseline}) {
          const PrecisionPolicy pol = make_policy(reading, fmt, kind);
          const AttentionReference ref = make_reference(shape, pol, q, k, v, g);
          const AttentionParams params = params_of(pol, kind, 8, 12);
          const std::string what = std::string(reading) + " " + std::string(to_string(fmt)) + " " +
                                   std::string(to_string(kind)) + (causal ? " causal" : "");
          const ForwardCheck<float> f = check_forward<float>(ref, params);
          EXPECT_TRUE(f.ok()) << what << ": " << f.summary();
          const ForwardCheck<double> fd = check_forward<double>(ref, params);
          EXPECT_TRUE(fd.ok()) << what << " (double buffers): " << fd.summary();
          const BackwardCheck<float> b = check_backward<float>(ref, params);
          EXPECT_TRUE(b.ok()) << what << ": " << b.summary();
        }
      }
    }
  }
}

// FA3's FP8 path against fp64 on the unquantized inputs, with each switch, on normal and outlier inputs
// (FA3's recipe): within forward_bound, which counts the quantization of Q, K, V (u of e4m3 and its
// subnormals) and of P.
std::vector<double> outliers(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<double> x(n);
  for (double& e : x) {
    const double base = normal(rng), big = normal(rng);
    e = uniform(rng) < 0.01 ? base + 10.0 * big : base;
  }
  return x;
}

TEST(Fa3Fp8, ForwardWithinBoundWithEachSwitch) {
  const AttentionShape shape = make_shape(2, 64, 32, false);
  const std::size_t size = static_cast<std::size_t>(2 * 64 * 32);
  for (int inputs = 0; inputs < 2; ++inputs) {
    const std::vector<double> q = inputs ? outliers(size, 41) : random_normal(size, 41);
    const std::vector<double> k = inputs ? outliers(size, 42) : random_normal(size, 42);
    const std::vector<double> v = inputs ? outliers(size, 43) : random_normal(size, 43);
    for (Quantization quant : {Quantization::block, Quantization::head}) {
      for (bool incoherent : {true, false}) {
        for (AttentionKind kind : {AttentionKind::flash, AttentionKind::baseline}) {
          PrecisionPolicy pol = make_policy("fa3", Format::fp8_e4m3, kind);
          pol.quantization = quant;
          pol.incoherent = incoherent;
          const AttentionReference ref = make_reference(shape, pol, q, k, v);
          const ForwardCheck<float> f = check_forward<float>(ref, params_of(pol, kind, 16, 16));
          EXPECT_TRUE(f.ok()) << to_string(quant) << (incoherent ? " incoherent " : " ") << to_string(kind)
                              << (inputs ? " outliers: " : " normal: ") << f.summary();
        }
      }
    }
  }
}

// Block quantization: one factor per block of rows, c = amax / 448, x_q = e4m3(x / c). Two keys in
// blocks of one (block_kv 1), d = 1, scale ln 2 (scale_log2 = 1): the query sees key 1 only (scores
// -200 and 0: P = (exp2(-192) = 0, exp2(8) = 256) with Max_offset), so O = V_1 as quantized. V =
// (1000, 0.01): one factor per head (1000 / 448) leaves 0.01 / c = 0.00448 among e4m3's subnormals
// (spacing 2^-9): it becomes 2 spacings, O = 0.00873; one factor per block gives key 1 its own
// (0.01 / 448): 0.01 / c = 448 exactly and O = 0.01 up to fp32 and the bf16 output.
TEST(Fa3Fp8, BlockQuantizationGivesEachBlockItsOwnScale) {
  const AttentionShape shape = make_shape(1, 2, 1, false, 0.69314718055994530942);
  const std::vector<float> q{1.0f, 0.0f}, k{-200.0f, 0.0f}, v{1000.0f, 0.01f};
  const Format e4m3 = Format::fp8_e4m3, bf16 = Format::bf16;
  PrecisionPolicy pol = make_policy("fa3", e4m3, AttentionKind::flash);
  pol.incoherent = false;
  const AttentionParams params = params_of(pol, AttentionKind::flash, 1, 1);
  const float block = forward(shape, params, q, k, v).o[0];
  const float c1 = static_cast<float>(0.01f / 448.0);
  ASSERT_EQ(round_to(e4m3, 0.01f / c1), 448.0f);
  EXPECT_EQ(block, round_to(bf16, (c1 * (256.0f * 448.0f)) * std::ldexp(1.0f, -8)));
  pol.quantization = Quantization::head;
  const float head = forward(shape, params_of(pol, AttentionKind::flash, 1, 1), q, k, v).o[0];
  const float c = static_cast<float>(1000.0f / 448.0), v1 = round_to(e4m3, 0.01f / c);
  EXPECT_EQ(v1, 2 * std::ldexp(1.0f, -9));
  EXPECT_EQ(head, round_to(bf16, (256.0f * v1) * (std::ldexp(1.0f, -8) * c)));
  EXPECT_LT(std::fabs(block - 0.01f), std::fabs(head - 0.01f) / 10);
}

// Incoherent processing: Q and K times H D / sqrt(d) before quantization. Exact arithmetic keeps every
// score (the transform is orthogonal): with fp32 storage and no quantization the outputs agree with
// and without it to fp32 roundoff. With e4m3, scores dominated by one channel (an outlier in the same
// channel of a query and of a key) carry e4m3's relative error u of that one product; spread over d
// channels the errors add incoherently, so the error of those rows drops.
TEST(Fa3Fp8, IncoherentProcessingSpreadsOutliers) {
  const AttentionShape shape = make_shape(1, 64, 64, false);
  const std::size_t size = static_cast<std::size_t>(64 * 64);
  std::vector<double> q = random_normal(size, 61), k = random_normal(size, 62);
  const std::vector<double> v = random_normal(size, 63);
  for (std::int64_t i = 0; i < 64; i += 4) q[i * 64 + 7] = 12.0 + 0.1 * static_cast<double>(i);
  for (std::int64_t j = 0; j < 64; j += 3) k[j * 64 + 7] = 9.0 - 0.1 * static_cast<double>(j);
  PrecisionPolicy exact = make_policy("fa3", Format::fp32, AttentionKind::flash);
  const AttentionReference ref32 = make_reference(shape, exact, q, k, v);
  const double plain = check_forward<float>(ref32, params_of(exact, AttentionKind::flash, 16, 16)).error.max_abs;
  exact.incoherent = true;
  const ForwardCheck<float> rotated = check_forward<float>(ref32, params_of(exact, AttentionKind::flash, 16, 16));
  EXPECT_TRUE(rotated.ok()) << rotated.summary();
  EXPECT_LT(rotated.error.max_abs, 64 * unit_roundoff(Format::fp32) * ref32.vmax) << "plain " << plain;
  double err[2];
  for (int i = 0; i < 2; ++i) {
    PrecisionPolicy pol = make_policy("fa3", Format::fp8_e4m3, AttentionKind::flash);
    pol.incoherent = i == 0;
    const AttentionReference ref = make_reference(shape, pol, q, k, v);
    const ForwardCheck<float> f = check_forward<float>(ref, params_of(pol, AttentionKind::flash, 16, 16));
    EXPECT_TRUE(f.ok()) << f.summary();
    err[i] = f.error.rmse;
  }
  EXPECT_LT(2 * err[0], err[1]) << "incoherent " << err[0] << " without " << err[1];
}

TEST(Fa3Fp8, RefusedWhereItCannotRun) {
  const AttentionShape shape = make_shape(1, 4, 12, false);
  std::vector<float> x(48, 1.0f), o(48), lse(4);
  const PrecisionPolicy pol = make_policy("fa3", Format::fp8_e4m3, AttentionKind::flash);
  const AttentionParams params = params_of(pol, AttentionKind::flash, 4, 4);
  try {
    attention_forward<float>(shape, params, x.data(), x.data(), x.data(), o.data(), lse.data());
    FAIL() << "incoherent processing at head_dim 12 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("power of two"), std::string::npos) << e.what();
  }
  const AttentionShape shape16 = make_shape(1, 4, 16, false);
  std::vector<float> y(64, 1.0f), o16(64), dq(64), dk(64), dv(64);
  attention_forward<float>(shape16, params, y.data(), y.data(), y.data(), o16.data(), lse.data());
  try {
    attention_backward<float>(shape16, params, y.data(), y.data(), y.data(), o16.data(), lse.data(), y.data(),
                              dq.data(), dk.data(), dv.data());
    FAIL() << "a backward pass of the FP8 path accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("no backward pass"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fastudy
