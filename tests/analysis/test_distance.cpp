// Tests of the one-pair distances in analysis/distance.hpp: scipy.stats.wasserstein_distance semantics
// (the scipy documentation's values, unequal sizes and weights against a naive reference of the CDF
// integral), input validation, W2, the elementwise metrics, exact summation and the radix sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "analysis/distance.hpp"
#include "analysis/radix_sort.hpp"

namespace fastudy {
namespace {

constexpr double kU64 = 0x1p-53;  // fp64 unit roundoff

// The definition, written naively in long double: integral over the merged sorted support of
// |F_u - F_v|, with F evaluated by counting (weighting) every value <= x. O(N^2), for small inputs.
long double naive_w1(const std::vector<double>& u, const std::vector<double>& v,
                     const std::vector<double>& wu = {}, const std::vector<double>& wv = {}) {
  std::vector<double> all(u);
  all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto cdf = [](const std::vector<double>& x, const std::vector<double>& w, double t) {
    long double num = 0, den = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const long double wi = w.empty() ? 1.0L : w[i];
      den += wi;
      if (x[i] <= t) num += wi;
    }
    return num / den;
  };
  long double s = 0;
  for (std::size_t k = 0; k + 1 < all.size(); ++k)
    s += std::fabs(cdf(u, wu, all[k]) - cdf(v, wv, all[k])) * (static_cast<long double>(all[k + 1]) - all[k]);
  return s;
}

std::vector<double> normal_values(std::size_t n, unsigned seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

TEST(Wasserstein1, ScipyDocumentationValues) {
  // The three examples of scipy.stats.wasserstein_distance's documentation.
  EXPECT_DOUBLE_EQ(wasserstein1(std::vector<double>{0, 1, 3}, std::vector<double>{5, 6, 8}), 5.0);
  EXPECT_DOUBLE_EQ(wasserstein1(std::vector<double>{0, 1}, std::vector<double>{0, 1},
                                std::vector<double>{3, 1}, std::vector<double>{2, 2}),
                   0.25);
  // Each of the <= 6 integral terms takes ~6 roundings (two CDF divisions, a cumulative weight sum of
  // <= 4 terms, the difference, the width, the product): <= 16 u relative; the exact sum adds one.
  const double tol = 16 * kU64 * 4.0781331438047861;
  EXPECT_NEAR(wasserstein1(std::vector<double>{3.4, 3.9, 7.5, 7.8}, std::vector<double>{4.5, 1.4},
                           std::vector<double>{1.4, 0.9, 3.1, 7.2}, std::vector<double>{3.2, 3.5}),
              4.0781331438047861, tol);
}

TEST(Wasserstein1, EqualSizesIsMeanAbsSortedDifference) {
  // Integers: every difference and sum is exact, so the result is exact.
  const std::vector<double> u{7, -2, 5, 0, 3}, v{1, 1, 4, 10, -6};
  // sorted: -2 0 3 5 7 vs -6 1 1 4 10: |d| = 4 1 2 1 3 -> 11 / 5
  EXPECT_EQ(wasserstein1(u, v), 11.0 / 5.0);
  EXPECT_EQ(wasserstein1(v, u), 11.0 / 5.0);
  EXPECT_EQ(wasserstein1(u, u), 0.0);
}

TEST(Wasserstein1, UnequalSizesAndWeightsMatchTheNaiveIntegral) {
  const auto u = normal_values(37, 1), v = normal_values(23, 2, 2.0);
  auto wu = normal_values(37, 3), wv = normal_values(23, 4);
  for (auto& w : wu) w = std::fabs(w);
  for (auto& w : wv) w = std::fabs(w);
  wu[5] = 0.0;  // zero weights are allowed
  // The CDF values come from cumulative sums of <= 37 weights (<= 37 u relative each), divided and
  // subtracted (2 u more): <= 40 u relative per term; terms are non-negative, so relative to the sum.
  const double tol = 40 * kU64;
  for (bool weighted : {false, true}) {
    const double got = weighted ? wasserstein1(u, v, wu, wv) : wasserstein1(u, v);
    const double want = static_cast<double>(weighted ? naive_w1(u, v, wu, wv) : naive_w1(u, v));
    EXPECT_NEAR(got, want, tol * want) << "weighted=" << weighted;
  }
  // Uniform weights given explicitly take the general path; it must agree with the equal-size path.
  const auto a = normal_values(50, 5), b = normal_values(50, 6);
  const std::vector<double> ones(50, 1.0);
  const double fast = wasserstein1(a, b), general = wasserstein1(a, b, ones, ones);
  EXPECT_NEAR(fast, general, 60 * kU64 * fast);
}

TEST(Wasserstein1, FloatInputsAreWidenedExactly) {
  std::vector<float> uf{0.1f, 2.5f, -3.25f, 7.0f}, vf{1.5f, -0.3f, 2.0f};
  std::vector<double> ud(uf.begin(), uf.end()), vd(vf.begin(), vf.end());
  EXPECT_EQ(wasserstein1(uf, vf), wasserstein1(ud, vd));
}

TEST(Wasserstein1, RejectsInvalidInput) {
  const std::vector<double> x{1, 2, 3}, empty;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  auto message_of = [](auto&& f) {
    try {
      f();
    } catch (const DistanceError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of([&] { wasserstein1(empty, x); }).find("u_values is empty"), std::string::npos);
  EXPECT_NE(message_of([&] { wasserstein1(x, empty); }).find("v_values is empty"), std::string::npos);
  EXPECT_NE(message_of([&] { wasserstein1(x, std::vector<double>{1, nan}); }).find("v_values[1]"),
            std::string::npos);
  EXPECT_NE(message_of([&] { wasserstein1(std::vector<double>{inf}, x); }).find("not finite"),
            std::string::npos);
  EXPECT_NE(message_of([&] { wasserstein1(x, x, std::vector<double>{1, -1, 1}); }).find("u_weights[1]"),
            std::string::npos);
  EXPECT_NE(message_of([&] { wasserstein1(x, x, {}, std::vector<double>{1, 1}); }).find("has 2 entries"),
            std::string::npos);
  EXPECT_NE(message_of([&] { wasserstein1(x, x, std::vector<double>{0, 0, 0}); }).find("sums to"),
            std::string::npos);
  EXPECT_NE(message_of([&] { wasserstein1(x, x, std::vector<double>{1, inf, 1}); }).find("u_weights[1]"),
            std::string::npos);
  EXPECT_NE(message_of([&] { wasserstein1(x, x, std::vector<double>{1, nan, 1}); }).find("u_weights[1]"),
            std::string::npos);
  EXPECT_THROW(wasserstein2(x, std::vector<double>{1, 2}), DistanceError);
}

TEST(Wasserstein2, EqualSizes) {
  EXPECT_EQ(wasserstein2(std::vector<double>{0, 1, 3}, std::vector<double>{5, 6, 8}), 5.0);
  // sorted |d| = 4 1 2 1 3 (see above): sqrt((16+1+4+1+9)/5)
  EXPECT_DOUBLE_EQ(wasserstein2(std::vector<float>{7, -2, 5, 0, 3}, std::vector<float>{1, 1, 4, 10, -6}),
                   std::sqrt(31.0 / 5.0));
}

TEST(Elementwise, HandValues) {
  const std::vector<double> a{1, 2, 3, 4}, ref{1, 2, 5, 0};
  const ElementwiseMetrics m = elementwise_metrics(a, ref);
  EXPECT_EQ(m.max_abs, 4.0);
  EXPECT_EQ(m.mean_abs, 1.5);
  EXPECT_DOUBLE_EQ(m.rel_l2, std::sqrt(20.0) / std::sqrt(30.0));
  EXPECT_EQ(m.count, 4u);
  EXPECT_EQ(m.nonfinite, 0u);
  // A zero reference: 0 if equal, +inf otherwise.
  const std::vector<double> z{0, 0};
  EXPECT_EQ(elementwise_metrics(z, z).rel_l2, 0.0);
  EXPECT_EQ(elementwise_metrics(std::vector<double>{0, 1}, z).rel_l2, std::numeric_limits<double>::infinity());
  EXPECT_THROW(elementwise_metrics(a, z), DistanceError);
}

TEST(Elementwise, NonFiniteIsCountedNotPropagated) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> a{1, nan, 3, 5}, ref{1, 2, inf, 2};
  const ElementwiseMetrics m = elementwise_metrics(a, ref);
  EXPECT_EQ(m.count, 2u);
  EXPECT_EQ(m.nonfinite, 2u);
  EXPECT_EQ(m.max_abs, 3.0);
  EXPECT_EQ(m.mean_abs, 1.5);
  // ||ref|| over ref's finite entries {1, 2, 2}; the difference over both-finite indices {0, 3}.
  EXPECT_DOUBLE_EQ(m.rel_l2, 3.0 / 3.0);
}

TEST(ExactSum, IsExactAndOrderIndependent) {
  // Naive fp64 summation of 1e16 + 1000 x 1 loses every 1 (ulp(1e16) = 2); the exact sum does not.
  ExactSum s;
  s.add(1e16);
  for (int i = 0; i < 1000; ++i) s.add(1.0);
  EXPECT_EQ(s.value(), 1e16 + 1000);
  // Subnormals and the largest double.
  ExactSum t;
  t.add(std::numeric_limits<double>::denorm_min());
  t.add(std::numeric_limits<double>::denorm_min());
  EXPECT_EQ(t.value(), 2 * std::numeric_limits<double>::denorm_min());
  ExactSum big;
  big.add(std::numeric_limits<double>::max());
  EXPECT_EQ(big.value(), std::numeric_limits<double>::max());
  big.add(std::numeric_limits<double>::max());
  EXPECT_EQ(big.value(), std::numeric_limits<double>::infinity());
  // Values over 600 binades in shuffled orders and split into groups: bit-identical totals.
  std::mt19937_64 rng(11);
  std::vector<double> x(3000);
  for (auto& v : x) v = std::ldexp(std::uniform_real_distribution<double>(0.5, 1.0)(rng),
                                   static_cast<int>(rng() % 600) - 300);
  ExactSum ref;
  for (double v : x) ref.add(v);
  for (int trial = 0; trial < 3; ++trial) {
    std::shuffle(x.begin(), x.end(), rng);
    ExactSum a, b;
    for (std::size_t i = 0; i < x.size(); ++i) (i % 3 == 0 ? a : b).add(x[i]);
    b.add(a);
    EXPECT_EQ(b.value(), ref.value());
  }
  // Faithful rounding: within 1 ulp of the long double sum of the largest terms' total.
  long double ld = 0;
  std::vector<double> sorted(x);
  std::sort(sorted.begin(), sorted.end());
  for (double v : sorted) ld += v;
  EXPECT_NEAR(ref.value(), static_cast<double>(ld), 2 * kU64 * ref.value());
}

TEST(RadixSort, MatchesStdSortIncludingSignedZeroAndInfinities) {
  std::mt19937 rng(3);
  std::vector<float> f(5003);  // not a multiple of the 4 input streams of the first pass
  for (auto& v : f) v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), int(rng() % 80) - 40);
  f[10] = -0.0f;
  f[11] = 0.0f;
  f[12] = std::numeric_limits<float>::infinity();
  f[13] = -std::numeric_limits<float>::infinity();
  f[14] = std::numeric_limits<float>::denorm_min();
  std::vector<float> want(f);
  std::sort(want.begin(), want.end());
  radix_sort(f.data(), f.size());
  for (std::size_t i = 0; i < f.size(); ++i) ASSERT_EQ(f[i], want[i]) << i;
  // -0 before +0 (the bit-pattern order), so the order is total.
  const auto zero = std::find(f.begin(), f.end(), 0.0f);
  EXPECT_TRUE(std::signbit(*zero));
  EXPECT_FALSE(std::signbit(*(zero + 1)));

