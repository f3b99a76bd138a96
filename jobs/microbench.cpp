// `fastudy microbench GRID.toml`: the numeric microbenchmark (the paper's Section IV). Expands every
// [[microbench.sweeps]] into points, splits them round-robin over the MPI ranks, gathers the rows on
// rank 0 in point order (so the output does not depend on the number of ranks) and writes
//   OUT/microbench.csv   one row per point and algorithm, with a provenance header
//   OUT/microbench.h5    the same table as one dataset per column under /rows (string columns as
//                        integer codes with a `labels` attribute, one label per line)
// Both are written from one schema of columns (kColumns below). Rank 0 prints the flash/baseline
// error ratio per format, reading (policy) and rounding, and against the number of KV tiles.
// Real kernels (README "Real kernels"): a sweep with devices = ["cpu", "cuda"] adds our CUDA kernels'
// rows to each point (checked against the CPU kernels), one with framework = [...] adds points of
// policy "native" with LibTorch's SDPA rows; cuda_preflight refuses them (exit 2) before any work
// where a rank sees no device, and rank 0 prints microbench_table::real_kernel_tables.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <variant>

#include "base/atomic_file.hpp"
#include "base/checksum.hpp"
#include "base/log.hpp"
#include "base/number.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"
#include "fastudy/version.hpp"
#include "jobs/microbench_sdpa.hpp"
#include "jobs/microbench_table.hpp"
#include "kernels/microbench.hpp"
#if FASTUDY_HAVE_CUDA_KERNELS
#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/microbench_cuda.hpp"
#endif
#include "src/io/checkpoint.hpp"
#include "src/io/h5.hpp"
#include "src/runtime/gpu.hpp"
#include "src/runtime/mpi.hpp"
#include "src/train/trainer.hpp"

namespace fs = std::filesystem;

