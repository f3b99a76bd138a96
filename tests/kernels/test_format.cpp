// Tests of the emulated number formats (kernels/format.hpp, kernels/round.hpp): names, properties,
// and round-to-nearest-even bit-exact with hardware and with independent references.
//   fp16: against the F16C instruction (vcvtps2ph, round to nearest even) on every rounding-relevant bit
//   pattern class and 2^26 random fp32 patterns.
//   bf16: against c10::BFloat16's round_to_nearest_even, re-typed below, on the same sweep.
//   every format: against an exact rational reference (frexp/ldexp, no bit tricks) on a strided
//   subset of all fp32 patterns and on random doubles; fp8 against hand-checked tables.
//   double sources: crafted cases where rounding through fp32 first would give a different answer.
#include <gtest/gtest.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/error.hpp"
#include "kernels/format.hpp"
#include "kernels/round.hpp"

namespace fastudy {
namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
std::uint64_t bits_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
}

// Exact reference: x (finite, exact in double or long double) rounded to p fraction bits with the
// exponent range [emin, emax], ties to even, by arithmetic on the value (no bit manipulation).
long double reference_round(long double x, int p, int emin, int emax, bool nan_on_overflow) {
  if (std::isnan(x)) return x;
  const long double inf = std::numeric_limits<long double>::infinity();
  const long double nan = std::numeric_limits<long double>::quiet_NaN();
  if (std::isinf(x)) return nan_on_overflow ? nan : x;
  if (x == 0) return x;
  const long double a = std::fabs(x);
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the binade exponent is e - 1
  const int quantum_exp = std::max(e - 1, emin) - p;
  const long double scaled = std::ldexp(a, -quantum_exp);  // exact: power-of-two scaling
  long double n = std::floor(scaled);
  const long double rem = scaled - n;
  if (rem > 0.5L || (rem == 0.5L && std::fmod(n, 2.0L) != 0)) n += 1;
  long double r = std::ldexp(n, quantum_exp);
  const long double max_fraction = std::ldexp(1.0L, p) - 1 - (nan_on_overflow ? 1 : 0);
  const long double max_value = std::ldexp(std::ldexp(1.0L, p) + max_fraction, emax - p);
  if (r > max_value) return nan_on_overflow ? nan : (std::signbit(x) ? -inf : inf);
  return std::signbit(x) ? -r : r;
}

struct FormatParams {
  Format f;
  int p, emin, emax;
  bool nan_on_overflow;
};
constexpr FormatParams kParams[] = {
    {Format::fp32, 23, -126, 127, false},    {Format::tf32, 10, -126, 127, false},
    {Format::fp16, 10, -14, 15, false},      {Format::bf16, 7, -126, 127, false},
    {Format::fp8_e4m3, 3, -6, 8, true},      {Format::fp8_e5m2, 2, -14, 15, false},
};

// Same value, or both NaN.
template <class T>
bool same(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return bits_of(a) == bits_of(b);
}

TEST(Format, NamesRoundTrip) {
  for (Format f : kAllFormats) {
    auto parsed = parse_format(to_string(f));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, f);
  }
  EXPECT_FALSE(parse_format("fp12").has_value());
  EXPECT_FALSE(parse_format("FP16").has_value());
  EXPECT_EQ(format_names(), "fp64, fp32, tf32, fp16, bf16, fp8_e4m3, fp8_e5m2");
}

TEST(Format, MantissaBitsAndUnitRoundoff) {
  EXPECT_EQ(mantissa_bits(Format::fp64), 52);
  EXPECT_EQ(mantissa_bits(Format::fp32), 23);
  EXPECT_EQ(mantissa_bits(Format::tf32), 10);
  EXPECT_EQ(mantissa_bits(Format::fp16), 10);
  EXPECT_EQ(mantissa_bits(Format::bf16), 7);
  EXPECT_EQ(mantissa_bits(Format::fp8_e4m3), 3);
  EXPECT_EQ(mantissa_bits(Format::fp8_e5m2), 2);
  EXPECT_EQ(unit_roundoff(Format::fp64), std::ldexp(1.0, -53));
  EXPECT_EQ(unit_roundoff(Format::fp32), std::ldexp(1.0, -24));
  EXPECT_EQ(unit_roundoff(Format::fp16), std::ldexp(1.0, -11));
  EXPECT_EQ(unit_roundoff(Format::bf16), std::ldexp(1.0, -8));
}

