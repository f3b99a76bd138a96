// Number format names, properties and the runtime-dispatched rounding (a switch over the inline
// templates of kernels/round.hpp). Kernels that round in hot loops use round_to_format<F> directly.
#include <cmath>
#include <cstring>

#include "kernels/format.hpp"

#include "kernels/round.hpp"

namespace fastudy {

std::string_view to_string(Format f) {
  switch (f) {
    case Format::fp64: return "fp64";
    case Format::fp32: return "fp32";
    case Format::tf32: return "tf32";
    case Format::fp16: return "fp16";
    case Format::bf16: return "bf16";
    case Format::fp8_e4m3: return "fp8_e4m3";
    case Format::fp8_e5m2: return "fp8_e5m2";
  }
  return "unknown";
}

std::optional<Format> parse_format(std::string_view name) {
  for (Format f : kAllFormats) {
    if (to_string(f) == name) return f;
  }
  return std::nullopt;
}

std::string format_names() {
  std::string names;
  for (Format f : kAllFormats) {
    if (!names.empty()) names += ", ";
    names += to_string(f);
  }
  return names;
}

namespace {

template <class T>
T round_switch(Format f, T x) {
  switch (f) {
    case Format::fp64: return round_to_format<Format::fp64>(x);
    case Format::fp32: return round_to_format<Format::fp32>(x);
    case Format::tf32: return round_to_format<Format::tf32>(x);
    case Format::fp16: return round_to_format<Format::fp16>(x);
    case Format::bf16: return round_to_format<Format::bf16>(x);
    case Format::fp8_e4m3: return round_to_format<Format::fp8_e4m3>(x);
    case Format::fp8_e5m2: return round_to_format<Format::fp8_e5m2>(x);
  }
  return x;
}

template <Format F, class T>
void round_span(T* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) x[i] = round_to_format<F>(x[i]);
}

// fp32 -> bf16, the trainer's hottest rounding, without branches so the loop vectorises. bf16 has
// fp32's exponent range, so one rule covers normals, subnormals, overflow to inf and inf itself
// (round_to_format's normal-range rule: add 0x7fff plus the lowest kept bit, clear the low 16 bits);
// NaN becomes the quiet NaN with its sign, as round_to_format returns. Equal to round_to_format
// bit for bit (tests/kernels/test_format.cpp).
template <>
void round_span<Format::bf16, float>(float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, &x[i], sizeof u);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const std::uint32_t r = nan ? ((u & 0x80000000u) | 0x7fc00000u) : rounded;
    std::memcpy(&x[i], &r, sizeof r);
  }
}

template <class T>
void round_inplace_switch(Format f, T* x, std::size_t n) {
  switch (f) {
    case Format::fp64: return round_span<Format::fp64>(x, n);
    case Format::fp32: return round_span<Format::fp32>(x, n);
    case Format::tf32: return round_span<Format::tf32>(x, n);
    case Format::fp16: return round_span<Format::fp16>(x, n);
    case Format::bf16: return round_span<Format::bf16>(x, n);
    case Format::fp8_e4m3: return round_span<Format::fp8_e4m3>(x, n);
    case Format::fp8_e5m2: return round_span<Format::fp8_e5m2>(x, n);
  }
}

}  // namespace

int mantissa_bits(Format f) {
  switch (f) {
    case Format::fp64: return FormatTraits<Format::fp64>::p;
    case Format::fp32: return FormatTraits<Format::fp32>::p;
    case Format::tf32: return FormatTraits<Format::tf32>::p;
    case Format::fp16: return FormatTraits<Format::fp16>::p;
    case Format::bf16: return FormatTraits<Format::bf16>::p;
    case Format::fp8_e4m3: return FormatTraits<Format::fp8_e4m3>::p;
    case Format::fp8_e5m2: return FormatTraits<Format::fp8_e5m2>::p;
  }
  return 0;
}

double unit_roundoff(Format f) {
  double u = 0.5;
  for (int i = 0; i < mantissa_bits(f); ++i) u *= 0.5;
  return u;
}

namespace {

template <Format F>
double largest_finite_of() {
  using Tr = FormatTraits<F>;
  // e4m3: the all-ones pattern is NaN, so the largest fraction is 1.110b (1.75); others 2 - 2^-p.
  const double fraction = Tr::nan_on_overflow ? 2.0 - std::ldexp(1.0, 1 - Tr::p) : 2.0 - std::ldexp(1.0, -Tr::p);
  return std::ldexp(fraction, Tr::emax);
}

template <Format F>
double subnormal_spacing_of() {
  return std::ldexp(1.0, FormatTraits<F>::emin - FormatTraits<F>::p);
}

}  // namespace

double largest_finite(Format f) {
  switch (f) {
    case Format::fp64: return largest_finite_of<Format::fp64>();
    case Format::fp32: return largest_finite_of<Format::fp32>();
    case Format::tf32: return largest_finite_of<Format::tf32>();
    case Format::fp16: return largest_finite_of<Format::fp16>();
    case Format::bf16: return largest_finite_of<Format::bf16>();
    case Format::fp8_e4m3: return largest_finite_of<Format::fp8_e4m3>();
    case Format::fp8_e5m2: return largest_finite_of<Format::fp8_e5m2>();
  }
  return 0.0;
}

