// The radix sort behind radix_sort() and SortedSet (internal to analysis/): reads in[0, n), writes
// the sorted values to out (may equal in); `scratch` (2n keys) is reused across calls (a ValueBuffer:
// growing it touches no page until the sort writes there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "analysis/value_buffer.hpp"

namespace fastudy {

void radix_sort_into(const float* in, float* out, std::size_t n, ValueBuffer<std::uint32_t>& scratch);
void radix_sort_into(const double* in, double* out, std::size_t n, ValueBuffer<std::uint64_t>& scratch);

// The concatenation of `spans` sorted into the consecutive pieces `outs` (sorted positions [0, outs[0].size)
// to outs[0], the next ones to outs[1], ...; as many places as the spans hold values, else Error). The
// pieces may overlap the spans: every value is read before any is written. The distributed sort's
// receiving side: its values arrive in pieces, and its sorted range goes partly to this rank's window,
// partly to the neighbours' (analysis/sorted_exchange).
template <class T>
struct SortSpan {
  const T* data = nullptr;
  std::size_t size = 0;
};
template <class T>
struct OutSpan {
  T* data = nullptr;
  std::size_t size = 0;
};
void radix_sort_spans(const std::vector<SortSpan<float>>& spans, const std::vector<OutSpan<float>>& outs,
                      ValueBuffer<std::uint32_t>& scratch);
void radix_sort_spans(const std::vector<SortSpan<double>>& spans, const std::vector<OutSpan<double>>& outs,
                      ValueBuffer<std::uint64_t>& scratch);

// The sort's order as an unsigned key (monotone map of the IEEE bit pattern): -NaN < -inf < ... < -0 <
// +0 < ... < +inf < +NaN. The distributed sort compares values with splitters in this order.
std::uint32_t sort_key(float x);
std::uint64_t sort_key(double x);

}  // namespace fastudy