__attribute__((target("avx,f16c"))) void f16c_round(const float* in, float* out) {
  const __m128 x = _mm_loadu_ps(in);
  const __m128i h = _mm_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm_storeu_ps(out, _mm_cvtph_ps(h));
}

// The fp32 patterns the sweeps check (a full 2^32 sweep takes ~40 s here, too slow for CI):
//   structured: every sign and exponent x the 4 bits at and below the kept lowest bit (lsb, round,
//   and the top sticky bits: ties, just-above, just-below, odd/even) exhaustively x 9 patterns of the
//   lower sticky bits x 8 patterns of the upper fraction bits (including all ones, for carries);
//   random: 2^26 uniformly random patterns.
template <class Check>
void sweep_patterns(int shift, Check check) {
  std::mt19937_64 rng(2405);
  const std::uint32_t low_bits = shift - 3;               // sticky bits below the 4 exhaustive ones
  const std::uint32_t low_mask = (1u << low_bits) - 1;
  const std::uint32_t high_bits = 23 - (shift + 1);       // fraction bits above the kept lsb
  const std::uint32_t high_mask = (1u << high_bits) - 1;
  std::vector<std::uint32_t> lows = {0, 1, low_mask, 1u << (low_bits - 1), low_mask >> 1};
  std::vector<std::uint32_t> highs = {0, high_mask, 1, high_mask - 1};
  while (lows.size() < 9) lows.push_back(static_cast<std::uint32_t>(rng()) & low_mask);
  while (highs.size() < 8) highs.push_back(static_cast<std::uint32_t>(rng()) & high_mask);
  for (std::uint32_t sign_exp = 0; sign_exp < 512; ++sign_exp)
    for (std::uint32_t mid = 0; mid < 16; ++mid)
      for (std::uint32_t lo : lows)
        for (std::uint32_t hi : highs)
          check((sign_exp << 23) | (hi << (shift + 1)) | (mid << low_bits) | lo);
  for (int i = 0; i < (1 << 26); ++i) check(static_cast<std::uint32_t>(rng()));
}

TEST(Format, Fp16MatchesF16c) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this CPU has no F16C instructions";
  std::uint64_t mismatches = 0, checked = 0;
  std::uint32_t first_bad = 0;
  sweep_patterns(13, [&](std::uint32_t u) {
    float in[4] = {float_of(u), 0, 0, 0}, hw[4];
    f16c_round(in, hw);
    ++checked;
    if (!same(round_to_format<Format::fp16>(in[0]), hw[0]) && mismatches++ == 0) first_bad = u;
  });
  EXPECT_GT(checked, std::uint64_t(1) << 26);
  EXPECT_EQ(mismatches, 0u) << "first mismatch at fp32 pattern 0x" << std::hex << first_bad;
}

__attribute__((target("avx,f16c"))) float f16c_decode(std::uint16_t bits) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(static_cast<short>(bits))));
}

// Every one of the 65,536 binary16 patterns: the value equals the F16C instruction's conversion (NaN
// payloads included), and encoding it gives the pattern back (NaN: a NaN of the same sign).
TEST(Format, Fp16BitsDecodeLikeF16cAndRoundTrip) {
  int decode_mismatches = 0, roundtrip_mismatches = 0;
  const bool f16c = __builtin_cpu_supports("f16c");
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float x = from_fp16_bits(bits);
    if (f16c && bits_of(x) != bits_of(f16c_decode(bits))) ++decode_mismatches;
    const std::uint16_t back = to_fp16_bits(x);
    const bool nan = (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu) != 0;
    const bool ok = nan ? std::isnan(from_fp16_bits(back)) && (back & 0x8000u) == (bits & 0x8000u) : back == bits;
    if (!ok) ++roundtrip_mismatches;
    if (!nan) {
      EXPECT_EQ(round_to(Format::fp16, x), x) << "pattern " << b << " is not an fp16 value";
    }
  }
  EXPECT_EQ(decode_mismatches, 0);
  EXPECT_EQ(roundtrip_mismatches, 0);
  EXPECT_EQ(from_fp16_bits(0x3c00), 1.0f);
  EXPECT_EQ(from_fp16_bits(0x0001), 0x1.0p-24f);  // the smallest subnormal
  EXPECT_EQ(from_fp16_bits(0x7bff), 65504.0f);    // the largest finite value
}

