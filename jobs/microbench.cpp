// `fastudy microbench GRID.toml`: the numeric microbenchmark (the paper's Section IV). Expands every
// [[microbench.sweeps]] into points, splits them round-robin over the MPI ranks, gathers the rows on
// rank 0 in point order (so the output does not depend on the number of ranks) and writes
//   OUT/microbench.csv   one row per point and algorithm, with a provenance header
//   OUT/microbench.h5    the same table as one dataset per column under /rows (string columns as
//                        integer codes with a `labels` attribute, one label per line)
// Rank 0 prints the flash/baseline error ratio per format and policy.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>

#include "base/log.hpp"
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

const char* kColumns[] = {"sweep",     "algorithm", "pass",    "format",   "policy",   "seq_len",  "head_dim",
                          "block_q",   "block_kv",  "loop_order", "causal", "trial",    "distribution",
                          "max_abs",   "mean_abs",  "std_abs", "rel_l2",   "rescales_per_row", "tiles_kv"};
constexpr int kFirstNumeric = 13;  // max_abs onwards are floating point
const std::vector<int> kIntColumns{5, 6, 7, 8, 10, 11, 18};

std::string fmt(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string csv_line(const std::string& sweep, const MicrobenchRow& r) {
  const MicrobenchPoint& p = r.point;
  std::ostringstream os;
  os << sweep << ',' << r.algorithm << ',' << p.pass << ',' << to_string(p.format) << ',' << p.policy << ','
     << p.seq_len << ',' << p.head_dim << ',' << p.block_q << ',' << p.block_kv << ',' << to_string(p.loop_order) << ','
     << (p.causal ? 1 : 0) << ',' << p.trial << ',' << p.distribution << ',' << fmt(r.max_abs) << ','
     << fmt(r.mean_abs) << ',' << fmt(r.std_abs) << ',' << fmt(r.rel_l2) << ',' << fmt(r.rescales_per_row) << ','
     << r.tiles_kv;
  return os.str();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

void write_h5(const std::string& path, const std::vector<std::vector<std::string>>& rows, const Provenance& prov) {
  const std::string tmp = path + ".tmp";
  {
    h5::File f = h5::File::create(tmp, nullptr);
    h5::Group root = f.root();
    root.set_attr("provenance", prov.header());
    root.set_attr("config_hash", prov.config_hash);
    root.set_attr("format", std::string("fastudy-microbench/1"));
    std::string cols;
    for (const char* c : kColumns) cols += (cols.empty() ? "" : ",") + std::string(c);
    root.set_attr("columns", cols);
    h5::Group g = root.create_group("rows");
    const std::int64_t n = static_cast<std::int64_t>(rows.size());
    h5::Transfer xfer(f);
    for (int c = 0; c < static_cast<int>(std::size(kColumns)); ++c) {
      const bool is_int = std::find(kIntColumns.begin(), kIntColumns.end(), c) != kIntColumns.end();
      if (c >= kFirstNumeric && !is_int) {
        std::vector<double> col(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) col[i] = std::strtod(rows[i][c].c_str(), nullptr);
        g.create_dataset(kColumns[c], DType::f64, {n}).write_rows(col.data(), 0, n, xfer);
      } else if (is_int) {
        std::vector<std::int64_t> col(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) col[i] = std::stoll(rows[i][c]);
        g.create_dataset(kColumns[c], DType::i64, {n}).write_rows(col.data(), 0, n, xfer);
      } else {
        std::vector<std::string> labels;
        std::vector<std::int64_t> codes(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) {
          auto it = std::find(labels.begin(), labels.end(), rows[i][c]);
          if (it == labels.end()) it = labels.insert(labels.end(), rows[i][c]);
          codes[i] = it - labels.begin();
        }
        h5::Dataset d = g.create_dataset(kColumns[c], DType::i64, {n});
        d.write_rows(codes.data(), 0, n, xfer);
        std::string joined;
        for (const auto& l : labels) joined += l + "\n";
        d.set_attr("labels", joined);
      }
    }
    f.close();
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename " + tmp + " to " + path + ": " + ec.message());
}

// Flash/baseline error ratio (vs fp64) per sweep, pass, format and policy: the median over points of the
// per-point ratio of max |d|, with the medians of each error beside it.
void print_summary(const std::vector<std::vector<std::string>>& rows) {
  struct Acc {
    std::vector<double> flash, baseline, ratio;
  };
  std::map<std::string, Acc> acc;
  std::map<std::string, double> baseline_of;  // point key -> baseline max_abs
  auto point_key = [](const std::vector<std::string>& r) {
    std::string k;
    for (int c : {0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}) k += r[c] + "|";
    return k;
  };
  for (const auto& r : rows)
    if (r[1] == "baseline") baseline_of[point_key(r)] = std::strtod(r[13].c_str(), nullptr);
  for (const auto& r : rows) {
    const std::string key = r[0] + "|" + r[2] + "|" + r[3] + "|" + r[4];
    const double e = std::strtod(r[13].c_str(), nullptr);
    if (r[1] == "flash") {
      acc[key].flash.push_back(e);
      auto it = baseline_of.find(point_key(r));
      if (it != baseline_of.end() && it->second > 0) acc[key].ratio.push_back(e / it->second);
    } else if (r[1] == "baseline") {
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

  // Round-robin: point i runs on rank i % size. Each rank returns "index\tline\n..." for its rows.
  std::ostringstream mine;
  std::size_t done = 0, next_report = points.size() / 10 + 1;
  for (std::size_t i = static_cast<std::size_t>(world.rank()); i < points.size(); i += static_cast<std::size_t>(world.size())) {
    if (stop_signal_received()) break;  // checked again collectively below
    const SweepPoint& sp = points[i];
    std::optional<PrecisionPolicy> policy;
    if (st.attention.custom_policies.count(sp.point.policy))
      policy = resolve_policy(st.attention, sp.point.policy, sp.point.format);
    for (const auto& row : run_microbench_point(sp.point, policy, threads)) mine << i << '\t' << csv_line(sp.sweep, row) << '\n';
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
  std::vector<std::string> parts = world.gather(mine.str());

  on_root(world, [&] {
    std::vector<std::pair<std::size_t, std::string>> lines;
    for (const auto& part : parts) {
      std::istringstream in(part);
      std::string l;
      while (std::getline(in, l)) {
        auto tab = l.find('\t');
        lines.emplace_back(std::stoull(l.substr(0, tab)), l.substr(tab + 1));
      }
    }
    std::stable_sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::ostringstream csv;
    csv << ctx.prov.header();
    for (std::size_t c = 0; c < std::size(kColumns); ++c) csv << (c ? "," : "") << kColumns[c];
    csv << '\n';
    std::vector<std::vector<std::string>> rows;
    for (const auto& [idx, l] : lines) {
      csv << l << '\n';
      rows.push_back(split(l, ','));
    }
    write_h5(h5_path, rows, ctx.prov);
    write_text_file(csv_path, csv.str());
    print_summary(rows);
    log::info("microbench: wrote " + csv_path + " and " + h5_path + " (" + std::to_string(rows.size()) + " rows)");
  });
  return kExitOk;
}

}  // namespace fastudy
