// The files `fastudy reduce` writes on rank 0 (jobs/reduce.cpp), each whole and sealed with its
// checksum sidecar, every data row after the provenance header:
//   OUT/deviation.h5   /steps/<step>/<t>/<metric>: V x V matrices of tensor t (its index in the plan;
//                      the tensor's name is the group's attribute `name`), one per metric of [reduce]
//                      metrics, NaN where the pair was not computed ([reduce] pairs); the root's
//                      attributes `metrics` and `pairs` say which
//   OUT/deviation.csv  one row per step, tensor and computed pair (tensor "model" is the whole model),
//                      a column per metric of [reduce] metrics
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
#include "base/pair_metrics.hpp"
#include "src/core/config.hpp"
#include "src/core/provenance.hpp"

namespace fastudy {

inline constexpr const char* kModelTensor = "model";  // the whole-model pseudo-tensor

// What reduce compares: the same on every rank (rank 0 makes it, every rank gets it; the pairs and
// what to compute every rank derives from the study).
struct ReducePlan {
  std::vector<const Variant*> variants;  // those reduced (left-out ones excluded)
  std::vector<std::string> left_out;     // "id: reason"
  std::vector<std::int64_t> steps;
  std::vector<std::string> tensors;      // parameter names, then "model"
  std::vector<std::int64_t> sizes;       // elements of each parameter (read from the first variant)
  // An imported study (jobs/reduce_import.hpp): files[v][s] holds variant v's checkpoint of steps[s],
  // read as fp64 when f64 (a tensor is stored as fp64), else fp32. Empty for a trained study.
  std::vector<std::vector<std::string>> files;
  bool f64 = false;  // some tensor is stored as fp64: every value compared as fp64, else fp32
  // What to compute ([reduce] metrics, per_tensor, whole_model) and between which variants (indices
  // into `variants`, i < j, ascending: reduce_pairs in jobs/reduce_work.hpp).
  std::vector<std::size_t> metrics;  // indices into kPairMetrics (base/pair_metrics.hpp), ascending
  bool per_tensor = true;
  bool whole_model = true;
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  std::string pairs_note;  // how the pairs were chosen ("the verdict's", "all", ...)
  // Whether a listed metric is computed by `pass` (MetricPass::sorted: W1 always is, the ranking's).
  bool needs(MetricPass pass) const;
};

// The result of task k = (step k / T, tensor k % T) of T tensors (tensor T - 1 the whole model): for
// every computed pair p = (i, j) of ReducePlan::pairs and metric m (index into kPairMetrics, every row
// whether listed or not), the value for (i, j) and for (j, i) (they differ only for rel_l2, whose
// reference is the second), at (p kPairMetricCount + m) 2 + {0, 1}. Empty for
// the tasks [reduce] per_tensor or whole_model leave out.
using TaskResults = std::vector<std::vector<double>>;

// The V x V row-major matrix of metric m (index into kPairMetrics) of one task's result: NaN where no
// pair was computed, 0 on the diagonal.
std::vector<double> task_matrix(const ReducePlan& plan, const std::vector<double>& result, std::size_t metric);

// The bytes the files above take for `plan`, for the disk check before the reduce works: every matrix
// value (8 bytes) of deviation.h5 with HDF5's metadata (at most 4 KiB per group, 1 KiB per dataset),
// every deviation.csv row at its length (25 bytes a number), and 1 MiB for the other CSVs; only the
// pairs, metrics and tensors the plan computes.
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
