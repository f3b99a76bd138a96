// The files `fastudy reduce` writes (reduce_output.hpp): the deviation matrices as HDF5 and CSV, the
// axes, the ranking, the verdict and the fp64 twins as CSV.
#include "jobs/reduce_output.hpp"

#include <algorithm>
#include <limits>
#include <sstream>

#include "base/atomic_file.hpp"
#include "base/checksum.hpp"
#include "base/number.hpp"
#include "base/quote.hpp"
#include "src/io/h5.hpp"

namespace fastudy {

bool ReducePlan::needs(MetricPass pass) const {
  for (std::size_t k : metrics)
    if (kPairMetrics[k].pass == pass) return true;
  return false;
}

std::vector<double> task_matrix(const ReducePlan& plan, const std::vector<double>& result, std::size_t metric) {
  const std::size_t V = plan.variants.size();
  std::vector<double> m(V * V, std::numeric_limits<double>::quiet_NaN());
  for (std::size_t v = 0; v < V; ++v) m[v * V + v] = 0;
  for (std::size_t p = 0; p < plan.pairs.size() && !result.empty(); ++p) {
    const auto [i, j] = plan.pairs[p];
    m[i * V + j] = result[(p * kPairMetricCount + metric) * 2];
    m[j * V + i] = result[(p * kPairMetricCount + metric) * 2 + 1];
  }
  return m;
}

std::uint64_t reduce_output_bytes(const ReducePlan& plan) {
  constexpr std::uint64_t kGroupMeta = 4096, kDatasetMeta = 1024, kNumber = 25, kSmallCsvs = std::uint64_t{1} << 20;
  const std::uint64_t V = plan.variants.size(), S = plan.steps.size(), pairs = plan.pairs.size(),
                      M = plan.metrics.size();
  // The tensors written: the per-tensor ones ([reduce] per_tensor) and the whole model ([reduce] whole_model).
  std::uint64_t ids = 0, names = 0, tensors = 0;
  for (const auto* v : plan.variants) ids += v->id.size() + 4;
  for (std::size_t t = 0; t < plan.tensors.size(); ++t) {
    const bool model = t + 1 == plan.tensors.size();
    if (model ? !plan.whole_model : !plan.per_tensor) continue;
    names += plan.tensors[t].size() + 4;
    ++tensors;
  }
  const std::uint64_t h5 = kGroupMeta * (2 + S) + S * tensors * (kGroupMeta + M * (kDatasetMeta + V * V * sizeof(double))) +
                           kGroupMeta + 2 * ids;
  const std::uint64_t csv = S * (names * pairs + tensors * pairs * (2 * ids / std::max<std::uint64_t>(V, 1) + 20 + M * kNumber));
  return h5 + csv + kSmallCsvs;
}

namespace {

// deviation.h5's content, written into `tmp`.
void write_deviation_file(const std::string& tmp, const ReducePlan& plan, const TaskResults& results, const Provenance& prov) {
  const std::size_t V = plan.variants.size();
  const std::int64_t v64 = static_cast<std::int64_t>(V);
  h5::File f = h5::File::create(tmp, nullptr);
  h5::Group root = f.root();
  root.set_attr("format", std::string("fastudy-deviation/2"));
  root.set_attr("provenance", prov.header());
  root.set_attr("config_hash", prov.config_hash);
  std::string ids, axes, left;
  for (const auto* v : plan.variants) {
    ids += v->id + "\n";
    for (std::size_t a = 0; a < v->axes.size(); ++a) axes += (a ? "," : "") + v->axes[a].first + "=" + v->axes[a].second;
    axes += "\n";
  }
  for (const auto& l : plan.left_out) left += one_line(l) + "\n";
  root.set_attr("variants", ids);
  root.set_attr("variant_axes", axes);
  root.set_attr("left_out", left);
  std::string metrics;
  for (std::size_t k : plan.metrics) metrics += (metrics.empty() ? "" : ",") + std::string(kPairMetrics[k].name);
  root.set_attr("metrics", metrics);
  root.set_attr("pairs", plan.pairs_note);
  h5::Transfer xfer(f);
  h5::Group steps = root.create_group("steps");
  std::size_t task = 0;
  for (auto s : plan.steps) {
    h5::Group sg = steps.create_group(std::to_string(s));
    sg.set_attr("step", static_cast<std::int64_t>(s));
    for (std::size_t t = 0; t < plan.tensors.size(); ++t) {
      const std::vector<double>& r = results[task++];
      if (r.empty()) continue;  // not computed ([reduce] per_tensor, whole_model)
      // The tensor's group is named by its index; its name (another program's, which may hold '/' or be
      // ".") is an attribute, never a path.
      h5::Group tg = sg.create_group(std::to_string(t));
      tg.set_attr("name", plan.tensors[t]);
      for (std::size_t k : plan.metrics)
        tg.create_dataset(std::string(kPairMetrics[k].name), DType::f64, {v64, v64})
            .write_rows(task_matrix(plan, r, k).data(), 0, v64, xfer);
    }
  }
  f.close();
}

}  // namespace

void write_deviation_h5(const std::string& path, const ReducePlan& plan, const TaskResults& results,
                        const Provenance& prov) {
  try {
    atomic_write_sealed_with(path, [&](const std::string& tmp) { write_deviation_file(tmp, plan, results, prov); });
  } catch (const h5::H5Error& e) {  // a full disk: the file, the system's error and the file system
    throw Error("cannot write " + path + ": " + e.details() + file_system_note(path),
                "free space on that file system (or choose another --out) and run the reduce again");
  }
}

void write_deviation_csv(const std::string& path, const ReducePlan& plan, const TaskResults& results,
                         const Provenance& prov) {
  const std::size_t T = plan.tensors.size();
  std::ostringstream csv;
  csv << prov.header() << "step,tensor,variant_a,variant_b";
  for (std::size_t k : plan.metrics) csv << ',' << kPairMetrics[k].name;
  csv << '\n';
  for (std::size_t si = 0; si < plan.steps.size(); ++si)
    for (std::size_t t = 0; t < T; ++t) {
      const auto& r = results[si * T + t];
      if (r.empty()) continue;
      for (std::size_t p = 0; p < plan.pairs.size(); ++p) {
        const auto [i, j] = plan.pairs[p];
        csv << plan.steps[si] << ',' << csv_field(plan.tensors[t]) << ',' << csv_field(plan.variants[i]->id) << ','
            << csv_field(plan.variants[j]->id);
        for (std::size_t k : plan.metrics) csv << ',' << number_text(r[(p * kPairMetricCount + k) * 2]);
        csv << '\n';
      }
    }
  atomic_write_sealed(path, csv.str());
}

void write_axes_csv(const std::string& path, const std::vector<RankingAxis>& axes, const Provenance& prov) {
  std::ostringstream ax;
  ax << prov.header() << "axis,role,baseline,replicate,values\n";
  for (const auto& a : axes) {
    std::string values;
    for (std::size_t k = 0; k < a.values.size(); ++k) values += (k ? ";" : "") + a.values[k];
    ax << csv_field(a.name) << ',' << source_role_name(a.role) << ','
       << csv_field(a.baseline.empty() ? a.values.front() : a.baseline) << ',' << (a.replicate ? 1 : 0) << ','
       << csv_field(values) << '\n';
  }
  atomic_write_sealed(path, ax.str());
}

void write_ranking_csv(const std::string& path, const Ranking& ranking, const Provenance& prov) {
  std::ostringstream rc;
  rc << prov.header()
     << "axis,role,condition,value_a,value_b,pairs,independent,step,w1_mean,w1_min,w1_max,max_abs_mean,slope\n";
  for (const auto& r : ranking.rows)
    rc << csv_field(r.axis) << ',' << source_role_name(r.role) << ',' << csv_field(r.condition) << ','
       << csv_field(r.value_a) << ',' << csv_field(r.value_b) << ',' << r.pairs << ',' << r.independent << ',' << r.step << ',' << number_text(r.w1_mean) << ','
       << number_text(r.w1_min) << ',' << number_text(r.w1_max) << ',' << number_text(r.max_abs_mean) << ','
       << number_text(r.slope) << '\n';
  for (const auto& n : ranking.notes) rc << "# note: " << one_line(n) << '\n';
  atomic_write_sealed(path, rc.str());
}

void write_verdict_csv(const std::string& path, const Ranking& ranking, const Provenance& prov) {
  std::ostringstream vc;
  vc << prov.header()
     << "axis,baseline,value,condition,reference,reference_pair,pairs,independent,reference_pairs,"
        "reference_independent,step,w1,reference_w1,end_ratio,end_lo,end_hi,slope,reference_slope,slope_ratio,"
        "slope_lo,slope_hi,informative,noise_w1,measure,comparison,verdict\n";
  for (const auto& c : ranking.comparisons)
    vc << csv_field(c.axis) << ',' << csv_field(c.baseline) << ',' << csv_field(c.value) << ','
       << csv_field(c.condition) << ',' << csv_field(c.reference) << ',' << csv_field(c.reference_pair) << ',' << c.pairs << ',' << c.independent << ',' << c.reference_pairs << ','
       << c.reference_independent << ',' << c.step << ',' << number_text(c.w1) << ',' << number_text(c.reference_w1)
       << ',' << number_text(c.end_ratio) << ',' << number_text(c.end_lo) << ',' << number_text(c.end_hi) << ','
       << number_text(c.slope) << ',' << number_text(c.reference_slope) << ',' << number_text(c.slope_ratio) << ','
       << number_text(c.slope_lo) << ',' << number_text(c.slope_hi) << ',' << (c.informative ? 1 : 0) << ','
       << number_text(c.noise_w1) << ',' << csv_field(c.measure) << ',' << csv_field(c.comparison) << ','
       << csv_field(c.verdict) << '\n';
  atomic_write_sealed(path, vc.str());
}

void write_twins_csv(const std::string& path, const Ranking& ranking, const Provenance& prov) {
  std::ostringstream tw;
  tw << prov.header() << "variant,twin,precision,step,w1,max_abs\n";
  for (const auto& t : ranking.twins)
    tw << csv_field(t.variant) << ',' << csv_field(t.twin) << ',' << csv_field(t.precision) << ',' << t.step << ',' << number_text(t.w1) << ','
       << number_text(t.max_abs) << '\n';
  atomic_write_sealed(path, tw.str());
}

}  // namespace fastudy
