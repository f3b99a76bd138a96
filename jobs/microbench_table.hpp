// The microbench job's rows as written (one cell per column of the schema kColumns in
// jobs/microbench.cpp) and the real-kernel tables rank 0 prints from them (README "Real kernels"),
// exposed for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "kernels/microbench.hpp"

namespace fastudy::microbench_table {

using Cell = std::variant<std::string, std::int64_t, double>;
using Record = std::vector<Cell>;  // one output row, a cell per column

// The output row of `r` in sweep `sweep`.
Record record_of(const std::string& sweep, const MicrobenchRow& r);

// The real-kernel tables (errors max |d| against the fp64 golden value, medians over trials):
//   our CUDA kernels against our CPU kernels: per sweep, pass, format, policy and kind, both errors,
//            the checks (bit-identical / within bound / failed) and the largest vs_cpu;
//   the framework's kernels: per input (sweep, pass, format, N, d, causal, distribution), each SDPA
//            backend's error;
//   the readings: per input and emulated reading (CPU flash rows: policy, rounding, tiles, loop order),
//            its error, sdpa_flash's, their ratio and within_2x's verdict on the two medians.
// "" when the rows have none of these algorithms. `failed` gets the number of CUDA rows whose check
// failed (DIFFERS, EXCEEDS BOUND).
std::string real_kernel_tables(const std::vector<Record>& rows, std::size_t& failed);

}  // namespace fastudy::microbench_table