namespace fastudy {

namespace {

struct SweepPoint {
  std::string sweep;
  MicrobenchPoint point;
  const MicrobenchSweep* source = nullptr;  // the sweep it came from (captured inputs: where they are)
  bool cuda = false;                        // also our CUDA kernels (devices lists "cuda")
  std::vector<std::string> framework;       // a framework point (policy "native"): these SDPA backends
};

bool lists(const std::vector<std::string>& v, const char* x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The tiles of a sweep at head dim d: its `blocks`, or (when it lists SRAM sizes) each SRAM size
// under each tile rule, as {block_q, block_kv, sram, rule}.
struct Tiles {
  int block_q, block_kv, sram;
  std::string rule;
};
std::vector<Tiles> sweep_tiles(const MicrobenchSweep& sw, int d) {
  std::vector<Tiles> out;
  if (sw.sram.empty()) {
    for (const auto& [bq, bkv] : sw.blocks) out.push_back({bq, bkv, 0, ""});
    return out;
  }
  for (int m : sw.sram)
    for (const auto& rule : sw.tile_rules) {
      const auto [bq, bkv] = paper_tiles(m, d, rule);
      out.push_back({bq, bkv, m, rule});
    }
  return out;
}

// The rank of each point: largest microbench_cost first (ties: point order), each to the rank with
// the least cost so far (ties: the lower rank) — the longest-processing-time rule, deterministic.
std::vector<int> deal_points(const std::vector<SweepPoint>& points, int ranks) {
  std::vector<std::size_t> order(points.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<double> cost(points.size());
  for (std::size_t i = 0; i < points.size(); ++i) cost[i] = microbench_cost(points[i].point);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cost[a] > cost[b]; });
  std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
  std::vector<int> owner(points.size(), 0);
  for (std::size_t i : order) {
    const auto r = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = static_cast<int>(r);
    load[r] += cost[i];
  }
  return owner;
}

// The variant a captured sweep reads its checkpoint from; UsageError when the grid has no such variant.
const Variant& captured_variant(const Study& st, const MicrobenchSweep& sw) {
  const Variant* v = st.find_variant(sw.captured_variant);
  if (v == nullptr) {
    std::string ids;
    for (const auto& x : st.variants) ids += (ids.empty() ? "" : ", ") + x.id;
    throw UsageError("[microbench] sweep '" + sw.name + "': captured_variant = \"" + sw.captured_variant +
                         "\" is not a variant of this study",
                     "use one of: " + ids);
  }
  if (sw.captured_layer >= st.model.layers) {
    throw UsageError("[microbench] sweep '" + sw.name + "': captured_layer = " + std::to_string(sw.captured_layer) +
                         " is not a layer of the model ([model] layers = " + std::to_string(st.model.layers) + ")",
                     "use a block index from 0 to " + std::to_string(st.model.layers - 1));
  }
  return *v;
}

// The checkpoint a captured sweep reads: the study's checkpoint of the variant at captured_step (or
// the variant's last step).
std::string captured_checkpoint(const Study& st, const std::string& out_dir, const MicrobenchSweep& sw) {
  const Variant& v = captured_variant(st, sw);
  return checkpoint_path(out_dir, v.id, sw.captured_step > 0 ? sw.captured_step : v.train.steps);
}

// Q, K, V of a captured sweep, read once per rank (cache keyed by checkpoint, layer and batch).
const MicrobenchInputs& captured_inputs(const Study& st, const std::string& out_dir, const MicrobenchSweep& sw,
                                        std::map<std::string, MicrobenchInputs>& cache) {
  const std::string path = captured_checkpoint(st, out_dir, sw);
  const std::string key = path + "|" + std::to_string(sw.captured_layer) + "|" + std::to_string(sw.captured_batch);
  auto it = cache.find(key);
  if (it == cache.end()) {
    const CapturedAttention cap = capture_attention_inputs(
        captured_variant(st, sw), read_checkpoint(path), sw.captured_layer, sw.captured_batch);
    log::info("microbench: captured Q, K, V of layer " + std::to_string(sw.captured_layer) + " on batch " +
              std::to_string(sw.captured_batch) + " from " + path);
    MicrobenchInputs in;
    in.q = cap.q;
    in.k = cap.k;
    in.v = cap.v;
    it = cache.emplace(key, std::move(in)).first;
  }
  return it->second;
}

std::vector<SweepPoint> expand_points(const Study& st) {
  std::vector<SweepPoint> pts;
  for (const auto& sw0 : st.microbench.sweeps) {
    // A captured sweep has the shape of the model's attention on one batch of the variant.
    MicrobenchSweep captured_shape;
    if (sw0.distribution == InputDistribution::captured) {
      captured_shape = sw0;
      captured_shape.seq_lens = {st.model.seq_len};
      captured_shape.head_dims = {st.model.d_model / st.model.heads};
      captured_shape.batch = captured_variant(st, sw0).train.batch;
      captured_shape.heads = st.model.heads;
    }
    const MicrobenchSweep& sw = sw0.distribution == InputDistribution::captured ? captured_shape : sw0;
    // What every point of the sweep draws its inputs from.
    auto set_inputs = [&sw](MicrobenchPoint& p) {
      p.batch = sw.batch;
      p.heads = sw.heads;
      p.distribution = sw.distribution;
      p.outlier_fraction = sw.outlier_fraction;
      p.outlier_scale = sw.outlier_scale;
      p.sink_logit = sw.sink_logit;
      p.seed = sw.seed;
    };
    std::vector<std::optional<Rounding>> roundings(sw.roundings.begin(), sw.roundings.end());
    if (roundings.empty()) roundings.push_back(std::nullopt);  // each policy's own
    for (Pass pass : sw.passes)
      for (Format f : sw.formats)
        for (const auto& policy : sw.policies)
          for (const auto& rounding : roundings)
            for (int n : sw.seq_lens)
              for (int d : sw.head_dims)
                for (const Tiles& tiles : sweep_tiles(sw, d))
                  for (LoopOrder order : sw.loop_orders)
                    for (bool causal : sw.causal)
                      for (int trial = 0; trial < sw.trials; ++trial) {
                        MicrobenchPoint p;
                        p.pass = pass;
                        p.format = f;
                        p.policy = policy;
                        p.rounding = rounding;
                        p.seq_len = n;
                        p.head_dim = d;
                        p.block_q = std::min(tiles.block_q, n);  // the kernels clip too; record what ran
                        p.block_kv = std::min(tiles.block_kv, n);
                        p.sram = tiles.sram;
                        p.tile_rule = tiles.rule;
                        p.loop_order = order;
                        p.causal = causal;
                        p.trial = trial;
                        set_inputs(p);
                        pts.push_back({sw.name, p, &sw0, lists(sw.devices, "cuda"), {}});
                      }
    // The framework's kernels: one point per input (pass, format, shape, causal, trial), policy
    // "native" (the hardware's own arithmetic), no tiles of ours (block sizes 0, tile rule "native").
    if (!sw.framework.empty())
      for (Pass pass : sw.passes)
        for (Format f : sw.formats)
          for (int n : sw.seq_lens)
            for (int d : sw.head_dims)
              for (bool causal : sw.causal)
                for (int trial = 0; trial < sw.trials; ++trial) {
                  MicrobenchPoint p;
                  p.pass = pass;
                  p.format = f;
                  p.policy = "native";
                  p.seq_len = n;
                  p.head_dim = d;
                  p.block_q = p.block_kv = 0;
                  p.tile_rule = "native";
                  p.causal = causal;
                  p.trial = trial;
                  set_inputs(p);
                  pts.push_back({sw.name, p, &sw0, false, sw.framework});
                }
  }
  return pts;
}

// ---- the output columns: one row each, in file order ---------------------------------------------
// The CSV, the HDF5 table (one dataset per column under /rows; text columns as integer codes with a
// `labels` attribute, one label per line) and the summary are all written from this schema, and the
// report reads the columns by these names (the HDF5 `columns` attribute lists them). A new column is
// one row here (and its value in MicrobenchRow).
enum class ColumnType { text, integer, real };
using microbench_table::Cell;
using microbench_table::Record;

struct Column {
  const char* name;
  ColumnType type;
  Cell (*get)(const std::string& sweep, const MicrobenchRow& r);
};

const Column kColumns[] = {
    {"sweep", ColumnType::text, [](const std::string& sweep, const MicrobenchRow&) -> Cell { return sweep; }},
    {"algorithm", ColumnType::text, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.algorithm; }},
    {"pass", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.point.pass)); }},
    {"format", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.point.format)); }},
    {"policy", ColumnType::text, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.point.policy; }},
    {"rounding", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.rounding)); }},
    {"seq_len", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.seq_len}; }},
    {"head_dim", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.head_dim}; }},
    {"block_q", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.block_q}; }},
    {"block_kv", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.block_kv}; }},
    {"sram", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.sram}; }},
    {"tile_rule", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell {
       return r.point.tile_rule.empty() ? std::string("blocks") : r.point.tile_rule;
     }},
    {"loop_order", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.point.loop_order)); }},
    {"causal", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.causal ? 1 : 0}; }},
    {"trial", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.trial}; }},
    {"distribution", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.point.distribution)); }},
    {"max_abs", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.max_abs; }},
    {"mean_abs", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.mean_abs; }},
    {"std_abs", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.std_abs; }},
    {"rel_l2", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.rel_l2; }},
    {"rmse", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.rmse; }},
    {"mean_signed", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.mean_signed; }},
    {"max_ulp", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.max_ulp; }},
    {"repeated_max_rows", ColumnType::real,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return r.repeated_max_rows; }},
    {"rescales_per_row", ColumnType::real,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return r.rescales_per_row; }},
    {"tiles_kv", ColumnType::integer, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.tiles_kv; }},
    {"check", ColumnType::text, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.check; }},
    {"vs_cpu", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.vs_cpu; }},
    {"check_bound", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.check_bound; }},
};
constexpr std::size_t kNumColumns = std::size(kColumns);

