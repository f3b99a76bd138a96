// Tests of the attention kernels (kernels/attention.hpp) against the fp64 reference: every kernel
// (baseline, flash kv_outer = FA-1, flash q_outer = FA-2) x format x reading (pure, eager, fa2, fa3, mixed,
// each kind with its reading's policy) x causal,
// on float and double buffers; exact results where the exact answer is representable; the backward
// against finite differences; FlashAttention's own acceptance rule (flash error <= 2x baseline error
// in the mixed policy); odd sizes and clipped blocks; rescale counts; the portable build.
// Every comparison with the reference goes through the check harness (kernels/check.hpp), which
// holds the error metrics and the unit-roundoff bounds.
//
// B batch, H heads, N sequence, d head dim; tensors are [B, H, N, d].
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/check.hpp"
#include "kernels/detail/attention_isa.hpp"
#include "kernels/format.hpp"

namespace fastudy {
namespace {

using Variant = KernelVariant;
constexpr const auto& kVariants = kKernelVariants;

std::vector<double> random_normal(std::size_t n, std::uint64_t seed, double sigma = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<double> x(n);
  for (double& v : x) v = dist(rng);
  return x;
}

std::vector<double> rounded(const std::vector<double>& x, Format f) {
  std::vector<double> r = x;
  round_inplace(f, r.data(), r.size());
  return r;
}

// The kernels on T buffers, results widened to double (for the tests of exact results and of
// AttentionStats; comparisons with the reference use check_forward / check_backward).
template <class T>
std::vector<double> forward_as(const AttentionShape& shape, const AttentionParams& params, const std::vector<double>& q,
                               const std::vector<double>& k, const std::vector<double>& v,
                               AttentionStats* stats = nullptr) {
  std::vector<T> qt(q.begin(), q.end()), kt(k.begin(), k.end()), vt(v.begin(), v.end()), ot(q.size());
  std::vector<T> lt(shape.batch * shape.heads * shape.seq_len);
  const AttentionStats st = attention_forward<T>(shape, params, qt.data(), kt.data(), vt.data(), ot.data(), lt.data());
  if (stats) *stats = st;
  return std::vector<double>(ot.begin(), ot.end());
}

struct Inputs {
  AttentionShape shape;
  std::vector<double> q, k, v;
};

Inputs make_inputs(std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t d, bool causal, std::uint64_t seed) {
  Inputs in;
  in.shape.batch = b;
  in.shape.heads = h;
  in.shape.seq_len = n;
  in.shape.head_dim = d;
  in.shape.causal = causal;
  const std::size_t size = static_cast<std::size_t>(b * h * n * d);
  in.q = random_normal(size, seed);
  in.k = random_normal(size, seed + 1);
  in.v = random_normal(size, seed + 2);
  return in;
}

// The reading's policy of a variant's kind; incoherent processing (FA3's FP8 path) only where the head
// dim is a power of two (its Hadamard transform).
PrecisionPolicy policy_for(std::string_view reading, Format f, const Variant& var, std::int64_t d) {
  PrecisionPolicy p = make_policy(reading, f, var.attention);
  if ((d & (d - 1)) != 0) p.incoherent = false;
  return p;
}

template <class T>
void check_forward_against_reference(int block_q, int block_kv, std::int64_t n, std::int64_t d) {
  for (bool causal : {false, true}) {
    const Inputs in = make_inputs(1, 2, n, d, causal, 100 + n);
    for (const auto& reading : kReadings) {
      const std::string_view preset = reading.name;
      for (Format f : kAllFormats) {
        // The reference sees the inputs as the kernels hold them (rounded to the reading's input formats
        // of q, k, v: both kinds share them).
        const AttentionReference ref =
            make_reference(in.shape, make_policy(preset, f, AttentionKind::flash), in.q, in.k, in.v);
        for (const Variant& var : kVariants) {
          AttentionParams params = var.params(policy_for(preset, f, var, d), block_q, block_kv);
          // bound: forward_bound on T buffers; lse_bound: the same scaled by 1/max|v| + max|lse|.
          const ForwardCheck<T> c = check_forward<T>(ref, params);
          EXPECT_LE(c.error.max_abs, c.bound) << var.name << " " << preset << " " << to_string(f)
                                              << (causal ? " causal" : "")
                                              << " T=" << (std::is_same_v<T, float> ? "float" : "double")
                                              << " blocks " << block_q << "x" << block_kv;
          EXPECT_LE(c.lse_error.max_abs, c.lse_bound) << var.name << " lse " << preset << " " << to_string(f);
        }
      }
    }
  }
}

TEST(Attention, ForwardMatchesReferenceFloat) { check_forward_against_reference<float>(8, 12, 37, 16); }
TEST(Attention, ForwardMatchesReferenceDouble) { check_forward_against_reference<double>(8, 12, 37, 16); }
TEST(Attention, ForwardOddAndClippedBlocks) {
  check_forward_against_reference<float>(64, 100, 29, 7);  // blocks larger than N are clipped to N
  check_forward_against_reference<float>(1, 5, 13, 3);     // single-row Q blocks
  check_forward_against_reference<double>(7, 1, 11, 9);    // single-key tiles: N - 1 rescales
}

TEST(Attention, Fp64IsTheReferenceToRoundoff) {
  // In fp64 on double buffers every step is exact up to fp64 rounding, so the bound shrinks to
  // about (d + N) * 2^-53 relative: the kernels compute the same function as the reference.
  const Inputs in = make_inputs(2, 2, 50, 24, true, 5);
  const AttentionReference ref = make_reference(in.shape, in.q, in.k, in.v);
  for (const char* reading : {"pure", "fa2", "fa3"}) {
    for (const Variant& var : kVariants) {
      AttentionParams params = var.params(make_policy(reading, Format::fp64, var.attention), 16, 16);
      EXPECT_LT(check_forward<double>(ref, params).error.max_abs, 1e-13) << var.name << " " << reading;
    }
  }
}

// One-hot attention: key j is the unit vector e_j (d = N) and query i is -256 (1 - e_t(i)), so
// S_i,t(i) = 0 and every other score is -256, exactly, in every format (256 = 2^8 fits even fp8).
// exp(-256) ~ 1e-111 vanishes against 1 in every format, so O_i = V_t(i) exactly: no rounding may
// leak in, whatever the kernel, loop order, block size, format or policy.
TEST(Attention, OneHotAttentionIsExact) {
  const std::int64_t n = 24, d = 24;
  const double vals[] = {0.5, -1.0, 1.5, 2.0, -0.25, 0.75, -3.0, 1.25};
  for (bool causal : {false, true}) {
    AttentionShape shape;
    shape.seq_len = n;
    shape.head_dim = d;
    shape.scale = 1.0;
    shape.causal = causal;
    std::vector<double> q(n * d, 0.0), k(n * d, 0.0), v(n * d);
    std::vector<std::int64_t> target(n);
    for (std::int64_t i = 0; i < n; ++i) {
      target[i] = causal ? i / 2 : (i * 7 + 3) % n;
      k[i * d + i] = 1.0;
      for (std::int64_t t = 0; t < d; ++t) q[i * d + t] = t == target[i] ? 0.0 : -256.0;
      for (std::int64_t t = 0; t < d; ++t) v[i * d + t] = vals[(i + 3 * t) % 8];
    }
    for (const auto& reading : kReadings) {
      for (Format f : kAllFormats) {
        for (const Variant& var : kVariants) {
          // FA3's FP8 path quantizes V with a scale: O is V up to that rounding, not exactly.
          if (make_policy(reading.name, f, var.attention).quantization != Quantization::none) continue;
          const char* preset = reading.name.data();
          for (int block : {1, 5, 24}) {
            AttentionParams params = var.params(make_policy(preset, f, var.attention), block, block + 2);
            for (int as_double = 0; as_double < 2; ++as_double) {
              const std::vector<double> out = as_double ? forward_as<double>(shape, params, q, k, v)
                                                        : forward_as<float>(shape, params, q, k, v);
              for (std::int64_t i = 0; i < n; ++i)
                for (std::int64_t t = 0; t < d; ++t)
                  ASSERT_EQ(out[i * d + t], v[target[i] * d + t])
                      << var.name << " " << preset << " " << to_string(f) << " block " << block << " row " << i;
            }
          }
        }
      }
    }
  }
}

// V constant down each column, with power-of-two values: flash computes O = c * (sum of P) / l
// where the running sum l adds the same P values in the same format, order and rescales as the
// numerator (pure policy: accum = stats = o_running), and multiplying by a power of two commutes with
// rounding, so O = c exactly. (The baseline normalises P first, so its sum of P is not exactly 1.)
TEST(Attention, FlashWithConstantPowerOfTwoColumnsIsExact) {
  const Inputs in = make_inputs(1, 2, 45, 8, false, 77);
  const double cols[] = {0.5, -2.0, 4.0, 1.0, -0.125, 8.0, -1.0, 0.25};
  std::vector<double> v(in.v.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = cols[i % 8];
  for (Format f : {Format::fp64, Format::fp32, Format::tf32, Format::fp16, Format::bf16}) {
    for (LoopOrder order : {LoopOrder::kv_outer, LoopOrder::q_outer}) {
      for (bool causal : {false, true}) {
        AttentionShape shape = in.shape;
        shape.causal = causal;
        AttentionParams params;
        params.order = order;
        params.policy = make_policy("pure", f, AttentionKind::flash);
        params.block_q = 6;
        params.block_kv = 10;
        const std::vector<double> q = rounded(in.q, f), k = rounded(in.k, f);
        for (int as_double = 0; as_double < 2; ++as_double) {
          const std::vector<double> out =
              as_double ? forward_as<double>(shape, params, q, k, v) : forward_as<float>(shape, params, q, k, v);
          for (std::size_t i = 0; i < out.size(); ++i)
            ASSERT_EQ(out[i], v[i]) << to_string(f) << " " << to_string(order) << " element " << i;
        }
      }
    }
  }
}

TEST(Attention, ReferenceBackwardMatchesFiniteDifferences) {
  // Central differences of L = sum(dO * O) with step h = 1e-5: truncation error ~ h^2 |O'''| ~ 1e-10
  // and cancellation ~ 2^-53 |L| / h ~ 1e-11, so 1e-8 absolute (inputs and gradients are O(1)).
  for (bool causal : {false, true}) {
    Inputs in = make_inputs(1, 1, 6, 3, causal, 11);
    const std::vector<double> dout = random_normal(in.q.size(), 12);
    const std::vector<double> grad = make_reference(in.shape, in.q, in.k, in.v, dout).grad;
    auto loss = [&](const Inputs& x) {
      std::vector<double> o(x.q.size());
      attention_forward_reference(x.shape, x.q.data(), x.k.data(), x.v.data(), o.data(), nullptr);
      double l = 0;
      for (std::size_t i = 0; i < o.size(); ++i) l += dout[i] * o[i];
      return l;
    };
    const double h = 1e-5;
    const std::size_t size = in.q.size();
    for (int which = 0; which < 3; ++which) {
      for (std::size_t i = 0; i < size; ++i) {
        Inputs plus = in, minus = in;
        std::vector<double>& xp = which == 0 ? plus.q : which == 1 ? plus.k : plus.v;
        std::vector<double>& xm = which == 0 ? minus.q : which == 1 ? minus.k : minus.v;
        xp[i] += h;
        xm[i] -= h;
        const double fd = (loss(plus) - loss(minus)) / (2 * h);
        EXPECT_NEAR(grad[which * size + i], fd, 1e-8) << "input " << which << " element " << i;
      }
    }
  }
}

// Backward error in relative L2 against the fp64 reference backward, within backward_bound (its
// derivation is in kernels/check.hpp).
template <class T>
void check_backward_against_reference() {
  for (bool causal : {false, true}) {
    const Inputs in = make_inputs(1, 2, 21, 8, causal, 300);
    const std::vector<double> dout_raw = random_normal(in.q.size(), 301);
    for (const auto& reading : kReadings) {
      const std::string_view preset = reading.name;
      for (Format f : {Format::fp64, Format::fp32, Format::tf32, Format::fp16, Format::bf16}) {
        // Q, K, V, dO rounded to f (the storage and grad formats, the same for both kinds).
        const AttentionReference ref =
            make_reference(in.shape, make_policy(preset, f, AttentionKind::flash), in.q, in.k, in.v, dout_raw);
        for (const Variant& var : kVariants) {
          AttentionParams params = var.params(make_policy(preset, f, var.attention), 5, 8);
          const BackwardCheck<T> c = check_backward<T>(ref, params);
          EXPECT_LE(c.error.rel_l2, c.bound) << var.name << " " << preset << " " << to_string(f)
                                             << (causal ? " causal" : "");
        }
      }
    }
  }
}

TEST(Attention, BackwardMatchesReferenceFloat) { check_backward_against_reference<float>(); }
TEST(Attention, BackwardOddBlocks) {
  // KV tiles that start off a vector boundary (20 keys per tile, 16 or 8 lanes) and a ragged last tile.
  // The reference on the unrounded fp64 inputs: the kernels' rounding of them to fp32 counts too.
  const Inputs in = make_inputs(1, 1, 32, 5, false, 400);
  const AttentionReference ref = make_reference(in.shape, in.q, in.k, in.v, random_normal(in.q.size(), 401));
  for (const Variant& var : kVariants) {
    // each variant's own loop order
    const AttentionParams params = var.params(make_policy("mixed", Format::fp32, var.attention), 7, 20);
    const BackwardCheck<float> c = check_backward<float>(ref, params);
    EXPECT_LE(c.error.rel_l2, c.bound) << var.name;
  }
}
TEST(Attention, BackwardMatchesReferenceDouble) { check_backward_against_reference<double>(); }

TEST(Attention, Fp64BackwardIsTheReferenceToRoundoff) {
  const Inputs in = make_inputs(1, 2, 33, 8, true, 9);
  const AttentionReference ref = make_reference(in.shape, in.q, in.k, in.v, random_normal(in.q.size(), 10));
  for (const char* reading : {"pure", "fa2", "fa3"}) {
    for (const Variant& var : kVariants) {
      AttentionParams params = var.params(make_policy(reading, Format::fp64, var.attention), 8, 8);
      EXPECT_LT(check_backward<double>(ref, params).error.rel_l2, 1e-13) << var.name << " " << reading;
    }
  }
}

// FlashAttention's acceptance rule: its kernels' error against the fp64 reference is at most twice a
// PyTorch implementation's in the same format (tests/test_flash_attn.py). The kernels (fa2, fa3) and
// the hypothetical mixed reading (fp32 accumulators and statistics) against the framework baseline.
TEST(Attention, FlashErrorAtMostTwiceBaseline) {
  for (const char* reading : {"fa2", "fa3", "mixed"}) {
    for (Format f : {Format::fp16, Format::bf16}) {
      for (std::uint64_t seed : {1, 2, 3}) {
        // N = 512 with 32-wide tiles: 16 KV tiles, 15 rescales per row.
        const Inputs in = make_inputs(1, 2, 512, 64, seed == 3, 1000 * seed);
        const ReadingPolicies policies = make_reading(reading, f);
        AttentionParams params;
        params.policy = policies.baseline;
        params.block_q = 32;
        params.block_kv = 32;
        const AttentionReference ref = make_reference(in.shape, policies.flash, in.q, in.k, in.v);
        params.attention = AttentionKind::baseline;
        const double base = check_forward<float>(ref, params).error.max_abs;
        params.attention = AttentionKind::flash;
        params.policy = policies.flash;
        for (LoopOrder order : {LoopOrder::kv_outer, LoopOrder::q_outer}) {
          params.order = order;
          const double flash = check_forward<float>(ref, params).error.max_abs;
          EXPECT_LE(flash, 2 * base) << reading << " " << to_string(f) << " " << to_string(order) << " seed "
                                     << seed << " baseline " << base;
        }
      }
    }
  }
}

TEST(Attention, RescaleCounts) {
  const Inputs in = make_inputs(1, 1, 100, 4, false, 3);
  AttentionParams params;
  params.block_q = 16;
  for (int bc : {1, 7, 32, 100, 128}) {
    params.block_kv = bc;
    for (LoopOrder order : {LoopOrder::kv_outer, LoopOrder::q_outer}) {
      params.order = order;
      AttentionStats st;
      forward_as<float>(in.shape, params, in.q, in.k, in.v, &st);
      const std::int64_t tiles = (100 + std::min(bc, 100) - 1) / std::min(bc, 100);
      EXPECT_EQ(st.tiles_kv, tiles);
      EXPECT_EQ(st.rescales_per_row, static_cast<double>(tiles - 1)) << "Bc " << bc;
    }
  }
  // Causal: row i sees floor(i / Bc) + 1 tiles. N = 10, Bc = 4: rows 0-3: 0, 4-7: 1, 8-9: 2 -> 8/10.
  Inputs small = make_inputs(1, 1, 10, 4, true, 3);
  params.block_kv = 4;
  AttentionStats st;
  forward_as<float>(small.shape, params, small.q, small.k, small.v, &st);
  EXPECT_DOUBLE_EQ(st.rescales_per_row, 0.8);
  params.attention = AttentionKind::baseline;
  forward_as<float>(small.shape, params, small.q, small.k, small.v, &st);
  EXPECT_EQ(st.tiles_kv, 1);
  EXPECT_EQ(st.rescales_per_row, 0.0);
}

// The vectorised static rounding (a compile-time policy) and the per-value runtime rounding (any
// custom policy) must give bit-identical forward results: changing only `grad`, which the forward
// never uses, moves the policy from the first path to the second.
TEST(Attention, StaticAndRuntimeRoundingAgreeBitForBit) {
  const Inputs in = make_inputs(1, 2, 40, 16, true, 55);
  for (const auto& reading : kReadings) {
    for (Format f : kAllFormats) {
      for (const Variant& var : kVariants) {
        AttentionParams params = var.params(make_policy(reading.name, f, var.attention), 9, 16);
        const Format in_f = input_format(params.policy, f);
        const std::vector<double> q = rounded(in.q, in_f), k = rounded(in.k, in_f), v = rounded(in.v, in_f);
        const std::vector<double> a = forward_as<float>(in.shape, params, q, k, v);
        params.policy.grad = params.policy.grad == Format::bf16 ? Format::fp16 : Format::bf16;
        const std::vector<double> b = forward_as<float>(in.shape, params, q, k, v);
        for (std::size_t i = 0; i < a.size(); ++i) {
          if (std::isnan(a[i]) && std::isnan(b[i])) continue;
          ASSERT_EQ(a[i], b[i]) << var.name << " " << reading.name << " " << to_string(f) << " element " << i;
        }
      }
    }
  }
}

// Rounding toward zero and stochastic rounding through the kernels: every reading and both loop
// orders stay within the forward bound (which doubles for these modes: one ulp = 2u per rounding);
// stochastic results are reproducible, independent of the thread count and of how the heads are split
// over calls (a rank passes head_offset), and change with the seed.
TEST(Attention, RoundingModesWithinBoundAndReproducible) {
  const Inputs in = make_inputs(2, 2, 45, 16, true, 71);
  for (Rounding mode : {Rounding::zero, Rounding::stochastic}) {
    for (const auto& reading : kReadings) {
      const std::string_view preset = reading.name;
      for (Format f : {Format::fp16, Format::bf16, Format::fp8_e4m3}) {
        PrecisionPolicy flash_policy = make_policy(preset, f, AttentionKind::flash);
        flash_policy.rounding = mode;
        const AttentionReference ref = make_reference(in.shape, flash_policy, in.q, in.k, in.v);
        for (const Variant& var : kVariants) {
          PrecisionPolicy policy = make_policy(preset, f, var.attention);
          policy.rounding = mode;
          AttentionParams params = var.params(policy, 8, 12);
          params.rounding_seed = 99;
          const ForwardCheck<float> c = check_forward<float>(ref, params);
          const std::string what = std::string(var.name) + " " + std::string(preset) + " " +
                                   std::string(to_string(f)) + " " + std::string(to_string(mode));
          EXPECT_LE(c.error.max_abs, c.bound) << what;
          if (mode != Rounding::stochastic) continue;
          params.threads = 1;
          const std::vector<double> one = forward_as<float>(in.shape, params, ref.q, ref.k, ref.v);
          params.threads = 2;
          EXPECT_EQ(forward_as<float>(in.shape, params, ref.q, ref.k, ref.v), one) << what << " threads";
          // The batch in two calls of one sample each, the second with head_offset = its first head.
          AttentionShape half = in.shape;
          half.batch = 1;
          const std::size_t n = ref.q.size() / 2;
          auto part = [&](const std::vector<double>& x, int i) {
            return std::vector<double>(x.begin() + i * n, x.begin() + (i + 1) * n);
          };
          std::vector<double> split;
          for (int i = 0; i < 2; ++i) {
            params.head_offset = i * in.shape.heads;
            const std::vector<double> o = forward_as<float>(half, params, part(ref.q, i), part(ref.k, i), part(ref.v, i));
            split.insert(split.end(), o.begin(), o.end());
          }
          EXPECT_EQ(split, one) << what << " split over two calls";
          params.head_offset = 0;
          params.rounding_seed = 100;
          EXPECT_NE(forward_as<float>(in.shape, params, ref.q, ref.k, ref.v), one) << what << " another seed";
        }
      }
    }
  }
}

// The bias each mode leaves in the output, on inputs where it shows: V > 0 everywhere, so O > 0 and
// every rounding toward zero shrinks it. Eager bf16 flash (the running O and sum stored in bf16):
// truncation gives a mean signed error below -u/4 relative to O (each of the per-tile roundings
// of O, l and P is biased by -u on average: the ratio O/l cancels part of it, not all), while
// nearest and stochastic stay within u/4 of zero on this many outputs (3 * 128 * 32 values; their
// errors are unbiased, the standard error of the mean is below u / sqrt(12288) ~ u/110).
TEST(Attention, TruncationBiasesOutputsStochasticDoesNot) {
  Inputs in = make_inputs(3, 1, 128, 32, false, 81);
  for (double& x : in.v) x = 1.0 + std::fabs(x);
  const double u = unit_roundoff(Format::bf16);
  for (Rounding mode : kAllRoundings) {
    PrecisionPolicy policy = make_policy("eager", Format::bf16, AttentionKind::flash);
    policy.rounding = mode;
    const AttentionReference ref = make_reference(in.shape, policy, in.q, in.k, in.v);
    AttentionParams params;
    params.policy = policy;
    params.block_q = 16;
    params.block_kv = 8;  // 16 KV tiles
    params.rounding_seed = 5;
    const std::vector<double> o = forward_as<float>(in.shape, params, ref.q, ref.k, ref.v);
    double bias = 0;
    for (std::size_t i = 0; i < o.size(); ++i) bias += (o[i] - ref.o[i]) / ref.o[i];
    bias /= static_cast<double>(o.size());
    if (mode == Rounding::zero) EXPECT_LT(bias, -u / 4) << "zero";
    else EXPECT_LT(std::fabs(bias), u / 4) << to_string(mode);
  }
}

TEST(Attention, ThreadCountDoesNotChangeResults) {
  const Inputs in = make_inputs(2, 3, 33, 16, false, 8);
  AttentionParams params;
  params.policy = make_policy("fa2", Format::bf16, AttentionKind::flash);
  params.block_q = 8;
  params.block_kv = 8;
  params.threads = 1;
  const std::vector<double> one = forward_as<float>(in.shape, params, in.q, in.k, in.v);
  params.threads = 2;
  EXPECT_EQ(forward_as<float>(in.shape, params, in.q, in.k, in.v), one);
}

// Every instruction-set build this CPU can run (the portable one with 16-byte vectors and no FMA is
// what a CPU without AVX2 gets), called directly whatever attention.cpp would pick: forward and
// backward against the reference, fp64 on doubles and mixed bf16 on floats.
std::vector<const detail::AttentionIsa*> runnable_isas() {
  std::vector<const detail::AttentionIsa*> isas{detail::attention_isa_generic()};
#if defined(__x86_64__) && defined(__GNUC__)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (avx2 && detail::attention_isa_avx2()) isas.push_back(detail::attention_isa_avx2());
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") && detail::attention_isa_avx512())
    isas.push_back(detail::attention_isa_avx512());
#endif
  return isas;
}

TEST(Attention, EveryInstructionSetBuildMatchesReference) {
  const Inputs in = make_inputs(1, 2, 37, 16, true, 21);
  const std::int64_t heads = 2;
  const PrecisionPolicy fp64 = make_policy("pure", Format::fp64, AttentionKind::flash);
  const PrecisionPolicy bf16 = make_policy("mixed", Format::bf16, AttentionKind::flash);
  const AttentionReference ref = make_reference(in.shape, in.q, in.k, in.v, random_normal(in.q.size(), 22));
  const AttentionReference ref16 = make_reference(in.shape, bf16, in.q, in.k, in.v);  // Q, K, V rounded to bf16
  for (const detail::AttentionIsa* isa : runnable_isas()) {
    ASSERT_NE(isa, nullptr);
    // The build's functions as harness kernels, over all heads on this thread.
    const ForwardKernel<double> forward_f64 = [&](const AttentionShape& s, const AttentionParams& p, const double* q,
                                                  const double* k, const double* v, double* o, double* lse) {
      isa->forward_f64(s, p, q, k, v, o, lse, 0, heads);
      return AttentionStats{};
    };
    const BackwardKernel<double> backward_f64 = [&](const AttentionShape& s, const AttentionParams& p, const double* q,
                                                    const double* k, const double* v, const double* o,
                                                    const double* lse, const double* dout, double* dq, double* dk,
                                                    double* dv) {
      isa->backward_f64(s, p, q, k, v, o, lse, dout, dq, dk, dv, 0, heads);
    };
    const ForwardKernel<float> forward_f32 = [&](const AttentionShape& s, const AttentionParams& p, const float* q,
                                                 const float* k, const float* v, float* o, float* lse) {
      isa->forward_f32(s, p, q, k, v, o, lse, 0, heads);
      return AttentionStats{};
    };
    for (const Variant& var : kVariants) {
      AttentionParams params = var.params(fp64, 8, 8);
      EXPECT_LT(check_forward<double>(ref, params, forward_f64).error.max_abs, 1e-13) << isa->name << " " << var.name;
      EXPECT_LT(check_backward<double>(ref, params, forward_f64, backward_f64).error.rel_l2, 1e-13)
          << isa->name << " " << var.name;

      for (const char* reading : {"mixed", "fa2"}) {
        params.policy = make_policy(reading, Format::bf16, var.attention);
        const ForwardCheck<float> c = check_forward<float>(ref16, params, forward_f32);
        EXPECT_LE(c.error.max_abs, c.bound) << isa->name << " " << var.name << " " << reading;
      }
    }
  }
}

TEST(Attention, NamesAndPolicies) {
  EXPECT_EQ(parse_attention_kind("flash"), AttentionKind::flash);
  EXPECT_EQ(parse_attention_kind("baseline"), AttentionKind::baseline);
  EXPECT_FALSE(parse_attention_kind("Flash").has_value());
  EXPECT_EQ(parse_loop_order("kv_outer"), LoopOrder::kv_outer);
  EXPECT_EQ(parse_loop_order("q_outer"), LoopOrder::q_outer);
  EXPECT_FALSE(parse_loop_order("swapped").has_value());
  EXPECT_EQ(to_string(LoopOrder::kv_outer), "kv_outer");
  EXPECT_EQ(to_string(AttentionKind::baseline), "baseline");
  const PrecisionPolicy mixed = make_policy("mixed", Format::bf16, AttentionKind::flash);
  EXPECT_EQ(mixed.name, "mixed");
  EXPECT_EQ(mixed.p, Format::bf16);
  EXPECT_EQ(mixed.o, Format::bf16);
  EXPECT_EQ(mixed.accum, Format::fp32);
  EXPECT_EQ(mixed.stats, Format::fp32);
  EXPECT_EQ(mixed.o_running, Format::fp32);
  EXPECT_EQ(make_policy("mixed", Format::fp64, AttentionKind::flash).accum, Format::fp64);
  EXPECT_EQ(make_policy("pure", Format::bf16, AttentionKind::flash).o_running, Format::bf16);
  const PrecisionPolicy pure = make_policy("pure", Format::fp16, AttentionKind::baseline);
  EXPECT_EQ(pure.accum, Format::fp16);
  EXPECT_EQ(pure.division, Format::fp16);
  EXPECT_THROW(make_policy("fancy", Format::fp16, AttentionKind::flash), std::exception);
  EXPECT_EQ(policy_preset_names(), "pure, eager, fa2, fa3, mixed");
  // eager: op outputs and flash's running state in the format, values inside an op in fp32.
  const PrecisionPolicy eager = make_policy("eager", Format::bf16, AttentionKind::flash);
  for (PolicyMember m : {&PrecisionPolicy::s, &PrecisionPolicy::p, &PrecisionPolicy::o, &PrecisionPolicy::o_running,
                         &PrecisionPolicy::stats_running, &PrecisionPolicy::rescale, &PrecisionPolicy::exp_arg})
    EXPECT_EQ(eager.*m, Format::bf16);
  for (PolicyMember m : {&PrecisionPolicy::accum, &PrecisionPolicy::stats, &PrecisionPolicy::softmax,
                         &PrecisionPolicy::division})
    EXPECT_EQ(eager.*m, Format::fp32);
  EXPECT_EQ(make_policy("eager", Format::fp64, AttentionKind::flash).accum, Format::fp64);
  for (const auto& preset : kReadings) {
    EXPECT_TRUE(is_policy_preset(preset.name));
    for (AttentionKind kind : {AttentionKind::flash, AttentionKind::baseline})
      EXPECT_EQ(make_policy(preset.name, Format::fp16, kind).rounding, Rounding::nearest);
  }
  EXPECT_FALSE(is_policy_preset("fancy"));
}

TEST(Attention, RejectsBadArguments) {
  AttentionShape shape;
  shape.seq_len = 0;
  AttentionParams params;
  float x[4] = {0, 0, 0, 0}, o[4], l[4];
  EXPECT_THROW(attention_forward<float>(shape, params, x, x, x, o, l), std::exception);
  shape.seq_len = 1;
  params.block_kv = 0;
  EXPECT_THROW(attention_forward<float>(shape, params, x, x, x, o, l), std::exception);
  params.block_kv = 4;
  EXPECT_NO_THROW(attention_forward<float>(shape, params, x, x, x, o, l));
  EXPECT_THROW(attention_backward<float>(shape, params, x, x, x, o, nullptr, x, o, o, o), std::exception);
}

}  // namespace
}  // namespace fastudy
