// `fastudy microbench GRID.toml`: the numeric microbenchmark (the paper's Section IV). Expands every
// [[microbench.sweeps]] into points, splits them round-robin over the MPI ranks, gathers the rows on
// rank 0 in point order (so the output does not depend on the number of ranks) and writes
//   OUT/microbench.csv   one row per point and algorithm, with a provenance header
//   OUT/microbench.h5    the same table as one dataset per column under /rows (string columns as
//                        integer codes with a `labels` attribute, one label per line)
// Both are written from one schema of columns (kColumns below). Rank 0 prints the flash/baseline
// error ratio per format and policy.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
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
#include "kernels/microbench.hpp"
#include "src/io/h5.hpp"
#include "src/runtime/mpi.hpp"

namespace fs = std::filesystem;

namespace fastudy {

namespace {

struct SweepPoint {
  std::string sweep;
  MicrobenchPoint point;
};

std::vector<SweepPoint> expand_points(const Study& st) {
  std::vector<SweepPoint> pts;
  for (const auto& sw : st.microbench.sweeps)
    for (const auto& pass : sw.passes)
      for (Format f : sw.formats)
        for (const auto& policy : sw.policies)
          for (int n : sw.seq_lens)
            for (int d : sw.head_dims)
              for (const auto& [bq, bkv] : sw.blocks)
                for (LoopOrder order : sw.loop_orders)
                  for (bool causal : sw.causal)
                    for (int trial = 0; trial < sw.trials; ++trial) {
                      MicrobenchPoint p;
                      p.pass = pass;
                      p.format = f;
                      p.policy = policy;
                      p.seq_len = n;
                      p.head_dim = d;
                      p.block_q = std::min(bq, n);  // the kernels clip too; record what ran
                      p.block_kv = std::min(bkv, n);
                      p.loop_order = order;
                      p.causal = causal;
                      p.trial = trial;
                      p.batch = sw.batch;
                      p.heads = sw.heads;
                      p.distribution = sw.distribution;
                      p.outlier_fraction = sw.outlier_fraction;
                      p.outlier_scale = sw.outlier_scale;
                      p.seed = sw.seed;
                      pts.push_back({sw.name, p});
                    }
  return pts;
}

// ---- the output columns: one row each, in file order ---------------------------------------------
// The CSV, the HDF5 table (one dataset per column under /rows; text columns as integer codes with a
// `labels` attribute, one label per line) and the summary are all written from this schema, and the
// report reads the columns by these names (the HDF5 `columns` attribute lists them). A new column is
// one row here (and its value in MicrobenchRow).
enum class ColumnType { text, integer, real };
using Cell = std::variant<std::string, std::int64_t, double>;
using Record = std::vector<Cell>;  // one output row, a cell per column

struct Column {
  const char* name;
  ColumnType type;
  Cell (*get)(const std::string& sweep, const MicrobenchRow& r);
};

const Column kColumns[] = {
    {"sweep", ColumnType::text, [](const std::string& sweep, const MicrobenchRow&) -> Cell { return sweep; }},
    {"algorithm", ColumnType::text, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.algorithm; }},
    {"pass", ColumnType::text, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.point.pass; }},
    {"format", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.point.format)); }},
    {"policy", ColumnType::text, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.point.policy; }},
    {"seq_len", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.seq_len}; }},
    {"head_dim", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.head_dim}; }},
    {"block_q", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.block_q}; }},
    {"block_kv", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.block_kv}; }},
    {"loop_order", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.point.loop_order)); }},
    {"causal", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.causal ? 1 : 0}; }},
    {"trial", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.trial}; }},
    {"distribution", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return r.point.distribution; }},
    {"max_abs", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.max_abs; }},
    {"mean_abs", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.mean_abs; }},
    {"std_abs", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.std_abs; }},
    {"rel_l2", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.rel_l2; }},
    {"rescales_per_row", ColumnType::real,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return r.rescales_per_row; }},
    {"tiles_kv", ColumnType::integer, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.tiles_kv; }},
};
constexpr std::size_t kNumColumns = std::size(kColumns);

// The position of a column in kColumns (a name not in the schema is a programming error).
std::size_t column(std::string_view name) {
  for (std::size_t c = 0; c < kNumColumns; ++c)
    if (name == kColumns[c].name) return c;
  throw std::logic_error("microbench: no column " + std::string(name));
}

Record record_of(const std::string& sweep, const MicrobenchRow& r) {
  Record rec;
  rec.reserve(kNumColumns);
  for (const auto& c : kColumns) rec.push_back(c.get(sweep, r));
  return rec;
}

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

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
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