  auto d = normal_values(4098, 9, 1e3);
  d.push_back(std::numeric_limits<double>::quiet_NaN());
  radix_sort(d.data(), d.size());
  EXPECT_TRUE(std::isnan(d.back()));
  EXPECT_TRUE(std::is_sorted(d.begin(), d.end() - 1));
}

// The sizes past the caches (more than 2^17 floats, 2^16 doubles): the first pass's balanced buckets
// of the top bits, a bucket of one fine bin too large for the cache (a cluster of close values: more
// MSD passes on fewer bits), and the pieces of radix_sort_spans, against std::sort in the bit-pattern
// order.
template <class T, class U>
U bits_of(T x) {
  U u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
template <class T>
bool key_less(T a, T b) {
  return sort_key(a) < sort_key(b);
}

template <class T>
std::vector<T> large_mix(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<T> weights(0, T(0.02));
  std::uniform_real_distribution<T> near_one(T(1), T(1) + T(1e-4));
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = rng() % 8;
    x[i] = r < 4 ? weights(rng) : r < 7 ? near_one(rng) : T(std::ldexp(weights(rng), int(rng() % 200) - 100));
  }
  x[1] = -0.0;
  x[2] = 0.0;
  x[3] = std::numeric_limits<T>::infinity();
  x[4] = -std::numeric_limits<T>::infinity();
  x[5] = std::numeric_limits<T>::denorm_min();
  x[6] = std::numeric_limits<T>::quiet_NaN();
  return x;
}

