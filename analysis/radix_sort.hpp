// The radix sort behind radix_sort() and SortedSet (internal to analysis/): reads in[0, n), writes
// the sorted values to out (may equal in); `scratch` (2n keys) is reused across calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastudy {

void radix_sort_into(const float* in, float* out, std::size_t n, std::vector<std::uint32_t>& scratch);
void radix_sort_into(const double* in, double* out, std::size_t n, std::vector<std::uint64_t>& scratch);

// The concatenation of `spans` sorted into out (as many values as the spans hold; out may not overlap
// them): the distributed sort's receiving side, whose values arrive in pieces (analysis/sorted_exchange).
template <class T>
struct SortSpan {
  const T* data = nullptr;
  std::size_t size = 0;
};
void radix_sort_spans(const std::vector<SortSpan<float>>& spans, float* out, std::vector<std::uint32_t>& scratch);
void radix_sort_spans(const std::vector<SortSpan<double>>& spans, double* out, std::vector<std::uint64_t>& scratch);

// The sort's order as an unsigned key (monotone map of the IEEE bit pattern): -NaN < -inf < ... < -0 <
// +0 < ... < +inf < +NaN. The distributed sort compares values with splitters in this order.
std::uint32_t sort_key(float x);
std::uint64_t sort_key(double x);

}  // namespace fastudy
