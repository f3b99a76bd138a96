// The fa2 reading under launch = "pytorch" (kernels/detail/fa2_pytorch.hpp, kernels/fa2_launch.hpp,
// kernels/nv_math_model.hpp) against outputs of the real FlashAttention-2 kernel recorded on an NVIDIA
// H200 (PyTorch 2.11.0+cu130, SDPA flash backend): tests/data/fa2_truth/ holds four cases cut from
// shared/gpu-truth by scripts/gpu_truth_input.py (fp16 causal d64, bf16 d64, and two d128 cases that take
// the split-KV kernel and its combine step). The promise, element by element on the same inputs: at
// least 99% of O, dK and dV (and dQ, whose atomicAdd order the GPU does not fix; two KV blocks here, so
// every order gives the same sums) bit-identical with the kernel's, lse within 1 fp32 ulp on every row.
// What the reading gives on these cases, and what is asserted: every element of O, lse, dQ, dK and dV
// bit-identical (docs/benchmarks.md has all eleven recorded cases). Also: the launch rules against PyTorch's
// heuristic on known shapes, and the CUDA math models against correctly rounded references and against
// what the H200's special function unit returned (tests/data/sfu_probe/).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "kernels/attention.hpp"
#include "kernels/fa2_launch.hpp"
#include "kernels/nv_math_model.hpp"
#include "src/io/tensor_file.hpp"

namespace fastudy {
namespace {

struct Recorded {
  AttentionShape shape;
  Format format = Format::fp16;
  std::vector<float> q, k, v, dout, o, lse, dq, dk, dv;
};

Recorded load(const std::string& name, bool causal) {
  const io::TensorFile f = io::TensorFile::open(std::string(FASTUDY_TEST_DATA) + "/fa2_truth/" + name);
  Recorded r;
  const io::TensorEntry* q = f.find("q");
  r.shape.batch = q->shape[0];
  r.shape.heads = q->shape[1];
  r.shape.seq_len = q->shape[2];
  r.shape.head_dim = q->shape[3];
  r.shape.causal = causal;
  r.format = *q->format;
  for (auto [tensor, out] : {std::pair<const char*, std::vector<float>*>{"q", &r.q}, {"k", &r.k}, {"v", &r.v},
                             {"do", &r.dout}, {"o", &r.o}, {"lse", &r.lse}, {"dq", &r.dq}, {"dk", &r.dk}, {"dv", &r.dv}}) {
    const io::TensorEntry* e = f.find(tensor);
    out->resize(e->elements);
    f.read(*e, out->data());
  }
  return r;
}

double identical(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.size(); ++i) same += std::memcmp(&a[i], &b[i], sizeof(float)) == 0;
  return static_cast<double>(same) / static_cast<double>(a.size());
}

std::int64_t fp32_ulps(float a, float b) {
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = std::numeric_limits<std::int32_t>::min() - ia;
  if (ib < 0) ib = std::numeric_limits<std::int32_t>::min() - ib;
  return std::llabs(static_cast<std::int64_t>(ia) - ib);
}

AttentionParams pytorch_params(Format f) {
  AttentionParams p;
  p.attention = AttentionKind::flash;
  p.policy = make_policy("fa2", f, AttentionKind::flash);
  p.launch = Launch::pytorch;
  p.sm_count = kHopperSmCount;
  p.threads = 1;
  return p;
}

struct Case {
  const char* file;
  bool causal;
  int splits;  // what PyTorch's launch picks for the case's shape on 132 SMs
};

class RecordedKernel : public ::testing::TestWithParam<Case> {};

TEST_P(RecordedKernel, ForwardAgreesBitForBit) {
  const Case c = GetParam();
  const Recorded r = load(c.file, c.causal);
  EXPECT_EQ(fa2_forward_launch(r.shape, kHopperSmCount).num_splits, c.splits);
  std::vector<float> o(r.o.size()), lse(r.lse.size());
  attention_forward<float>(r.shape, pytorch_params(r.format), r.q.data(), r.k.data(), r.v.data(), o.data(), lse.data());
  EXPECT_EQ(identical(o, r.o), 1.0) << c.file;  // the promise is >= 99%; every element on these cases
  // lse: within 1 fp32 ulp on every row; bit-identical is what the reading gives on these cases (the row
  // sum's rescale contracted into an fma as nvcc compiles it, ex2/lg2.approx as the H200 computes them).
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const std::int64_t ulps = fp32_ulps(lse[i], r.lse[i]);
    EXPECT_LE(ulps, 1) << c.file << " row " << i << ": " << lse[i] << " vs " << r.lse[i];
  }
  EXPECT_EQ(identical(lse, r.lse), 1.0) << c.file;
}