// Every bf16 pattern: the value is the top half of a binary32 and encodes back to the same pattern.
TEST(Format, Bf16BitsRoundTrip) {
  int mismatches = 0;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float x = from_bf16_bits(bits);
    if (bits_of(x) != b << 16 || to_bf16_bits(x) != bits) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(from_bf16_bits(0x3f80), 1.0f);
}

// c10::BFloat16's round_to_nearest_even (c10/util/BFloat16.h), re-typed: NaN -> 0x7FC0.
std::uint16_t c10_round_to_nearest_even(float src) {
  if (std::isnan(src)) return UINT16_C(0x7FC0);
  const std::uint32_t u = bits_of(src);
  const std::uint32_t rounding_bias = ((u >> 16) & 1) + UINT32_C(0x7FFF);
  return static_cast<std::uint16_t>((u + rounding_bias) >> 16);
}

// ulp_distance counts the values of the format between two of its values: against the ordering of the
// bit patterns (sign-magnitude, positive patterns ascend with the value) on every bf16 and fp16 value
// against a fixed set, and on random fp32 and fp64 values with their neighbours.
std::int64_t signed_position(std::uint64_t bits, int sign_bit) {
  const std::uint64_t magnitude = bits & ((std::uint64_t{1} << sign_bit) - 1);
  return (bits >> sign_bit) & 1 ? -static_cast<std::int64_t>(magnitude) : static_cast<std::int64_t>(magnitude);
}

TEST(Format, UlpDistanceCountsTheValuesBetween) {
  const std::uint16_t others[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x3f80, 0xbf80, 0x0080, 0x7f7f, 0xff7f};
  int wrong = 0;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float x = from_bf16_bits(bits);
    if (std::isfinite(x))
      for (std::uint16_t o : others)
        wrong += ulp_distance(Format::bf16, x, from_bf16_bits(o)) !=
                 std::llabs(signed_position(bits, 15) - signed_position(o, 15));
    const float h = from_fp16_bits(bits);
    if (std::isfinite(h))
      for (std::uint16_t o : {std::uint16_t(0x0000), std::uint16_t(0x8001), std::uint16_t(0x3c00), std::uint16_t(0x7bff)})
        wrong += ulp_distance(Format::fp16, h, from_fp16_bits(o)) !=
                 std::llabs(signed_position(bits, 15) - signed_position(o, 15));
  }
  EXPECT_EQ(wrong, 0);
  std::mt19937_64 rng(11);
  for (int i = 0; i < 100000; ++i) {
    const float a = float_of(static_cast<std::uint32_t>(rng()) & 0xff7fffffu);  // finite: exponent below 255
    const float b = float_of(static_cast<std::uint32_t>(rng()) & 0xff7fffffu);
    ASSERT_EQ(ulp_distance(Format::fp32, a, b),
              std::llabs(signed_position(bits_of(a), 31) - signed_position(bits_of(b), 31)))
        << a << " " << b;
    const double c = std::ldexp(static_cast<double>(rng() >> 11), -40 - static_cast<int>(rng() % 1000));
    ASSERT_EQ(ulp_distance(Format::fp64, c, std::nextafter(c, 1e300)), 1) << c;
    ASSERT_EQ(ulp_distance(Format::fp64, -c, c), 2 * signed_position(bits_of(c), 63)) << c;
  }
  // Across a power of two, through the subnormals, and across zero, in the narrow formats too.
  EXPECT_EQ(ulp_distance(Format::bf16, 1.0, 1.0 - 0x1p-8), 1);
  EXPECT_EQ(ulp_distance(Format::bf16, 1.0, 1.0 + 0x1p-7), 1);
  EXPECT_EQ(ulp_distance(Format::fp16, 0x1p-24, -0x1p-24), 2);
  EXPECT_EQ(ulp_distance(Format::fp8_e4m3, 1.0, 448.0), 8 * 9 - 2);  // 1 = 2^0 .. 448 = 1.75 * 2^8
  EXPECT_EQ(ulp_distance(Format::bf16, 0.0, -0.0), 0);
  EXPECT_THROW(ulp_distance(Format::bf16, 1.0, std::numeric_limits<double>::infinity()), Error);
}

