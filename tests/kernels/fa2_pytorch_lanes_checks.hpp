// The vector paths of the fa2 reading's forward (kernels/detail/fa2_pytorch.hpp) against the scalar models
// they stand for, bit for bit: exponent_max_tile + poison_tile + mma_chunk (the tensor cores' dot product,
// with the fixup of the lanes outside the vector path) against mma::dot_k16, sfu_square_lanes against
// nv::sfu_square on every remainder, ex2_lanes against nv::ex2_approx. Included by one translation unit per
// vector width (test_fa2_pytorch_lanes_*.cpp), after it has set the target and included fa2_pytorch.hpp;
// each check returns the number of mismatching lanes and prints the first few. Deterministic (fixed seeds).
//
// L the vector lanes.
// Its standard headers (<cstdio>, <random>) are included by each translation unit before it switches the
// target: a template first defined under `#pragma GCC target` is compiled for that target, and the linker
// keeps one instance for every caller (an AVX-512 mersenne_twister_engine in the AVX2 and portable tests).
#pragma once

#include <cstdio>
#include <random>

namespace fastudy {
namespace {

inline std::uint32_t lane_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// The exponent the forward stores for a value of F (fa2_forward_operands, p_tile): mma::split's e, and 127
// for inf and NaN (whose chunks are poisoned).
template <Format F>
std::int8_t stored_exponent(float x) {
  return static_cast<std::int8_t>(std::isfinite(x) ? mma::split<F>(x).e : 127);
}

// One dot-product chunk as the forward holds it: the A values of L lanes ([16][L]), the B values of 4
// outputs ([16][4]) and an accumulator per output and lane ([4][L]).
struct LanesChunk {
  float a[16 * kFL];
  float b[16 * 4];
  float acc[4 * kFL];
};

// Values of F drawn to reach every path of the model: a common exponent spread over `spread` binades
// around `center`, with zeros, F's subnormals, inf and NaN at the given rates (per thousand).
template <Format F>
float lanes_value(std::mt19937_64& rng, int center, int spread, int zeros, int subnormals, int specials) {
  std::uniform_int_distribution<int> per_mille(0, 999), sign(0, 1);
  std::uniform_real_distribution<float> sig(1.0f, 2.0f);
  const int r = per_mille(rng);
  const float s = sign(rng) ? -1.0f : 1.0f;
  if (r < zeros) return s * 0.0f;
  if (r < zeros + subnormals)
    return round_to_format<F>(s * std::ldexp(sig(rng), FormatTraits<F>::emin - 1 - per_mille(rng) % FormatTraits<F>::p));
  if (r < zeros + subnormals + specials) return r % 3 == 0 ? NAN : s * INFINITY;
  const int e = center + (spread > 0 ? per_mille(rng) % (2 * spread + 1) - spread : 0);
  return round_to_format<F>(s * std::ldexp(sig(rng), e));
}

// The forward's sequence for one chunk (score_tile, pv_tile): int8 exponents, their maxima, the poison of
// chunks that hold an inf or NaN, then mma_chunk per output; each lane against mma::dot_k16.
template <Format F, bool kZeroAcc>
std::int64_t chunk_mismatches(const LanesChunk& c, int& shown) {
  std::int8_t ea[16 * kFL], eb[16 * 4], pa[kFL], pb[4];
  std::uint8_t e[4 * kFL];
  bool a_special = false, b_special = false;
  for (int l = 0; l < kFL; ++l) pa[l] = -128;
  for (int o = 0; o < 4; ++o) pb[o] = -128;
  for (int i = 0; i < 16; ++i) {
    for (int l = 0; l < kFL; ++l) {
      ea[i * kFL + l] = stored_exponent<F>(c.a[i * kFL + l]);
      if (!std::isfinite(c.a[i * kFL + l])) pa[l] = 127, a_special = true;
    }
    for (int o = 0; o < 4; ++o) {
      eb[i * 4 + o] = stored_exponent<F>(c.b[i * 4 + o]);
      if (!std::isfinite(c.b[i * 4 + o])) pb[o] = 127, b_special = true;
    }
  }
  exponent_max_tile(e, ea, kFL, eb, 4, 4);
  if (a_special || b_special) poison_tile(e, 4, a_special ? pa : nullptr, b_special ? pb : nullptr);
  FV a[16];
  for (int i = 0; i < 16; ++i) a[i] = vload(c.a + i * kFL);
  std::int64_t bad = 0;
  for (int o = 0; o < 4; ++o) {
    const FV acc = kZeroAcc ? FV{} : vload(c.acc + o * kFL);
    const FV out = mma_chunk<F, kZeroAcc>(acc, a, c.b + o, 4, e + o * kFL, c.a, kFL);
    for (int l = 0; l < kFL; ++l) {
      float av[16], bv[16];
      for (int i = 0; i < 16; ++i) av[i] = c.a[i * kFL + l], bv[i] = c.b[i * 4 + o];
      const float want = mma::dot_k16<F>(av, bv, acc[l]);
      if (lane_bits(out[l]) == lane_bits(want)) continue;
      if (shown++ < 5)
        std::printf("mma_chunk lane %d output %d: %a, dot_k16 %a (acc %a)\n", l, o, out[l], want, acc[l]);
      ++bad;
    }
  }
  return bad;
}

// Random and adversarial chunks: wide and narrow exponent spreads (bf16's whole range; fp16's), exponents
// at the vector path's edges (e_max near +-100), zero and subnormal operands and accumulators,
// accumulators of every magnitude from fp32's subnormals to inf and NaN, inf and NaN operands, and
// chunks of 16 equal maximal products of one sign (their int32 sum overflows).
template <Format F>
std::int64_t mma_chunk_mismatches() {
  using Tr = FormatTraits<F>;
  std::mt19937_64 rng(F == Format::fp16 ? 16 : 17);
  std::uniform_int_distribution<int> pick(0, 1 << 30);
  std::uniform_real_distribution<float> sig(1.0f, 2.0f);
  const int emax_f = Tr::emax, emin_f = Tr::emin;
  std::int64_t bad = 0;
  int shown = 0;
  LanesChunk c;
  for (int trial = 0; trial < 6000; ++trial) {
    const int kind = trial % 8;
    // Operand exponents: around 0 (attention's scores), over F's whole range, or near the edges.
    int center = 0, spread = 6, zeros = 20, subnormals = 10, specials = 0;
    if (kind == 1) center = (emax_f + emin_f) / 2, spread = (emax_f - emin_f) / 2;
    if (kind == 2) center = F == Format::bf16 ? 50 : 7, spread = 2;           // products near e_max 100 (bf16)
    if (kind == 3) center = F == Format::bf16 ? -50 : -7, spread = 2;         // and -100
    if (kind == 4) zeros = 600, subnormals = 200;                             // mostly zero chunks
    if (kind == 5) specials = 15;                                             // inf and NaN operands
    if (kind == 6) spread = 0;                                                // one exponent per chunk
    for (float& x : c.a) x = lanes_value<F>(rng, center, spread, zeros, subnormals, specials);
    for (float& x : c.b) x = lanes_value<F>(rng, center, spread, zeros, subnormals, specials);
    if (kind == 7) {  // 16 maximal products of one sign: sum_i (2 - 2^-p)^2 2^25 units, past int32's range
      const float big = round_to_format<F>(std::ldexp(2.0f - std::ldexp(1.0f, -Tr::p), pick(rng) % 9 - 4));
      const float s = pick(rng) % 2 ? -1.0f : 1.0f;
      for (int i = 0; i < 16; ++i) {
        for (int l = 0; l < kFL; ++l) c.a[i * kFL + l] = l % 3 == 0 ? s * big : big;
        for (int o = 0; o < 4; ++o) c.b[i * 4 + o] = o == 3 ? round_to_format<F>(big * 0.75f) : big;
      }
    }
    // Accumulators: zero, F-like magnitudes near the products', or any fp32 magnitude down to subnormals.
    for (float& x : c.acc) {
      const int r = pick(rng) % 100;
      const float s = pick(rng) % 2 ? -1.0f : 1.0f;
      if (r < 15) x = s * 0.0f;
      else if (r < 25) x = s * std::ldexp(sig(rng), -126 - pick(rng) % 24);  // fp32 subnormal
      else if (r < 27) x = r == 25 ? s * INFINITY : NAN;
      else if (r < 60) x = s * std::ldexp(sig(rng), 2 * center + pick(rng) % 11 - 5);
      else x = s * std::ldexp(sig(rng), pick(rng) % 254 - 126);
    }
    // Lanes whose 16 A values are all zero (the causal mask's P), outputs whose 16 B values are (dS, zero
    // padding), mostly with zero accumulators.
    if (kind == 4 || kind == 5) {
      for (int l = 0; l < kFL; ++l) {
        if (pick(rng) % 3 != 0) continue;
        for (int i = 0; i < 16; ++i) c.a[i * kFL + l] = pick(rng) % 2 ? -0.0f : 0.0f;
        for (int o = 0; o < 4; ++o)
          if (pick(rng) % 4 != 0) c.acc[o * kFL + l] = pick(rng) % 2 ? -0.0f : 0.0f;
      }
      for (int o = 0; o < 4; ++o) {
        if (pick(rng) % 3 != 0) continue;
        for (int i = 0; i < 16; ++i) c.b[i * 4 + o] = pick(rng) % 2 ? -0.0f : 0.0f;
        for (int l = 0; l < kFL; ++l)
          if (pick(rng) % 4 != 0) c.acc[o * kFL + l] = pick(rng) % 2 ? -0.0f : 0.0f;
      }
    }
    bad += chunk_mismatches<F, false>(c, shown) + chunk_mismatches<F, true>(c, shown);
  }
  return bad;
}

// sfu_square_lanes on every 17-bit remainder against nv::sfu_square.
inline std::int64_t sfu_square_mismatches() {
  std::int64_t bad = 0;
  for (std::int32_t r0 = 0; r0 < (1 << 17); r0 += kFL) {
    IV r;
    for (int l = 0; l < kFL; ++l) r[l] = r0 + l;
    const IV sq = sfu_square_lanes(r);
    for (int l = 0; l < kFL; ++l) bad += static_cast<std::uint32_t>(sq[l]) != nv::sfu_square(static_cast<std::uint32_t>(r0 + l));
  }
  return bad;
}

// ex2_lanes against nv::ex2_approx: the fp32 values of the softmax's range [-20, 0] at a stride of 251 bit
// patterns, 2^22 random bit patterns over the whole line, and the edges (zeros, subnormals, -126 and the
// halving below it, +-128, +-inf, NaN) each in every lane of a vector, then shuffled among each other.
inline std::int64_t ex2_mismatches() {
  std::vector<float> xs;
  for (std::uint32_t u = 0x80000000u; u <= 0xC1A00000u; u += 251) xs.push_back(nv::f32(u));
  std::mt19937_64 rng(2);
  for (int i = 0; i < (1 << 22); ++i) xs.push_back(nv::f32(static_cast<std::uint32_t>(rng())));
  const float edges[] = {0.0f,    -0.0f,       0x1p-149f,   -0x1p-149f, 0x1p-127f, -0x1p-127f, -126.0f,
                         -126.00001f, -125.99999f, -149.0f, -150.0f,  -252.0f,   -253.0f,    127.99999f,
                         128.0f,  -128.0f,     1000.0f,     -1000.0f,   INFINITY,  -INFINITY,  NAN,
                         0.5f,    -0.5f,       1.0f,        -1.0f,      0x1p-24f,  -0x1p-24f};
  const std::size_t first_edge = xs.size();
  for (float x : edges)
    for (int rep = 0; rep < kFL; ++rep) xs.push_back(x);
  for (float x : edges) xs.push_back(x);
  std::shuffle(xs.begin() + static_cast<std::ptrdiff_t>(first_edge + sizeof edges / sizeof edges[0] * kFL), xs.end(), rng);
  while (xs.size() % kFL != 0) xs.push_back(0.0f);
  std::int64_t bad = 0;
  int shown = 0;
  for (std::size_t i = 0; i < xs.size(); i += kFL) {
    const FV out = ex2_lanes(vload(xs.data() + i));
    for (int l = 0; l < kFL; ++l) {
      const float x = xs[i + static_cast<std::size_t>(l)], want = nv::ex2_approx(x);
      if (lane_bits(out[l]) == lane_bits(want)) continue;
      if (shown++ < 5) std::printf("ex2_lanes(%a): %a, ex2_approx %a\n", x, out[l], want);
      ++bad;
    }
  }
  return bad;
}

// The checks as the tests call them: not inlined into the test bodies, which are compiled for the baseline
// target (a CPU without the vector width skips them before anything of it runs).
__attribute__((noinline)) inline std::int64_t lanes_mma_chunk_fp16() { return mma_chunk_mismatches<Format::fp16>(); }
__attribute__((noinline)) inline std::int64_t lanes_mma_chunk_bf16() { return mma_chunk_mismatches<Format::bf16>(); }
__attribute__((noinline)) inline std::int64_t lanes_sfu_square() { return sfu_square_mismatches(); }
__attribute__((noinline)) inline std::int64_t lanes_ex2() { return ex2_mismatches(); }

}  // namespace
}  // namespace fastudy

// The tests of one vector width, in the suite `suite`, run where `supported` (the CPU has the instructions).
#define FASTUDY_FA2_LANES_TESTS(suite, supported)                                    \
  TEST(suite, MmaChunkMatchesDotK16) {                                               \
    if (!(supported)) GTEST_SKIP() << "the CPU lacks this vector width";             \
    EXPECT_EQ(fastudy::lanes_mma_chunk_fp16(), 0);                                   \
    EXPECT_EQ(fastudy::lanes_mma_chunk_bf16(), 0);                                   \
  }                                                                                  \
  TEST(suite, SfuSquareMatchesTheModelOnEveryRemainder) {                            \
    if (!(supported)) GTEST_SKIP() << "the CPU lacks this vector width";             \
    EXPECT_EQ(fastudy::lanes_sfu_square(), 0);                                       \
  }                                                                                  \
  TEST(suite, Ex2LanesMatchesEx2Approx) {                                            \
    if (!(supported)) GTEST_SKIP() << "the CPU lacks this vector width";             \
    EXPECT_EQ(fastudy::lanes_ex2(), 0);                                              \
  }