TEST_P(RecordedKernel, BackwardAgreesBitForBit) {
  const Case c = GetParam();
  const Recorded r = load(c.file, c.causal);
  // The backward on the kernel's own O and lse, as the GPU's backward read them.
  std::vector<float> dq(r.q.size()), dk(r.q.size()), dv(r.q.size());
  attention_backward<float>(r.shape, pytorch_params(r.format), r.q.data(), r.k.data(), r.v.data(), r.o.data(),
                            r.lse.data(), r.dout.data(), dq.data(), dk.data(), dv.data());
  // The promise is >= 99%; on these cases every element agrees (measured), dQ too: two KV blocks, so the
  // GPU's atomicAdd order cannot change its sums.
  EXPECT_EQ(identical(dk, r.dk), 1.0) << c.file;
  EXPECT_EQ(identical(dv, r.dv), 1.0) << c.file;
  EXPECT_EQ(identical(dq, r.dq), 1.0) << c.file;
}

INSTANTIATE_TEST_SUITE_P(H200, RecordedKernel,
                         ::testing::Values(Case{"c01_fp16_causal_d64.safetensors", true, 1},
                                           Case{"c04_bf16_d64.safetensors", false, 1},
                                           Case{"c08_bf16_d128_split.safetensors", false, 2},
                                           Case{"c09_fp16_causal_d128_split.safetensors", true, 2}),
                         [](const auto& info) {
                           std::string n = info.param.file;
                           return n.substr(0, n.find('.'));
                         });

// The reading depends on the launch: with the fixed 64 x 64 tiles of launch = "blocks" (today's fa2
// reading: FMA-chained dot products, a polynomial exp2) the agreement is far lower.
TEST(RecordedKernelLaunch, BlocksLaunchIsAnotherReading) {
  const Recorded r = load("c04_bf16_d64.safetensors", false);
  AttentionParams p = pytorch_params(r.format);
  p.launch = Launch::blocks;
  p.block_q = p.block_kv = 64;
  std::vector<float> o(r.o.size()), lse(r.lse.size());
  attention_forward<float>(r.shape, p, r.q.data(), r.k.data(), r.v.data(), o.data(), lse.data());
  EXPECT_LT(identical(o, r.o), 0.95);
}