TEST(Format, Bf16MatchesC10) {
  std::uint64_t mismatches = 0;
  std::uint32_t first_bad = 0;
  sweep_patterns(16, [&](std::uint32_t u) {
    const float x = float_of(u);
    const float ours = round_to_format<Format::bf16>(x);
    const float ref = float_of(std::uint32_t(c10_round_to_nearest_even(x)) << 16);
    const bool ok = same(ours, ref) && (bits_of(ours) & 0xFFFFu) == 0;
    if (!ok && mismatches++ == 0) first_bad = u;
  });
  EXPECT_EQ(mismatches, 0u) << "first mismatch at fp32 pattern 0x" << std::hex << first_bad;
}

// round_inplace's branch-free fp32 -> bf16 loop against the per-value rounding, bit for bit (NaN
// payloads included), over the same patterns.
TEST(Format, Bf16RoundInplaceMatchesPerValueBitForBit) {
  std::vector<std::uint32_t> patterns;
  sweep_patterns(16, [&](std::uint32_t u) { patterns.push_back(u); });
  for (std::uint32_t u : {0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu, 0x7f7fffffu, 0x00000001u,
                          0x80008000u})
    patterns.push_back(u);
  std::vector<float> x(patterns.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float_of(patterns[i]);
  round_inplace(Format::bf16, x.data(), x.size());
  std::uint64_t mismatches = 0;
  std::uint32_t first_bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (bits_of(x[i]) != bits_of(round_to_format<Format::bf16>(float_of(patterns[i]))) && mismatches++ == 0)
      first_bad = patterns[i];
  EXPECT_EQ(mismatches, 0u) << "first mismatch at fp32 pattern 0x" << std::hex << first_bad;
}

TEST(Format, EveryFormatMatchesExactReferenceOnFloats) {
  // A prime stride visits every exponent and many fraction patterns; the low patterns near each
  // format's rounding boundaries are covered by the full sweeps above and the tables below.
  constexpr std::uint64_t kStride = 4099;
  for (const FormatParams& fp : kParams) {
    std::uint64_t mismatches = 0;
    std::uint32_t first_bad = 0;
    for (std::uint64_t i = 0; i < (std::uint64_t(1) << 32); i += kStride) {
      const float x = float_of(static_cast<std::uint32_t>(i));
      const float ours = round_to(fp.f, x);
      const float ref = static_cast<float>(reference_round(x, fp.p, fp.emin, fp.emax, fp.nan_on_overflow));
      if (!same(ours, ref) && mismatches++ == 0) first_bad = static_cast<std::uint32_t>(i);
    }
    EXPECT_EQ(mismatches, 0u) << to_string(fp.f) << ": first mismatch at 0x" << std::hex << first_bad;
  }
}

TEST(Format, EveryFormatMatchesExactReferenceOnDoubles) {
  std::mt19937_64 rng(12345);
  for (const FormatParams& fp : kParams) {
    for (int i = 0; i < 200000; ++i) {
      // Random sign, fraction and an exponent around the format's range (normal, subnormal, overflow).
      const std::uint64_t fraction = rng() & ((std::uint64_t(1) << 52) - 1);
      const int exponent = fp.emin - fp.p - 3 + static_cast<int>(rng() % (fp.emax - fp.emin + fp.p + 6));
      double x = std::ldexp(1.0 + std::ldexp(static_cast<double>(fraction), -52), exponent);
      if (rng() & 1) x = -x;
      const double ours = round_to(fp.f, x);
      const double ref = static_cast<double>(reference_round(x, fp.p, fp.emin, fp.emax, fp.nan_on_overflow));
      ASSERT_TRUE(same(ours, ref)) << to_string(fp.f) << " x=" << x << " ours=" << ours << " ref=" << ref;
    }
  }
}

TEST(Format, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Format f : kAllFormats) {
    EXPECT_TRUE(std::isnan(round_to(f, nan))) << to_string(f);
    EXPECT_TRUE(std::isnan(round_to(f, -nan))) << to_string(f);
    EXPECT_TRUE(std::isnan(round_to(f, static_cast<double>(nan)))) << to_string(f);
    EXPECT_TRUE(std::signbit(round_to(f, -0.0f))) << to_string(f);
    EXPECT_TRUE(std::signbit(round_to(f, -0.0))) << to_string(f);
    EXPECT_EQ(round_to(f, 0.0f), 0.0f);
    EXPECT_EQ(round_to(f, 1.0f), 1.0f);
    EXPECT_EQ(round_to(f, -2.0), -2.0);
    if (f == Format::fp8_e4m3) {
      EXPECT_TRUE(std::isnan(round_to(f, inf)));
      EXPECT_TRUE(std::isnan(round_to(f, -static_cast<double>(inf))));
    } else {
      EXPECT_EQ(round_to(f, inf), inf) << to_string(f);
      EXPECT_EQ(round_to(f, -static_cast<double>(inf)), -static_cast<double>(inf)) << to_string(f);
    }
  }
  // A tiny negative value rounds to -0 in every narrow format.
  EXPECT_TRUE(std::signbit(round_to(Format::fp16, -1e-30f)));
  EXPECT_EQ(round_to(Format::fp16, -1e-30f), 0.0f);
  // A NaN whose payload sits only in the low bits must not turn into inf when bits are dropped.
  EXPECT_TRUE(std::isnan(round_to(Format::bf16, float_of(0x7F800001u))));
  EXPECT_TRUE(std::isnan(round_to(Format::fp16, float_of(0xFF800001u))));
}