double subnormal_spacing(Format f) {
  switch (f) {
    case Format::fp64: return subnormal_spacing_of<Format::fp64>();
    case Format::fp32: return subnormal_spacing_of<Format::fp32>();
    case Format::tf32: return subnormal_spacing_of<Format::tf32>();
    case Format::fp16: return subnormal_spacing_of<Format::fp16>();
    case Format::bf16: return subnormal_spacing_of<Format::bf16>();
    case Format::fp8_e4m3: return subnormal_spacing_of<Format::fp8_e4m3>();
    case Format::fp8_e5m2: return subnormal_spacing_of<Format::fp8_e5m2>();
  }
  return 0.0;
}

namespace {

template <Rounding M, class T>
T round_mode_switch(Format f, T x, std::uint32_t random) {
  switch (f) {
    case Format::fp64: return round_to_format_mode<Format::fp64, M>(x, random);
    case Format::fp32: return round_to_format_mode<Format::fp32, M>(x, random);
    case Format::tf32: return round_to_format_mode<Format::tf32, M>(x, random);
    case Format::fp16: return round_to_format_mode<Format::fp16, M>(x, random);
    case Format::bf16: return round_to_format_mode<Format::bf16, M>(x, random);
    case Format::fp8_e4m3: return round_to_format_mode<Format::fp8_e4m3, M>(x, random);
    case Format::fp8_e5m2: return round_to_format_mode<Format::fp8_e5m2, M>(x, random);
  }
  return x;
}

template <class T>
T round_any_mode(Format f, T x, Rounding r, std::uint32_t random) {
  switch (r) {
    case Rounding::nearest: return round_switch(f, x);
    case Rounding::zero: return round_mode_switch<Rounding::zero>(f, x, random);
    case Rounding::stochastic: return round_mode_switch<Rounding::stochastic>(f, x, random);
  }
  return x;
}

}  // namespace

std::string_view to_string(Rounding r) {
  switch (r) {
    case Rounding::nearest: return "nearest";
    case Rounding::zero: return "zero";
    case Rounding::stochastic: return "stochastic";
  }
  return "unknown";
}

std::optional<Rounding> parse_rounding(std::string_view name) {
  for (Rounding r : kAllRoundings)
    if (to_string(r) == name) return r;
  return std::nullopt;
}

std::string rounding_names() {
  std::string names;
  for (Rounding r : kAllRoundings) names += (names.empty() ? "" : ", ") + std::string(to_string(r));
  return names;
}

namespace {
std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
float float_of(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
}  // namespace

// binary16: sign 1, exponent 5 (bias 15), fraction 10. Subnormals are fraction * 2^-24; exponent 31 is
// inf (fraction 0) or NaN (the fraction's top bit is the quiet bit, as in binary32; a signalling NaN
// is returned quiet, as the hardware conversion does).
float from_fp16_bits(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu, fraction = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(fraction), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f)  // a NaN comes out quiet, as F16C's vcvtph2ps makes it
    return float_of(sign | 0x7f800000u | (fraction << 13) | (fraction != 0 ? 0x00400000u : 0u));
  return float_of(sign | ((exponent - 15 + 127) << 23) | (fraction << 13));
}

std::uint16_t to_fp16_bits(float value_in_fp16) {
  const std::uint32_t b = bits_of(value_in_fp16);
  const auto sign = static_cast<std::uint16_t>((b >> 16) & 0x8000u);
  if (std::isnan(value_in_fp16)) return static_cast<std::uint16_t>(sign | 0x7e00u | ((b >> 13) & 0x1ffu));
  if (std::isinf(value_in_fp16)) return static_cast<std::uint16_t>(sign | 0x7c00u);
  const float magnitude = std::fabs(value_in_fp16);
  if (magnitude < 0x1.0p-14f) return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(magnitude * 0x1.0p24f));
  const std::uint32_t exponent = ((b >> 23) & 0xffu) - 127 + 15;
  return static_cast<std::uint16_t>(sign | (exponent << 10) | ((b >> 13) & 0x3ffu));
}

// bfloat16 is the top half of binary32.
float from_bf16_bits(std::uint16_t bits) { return float_of(static_cast<std::uint32_t>(bits) << 16); }
std::uint16_t to_bf16_bits(float value_in_bf16) { return static_cast<std::uint16_t>(bits_of(value_in_bf16) >> 16); }

float round_to(Format f, float x, Rounding r, std::uint32_t random) { return round_any_mode(f, x, r, random); }
double round_to(Format f, double x, Rounding r, std::uint32_t random) { return round_any_mode(f, x, r, random); }

float round_to(Format f, float x) { return round_switch(f, x); }
double round_to(Format f, double x) { return round_switch(f, x); }
void round_inplace(Format f, float* x, std::size_t n) { round_inplace_switch(f, x, n); }
void round_inplace(Format f, double* x, std::size_t n) { round_inplace_switch(f, x, n); }

}  // namespace fastudy