template <class T>
void expect_sorted_like_std(std::vector<T> x) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  std::vector<T> want(x);
  std::sort(want.begin(), want.end(), key_less<T>);
  radix_sort(x.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ((bits_of<T, U>(x[i])), (bits_of<T, U>(want[i]))) << i;
}

TEST(RadixSort, LargeInputsPastTheCachesMatchStdSort) {
  expect_sorted_like_std(large_mix<float>(600001, 5));
  expect_sorted_like_std(large_mix<double>(300007, 6));
  // One value a million times (a bucket no bin split can shrink) and sorted input.
  std::vector<float> same(1 << 20, 0.5f);
  same[7] = -1.0f;
  expect_sorted_like_std(same);
  std::vector<float> up = large_mix<float>(400000, 7);
  std::sort(up.begin(), up.end(), key_less<float>);
  expect_sorted_like_std(up);
}

// Sizes whose first pass scatters through 64-byte lines (4 MiB of keys or more), an odd count so that
// the buckets' first lines start before them: weights whose fine bins are buckets of their own (each
// sorted on its low bits alone), a mix whose buckets take a pass by bin in the cache, a mix of
// clusters, and sorted runs as the whole-model sort receives them.
TEST(RadixSort, StreamedFirstPassAndBinPassesMatchStdSort) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> weights(0.0f, 0.02f);
  std::vector<float> w((std::size_t{1} << 21) + 4097);
  for (auto& v : w) v = weights(rng);
  expect_sorted_like_std(w);
  expect_sorted_like_std(large_mix<float>((std::size_t{1} << 21) + 333, 12));
  expect_sorted_like_std(large_mix<double>((std::size_t{1} << 20) + 77, 13));
  for (std::size_t at = 0; at < w.size(); at += 100003)
    std::sort(w.begin() + static_cast<std::ptrdiff_t>(at), w.begin() + static_cast<std::ptrdiff_t>(std::min(w.size(), at + 100003)),
              key_less<float>);
  expect_sorted_like_std(w);
}

TEST(RadixSort, SpansIntoPiecesInPlace) {
  const std::vector<float> x = large_mix<float>(500000, 8);
  std::vector<float> want(x);
  std::sort(want.begin(), want.end(), key_less<float>);
  // Three spans of one buffer, sorted back into it as four pieces of other lengths.
  std::vector<float> buf(x);
  ValueBuffer<std::uint32_t> scratch;
  radix_sort_spans({{buf.data(), 100000}, {buf.data() + 100000, 1}, {buf.data() + 100001, 399999}},
                   {{buf.data(), 7}, {buf.data() + 7, 250000}, {buf.data() + 250007, 0}, {buf.data() + 250007, 249993}},
                   scratch);
  for (std::size_t i = 0; i < buf.size(); ++i)
    ASSERT_EQ((bits_of<float, std::uint32_t>(buf[i])), (bits_of<float, std::uint32_t>(want[i]))) << i;
}

}  // namespace
}  // namespace fastudy