struct Case {
  double in, out;
};

TEST(Format, Fp8E4m3Table) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Hand-checked: 3 fraction bits, emin -6, max 1.75 * 2^8 = 448, overflow -> NaN (OCP e4m3 "fn").
  const Case cases[] = {
      {448, 448},                                 // largest finite value
      {464, 448},                                 // halfway 448..480: tie to even fraction 110
      {464.0001, nan},                            // above the tie rounds to 480, which is NaN
      {480, nan},      {1e6, nan},                // overflow saturates to NaN, never inf
      {1.0625, 1.0},                              // 1 + 2^-4: tie between 1.000b and 1.001b -> 1
      {1.1875, 1.25},                             // 1 + 3*2^-4: tie between 1.001b and 1.010b -> 1.25
      {std::ldexp(1.0, -6), std::ldexp(1.0, -6)},  // smallest normal
      {std::ldexp(1.0, -9), std::ldexp(1.0, -9)},  // smallest subnormal 2^-9
      {std::ldexp(1.0, -10), 0.0},                // half the smallest subnormal: tie to even -> 0
      {std::ldexp(1.5, -10), std::ldexp(1.0, -9)},
      {std::ldexp(3.0, -10), std::ldexp(2.0, -9)},  // 1.5 * 2^-9: tie between 1 and 2 quanta -> 2
      {std::ldexp(7.0, -9), std::ldexp(7.0, -9)},   // largest subnormal 0.875 * 2^-6
      {std::ldexp(7.5, -9), std::ldexp(1.0, -6)},   // tie between 7 and 8 quanta -> 8 = min normal
      {-448, -448},    {-500, -nan},
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(same(round_to(Format::fp8_e4m3, c.in), c.out)) << c.in;
    EXPECT_TRUE(same(static_cast<double>(round_to(Format::fp8_e4m3, static_cast<float>(c.in))), c.out)) << c.in;
  }
}

