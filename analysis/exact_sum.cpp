// Exact summation of doubles into integer limbs (ExactSum, exact_add/normalize/value of
// analysis/distance.hpp): sums that do not depend on the order of the terms.
#include "analysis/distance.hpp"

#include <cmath>
#include <cstring>

namespace fastudy {

// ---- exact summation ----------------------------------------------------------------------------

namespace {

constexpr std::int64_t kLimbMask = (std::int64_t{1} << 32) - 1;

std::uint64_t bits_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

}  // namespace

void exact_add(std::int64_t* limbs, double x) {
  // x = M * 2^E with M < 2^53 an integer and E >= -1074; bit position p = E + 1074 >= 0.
  const std::uint64_t u = bits_of(x);
  const std::uint64_t biased = (u >> 52) & 0x7ff;
  std::uint64_t m = u & ((std::uint64_t{1} << 52) - 1);
  int p = 0;
  if (biased == 0) {
    if (m == 0) return;
  } else {
    m |= std::uint64_t{1} << 52;
    p = static_cast<int>(biased) - 1;  // E = biased - 1075, p = E + 1074
  }
  const int k = p / 32;
  const unsigned __int128 t = static_cast<unsigned __int128>(m) << (p % 32);
  limbs[k] += static_cast<std::int64_t>(static_cast<std::uint64_t>(t) & kLimbMask);
  limbs[k + 1] += static_cast<std::int64_t>(static_cast<std::uint64_t>(t >> 32) & kLimbMask);
  limbs[k + 2] += static_cast<std::int64_t>(static_cast<std::uint64_t>(t >> 64) & kLimbMask);
}

void exact_normalize(std::int64_t* limbs) {
  std::int64_t carry = 0;
  for (int k = 0; k < kExactLimbs - 1; ++k) {
    const std::int64_t v = limbs[k] + carry;
    limbs[k] = v & kLimbMask;
    carry = v >> 32;
  }
  limbs[kExactLimbs - 1] += carry;
}

double exact_value(const std::int64_t* limbs) {
  std::int64_t l[kExactLimbs];
  std::memcpy(l, limbs, sizeof l);
  exact_normalize(l);  // canonical form: the result depends only on the exact value
  int top = kExactLimbs - 1;
  while (top >= 0 && l[top] == 0) --top;
  if (top < 0) return 0.0;
  // The top three limbs carry at least 65 significant bits; adding them from the top rounds twice at
  // most (0.5 ulp each; the limbs below add < 2^-64 relative), so the result is within about 1 ulp of
  // the exact sum, and a function of the exact sum alone.
  double r = 0.0;
  for (int k = top; k >= std::max(0, top - 2); --k)
    r += std::ldexp(static_cast<double>(l[k]), 32 * k - 1074);
  return r;
}

void ExactSum::add(const ExactSum& other) {
  for (int k = 0; k < kExactLimbs; ++k) limbs_[k] += other.limbs_[k];
  exact_normalize(limbs_.data());
}

}  // namespace fastudy
