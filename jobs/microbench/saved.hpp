// `[microbench] save_outputs = true`: every point's inputs and outputs in OUT/microbench_outputs.h5, so
// that a user can run the same inputs through their own framework and compare bit for bit
// (docs/microbench.md "Real kernels"). Written collectively by the ranks of the job (parallel HDF5): every
// rank creates the same groups and datasets, each writes the points it computed, rank 0 moves the finished file into
// place and seals it (base/checksum.hpp). Layout, every value float64 (exact: the values of every format
// are doubles), tensors [B, H, N, d]:
//   /                      attributes format = "fastudy-microbench-outputs/1", provenance, config_hash
//   /points/NNNNNN         one group per point, in the order of microbench.csv's points (6 digits from
//                          000000); attributes: the point's columns of microbench.csv (sweep, pass,
//                          format, policy, rounding, seq_len, head_dim, block_q, block_kv, loop_order,
//                          causal, trial, distribution) and batch, heads
//     q, k, v, do          the inputs every algorithm ran on (rounded to the policy's formats); do on
//                          backward points only
//     golden/o             the fp64 golden value; backward points: golden/dq, golden/dk, golden/dv
//     flash/o, baseline/o  our CPU kernels under the point's policy (dq, dk, dv likewise)
//     ALGORITHM/o          each real code the point ran (torch_flash, torch_baseline, sdpa_flash, ...),
//                          and our CUDA kernels (cuda_flash, cuda_baseline) where they ran
//     ALGORITHM_reading/o  beside a real code whose row names a reading (column vs_reading): that
//                          reading's output, which the row's bit_identical compares it with
//   A framework point (policy "native") has golden and its SDPA backends' groups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kernels/microbench.hpp"
#include "src/core/provenance.hpp"
#include "src/io/h5.hpp"
#include "src/runtime/mpi.hpp"

namespace fastudy {

inline constexpr const char* kSavedOutputsName = "microbench_outputs.h5";

// One point of the file: its microbench.csv columns and the algorithms whose outputs it holds (golden
// first).
struct SavedPoint {
  std::string sweep;
  MicrobenchPoint point;
  std::vector<std::string> algorithms;
};

// What one point saves: its inputs as every algorithm ran on them (dout empty on a forward point) and
// each algorithm's output by name (O, or dQ|dK|dV concatenated as the rows compare them).
struct SavedValues {
  std::vector<double> q, k, v, dout;
  std::map<std::string, std::vector<double>> outputs;
};

// The bytes the file of `points` takes, for the disk preflight: every value (8 bytes) and HDF5's
// metadata (at most 4 KiB per group and 1 KiB per dataset).
std::uint64_t saved_outputs_bytes(const std::vector<SavedPoint>& points);

class SavedOutputs {
 public:
  // Collective over `world`: creates the file under a temporary name beside `path` and every point's
  // group and datasets.
  SavedOutputs(const std::string& path, const std::vector<SavedPoint>& points, const Provenance& prov,
               mpi::Comm& world);
  // Left without finish() (an error on this rank): the file is given up without the collective close
  // (one rank alone; the job ends) or closed (one process), and the temporary file is removed.
  ~SavedOutputs();
  SavedOutputs(const SavedOutputs&) = delete;
  SavedOutputs& operator=(const SavedOutputs&) = delete;
  // This rank's point `index`: its inputs and every algorithm's output, one independent transfer each;
  // Error naming the algorithm where one is missing or of the wrong size, and the file and its file
  // system when a write fails (a full disk).
  void write(std::size_t index, const SavedValues& values);
  // Collective: closes the file; rank 0 moves it to `path`, sealed, when every rank closed it. With
  // `keep` false (a stopped run), or when a rank could not close it (an Error naming the file and its
  // file system, on every rank), the temporary file is removed instead.
  void finish(bool keep);

 private:
  std::string path_, tmp_;
  mpi::Comm& world_;
  void write_point(std::size_t index, const SavedValues& values);
  std::vector<SavedPoint> points_;
  std::optional<h5::File> file_;
  bool finished_ = false;
};

}  // namespace fastudy