TEST(Format, Fp8E5m2Table) {
  const double inf = std::numeric_limits<double>::infinity();
  // Hand-checked: 2 fraction bits, emin -14, max 1.75 * 2^15 = 57344, IEEE overflow to inf.
  const Case cases[] = {
      {57344, 57344},
      {61439, 57344},                                // below the halfway point to 2^16
      {61440, inf},                                  // tie between 57344 (odd) and 2^16 (even): inf
      {1.125, 1.0},                                  // tie between 1.00b and 1.01b -> 1
      {1.375, 1.5},                                  // tie between 1.01b and 1.10b -> 1.5
      {std::ldexp(1.0, -16), std::ldexp(1.0, -16)},  // smallest subnormal
      {std::ldexp(1.0, -17), 0.0},                   // tie -> 0
      {std::ldexp(3.0, -17), std::ldexp(2.0, -16)},  // 1.5 quanta -> 2 quanta
      {std::ldexp(3.0, -16), std::ldexp(3.0, -16)},  // largest subnormal 0.75 * 2^-14
      {-57344, -57344},
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(same(round_to(Format::fp8_e5m2, c.in), c.out)) << c.in;
    EXPECT_TRUE(same(static_cast<double>(round_to(Format::fp8_e5m2, static_cast<float>(c.in))), c.out)) << c.in;
  }
}

TEST(Format, DoubleRoundsOnceNotThroughFloat) {
  // Each input sits just off a tie of the target format by an amount fp32 cannot hold, so going
  // through fp32 first lands exactly on the tie and rounds to even: the wrong neighbour.
  const double t40 = std::ldexp(1.0, -40);
  struct DoubleCase {
    Format f;
    double in, single, via_fp32;
  };
  const DoubleCase cases[] = {
      // fp16 near 1 (ulp 2^-10): 1 + 2^-11 is the tie between 1 and 1 + 2^-10.
      {Format::fp16, 1 + std::ldexp(1.0, -11) + t40, 1 + std::ldexp(1.0, -10), 1.0},
      // 1 + 3*2^-11 is the tie between 1 + 2^-10 (odd) and 1 + 2^-9 (even); just below it -> 1 + 2^-10.
      {Format::fp16, 1 + 3 * std::ldexp(1.0, -11) - t40, 1 + std::ldexp(1.0, -10), 1 + std::ldexp(1.0, -9)},
      // fp16 subnormals (quantum 2^-24): 2^-25 is the tie between 0 and 2^-24.
      {Format::fp16, std::ldexp(1.0, -25) + std::ldexp(1.0, -60), std::ldexp(1.0, -24), 0.0},
      // bf16 near 1 (ulp 2^-7).
      {Format::bf16, 1 + std::ldexp(1.0, -8) + t40, 1 + std::ldexp(1.0, -7), 1.0},
      {Format::bf16, -(1 + std::ldexp(1.0, -8) + t40), -(1 + std::ldexp(1.0, -7)), -1.0},
      {Format::tf32, 1 + std::ldexp(1.0, -11) + t40, 1 + std::ldexp(1.0, -10), 1.0},
  };
  for (const DoubleCase& c : cases) {
    EXPECT_EQ(round_to(c.f, c.in), c.single) << to_string(c.f) << " " << c.in;
    EXPECT_EQ(static_cast<double>(round_to(c.f, static_cast<float>(c.in))), c.via_fp32) << to_string(c.f);
  }
  // Rounding a double to fp32 matches the hardware conversion, including subnormals and overflow.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const double x = std::ldexp(static_cast<double>(rng() >> 11), static_cast<int>(rng() % 320) - 53 - 160);
    EXPECT_EQ(round_to(Format::fp32, x), static_cast<double>(static_cast<float>(x))) << x;
  }
}