// The position of a column in kColumns (a name not in the schema is a programming error).
std::size_t column(std::string_view name) {
  for (std::size_t c = 0; c < kNumColumns; ++c)
    if (name == kColumns[c].name) return c;
  throw std::logic_error("microbench: no column " + std::string(name));
}

}  // namespace

Record microbench_table::record_of(const std::string& sweep, const MicrobenchRow& r) {
  Record rec;
  rec.reserve(kNumColumns);
  for (const auto& c : kColumns) rec.push_back(c.get(sweep, r));
  return rec;
}

namespace {
using microbench_table::record_of;

// CSV text of a cell: reals with 17 significant digits (they read back exactly).
std::string csv_text(const Cell& cell) {
  if (const auto* t = std::get_if<std::string>(&cell)) return *t;
  if (const auto* i = std::get_if<std::int64_t>(&cell)) return std::to_string(*i);
  return number_text(std::get<double>(cell));
}

std::string csv_line(const Record& rec) {
  std::string line;
  for (std::size_t c = 0; c < rec.size(); ++c) line += (c ? "," : "") + csv_text(rec[c]);
  return line;
}

double real_at(const Record& rec, std::string_view name) { return std::get<double>(rec[column(name)]); }
const std::string& text_at(const Record& rec, std::string_view name) { return std::get<std::string>(rec[column(name)]); }

// Records travel from the ranks to rank 0 as bytes: per record its point index, then per cell its
// value (text: length and bytes; integer and real: their 8 bytes), in schema order.
template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
T take(const std::string& in, std::size_t& at) {
  if (at + sizeof(T) > in.size()) throw Error("microbench: a rank sent a truncated record");
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  at += sizeof v;
  return v;
}

void encode(std::string& out, std::uint64_t index, const Record& rec) {
  put(out, index);
  for (std::size_t c = 0; c < kNumColumns; ++c) {
    if (kColumns[c].type == ColumnType::text) {
      const auto& t = std::get<std::string>(rec[c]);
      put(out, static_cast<std::uint64_t>(t.size()));
      out += t;
    } else if (kColumns[c].type == ColumnType::integer) {
      put(out, std::get<std::int64_t>(rec[c]));
    } else {
      put(out, std::get<double>(rec[c]));
    }
  }
}

std::vector<std::pair<std::uint64_t, Record>> decode(const std::string& in) {
  std::vector<std::pair<std::uint64_t, Record>> out;
  std::size_t at = 0;
  while (at < in.size()) {
    const auto index = take<std::uint64_t>(in, at);
    Record rec;
    for (const auto& c : kColumns) {
      if (c.type == ColumnType::text) {
        const auto n = take<std::uint64_t>(in, at);
        if (at + n > in.size()) throw Error("microbench: a rank sent a truncated record");
        rec.emplace_back(in.substr(at, n));
        at += n;
      } else if (c.type == ColumnType::integer) {
        rec.emplace_back(take<std::int64_t>(in, at));
      } else {
        rec.emplace_back(take<double>(in, at));
      }
    }
    out.emplace_back(index, std::move(rec));
  }
  return out;
}

void write_h5(const std::string& path, const std::vector<Record>& rows, const Provenance& prov) {
  atomic_write_sealed_with(path, [&](const std::string& tmp) {
    h5::File f = h5::File::create(tmp, nullptr);
    h5::Group root = f.root();
    root.set_attr("provenance", prov.header());
    root.set_attr("config_hash", prov.config_hash);
    root.set_attr("format", std::string("fastudy-microbench/1"));
    std::string cols;
    for (const auto& c : kColumns) cols += (cols.empty() ? "" : ",") + std::string(c.name);
    root.set_attr("columns", cols);
    h5::Group g = root.create_group("rows");
    const std::int64_t n = static_cast<std::int64_t>(rows.size());
    h5::Transfer xfer(f);
    for (std::size_t c = 0; c < kNumColumns; ++c) {
      if (kColumns[c].type == ColumnType::real) {
        std::vector<double> col(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) col[i] = std::get<double>(rows[i][c]);
        g.create_dataset(kColumns[c].name, DType::f64, {n}).write_rows(col.data(), 0, n, xfer);
      } else if (kColumns[c].type == ColumnType::integer) {
        std::vector<std::int64_t> col(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) col[i] = std::get<std::int64_t>(rows[i][c]);
        g.create_dataset(kColumns[c].name, DType::i64, {n}).write_rows(col.data(), 0, n, xfer);
      } else {
        std::vector<std::string> labels;
        std::vector<std::int64_t> codes(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) {
          const auto& text = std::get<std::string>(rows[i][c]);
          auto it = std::find(labels.begin(), labels.end(), text);
          if (it == labels.end()) it = labels.insert(labels.end(), text);
          codes[i] = it - labels.begin();
        }
        h5::Dataset d = g.create_dataset(kColumns[c].name, DType::i64, {n});
        d.write_rows(codes.data(), 0, n, xfer);
        std::string joined;
        for (const auto& l : labels) joined += l + "\n";
        d.set_attr("labels", joined);
      }
    }
    f.close();
  });
}

// A point: every column but the algorithm and the measurements.
std::string point_key(const Record& r) {
  std::string k;
  for (const char* name : {"sweep", "pass", "format", "policy", "rounding", "seq_len", "head_dim", "block_q",
                           "block_kv", "sram", "tile_rule", "loop_order", "causal", "trial", "distribution"})
    k += csv_text(r[column(name)]) + "|";
  return k;
}

// The median of v: the middle value, or the mean of the two middle ones (NaN when empty).
double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// The summary rank 0 prints: flash/baseline error ratios, both errors against the fp64 golden value,
// each the median over points of the per-point ratio, of max |d| and of rel_l2.
//   table 1: per sweep, pass, format, policy (reading) and rounding, with the median errors beside;
//   table 2 (the readings question): per sweep, pass, policy, rounding, format and number of KV tiles,
//            for every such group whose sweep covers two or more tile counts.
void print_summary(const std::vector<Record>& rows) {
  struct Acc {
    std::vector<double> flash, baseline, ratio, ratio_l2;
    std::size_t points = 0;
  };
  struct Base {
    double max_abs, rel_l2;
  };
  std::map<std::string, Base> baseline_of;  // point key -> baseline errors
  for (const auto& r : rows)
    if (text_at(r, "algorithm") == "baseline")
      baseline_of[point_key(r)] = {real_at(r, "max_abs"), real_at(r, "rel_l2")};
  // Group keys: (sweep, pass, policy, rounding, format) and, for table 2, the tile count.
  using Group = std::tuple<std::string, std::string, std::string, std::string, std::string>;
  std::map<Group, Acc> by_group;
  std::map<std::pair<Group, std::int64_t>, Acc> by_tiles;
  std::map<std::string, std::set<std::int64_t>> tiles_of_sweep;
  for (const auto& r : rows) {
    if (text_at(r, "algorithm") != "flash") continue;
    const Group g{text_at(r, "sweep"), text_at(r, "pass"), text_at(r, "policy"), text_at(r, "rounding"),
                  text_at(r, "format")};
    const std::int64_t tiles = std::get<std::int64_t>(r[column("tiles_kv")]);
    tiles_of_sweep[text_at(r, "sweep")].insert(tiles);
    for (Acc* a : {&by_group[g], &by_tiles[{g, tiles}]}) {
      ++a->points;
      a->flash.push_back(real_at(r, "max_abs"));
      auto it = baseline_of.find(point_key(r));
      if (it == baseline_of.end()) continue;
      a->baseline.push_back(it->second.max_abs);
      if (it->second.max_abs > 0) a->ratio.push_back(real_at(r, "max_abs") / it->second.max_abs);
      if (it->second.rel_l2 > 0) a->ratio_l2.push_back(real_at(r, "rel_l2") / it->second.rel_l2);
    }
  }
  std::ostringstream os;
  char line[240];
  std::snprintf(line, sizeof line, "%-12s %-9s %-9s %-11s %-6s %12s %12s %9s %9s %6s\n", "sweep", "pass", "policy",
                "rounding", "format", "flash max|d|", "base max|d|", "ratio max", "ratio l2", "points");
  os << "microbench: flash/baseline error ratio, both against the fp64 golden value (ratio max: of max|d|, "
        "ratio l2: of rel_l2; medians over points)\n"
     << line;
  for (const auto& [g, a] : by_group) {
    const auto& [sweep, pass, policy, rounding, format] = g;
    std::snprintf(line, sizeof line, "%-12s %-9s %-9s %-11s %-6s %12.3e %12.3e %9.2f %9.2f %6zu\n", sweep.c_str(),
                  pass.c_str(), policy.c_str(), rounding.c_str(), format.c_str(), median(a.flash), median(a.baseline),
                  median(a.ratio), median(a.ratio_l2), a.points);
    os << line;
  }
  bool header = false;
  for (const auto& [key, a] : by_tiles) {
    const auto& [g, tiles] = key;
    const auto& [sweep, pass, policy, rounding, format] = g;
    if (tiles_of_sweep[sweep].size() < 2) continue;
    if (!header) {
      std::snprintf(line, sizeof line, "%-12s %-9s %-9s %-11s %-6s %8s %9s %9s %6s\n", "sweep", "pass", "policy",
                    "rounding", "format", "tiles_kv", "ratio max", "ratio l2", "points");
      os << "microbench: flash/baseline error ratio against the number of KV tiles (medians over points)\n" << line;
      header = true;
    }
    std::snprintf(line, sizeof line, "%-12s %-9s %-9s %-11s %-6s %8lld %9.2f %9.2f %6zu\n", sweep.c_str(),
                  pass.c_str(), policy.c_str(), rounding.c_str(), format.c_str(), static_cast<long long>(tiles),
                  median(a.ratio), median(a.ratio_l2), a.points);
    os << line;
  }
  log::info(os.str());
}

bool is_cuda_algorithm(const std::string& a) { return a == "cuda_flash" || a == "cuda_baseline"; }
bool is_framework_algorithm(const std::string& a) { return a.rfind("sdpa_", 0) == 0; }

// microbench_table::real_kernel_tables (jobs/microbench_table.hpp).
std::string real_kernel_tables_of(const std::vector<Record>& rows, std::size_t& failed) {
  std::ostringstream os;
  char line[320];
  failed = 0;
  auto str = [](const Record& r, const char* c) { return csv_text(r[column(c)]); };
  // Our CUDA kernels against our CPU kernels.
  std::map<std::string, double> cpu_error;  // point key + kind -> CPU max |d|
  for (const auto& r : rows)
    if (text_at(r, "algorithm") == "flash" || text_at(r, "algorithm") == "baseline")
      cpu_error[point_key(r) + text_at(r, "algorithm")] = real_at(r, "max_abs");
  struct CudaAcc {
    std::vector<double> cuda, cpu;
    std::size_t identical = 0, within = 0, failed = 0;
    double worst = 0;
  };
  std::map<std::vector<std::string>, CudaAcc> cuda;
  for (const auto& r : rows) {
    const std::string& alg = text_at(r, "algorithm");
    if (!is_cuda_algorithm(alg)) continue;
    CudaAcc& a = cuda[{str(r, "sweep"), str(r, "pass"), str(r, "format"), str(r, "policy"), alg}];
    a.cuda.push_back(real_at(r, "max_abs"));
    const auto it = cpu_error.find(point_key(r) + alg.substr(5));
    if (it != cpu_error.end()) a.cpu.push_back(it->second);
    const std::string& check = text_at(r, "check");
    a.identical += check == "bit-identical";
    a.within += check == "within bound";
    a.failed += check != "bit-identical" && check != "within bound";
    a.worst = std::max(a.worst, real_at(r, "vs_cpu"));
  }
  if (!cuda.empty()) {
    std::snprintf(line, sizeof line, "%-12s %-9s %-6s %-7s %-13s %11s %11s %9s %9s %6s %10s\n", "sweep", "pass",
                  "format", "policy", "algorithm", "cuda max|d|", "cpu max|d|", "identical", "in bound", "FAILED",
                  "max vs_cpu");
    os << "microbench: our CUDA kernels against our CPU kernels (errors against the fp64 golden value, medians; "
          "checks: bit-identical where the host twin promises it, else within 2x the harness bound)\n"
       << line;
    for (const auto& [k, a] : cuda) {
      std::snprintf(line, sizeof line, "%-12s %-9s %-6s %-7s %-13s %11.3e %11.3e %9zu %9zu %6zu %10.3e\n",
                    k[0].c_str(), k[1].c_str(), k[2].c_str(), k[3].c_str(), k[4].c_str(), median(a.cuda),
                    median(a.cpu), a.identical, a.within, a.failed, a.worst);
      os << line;
      failed += a.failed;
    }
  }
  // The framework's kernels, and the readings that reproduce sdpa_flash's error.
  // Numbers right-aligned in 6 characters, so that the keys sort numerically (and print as before).
  auto padded = [&](const Record& r, const char* c) {
    const std::string t = str(r, c);
    return t.size() < 6 ? std::string(6 - t.size(), ' ') + t : t;
  };
  auto input = [&](const Record& r) {
    return std::vector<std::string>{str(r, "sweep"),    str(r, "pass"),   str(r, "format"),      padded(r, "seq_len"),
                                    padded(r, "head_dim"), str(r, "causal"), str(r, "distribution")};
  };
  std::map<std::vector<std::string>, std::map<std::string, std::vector<double>>> real;
  std::set<std::string> backends;
  for (const auto& r : rows) {
    const std::string& alg = text_at(r, "algorithm");
    if (!is_framework_algorithm(alg)) continue;
    real[input(r)][alg].push_back(real_at(r, "max_abs"));
    backends.insert(alg);
  }
  if (!real.empty()) {
    os << "microbench: the framework's kernels (LibTorch SDPA, one backend each), max|d| against the fp64 golden "
          "value, medians over trials\n";
    std::string head;
    std::snprintf(line, sizeof line, "%-12s %-9s %-6s %6s %5s %6s", "sweep", "pass", "format", "N", "d", "causal");
    head = line;
    for (const auto& b : backends) {
      std::snprintf(line, sizeof line, " %14s", b.c_str());
      head += line;
    }
    os << head << "\n";
    for (const auto& [k, by] : real) {
      std::snprintf(line, sizeof line, "%-12s %-9s %-6s %6s %5s %6s", k[0].c_str(), k[1].c_str(), k[2].c_str(),
                    k[3].c_str(), k[4].c_str(), k[5].c_str());
      std::string l = line;
      for (const auto& b : backends) {
        const auto it = by.find(b);
        std::snprintf(line, sizeof line, " %14.3e", it == by.end() ? std::nan("") : median(it->second));
        l += line;
      }
      os << l << "\n";
    }
    std::map<std::pair<std::vector<std::string>, std::string>, std::vector<double>> readings;
    for (const auto& r : rows) {
      if (text_at(r, "algorithm") != "flash") continue;
      const auto k = input(r);
      if (!real.count(k) || !real[k].count("sdpa_flash")) continue;
      readings[{k, str(r, "policy") + " " + str(r, "rounding") + " " + str(r, "block_q") + "x" + str(r, "block_kv") +
                       " " + str(r, "loop_order")}]
          .push_back(real_at(r, "max_abs"));
    }
    if (!readings.empty()) {
      std::snprintf(line, sizeof line, "%-12s %-9s %-6s %6s %5s %6s %-32s %13s %13s %8s  %s\n", "sweep", "pass",
                    "format", "N", "d", "causal", "reading (policy rounding tiles order)", "reading max|d|",
                    "sdpa_flash", "real/rd", "verdict");
      os << "microbench: which emulated reading reproduces the real flash kernel's error (within 2x: sdpa_flash <= 2x "
            "the reading's and the reading's <= 2x sdpa_flash's; FlashAttention's rule, medians over trials)\n"
         << line;
      for (const auto& [key, errs] : readings) {
        const auto& [k, reading] = key;
        const double rd = median(errs), fl = median(real[k]["sdpa_flash"]);
        std::snprintf(line, sizeof line, "%-12s %-9s %-6s %6s %5s %6s %-32s %13.3e %13.3e %8.2f  %s\n", k[0].c_str(),
                      k[1].c_str(), k[2].c_str(), k[3].c_str(), k[4].c_str(), k[5].c_str(), reading.c_str(), rd, fl,
                      rd > 0 ? fl / rd : std::nan(""), to_string(within_2x(fl, rd)));
        os << line;
      }
    }
  }
  return os.str();
}

// Every sweep that runs CUDA work: our kernels (devices lists "cuda") or the framework's. Checked on
// every rank before any work: each must see a device, and the device must hold the flash tiles of
// every CUDA point (else UsageError, exit 2, on every rank, naming the grid file, the key and the
// reason). Returns the device of this rank (select_gpu: the trainer's rule), made current; -1 when
// no sweep needs one.
int cuda_preflight(const Study& st, const std::vector<SweepPoint>& points, mpi::Comm& world) {
  const MicrobenchSweep* ours = nullptr;
  const MicrobenchSweep* framework = nullptr;
  for (const auto& sw : st.microbench.sweeps) {
    if (!ours && lists(sw.devices, "cuda")) ours = &sw;
    if (!framework && !sw.framework.empty()) framework = &sw;
  }
  if (!ours && !framework) return -1;
  std::string why;
  int count = 0;
  if (ours) {
#if FASTUDY_HAVE_CUDA_KERNELS
    count = cuda::device_count(&why);
#else
    why = "this build has no CUDA kernels";  // load_study refuses it first
    (void)points;
#endif
  }
  if ((!ours || count > 0) && framework) {
    if (sdpa_device_available(&why))
      count = ours ? std::min(count, sdpa_device_count()) : sdpa_device_count();
    else
      count = 0;
  }
  const std::int64_t missing = world.allreduce_max(std::int64_t{count > 0 ? 0 : 1});
  if (missing != 0) {
    const MicrobenchSweep& sw = ours && (count == 0 || !framework) ? *ours : *framework;
    const std::string key = &sw == ours ? "devices = [..., \"cuda\"]" : "framework";
    throw UsageError(st.file + ": [microbench] sweep '" + sw.name + "': " + key + " needs a CUDA device, and " +
                         (count > 0 ? std::string("another rank sees none")
                                    : "rank " + std::to_string(world.rank()) + " sees none (" + why + ")"),
                     "run on a machine with an NVIDIA GPU (nvidia-smi, CUDA_VISIBLE_DEVICES), or remove the key "
                     "(configs/microbench.toml runs on the CPU)");
  }
  const int device = select_gpu(world);  // the trainer's rule: node-local rank modulo the devices, made current
#if FASTUDY_HAVE_CUDA_KERNELS
  if (ours) {
    std::string sweep, why_tiles, hint;
    std::set<std::tuple<int, int, int>> seen;
    for (const auto& sp : points) {
      if (!sp.cuda || !seen.insert({sp.point.block_q, sp.point.block_kv, sp.point.head_dim}).second) continue;
      try {
        cuda::check_flash_tiles(sp.point.block_q, sp.point.block_kv, sp.point.head_dim);
      } catch (const UsageError& e) {
        sweep = sp.sweep;
        why_tiles = e.what();
        hint = e.hint();
        break;
      }
    }
    if (world.allreduce_max(std::int64_t{why_tiles.empty() ? 0 : 1}) != 0) {
      throw UsageError(st.file + ": [microbench] " +
                           (why_tiles.empty() ? std::string("another rank's device cannot hold the CUDA kernels' tiles")
                                              : "sweep '" + sweep + "': blocks (or sram) and head_dims with devices = "
                                                "[..., \"cuda\"]: " + why_tiles),
                       hint.empty() ? "use smaller block_q/block_kv for the CUDA kernels" : hint);
    }
  }
#endif
  return device;
}

}  // namespace

