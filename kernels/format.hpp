// Number formats emulated on the CPU: fp64, fp32, tf32, fp16, bf16, fp8 (e4m3, e5m2).
//
// A value "in format F" is stored in a float or double whose bit pattern is exactly representable in
// F; round_to() produces it by round-to-nearest-even, with F's overflow, subnormal and NaN rules,
// bit-exact with the hardware conversions (F16C for fp16, c10::BFloat16 for bf16, the OCP FP8 spec).
// The same words name a format everywhere: enum, TOML, CSV, CLI (`fp16`, `bf16`, ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fastudy {

enum class Format : std::uint8_t { fp64, fp32, tf32, fp16, bf16, fp8_e4m3, fp8_e5m2 };

// Every format, widest first.
inline constexpr Format kAllFormats[] = {Format::fp64, Format::fp32,     Format::tf32,    Format::fp16,
                                         Format::bf16, Format::fp8_e4m3, Format::fp8_e5m2};

std::string_view to_string(Format f);
std::optional<Format> parse_format(std::string_view name);
// "fp64, fp32, tf32, fp16, bf16, fp8_e4m3, fp8_e5m2": for error messages.
std::string format_names();

// Explicit mantissa (fraction) bits: fp64 52, fp32 23, tf32 10, fp16 10, bf16 7, e4m3 3, e5m2 2.
int mantissa_bits(Format f);
// Unit roundoff u = 2^-(mantissa_bits+1): the relative error bound of one RNE rounding (normal range).
double unit_roundoff(Format f);
// The largest finite value (fp16 65504, e4m3 448, e5m2 57344, ...) and the spacing of the subnormals,
// 2^(emin - mantissa_bits) (fp16 2^-24, e4m3 2^-9): below the smallest normal a rounding errs by up to
// half of it in absolute terms, not by u relative.
double largest_finite(Format f);
double subnormal_spacing(Format f);

// Round to the nearest value of format f, ties to even. Rounding a double goes straight to f (one
// rounding, never through fp32). fp64 is the identity; rounding a float to fp64 or fp32 is too.
float round_to(Format f, float x);
double round_to(Format f, double x);
void round_inplace(Format f, float* x, std::size_t n);
void round_inplace(Format f, double* x, std::size_t n);

// Stored 16-bit patterns (IEEE binary16, bfloat16: what files and frameworks hold) and their values,
// exactly: every fp16 and bf16 value is a float. to_*_bits takes a value already in the format
// (round_to first); its bits are the pattern with the same sign, exponent and fraction.
float from_fp16_bits(std::uint16_t bits);
float from_bf16_bits(std::uint16_t bits);
std::uint16_t to_fp16_bits(float value_in_fp16);
std::uint16_t to_bf16_bits(float value_in_bf16);

// How a value is rounded into a narrower format.
//   nearest     round to nearest, ties to even (IEEE default; what hardware conversions do).
//   zero        truncation toward zero: drop the low bits. Every rounding shrinks |x|, so errors are
//               biased toward zero (how some software emulations of low precision work). Overflow
//               gives the largest finite value, never inf.
//   stochastic  round up with probability equal to the dropped fraction (x's distance to the value
//               below, in units of the spacing): unbiased, E[round(x)] = x. The random bits come
//               from a counter-based hash of a seed and the value's position in the computation, so
//               a run is reproducible and independent of the thread and rank count.
enum class Rounding : std::uint8_t { nearest, zero, stochastic };
inline constexpr Rounding kAllRoundings[] = {Rounding::nearest, Rounding::zero, Rounding::stochastic};
std::string_view to_string(Rounding r);
std::optional<Rounding> parse_rounding(std::string_view name);
// "nearest, zero, stochastic"
std::string rounding_names();

// Round x into f in mode r. `random` is 32 uniform random bits (used by stochastic only).
float round_to(Format f, float x, Rounding r, std::uint32_t random);
double round_to(Format f, double x, Rounding r, std::uint32_t random);

}  // namespace fastudy