TEST(Format, RoundInplaceMatchesScalar) {
  std::mt19937_64 rng(3);
  std::vector<float> xf(1000);
  std::vector<double> xd(1000);
  for (std::size_t i = 0; i < xf.size(); ++i) {
    xd[i] = std::ldexp(static_cast<double>(rng() >> 11), -53) * 600 - 300;
    xf[i] = static_cast<float>(xd[i]);
  }
  for (Format f : kAllFormats) {
    std::vector<float> rf = xf;
    std::vector<double> rd = xd;
    round_inplace(f, rf.data(), rf.size());
    round_inplace(f, rd.data(), rd.size());
    for (std::size_t i = 0; i < xf.size(); ++i) {
      EXPECT_TRUE(same(rf[i], round_to(f, xf[i])));
      EXPECT_TRUE(same(rd[i], round_to(f, xd[i])));
    }
  }
  // fp64 and (for floats) fp32 are the identity.
  EXPECT_EQ(round_to(Format::fp64, 0.1), 0.1);
  EXPECT_EQ(round_to(Format::fp32, 0.1f), 0.1f);
  EXPECT_EQ(round_to(Format::fp32, 0.1), static_cast<double>(0.1f));
}

// ---- rounding toward zero and stochastic rounding ------------------------------------------------

TEST(Rounding, NamesRoundTrip) {
  for (Rounding r : kAllRoundings) EXPECT_EQ(parse_rounding(to_string(r)), r);
  EXPECT_FALSE(parse_rounding("up").has_value());
  EXPECT_EQ(rounding_names(), "nearest, zero, stochastic");
}

// Truncation: the neighbour nearer zero, for normal, subnormal and overflowing values of every format;
// every result is representable (rounding it to nearest changes nothing); finite values never become inf.
TEST(Rounding, ZeroTruncatesTowardZero) {
  std::mt19937_64 rng(5);
  for (Format f : {Format::tf32, Format::fp16, Format::bf16, Format::fp8_e4m3, Format::fp8_e5m2}) {
    for (int i = 0; i < 200000; ++i) {
      // Magnitudes from far below the smallest subnormal of fp16 to above fp8's range.
      const float x = std::ldexp(static_cast<float>(rng() % 1000000) / 1e6f + 1.0f, static_cast<int>(rng() % 60) - 30) *
                      ((rng() & 1) ? 1.0f : -1.0f);
      const float r = round_to(f, x, Rounding::zero, 0);
      ASSERT_EQ(round_to(f, r), r) << to_string(f) << " " << x;
      ASSERT_LE(std::fabs(r), std::fabs(x)) << to_string(f) << " " << x;
      ASSERT_TRUE(std::isfinite(r)) << to_string(f) << " " << x;
      const float nearest = round_to(f, x);
      if (std::fabs(nearest) <= std::fabs(x)) {
        ASSERT_EQ(r, nearest) << to_string(f) << " " << x;  // nearest is the lower neighbour
      } else if (std::isfinite(nearest)) {
        ASSERT_LT(std::fabs(r), std::fabs(nearest)) << to_string(f) << " " << x;
      }
    }
  }
  EXPECT_EQ(round_to(Format::fp16, 1e6f, Rounding::zero, 0), 65504.0f);    // overflow: the largest finite
  EXPECT_EQ(round_to(Format::fp8_e4m3, 1e4f, Rounding::zero, 0), 448.0f);
  EXPECT_TRUE(std::isinf(round_to(Format::bf16, std::numeric_limits<float>::infinity(), Rounding::zero, 0)));
  EXPECT_TRUE(std::isnan(round_to(Format::bf16, std::numeric_limits<float>::quiet_NaN(), Rounding::zero, 0)));
  EXPECT_TRUE(std::signbit(round_to(Format::fp16, -1e-30f, Rounding::zero, 0)));  // -0 stays negative
}

// Truncation is biased: on x uniform in [1, 2) the error x - trunc(x) is uniform on [0, ulp) (ulp = 2u
// at 1), so the mean signed error is -u, for nearest 0. With n = 2^20 draws the standard error of
// the mean is ulp / sqrt(12 n) < 2.9e-4 ulp: the bounds below are 5 standard errors wide.
TEST(Rounding, ZeroIsBiasedTowardZeroNearestIsNot) {
  std::mt19937_64 rng(6);
  for (Format f : {Format::fp16, Format::bf16}) {
    const double u = unit_roundoff(f), ulp = 2 * u;
    const int n = 1 << 20;
    double sum_zero = 0, sum_nearest = 0;
    for (int i = 0; i < n; ++i) {
      const double x = 1.0 + static_cast<double>(rng() >> 11) * 0x1p-53;
      sum_zero += round_to(f, x, Rounding::zero, 0) - x;
      sum_nearest += round_to(f, x) - x;
    }
    const double se = ulp / std::sqrt(12.0 * n);
    EXPECT_NEAR(sum_zero / n, -u, 5 * se) << to_string(f);
    EXPECT_NEAR(sum_nearest / n, 0.0, 5 * se) << to_string(f);
  }
}

