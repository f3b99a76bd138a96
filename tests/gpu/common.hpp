// Helpers of the tests/gpu tests: seeded inputs and the variants and formats the CUDA kernels
// implement. The fp64 reference, the error metrics and the unit-roundoff bounds are the check
// harness's (kernels/check.hpp), shared with the CPU kernel tests.
//
// B batch, H heads, N sequence, d head dim; tensors [B, H, N, d] row-major.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/check.hpp"
#include "kernels/format.hpp"

namespace fastudy::gpu_test {

inline std::vector<float> random_normal(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

inline std::vector<double> widen(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }
// Values that are floats already (a reference's rounded inputs) back into a float buffer.
inline std::vector<float> narrow(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

// The variants the CUDA kernels implement: all of them.
using Variant = KernelVariant;
constexpr const auto& kVariants = kKernelVariants;
inline constexpr Format kCudaFormats[] = {Format::fp32, Format::fp16, Format::bf16};

}  // namespace fastudy::gpu_test