std::string microbench_table::real_kernel_tables(const std::vector<Record>& rows, std::size_t& failed) {
  return real_kernel_tables_of(rows, failed);
}

int job_microbench(JobContext& ctx) {
  const Study& st = *ctx.study;
  mpi::Comm& world = *ctx.world;
  const std::string csv_path = (fs::path(ctx.out_dir) / "microbench.csv").string();
  const std::string h5_path = (fs::path(ctx.out_dir) / "microbench.h5").string();

  // Checked before anything is written: a captured sweep's variant, layer and checkpoint.
  const std::vector<SweepPoint> points = expand_points(st);
  for (const auto& sw : st.microbench.sweeps) {
    if (sw.distribution != InputDistribution::captured) continue;
    const std::string path = captured_checkpoint(st, ctx.out_dir, sw);
    if (!file_exists(path)) {
      throw UsageError("[microbench] sweep '" + sw.name + "': the checkpoint to capture Q, K, V from, " + path +
                           ", does not exist",
                       "train the variant first (fastudy train GRID), then run fastudy microbench GRID --resume; "
                       "or set captured_step to a step with a checkpoint");
    }
  }

  const int device = cuda_preflight(st, points, world);

  bool skip = false;
  on_root(world, [&] {
    prepare_output(ctx);
    skip = ctx.opts.resume && !ctx.opts.force && file_exists(csv_path) && file_exists(h5_path) &&
           read_text_file(csv_path).find("# config_hash: " + st.hash) != std::string::npos;
  });
  std::int64_t skip_flag = skip ? 1 : 0;
  world.bcast(skip_flag);
  if (skip_flag) {
    log::info("microbench: " + csv_path + " is complete for this grid; skipped (--force reruns it)");
    return kExitOk;
  }

  const int threads = world.size() == 1 ? std::max(1u, std::thread::hardware_concurrency()) : 1;
  log::info("microbench: " + std::to_string(points.size()) + " points over " + std::to_string(world.size()) +
            " rank(s)");

  // Points are dealt by cost (microbench_cost), largest first, each to the rank with the least work so
  // far (ties: the lower rank): every rank computes the same deal. Each point is computed whole by
  // one rank and rank 0 writes the rows in point order, so the output does not depend on the number
  // of ranks. Each rank sends its records (encode) to rank 0.
  const std::vector<int> owner = deal_points(points, world.size());
  std::size_t mine_total = 0;
  for (int o : owner) mine_total += o == world.rank();
  std::map<std::string, MicrobenchInputs> capture_cache;
  std::string mine;
  std::size_t done = 0, next_report = mine_total / 10 + 1;
  const auto busy_start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (owner[i] != world.rank()) continue;
    if (stop_signal_received()) break;  // checked again collectively below
    const SweepPoint& sp = points[i];
    std::optional<PrecisionPolicy> policy;
    if (st.attention.custom_policies.count(sp.point.policy))
      policy = resolve_policy(st.attention, sp.point.policy, sp.point.format);
    const MicrobenchInputs* captured = nullptr;
    if (sp.point.distribution == InputDistribution::captured)
      captured = &captured_inputs(st, ctx.out_dir, *sp.source, capture_cache);
    std::vector<MicrobenchRow> rows;
    if (!sp.framework.empty()) {
      // The inputs rounded to the format (the pure reading's q, k, v and grad formats).
      const MicrobenchRun run =
          prepare_microbench_point(sp.point, make_policy("pure", sp.point.format), threads, captured);
      for (const auto& backend : sp.framework) rows.push_back(microbench_sdpa_row(run, backend, device));
    } else {
      MicrobenchRun run;
      rows = run_microbench_point(sp.point, policy, threads, captured, sp.cuda ? &run : nullptr);
      if (sp.cuda) {
#if FASTUDY_HAVE_CUDA_KERNELS
        for (auto& r : cuda::microbench_cuda_rows(run)) rows.push_back(std::move(r));
#else
        throw std::logic_error("microbench: a CUDA point in a build without CUDA kernels");
#endif
      }
    }
    for (const auto& row : rows) encode(mine, i, record_of(sp.sweep, row));
    ++done;
    if (world.rank() == 0 && done >= next_report) {
      log::info("  microbench: rank 0 " + std::to_string(done) + "/" + std::to_string(mine_total));
      next_report += mine_total / 10 + 1;
    }
  }
  const double busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - busy_start).count();
  double busy_range[2] = {busy, -busy};
  world.allreduce_max(busy_range, 2);
  const double busy_max = busy_range[0], busy_min = -busy_range[1];
  if (world.size() > 1)
    log::info("microbench: ranks busy " + number_text(busy_min, 3) + " s to " + number_text(busy_max, 3) + " s");
  if (world.allreduce_max(static_cast<std::int64_t>(stop_signal_received())) != 0) {
    log::warn("microbench: stopped by a signal; nothing written (it reruns with --resume)");
    return kExitFailure;
  }
  std::vector<std::string> parts = world.gather(mine);
  std::int64_t failed_checks = 0;

  on_root(world, [&] {
    std::vector<std::pair<std::uint64_t, Record>> records;
    for (const auto& part : parts)
      for (auto& r : decode(part)) records.push_back(std::move(r));
    std::stable_sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::ostringstream csv;
    csv << ctx.prov.header();
    for (std::size_t c = 0; c < kNumColumns; ++c) csv << (c ? "," : "") << kColumns[c].name;
    csv << '\n';
    std::vector<Record> rows;
    for (auto& [idx, rec] : records) {
      csv << csv_line(rec) << '\n';
      rows.push_back(std::move(rec));
    }
    write_h5(h5_path, rows, ctx.prov);
    atomic_write_sealed(csv_path, csv.str());
    print_summary(rows);
    std::size_t failed = 0;
    const std::string tables = real_kernel_tables_of(rows, failed);
    if (!tables.empty()) log::info(tables);
    failed_checks = static_cast<std::int64_t>(failed);
    log::info("microbench: wrote " + csv_path + " and " + h5_path + " (" + std::to_string(rows.size()) + " rows)");
  });
  world.bcast(failed_checks);
  if (failed_checks != 0) {
    log::error("microbench: " + std::to_string(failed_checks) + " CUDA row(s) failed their check against our CPU "
               "kernels (column check: DIFFERS or EXCEEDS BOUND in " + csv_path + ")");
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace fastudy