// PyTorch's num_splits_heuristic (flash_api.cpp), worked by hand:
//   16 row-block-heads on 264 slots, 2 KV blocks: splits 1 (efficiency 16/264 = 0.06) and 2 (0.12): 2 is
//   the first within 85% of the best. One KV block: 1. 128 blocks, 2 KV blocks: 1 (0.48), 2 (0.97): 2.
//   212 >= 0.8 * 264 = 211.2 blocks: 1. 211 blocks, 64 KV blocks: 1 to 4 splits fill 0.799 of their waves,
//   5 splits 1055/264 = 3.996 waves (0.999), the best: 5 is the first within 85% of it.
TEST(Fa2Launch, SplitHeuristicAndTiles) {
  EXPECT_EQ(fa2_num_splits_heuristic(16, 264, 2, 128), 2);
  EXPECT_EQ(fa2_num_splits_heuristic(16, 264, 1, 128), 1);
  EXPECT_EQ(fa2_num_splits_heuristic(128, 264, 2, 128), 2);
  EXPECT_EQ(fa2_num_splits_heuristic(212, 264, 64, 128), 1);
  EXPECT_EQ(fa2_num_splits_heuristic(211, 264, 64, 128), 5);
  AttentionShape s{1, 4, 256, 64, false, 0.0};
  Fa2ForwardLaunch f = fa2_forward_launch(s, 132);
  EXPECT_EQ(f.num_splits, 1);
  EXPECT_EQ(f.block_m, 128);
  EXPECT_EQ(f.block_n, 128);
  s.head_dim = 128;
  f = fa2_forward_launch(s, 132);
  EXPECT_EQ(f.num_splits, 2);
  EXPECT_EQ(f.block_m, 64);
  EXPECT_EQ(f.block_n, 128);
  EXPECT_EQ(f.blocks_per_split, 1);
  s = AttentionShape{8, 16, 1024, 128, false, 0.0};  // 2048 row blocks: no split, 128 x 64 tiles
  f = fa2_forward_launch(s, 132);
  EXPECT_EQ(f.num_splits, 1);
  EXPECT_EQ(f.block_n, 64);
  const Fa2BackwardLaunch b = fa2_backward_launch(AttentionShape{1, 4, 256, 128, false, 0.0}, 132);
  EXPECT_EQ(b.block_m, 64);
  EXPECT_EQ(b.block_n, 128);
  EXPECT_EQ(b.dq_splits, 33);  // ceil(132 / (B H)): deterministic mode's dq_accum splits
  EXPECT_EQ(fa2_head_dim_instance(72), 96);
  EXPECT_THROW(fa2_head_dim_instance(257), Error);
}

// A policy other than the fa2 preset, or a format FlashAttention-2 does not take, is refused.
TEST(Fa2Launch, RefusesWhatTheKernelCannotRun) {
  AttentionShape s{1, 1, 32, 64, false, 0.0};
  std::vector<float> x(32 * 64, 0.5f), o(32 * 64), lse(32);
  AttentionParams p = pytorch_params(Format::fp16);
  p.policy = make_policy("fa2", Format::fp32, AttentionKind::flash);
  EXPECT_THROW(attention_forward<float>(s, p, x.data(), x.data(), x.data(), o.data(), lse.data()), Error);
  p = pytorch_params(Format::fp16);
  p.policy.p = Format::fp32;
  EXPECT_THROW(attention_forward<float>(s, p, x.data(), x.data(), x.data(), o.data(), lse.data()), Error);
  p = pytorch_params(Format::fp16);
  p.sm_count = 0;
  EXPECT_THROW(attention_forward<float>(s, p, x.data(), x.data(), x.data(), o.data(), lse.data()), Error);
}

// logf_accurate is libdevice's logf: within 1 ulp of the correctly rounded logarithm (CUDA's documented
// bound), exact at 1, -inf at 0, NaN for negatives. expf_accurate within 2 ulp (documented).
TEST(NvMathModel, AgainstCorrectlyRoundedReferences) {
  EXPECT_EQ(nv::logf_accurate(1.0f), 0.0f);
  EXPECT_EQ(nv::logf_accurate(0.0f), -INFINITY);
  EXPECT_TRUE(std::isnan(nv::logf_accurate(-1.0f)));
  for (float x = 1e-30f; x < 1e30f; x *= 1.37f) {
    const float want = static_cast<float>(std::log(static_cast<long double>(x)));
    EXPECT_LE(fp32_ulps(nv::logf_accurate(x), want), 1) << x;
  }
  for (float x = -80.0f; x < 80.0f; x += 0.173f) {
    const float want = static_cast<float>(std::exp(static_cast<long double>(x)));
    EXPECT_LE(fp32_ulps(nv::expf_accurate(x), want), 2) << x;
  }
  // ex2.approx.f32 within 2 ulp of 2^x wherever the result is normal (PTX ISA's bound); its edges.
  for (float x = -125.9f; x < 127.9f; x += 0.0371f)
    EXPECT_LE(fp32_ulps(nv::ex2_approx(x), static_cast<float>(std::exp2(static_cast<long double>(x)))), 2) << x;
  EXPECT_EQ(nv::ex2_approx(0.0f), 1.0f);
  EXPECT_EQ(nv::ex2_approx(-1.0f), 0.5f);
  EXPECT_EQ(nv::ex2_approx(-INFINITY), 0.0f);
  EXPECT_EQ(nv::ex2_approx(128.0f), INFINITY);
  EXPECT_TRUE(std::isnan(nv::ex2_approx(NAN)));
  // lg2.approx.f32: exact at powers of two >= 1; below 1 the unit's one's complement leaves the magnitude
  // 2^-36 short, truncated to 24 bits (0.5 gives 1 - 2^-23 in magnitude); a subnormal goes through x 2^24
  // and - 24: within 2 fp32 ulp (2^-15 at 140) of -140. -inf at 0, NaN for negatives.
  EXPECT_EQ(nv::lg2_approx(8.0f), 3.0f);
  EXPECT_EQ(nv::lg2_approx(0.5f), -0x1.fffffcp-1f);
  EXPECT_NEAR(nv::lg2_approx(0x1p-140f), -140.0f, 0x1p-15f);
  EXPECT_EQ(nv::lg2_approx(0.0f), -INFINITY);
  EXPECT_TRUE(std::isnan(nv::lg2_approx(-2.0f)));
  EXPECT_EQ(nv::fast_logf(1.0f), 0.0f);
}