// Stochastic rounding: always one of the two neighbours; up with probability equal to the dropped
// fraction, so E[round(x)] = x. For x at fraction t of the way from lo to hi, n draws give a mean
// with standard error ulp sqrt(t (1 - t) / n); the random bits resolve the fraction to 2^-32 of an
// ulp for double sources and to 2^-(dropped bits) for float sources (bf16 from float: 2^-16 ulp),
// a bias below 2^-16 ulp. Bound: 5 standard errors + that resolution.
TEST(Rounding, StochasticIsUnbiasedAndOnlyPicksNeighbours) {
  for (Format f : {Format::fp16, Format::bf16, Format::fp8_e4m3}) {
    for (double t : {0.1, 0.3, 0.5, 0.77}) {
      // Normal values of both signs and a subnormal of the format.
      const double subnormal = f == Format::fp16 ? 0x1p-20 : f == Format::bf16 ? 0x1p-130 : 0x1p-8;
      for (double scale : {1.0, -1.0, subnormal}) {
        const double base = 1.5 * scale;
        ASSERT_EQ(static_cast<double>(round_to(f, static_cast<float>(base))), base);
        // The grid step at base: 2^(e - p), with e at least the smallest normal exponent (subnormals).
        const int emin = f == Format::fp16 ? -14 : f == Format::bf16 ? -126 : -6;
        const double ulp = std::ldexp(1.0, std::max(std::ilogb(base), emin) - mantissa_bits(f));
        const float x = static_cast<float>(base + std::copysign(t * ulp, base));
        const float lo = static_cast<float>(base), hi = static_cast<float>(base + std::copysign(ulp, base));
        const int n = 1 << 18;
        double sum = 0;
        for (int i = 0; i < n; ++i) {
          const float r = round_to(f, x, Rounding::stochastic, random_bits32(0xC0FFEEu, static_cast<std::uint32_t>(i)));
          ASSERT_TRUE(r == lo || r == hi) << to_string(f) << " x " << x << " gave " << r;
          sum += r;
        }
        const double se = ulp * std::sqrt(t * (1 - t) / n);
        EXPECT_NEAR(sum / n, static_cast<double>(x), 5 * se + ulp * 0x1p-16) << to_string(f) << " x " << x;
      }
    }
  }
}

TEST(Rounding, StochasticIsReproducibleAndKeyed) {
  const float x = 1.0f + 0x1p-9f;  // a quarter of the way between two bf16 values
  std::vector<float> a, b, c;
  for (std::uint32_t i = 0; i < 4096; ++i) {
    a.push_back(round_to(Format::bf16, x, Rounding::stochastic, random_bits32(random_stream_key(7, 3), i)));
    b.push_back(round_to(Format::bf16, x, Rounding::stochastic, random_bits32(random_stream_key(7, 3), i)));
    c.push_back(round_to(Format::bf16, x, Rounding::stochastic, random_bits32(random_stream_key(7, 4), i)));
  }
  EXPECT_EQ(a, b);  // the same stream gives the same roundings
  EXPECT_NE(a, c);  // another head's stream gives others
  // Exactly representable values never move, whatever the bits.
  for (std::uint32_t bits : {0u, 1u, 0x7fffffffu, 0xffffffffu}) {
    EXPECT_EQ(round_to(Format::bf16, 1.5f, Rounding::stochastic, bits), 1.5f);
    EXPECT_EQ(round_to(Format::fp16, -0.25, Rounding::stochastic, bits), -0.25);
  }
}

}  // namespace
}  // namespace fastudy
