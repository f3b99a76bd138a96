// The files `fastudy reduce` writes on rank 0 (jobs/reduce.cpp), each whole and sealed with its
// checksum sidecar, every data row after the provenance header:
//   OUT/deviation.h5   /steps/<step>/<t>/{w1,w2,max_abs,mean_abs,rel_l2}: V x V matrices of tensor t (its
//                      index in the plan; the tensor's name is the group's attribute `name`)
//   OUT/deviation.csv  one row per step, tensor and pair (tensor "model" is the whole model)
//   OUT/axes.csv       each grid axis's role, baseline, replicate flag and values (the verdict's input)
//   OUT/ranking.csv    one row per source (axis), condition ("*": pooled) and value pair, and step
//   OUT/verdict.csv    one row per optimisation, value, condition and reference: the verdict
//   OUT/twins.csv      each variant's distance to its fp64 twin, when the grid has fp64
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/ranking.hpp"
#include "src/core/config.hpp"
#include "src/core/provenance.hpp"

namespace fastudy {

inline constexpr const char* kModelTensor = "model";  // the whole-model pseudo-tensor
inline constexpr int kMetrics = 5;                    // w1, w2, max_abs, mean_abs, rel_l2, in this order
inline constexpr const char* kMetricNames[kMetrics] = {"w1", "w2", "max_abs", "mean_abs", "rel_l2"};

// What reduce compares: the same on every rank (rank 0 makes it, every rank gets it).
struct ReducePlan {
  std::vector<const Variant*> variants;  // those reduced (left-out ones excluded)
  std::vector<std::string> left_out;     // "id: reason"
  std::vector<std::int64_t> steps;
  std::vector<std::string> tensors;      // parameter names, then "model"
  std::vector<std::int64_t> sizes;       // elements of each parameter (read from the first variant)
  // An imported study (jobs/reduce_import.hpp): files[v][s] holds variant v's checkpoint of steps[s],
  // read as fp64 when f64 (a tensor is stored as fp64), else fp32. Empty for a trained study.
  std::vector<std::vector<std::string>> files;
  bool f64 = false;
};

// The result of task k = (step k / T, tensor k % T) of T tensors: kMetrics V x V row-major matrices,
// metric-major (metric m, pair (i, j) at (m V + i) V + j).
using TaskResults = std::vector<std::vector<double>>;

// The bytes the files above take for `plan`, for the disk check before the reduce works: every matrix
// value (8 bytes) of deviation.h5 with HDF5's metadata (at most 4 KiB per group, 1 KiB per dataset),
// every deviation.csv row at its length (25 bytes a number), and 1 MiB for the other CSVs.
std::uint64_t reduce_output_bytes(const ReducePlan& plan);

void write_deviation_h5(const std::string& path, const ReducePlan& plan, const TaskResults& results,
                        const Provenance& prov);
void write_deviation_csv(const std::string& path, const ReducePlan& plan, const TaskResults& results,
                         const Provenance& prov);
void write_axes_csv(const std::string& path, const std::vector<RankingAxis>& axes, const Provenance& prov);
void write_ranking_csv(const std::string& path, const Ranking& ranking, const Provenance& prov);
void write_verdict_csv(const std::string& path, const Ranking& ranking, const Provenance& prov);
void write_twins_csv(const std::string& path, const Ranking& ranking, const Provenance& prov);

}  // namespace fastudy