// Every fp32 x of a range through the model, each result's distance in ulps from the exact 2^x (log2 x)
// rounded toward zero, counted as scripts/gpu_sfu_probe.cu counts the H200's ex2.approx.f32 and
// lg2.approx.f32 on the same inputs. The expected counts are the hardware's, recorded on the H200
// (tests/data/sfu_probe/h200.txt): a model off on even one input of the range moves a count.
struct SfuCounts {
  std::int64_t minus2, minus1, zero, plus1, plus2, other;
};

template <class Model, class Exact>
SfuCounts sfu_counts(std::uint32_t first, std::uint32_t last, Model model, Exact exact) {
  SfuCounts c{};
  for (std::uint64_t u = first; u <= last; ++u) {
    const float x = nv::f32(static_cast<std::uint32_t>(u));
    const double e = exact(static_cast<double>(x));
    float z = static_cast<float>(e);
    if (std::fabs(static_cast<double>(z)) > std::fabs(e)) z = std::nextafter(z, 0.0f);
    const std::int64_t d = static_cast<std::int64_t>(nv::bits(model(x))) - static_cast<std::int64_t>(nv::bits(z));
    (d == -2 ? c.minus2 : d == -1 ? c.minus1 : d == 0 ? c.zero : d == 1 ? c.plus1 : d == 2 ? c.plus2 : c.other)++;
  }
  return c;
}

TEST(NvMathModel, CountsOfTheH200) {
  // ex2.approx.f32 on [-20, -8] (0xC1000000..0xC1A00000, 10485761 inputs).
  const SfuCounts ex2 = sfu_counts(0xC1000000u, 0xC1A00000u, nv::ex2_approx, [](double x) { return std::exp2(x); });
  EXPECT_EQ(ex2.minus2, 36);
  EXPECT_EQ(ex2.minus1, 1866460);
  EXPECT_EQ(ex2.zero, 8079809);
  EXPECT_EQ(ex2.plus1, 539456);
  EXPECT_EQ(ex2.plus2 + ex2.other, 0);
  // lg2.approx.f32 on [2, 4) (0x40000000..0x407FFFFF, 8388608 inputs).
  const SfuCounts lg2 = sfu_counts(0x40000000u, 0x407FFFFFu, nv::lg2_approx, [](double x) { return std::log2(x); });
  EXPECT_EQ(lg2.minus2, 0);
  EXPECT_EQ(lg2.minus1, 22656);
  EXPECT_EQ(lg2.zero, 4116609);
  EXPECT_EQ(lg2.plus1, 4219949);
  EXPECT_EQ(lg2.plus2, 29394);
  EXPECT_EQ(lg2.other, 0);
}

}  // namespace
}  // namespace fastudy
