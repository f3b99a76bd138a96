// The radix sort behind radix_sort() and SortedSet (internal to analysis/): reads in[0, n), writes
// the sorted values to out (may equal in); `scratch` (2n keys) is reused across calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastudy {

void radix_sort_into(const float* in, float* out, std::size_t n, std::vector<std::uint32_t>& scratch);
void radix_sort_into(const double* in, double* out, std::size_t n, std::vector<std::uint64_t>& scratch);

}  // namespace fastudy