// Flash/baseline error ratio (vs fp64) per sweep, pass, format and policy: the median over points of the
// per-point ratio of max |d|, with the medians of each error beside it.
void print_summary(const std::vector<Record>& rows) {
  struct Acc {
    std::vector<double> flash, baseline, ratio;
  };
  std::map<std::string, Acc> acc;
  std::map<std::string, double> baseline_of;  // point key -> baseline max_abs
  // A point: every column but the algorithm and the measurements.
  auto point_key = [](const Record& r) {
    std::string k;
    for (const char* name : {"sweep", "pass", "format", "policy", "seq_len", "head_dim", "block_q", "block_kv",
                             "loop_order", "causal", "trial", "distribution"})
      k += csv_text(r[column(name)]) + "|";
    return k;
  };
  for (const auto& r : rows)
    if (text_at(r, "algorithm") == "baseline") baseline_of[point_key(r)] = real_at(r, "max_abs");
  for (const auto& r : rows) {
    const std::string key =
        text_at(r, "sweep") + "|" + text_at(r, "pass") + "|" + text_at(r, "format") + "|" + text_at(r, "policy");
    const double e = real_at(r, "max_abs");
    if (text_at(r, "algorithm") == "flash") {
      acc[key].flash.push_back(e);
      auto it = baseline_of.find(point_key(r));
      if (it != baseline_of.end() && it->second > 0) acc[key].ratio.push_back(e / it->second);
    } else if (text_at(r, "algorithm") == "baseline") {
      acc[key].baseline.push_back(e);
    }
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return std::nan("");
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  std::ostringstream os;
  char line[200];
  std::snprintf(line, sizeof line, "%-12s %-9s %-9s %-7s %14s %14s %12s %7s\n", "sweep", "pass", "format", "policy",
                "flash max|d|", "base max|d|", "flash/base", "points");
  os << "microbench: error against the fp64 golden value (medians over points)\n" << line;
  for (const auto& [key, a] : acc) {
    auto parts = split(key, '|');
    std::snprintf(line, sizeof line, "%-12s %-9s %-9s %-7s %14.3e %14.3e %12.2f %7zu\n", parts[0].c_str(),
                  parts[1].c_str(), parts[2].c_str(), parts[3].c_str(), median(a.flash), median(a.baseline),
                  median(a.ratio), a.flash.size());
    os << line;
  }
  log::info(os.str());
}

}  // namespace

int job_microbench(JobContext& ctx) {
  const Study& st = *ctx.study;
  mpi::Comm& world = *ctx.world;
  const std::string csv_path = (fs::path(ctx.out_dir) / "microbench.csv").string();
  const std::string h5_path = (fs::path(ctx.out_dir) / "microbench.h5").string();

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

  const std::vector<SweepPoint> points = expand_points(st);
  const int threads = world.size() == 1 ? std::max(1u, std::thread::hardware_concurrency()) : 1;
  log::info("microbench: " + std::to_string(points.size()) + " points over " + std::to_string(world.size()) +
            " rank(s)");

  // Round-robin: point i runs on rank i % size. Each rank sends its records (encode) to rank 0.
  std::string mine;
  std::size_t done = 0, next_report = points.size() / 10 + 1;
  for (std::size_t i = static_cast<std::size_t>(world.rank()); i < points.size(); i += static_cast<std::size_t>(world.size())) {
    if (stop_signal_received()) break;  // checked again collectively below
    const SweepPoint& sp = points[i];
    std::optional<PrecisionPolicy> policy;
    if (st.attention.custom_policies.count(sp.point.policy))
      policy = resolve_policy(st.attention, sp.point.policy, sp.point.format);
    for (const auto& row : run_microbench_point(sp.point, policy, threads)) encode(mine, i, record_of(sp.sweep, row));
    ++done;
    if (world.rank() == 0 && done * static_cast<std::size_t>(world.size()) >= next_report) {
      log::info("  microbench " + std::to_string(std::min(points.size(), done * static_cast<std::size_t>(world.size()))) +
                "/" + std::to_string(points.size()));
      next_report += points.size() / 10 + 1;
    }
  }
  if (world.allreduce_max(static_cast<std::int64_t>(stop_signal_received())) != 0) {
    log::warn("microbench: stopped by a signal; nothing written (it reruns with --resume)");
    return kExitFailure;
  }
  std::vector<std::string> parts = world.gather(mine);

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
    log::info("microbench: wrote " + csv_path + " and " + h5_path + " (" + std::to_string(rows.size()) + " rows)");
  });
  return kExitOk;
}

}  // namespace fastudy
