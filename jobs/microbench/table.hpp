// The microbench job's outputs, written on rank 0 from the rows of the schema in
// microbench_columns.hpp (microbench_output.cpp):
//   OUT/microbench.csv   one row per point and algorithm, with a provenance header
//   OUT/microbench.h5    the same table as one dataset per column under /rows (text columns as
//                        integer codes with a `labels` attribute, one label per line)
// and the tables rank 0 prints: the flash/baseline summary and the real-kernel tables
// (docs/microbench.md "Real kernels"; exposed for tests).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "jobs/microbench/columns.hpp"
#include "src/core/provenance.hpp"

namespace fastudy::microbench_table {

// The CSV and the HDF5 table of `rows` (in the order given), each written whole and sealed with its
// checksum sidecar (base/atomic_file.hpp). `notes` are "key: value" lines that follow the provenance
// header (the CSV's "# key: value" lines; the HDF5 file's attribute `notes`): code_notes below.
void write_csv(const std::string& path, const std::vector<Record>& rows, const Provenance& prov,
               const std::vector<std::string>& notes = {});
void write_h5(const std::string& path, const std::vector<Record>& rows, const Provenance& prov,
              const std::vector<std::string>& notes = {});

// What the rows' real code is (kRealCode, kernels/microbench.hpp), one line per algorithm of the rows
// that has an entry, in table order: "code ALGORITHM: models READING KIND (device DEVICE): CODE"
// ("models no reading" where none claims to), so the report can say which reading models which code
// from the data alone; `machine` (when not empty) adds "machine: MACHINE", where the CPU rows ran.
std::vector<std::string> code_notes(const std::vector<Record>& rows, const std::string& machine);

// The flash/baseline error ratios, both errors against the fp64 golden value, each the median over
// points of the per-point ratio, of max |d| and of rel_l2:
//   table 1: per sweep, pass, format, policy (reading) and rounding, with the median errors beside;
//   table 2 (the readings question): per sweep, pass, policy, rounding, format and number of KV tiles,
//            for every such group whose sweep covers two or more tile counts;
//   table 3 (Qiu & Yao's bias, rows on repeated_max inputs only): per sweep, pass, policy, rounding
//            and format, the median signed error (mean_signed) of flash, its share of flash's RMSE and
//            the baseline's median signed error.
std::string summary_tables(const std::vector<Record>& rows);

// The real-kernel tables (errors max |d| against the fp64 golden value, medians over trials):
//   our CUDA kernels against our CPU kernels: per sweep, pass, format, policy and kind, both errors,
//            the checks (bit-identical / within bound / failed) and the largest vs_cpu;
//   the framework's kernels: per input (sweep, pass, format, N, d, causal, distribution), each SDPA
//            backend's error;
//   the readings: per input and emulated reading (CPU flash rows: policy, rounding, tiles, loop order),
//            its error, sdpa_flash's, their ratio and within_2x's verdict on the two medians.
//   real code against the reading that claims to model it (rows with vs_reading): per sweep, pass,
//            format, distribution, head dim, algorithm and reading, the points, the smallest and the
//            median fraction of bit-identical elements, the largest difference in ulps, and both errors.
// "" when the rows have none of these algorithms. `failed` gets the number of CUDA rows whose check
// failed (DIFFERS, EXCEEDS BOUND).
std::string real_kernel_tables(const std::vector<Record>& rows, std::size_t& failed);

}  // namespace fastudy::microbench_table
