// Tests of the Hopper tensor-core dot-product model (kernels/mma_model.hpp, MMA-Sim's rules for
// mma.sync m16n8k16 .f32.{f16,bf16}): constructed cases whose results are worked out by hand in the
// comments (each one separates the model from the exact sum rounded to nearest and from a chain of
// fp32 FMAs, which is what a CPU would compute), and random cases against an independent reference
// written with fp64 arithmetic (frexp, ldexp, trunc: each truncated term and their sum are exact in
// fp64, see ref_dot) instead of the model's integer bit manipulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/format.hpp"
#include "kernels/mma_model.hpp"
#include "kernels/round.hpp"

namespace fastudy {
namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

struct Case {
  float a[16] = {};
  float b[16] = {};
  float c = 0.0f;
};

template <Format F>
float model(const Case& t) {
  return mma::dot_k16<F>(t.a, t.b, t.c);
}

// The fp32 FMA chain a CPU (or a CUDA core) computes: c, then acc = fmaf(a_i, b_i, acc) in order.
float fma_chain(const Case& t) {
  float acc = t.c;
  for (int i = 0; i < 16; ++i) acc = std::fma(t.a[i], t.b[i], acc);
  return acc;
}

// The exact dot product rounded once to the nearest fp32 (every term and partial sum below is exact
// in long double for the cases that use it: at most 64 significant bits).
float exact_nearest(const Case& t) {
  long double s = t.c;
  for (int i = 0; i < 16; ++i) s += static_cast<long double>(t.a[i]) * t.b[i];
  return static_cast<float>(s);
}

// The reference: MMA-Sim's rules written in fp64 arithmetic. A product of two fp16/bf16 values has at
// most 16 significant bits and a term truncated to 2^(e_max - 25) units is an integer below 2^27, so
// ldexp/trunc are exact and the sum of 17 such integers (< 2^32) is exact in double.
template <Format F>
float ref_dot(const Case& t) {
  double s64 = t.c;
  for (int i = 0; i < 16; ++i) s64 += static_cast<double>(t.a[i]) * static_cast<double>(t.b[i]);
  if (std::isnan(s64)) {
    const std::uint32_t nan = 0x7FFFFFFFu;
    float f;
    std::memcpy(&f, &nan, 4);
    return f;
  }
  if (std::isinf(s64)) return static_cast<float>(s64);
  auto exponent = [](double x, int emin) {
    if (x == 0.0) return -126;
    int k;
    std::frexp(x, &k);
    return std::max(k - 1, emin);
  };
  const int emin = FormatTraits<F>::emin;
  int e_max = exponent(t.c, -126);
  for (int i = 0; i < 16; ++i) e_max = std::max(e_max, exponent(t.a[i], emin) + exponent(t.b[i], emin));
  double sum = std::trunc(std::ldexp(static_cast<double>(t.c), 25 - e_max));
  for (int i = 0; i < 16; ++i)
    sum += std::trunc(std::ldexp(static_cast<double>(t.a[i]) * static_cast<double>(t.b[i]), 25 - e_max));
  const double v = std::ldexp(sum, e_max - 25);
  if (v == 0.0) return 0.0f;
  if (std::fabs(v) >= 0x1p128) return v > 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  float f = static_cast<float>(v);  // to nearest, then one step toward zero if that went outward
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
  return f;
}

// Case (a): the products are truncated after alignment. c = 1, sixteen products 1.5*2^-12 * 2^-13 =
// 1.5*2^-25: each is 1.5 units of 2^(0 - 25), truncated to 1, so the sum is 1 + 16*2^-25 = 1 + 2^-21.
// Exact: 1 + 24*2^-25 = 1 + 3*2^-22 (representable). FMA chain: 1 + 1.5*2^-25 rounds back to 1 each time.
TEST(MmaModel, ProductsAreTruncatedAfterAlignment) {
  Case t;
  t.c = 1.0f;
  for (int i = 0; i < 16; ++i) {
    t.a[i] = 0x1.8p-12f;
    t.b[i] = 0x1p-13f;
  }
  EXPECT_EQ(model<Format::fp16>(t), 1.0f + 0x1p-21f);
  EXPECT_EQ(model<Format::bf16>(t), 1.0f + 0x1p-21f);
  EXPECT_EQ(exact_nearest(t), 1.0f + 0x3p-22f);
  EXPECT_EQ(fma_chain(t), 1.0f);
}

// Case (b): the sum is rounded toward zero. 1*1 + (1.5*2^-12)(2^-12) = 1 + 1.5*2^-24, that is 2^25 + 3
// units of 2^-25 (26 bits): the top 24 are 2^23, so +1 exactly; negated -1 (toward zero, not down).
// To nearest (exact sum and FMA chain alike) it is 0.75 ulp above 1: 1 + 2^-23.
TEST(MmaModel, SumIsRoundedTowardZero) {
  Case t;
  t.a[0] = 1.0f;
  t.b[0] = 1.0f;
  t.a[5] = 0x1.8p-12f;
  t.b[5] = 0x1p-12f;
  EXPECT_EQ(model<Format::fp16>(t), 1.0f);
  EXPECT_EQ(exact_nearest(t), 1.0f + 0x1p-23f);
  EXPECT_EQ(fma_chain(t), 1.0f + 0x1p-23f);
  t.b[0] = -1.0f;
  t.b[5] = -0x1p-12f;
  EXPECT_EQ(model<Format::fp16>(t), -1.0f);
  EXPECT_EQ(exact_nearest(t), -1.0f - 0x1p-23f);
}

// Case (c): a negative term is truncated toward zero on its magnitude. 1 + 2 * (-1.5*2^-25): each
// negative product is -1.5 units, truncated to -1 (a floor would give -2), sum 2^25 - 2 units, 25 bits,
// top 24: 2^24 - 1 at 2^-24, that is 1 - 2^-24. With floors: 2^25 - 4 -> 1 - 2^-23.
TEST(MmaModel, NegativeTermsTruncateTowardZero) {
  Case t;
  t.a[0] = 1.0f;
  t.b[0] = 1.0f;
  for (int i = 1; i <= 2; ++i) {
    t.a[i] = -0x1.8p-12f;
    t.b[i] = 0x1p-13f;
  }
  EXPECT_EQ(model<Format::fp16>(t), 1.0f - 0x1p-24f);
  EXPECT_EQ(model<Format::bf16>(t), 1.0f - 0x1p-24f);
}

// Case (d): on Hopper k = 16 is one group. 1 + 2^-24 + 2^-24 with the second small product in the
// upper half (index 8): one group sums 2^25 + 4 units, exactly 1 + 2^-23. Two groups of 8 (Ampere's
// split) would round 1 + 2^-24 toward zero to 1 in between and give 1; so does the FMA chain (ties
// to even twice).
TEST(MmaModel, SixteenProductsAreOneGroup) {
  Case t;
  t.a[0] = 1.0f;
  t.b[0] = 1.0f;
  t.a[1] = 0x1p-12f;
  t.b[1] = 0x1p-12f;
  t.a[8] = 0x1p-12f;
  t.b[8] = 0x1p-12f;
  EXPECT_EQ(model<Format::fp16>(t), 1.0f + 0x1p-23f);
  EXPECT_EQ(fma_chain(t), 1.0f);
}

// Case (e): the accumulator takes part in the alignment and truncation. c = 2^30 dominates: units are
// 2^5, so sixteen products of 1.5 * 2^4 = 24 (0.75 units) vanish: c exactly. Exact: 2^30 + 384 (spacing
// 64 there, representable); FMA chain: each + 24 rounds back to 2^30 too.
TEST(MmaModel, AccumulatorSetsTheAlignment) {
  Case t;
  t.c = 0x1p30f;
  for (int i = 0; i < 16; ++i) {
    t.a[i] = 1.5f;
    t.b[i] = 16.0f;
  }
  EXPECT_EQ(model<Format::fp16>(t), 0x1p30f);
  EXPECT_EQ(exact_nearest(t), 0x1p30f + 384.0f);
  // And c truncated by a large product: 2^10 * 2^10 sets units of 2^-5; c = 1.5 * 2^-6 is 0.75 units.
  Case u;
  u.a[3] = 1024.0f;
  u.b[3] = 1024.0f;
  u.c = 0x1.8p-6f;
  EXPECT_EQ(model<Format::fp16>(u), 0x1p20f);
  EXPECT_EQ(exact_nearest(u), 0x1p20f);  // here rounding agrees: 2^20 + 0.023 is below half an ulp
  // -0.75 units truncate to 0 as well: 2^20 exactly, where rounding the exact sum 2^20 - 0.0234 toward
  // zero (as step 6 does) would give the fp32 value below 2^20, 2^20 - 2^-4.
  u.c = -0x1.8p-6f;
  EXPECT_EQ(model<Format::fp16>(u), 0x1p20f);
}

// Case (f): an fp16 subnormal keeps exponent -14. 2^-24 * 2^15 has exponent -14 + 15 = 1 (its value is
// 2^-9), so units are 2^-24 and a second product 1.5*2^-25 (0.75 units) vanishes: 2^-9. With its true
// exponent (-24) the largest exponent would be -9 and the sum exact: 2^-9 + 1.5*2^-25.
TEST(MmaModel, Fp16SubnormalKeepsTheSmallestNormalExponent) {
  Case t;
  t.a[0] = 0x1p-24f;
  t.b[0] = 0x1p15f;
  t.a[1] = 0x1.8p-12f;
  t.b[1] = 0x1p-13f;
  EXPECT_EQ(model<Format::fp16>(t), 0x1p-9f);
  EXPECT_EQ(exact_nearest(t), 0x1p-9f + 0x1.8p-25f);
}

// Case (g): MMA-Sim gives a zero operand exponent -126 and lets it take part in the maximum. bf16 0 *
// 2^120 has exponent -6, so units are 2^-31 and the product 1.5*2^-40 (a tiny fraction of a unit)
// vanishes: +0. A zero product ignored would leave the exact 1.5*2^-40.
TEST(MmaModel, ZeroOperandTakesPartWithExponentMinus126) {
  Case t;
  t.a[0] = 0.0f;
  t.b[0] = 0x1p120f;
  t.a[1] = 0x1.8p-20f;
  t.b[1] = 0x1p-20f;
  EXPECT_EQ(bits_of(model<Format::bf16>(t)), 0u);
  EXPECT_EQ(exact_nearest(t), 0x1.8p-40f);
}

// Special values and the ends of the range.
TEST(MmaModel, SpecialValuesZerosSubnormalsAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Case t;
  t.a[0] = inf;
  t.b[0] = 2.0f;
  EXPECT_EQ(model<Format::fp16>(t), inf);
  t.b[0] = -2.0f;
  EXPECT_EQ(model<Format::fp16>(t), -inf);
  t.b[0] = 0.0f;  // inf * 0: the canonical NaN
  EXPECT_EQ(bits_of(model<Format::fp16>(t)), 0x7FFFFFFFu);
  t.b[0] = 1.0f;
  t.c = -inf;  // inf - inf
  EXPECT_EQ(bits_of(model<Format::fp16>(t)), 0x7FFFFFFFu);
  Case n;
  n.a[7] = nan;
  EXPECT_EQ(bits_of(model<Format::bf16>(n)), 0x7FFFFFFFu);
  n.a[7] = 0.0f;
  n.c = -nan;
  EXPECT_EQ(bits_of(model<Format::bf16>(n)), 0x7FFFFFFFu);

  // A zero sum is +0, whatever the signs: 1*1 + 1*(-1), and -0 products with c = -0.
  Case z;
  z.a[0] = 1.0f;
  z.b[0] = 1.0f;
  z.a[1] = 1.0f;
  z.b[1] = -1.0f;
  EXPECT_EQ(bits_of(model<Format::fp16>(z)), 0u);
  Case mz;
  mz.c = -0.0f;
  for (int i = 0; i < 16; ++i) {
    mz.a[i] = -0.0f;
    mz.b[i] = 1.0f;
  }
  EXPECT_EQ(bits_of(model<Format::fp16>(mz)), 0u);

  // bf16 subnormals: 2^-130 * 1.5 = 1.5*2^-130, an fp32 subnormal; with c = 2^-149 (one quantum) the
  // sum is 1.5*2^-130 + 2^-149, all on the 2^-149 grid: exact.
  Case s;
  s.a[2] = 0x1p-130f;
  s.b[2] = 1.5f;
  s.c = 0x1p-149f;
  EXPECT_EQ(model<Format::bf16>(s), 0x1.8p-130f + 0x1p-149f);
  // A product of 1.5 quanta of 2^-149 (2^-126 * 1.5*2^-23) is floored to one quantum; to nearest, the
  // tie goes to the even two quanta.
  Case tiny;
  tiny.a[0] = 0x1p-126f;
  tiny.b[0] = 0x1.8p-23f;
  EXPECT_EQ(model<Format::bf16>(tiny), 0x1p-149f);
  EXPECT_EQ(exact_nearest(tiny), 0x1p-148f);

  // bf16 products overflow fp32: 2^100 * 2^100 = 2^200 -> +inf (MMA-Sim casts the truncated value).
  Case big;
  big.a[0] = 0x1p100f;
  big.b[0] = 0x1p100f;
  EXPECT_EQ(model<Format::bf16>(big), inf);
  big.b[0] = -0x1p100f;
  EXPECT_EQ(model<Format::bf16>(big), -inf);
  // A largest-exponent sum just below 2^128 stays finite, truncated: 2 * (1.9921875 * 2^126).
  Case edge;
  edge.a[0] = 0x1.fcp63f;  // bf16 1.1111111b * 2^63
  edge.b[0] = 0x1p63f;
  edge.a[1] = 0x1.fcp63f;
  edge.b[1] = 0x1p63f;
  EXPECT_EQ(model<Format::bf16>(edge), 0x1.fcp127f);
}

// Random operands in fp16 and bf16, from a narrow exponent spread (where the truncation decides the
// low bits) to the whole range (subnormals, overflow), against the fp64 reference, bit for bit; and
// the share of cases where the model differs from the FMA chain, to show the cases are not trivial.
template <Format F>
void random_cases(std::uint32_t seed, int spread, int count, int* differs_from_chain) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> coin(0, 15);
  std::uniform_int_distribution<int> exp_c(spread < 0 ? -30 : -spread, spread < 0 ? 30 : spread);
  auto value = [&](int lo, int hi) {
    std::uniform_int_distribution<int> ex(lo, hi);
    if (coin(gen) == 0) return 0.0f;
    const double v = (coin(gen) < 8 ? -1.0 : 1.0) * std::ldexp(mant(gen), ex(gen));
    return round_to_format<F>(static_cast<float>(v));
  };
  const int lo = F == Format::fp16 ? -26 : -135;
  const int hi = F == Format::fp16 ? 15 : 127;
  for (int n = 0; n < count; ++n) {
    Case t;
    const bool whole = spread < 0;
    for (int i = 0; i < 16; ++i) {
      t.a[i] = whole ? value(lo, hi) : value(-spread, spread);
      t.b[i] = whole ? value(lo, hi) : value(-spread, spread);
    }
    const double cv = std::ldexp(mant(gen), exp_c(gen) * (whole ? 4 : 2));
    t.c = coin(gen) == 0 ? 0.0f : static_cast<float>(coin(gen) < 8 ? -cv : cv);
    const float got = mma::dot_k16<F>(t.a, t.b, t.c);
    const float want = ref_dot<F>(t);
    ASSERT_EQ(bits_of(got), bits_of(want)) << "case " << n << " seed " << seed << ": model " << got << ", reference " << want;
    if (bits_of(got) != bits_of(fma_chain(t))) ++*differs_from_chain;
  }
}

TEST(MmaModel, RandomCasesMatchTheFp64Reference) {
  int differs = 0;
  random_cases<Format::fp16>(1, 3, 40000, &differs);
  random_cases<Format::bf16>(2, 3, 40000, &differs);
  // Over a narrow spread the last bits differ from the FMA chain in a good part of the cases.
  EXPECT_GT(differs, 8000);
  random_cases<Format::fp16>(3, 12, 20000, &differs);
  random_cases<Format::bf16>(4, 40, 20000, &differs);
  random_cases<Format::fp16>(5, -1, 20000, &differs);
  random_cases<Format::bf16>(6, -1, 20000, &differs);
}

}  // namespace
}  // namespace fastudy
