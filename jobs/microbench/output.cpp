// The microbench job's outputs (microbench_table.hpp): the CSV and HDF5 writers and the tables rank 0
// prints (the flash/baseline summary, the real-kernel tables), all over the schema of
// microbench_columns.hpp.
#include "jobs/microbench/table.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>

#include "base/checksum.hpp"
#include "src/io/h5.hpp"

namespace fastudy::microbench_table {

void write_csv(const std::string& path, const std::vector<Record>& rows, const Provenance& prov,
               const std::vector<std::string>& notes) {
  std::ostringstream csv;
  csv << prov.header();
  for (const auto& n : notes) csv << "# " << n << '\n';
  for (std::size_t c = 0; c < columns().size(); ++c) csv << (c ? "," : "") << columns()[c].name;
  csv << '\n';
  for (const auto& rec : rows) csv << csv_line(rec) << '\n';
  atomic_write_sealed(path, csv.str());
}

void write_h5(const std::string& path, const std::vector<Record>& rows, const Provenance& prov,
              const std::vector<std::string>& notes) {
  atomic_write_sealed_with(path, [&](const std::string& tmp) {
    h5::File f = h5::File::create(tmp, nullptr);
    h5::Group root = f.root();
    root.set_attr("provenance", prov.header());
    std::string joined;
    for (const auto& n : notes) joined += n + "\n";
    root.set_attr("notes", joined);
    root.set_attr("config_hash", prov.config_hash);
    root.set_attr("format", std::string("fastudy-microbench/1"));
    std::string cols;
    for (const auto& c : columns()) cols += (cols.empty() ? "" : ",") + std::string(c.name);
    root.set_attr("columns", cols);
    h5::Group g = root.create_group("rows");
    const std::int64_t n = static_cast<std::int64_t>(rows.size());
    h5::Transfer xfer(f);
    for (std::size_t c = 0; c < columns().size(); ++c) {
      const Column& spec = columns()[c];
      if (spec.type == ColumnType::real) {
        std::vector<double> col(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) col[i] = std::get<double>(rows[i][c]);
        g.create_dataset(spec.name, DType::f64, {n}).write_rows(col.data(), 0, n, xfer);
      } else if (spec.type == ColumnType::integer) {
        std::vector<std::int64_t> col(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) col[i] = std::get<std::int64_t>(rows[i][c]);
        g.create_dataset(spec.name, DType::i64, {n}).write_rows(col.data(), 0, n, xfer);
      } else {
        std::vector<std::string> labels;
        std::vector<std::int64_t> codes(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) {
          const auto& text = std::get<std::string>(rows[i][c]);
          auto it = std::find(labels.begin(), labels.end(), text);
          if (it == labels.end()) it = labels.insert(labels.end(), text);
          codes[i] = it - labels.begin();
        }
        h5::Dataset d = g.create_dataset(spec.name, DType::i64, {n});
        d.write_rows(codes.data(), 0, n, xfer);
        std::string joined;
        for (const auto& l : labels) joined += l + "\n";
        d.set_attr("labels", joined);
      }
    }
    f.close();
  });
}

std::vector<std::string> code_notes(const std::vector<Record>& rows, const std::string& machine) {
  std::set<std::string> present;
  for (const auto& r : rows) present.insert(text_at(r, "algorithm"));
  std::vector<std::string> notes;
  for (const auto& c : kRealCode) {
    if (!present.count(std::string(c.algorithm))) continue;
    notes.push_back("code " + std::string(c.algorithm) + ": models " +
                    (c.reading.empty() ? std::string("no reading")
                                       : std::string(c.reading) + " " + std::string(to_string(c.kind))) +
                    " (device " + std::string(c.device) + "): " + std::string(c.code));
  }
  if (!machine.empty()) notes.push_back("machine: " + machine);
  return notes;
}

namespace {

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

bool is_cuda_algorithm(const std::string& a) { return a == "cuda_flash" || a == "cuda_baseline"; }

// Real code against the reading that claims to model it (see real_kernel_tables).
std::string agreement_table(const std::vector<Record>& rows) {
  struct Acc {
    std::vector<double> identical, real, reading;
    double worst_ulp = 0;
  };
  std::map<std::string, double> reading_error;  // point key + kind -> the reading's max |d|
  for (const auto& r : rows)
    if (text_at(r, "algorithm") == "flash" || text_at(r, "algorithm") == "baseline")
      reading_error[point_key(r) + text_at(r, "algorithm")] = real_at(r, "max_abs");
  std::map<std::vector<std::string>, Acc> by;
  for (const auto& r : rows) {
    const std::string& vs = text_at(r, "vs_reading");
    if (vs == "-") continue;
    Acc& a = by[{text_at(r, "sweep"), text_at(r, "pass"), text_at(r, "format"), text_at(r, "distribution"),
                 csv_text(r[column("head_dim")]), text_at(r, "algorithm"), vs}];
    a.identical.push_back(real_at(r, "bit_identical"));
    a.worst_ulp = std::max(a.worst_ulp, real_at(r, "max_ulp_vs"));
    a.real.push_back(real_at(r, "max_abs"));
    // The reading's own row has the reading's scale placement: no error to show beside a placed comparison.
    const auto it = vs.find("/scale_") != std::string::npos ? reading_error.end()
                                                               : reading_error.find(point_key(r) + vs.substr(vs.rfind(' ') + 1));
    if (it != reading_error.end()) a.reading.push_back(it->second);
  }
  if (by.empty()) return "";
  std::ostringstream os;
  char line[320];
  std::snprintf(line, sizeof line, "%-12s %-9s %-6s %-9s %4s %-22s %-28s %6s %9s %9s %8s %11s %11s\n", "sweep", "pass",
                "format", "inputs", "d", "algorithm", "vs reading", "points", "ident min", "ident med", "max ulp",
                "real max|d|", "read max|d|");
  os << "microbench: real code against the reading that claims to model it, element by element on the same inputs "
        "(ident: fraction of bit-identical elements, smallest and median over points; max ulp: largest difference "
        "in ulps of the format; errors against the fp64 golden value, medians)\n"
     << line;
  for (const auto& [k, a] : by) {
    std::snprintf(line, sizeof line, "%-12s %-9s %-6s %-9s %4s %-22s %-28s %6zu %9.6f %9.6f %8.0f %11.3e %11.3e\n",
                  k[0].c_str(), k[1].c_str(), k[2].c_str(), k[3].c_str(), k[4].c_str(), k[5].c_str(), k[6].c_str(),
                  a.identical.size(), *std::min_element(a.identical.begin(), a.identical.end()), median(a.identical),
                  a.worst_ulp, median(a.real), median(a.reading));
    os << line;
  }
  return os.str();
}
bool is_framework_algorithm(const std::string& a) { return a.rfind("sdpa_", 0) == 0; }

// The "file" rows (a user's outputs read with the inputs): per output tensor the fraction of elements
// bit-identical with the reading's and the largest difference in ulps ("-" where not compared).
std::string file_table(const std::vector<Record>& rows) {
  std::ostringstream os;
  char line[400];
  bool any = false;
  auto cell = [&](const Record& r, const char* tensor) {
    const double ident = real_at(r, std::string("bit_identical_") + tensor);
    const double ulp = real_at(r, std::string("max_ulp_") + tensor);
    char c[40];
    if (std::isnan(ident)) std::snprintf(c, sizeof c, "%18s", "-");
    else std::snprintf(c, sizeof c, "%10.6f %7.0f", ident, ulp);
    return std::string(c);
  };
  for (const auto& r : rows) {
    if (text_at(r, "algorithm") != "file") continue;
    if (!any) {
      std::snprintf(line, sizeof line, "%-12s %-9s %-6s %-12s %-8s %6s %5s %6s %18s %18s %18s %18s %18s\n", "sweep",
                    "pass", "format", "vs reading", "launch", "N", "d", "causal", "o ident/ulp", "lse ident/ulp",
                    "dq ident/ulp", "dk ident/ulp", "dv ident/ulp");
      os << "microbench: the outputs in input_file against the reading's flash kernel on the same inputs (ident: "
            "fraction of bit-identical elements; ulp: largest difference, in ulps of the format, lse in fp32)\n"
         << line;
      any = true;
    }
    std::snprintf(line, sizeof line, "%-12s %-9s %-6s %-12s %-8s %6s %5s %6s %s %s %s %s %s\n", text_at(r, "sweep").c_str(),
                  text_at(r, "pass").c_str(), text_at(r, "format").c_str(), text_at(r, "vs_reading").c_str(),
                  text_at(r, "launch").c_str(), csv_text(r[column("seq_len")]).c_str(),
                  csv_text(r[column("head_dim")]).c_str(), csv_text(r[column("causal")]).c_str(), cell(r, "o").c_str(),
                  cell(r, "lse").c_str(), cell(r, "dq").c_str(), cell(r, "dk").c_str(), cell(r, "dv").c_str());
    os << line;
  }
  return os.str();
}

// Sweeps on repeated_max inputs (Qiu & Yao's case, configs/repeated_max.toml): the signed error
// (mean_signed, a bias) of flash and of the baseline against the fp64 golden value, and flash's as a
// share of its RMSE, medians over points; empty without such rows.
std::string signed_error_table(const std::vector<Record>& rows) {
  struct Acc {
    std::vector<double> flash, share, baseline;
  };
  using Group = std::tuple<std::string, std::string, std::string, std::string, std::string>;
  std::map<Group, Acc> by_group;
  std::map<std::string, double> baseline_of;  // point key -> baseline mean_signed
  for (const auto& r : rows)
    if (text_at(r, "algorithm") == "baseline") baseline_of[point_key(r)] = real_at(r, "mean_signed");
  for (const auto& r : rows) {
    if (text_at(r, "algorithm") != "flash" || text_at(r, "distribution") != "repeated_max") continue;
    Acc& a = by_group[{text_at(r, "sweep"), text_at(r, "pass"), text_at(r, "policy"), text_at(r, "rounding"),
                       text_at(r, "format")}];
    a.flash.push_back(real_at(r, "mean_signed"));
    if (real_at(r, "rmse") > 0) a.share.push_back(real_at(r, "mean_signed") / real_at(r, "rmse"));
    const auto it = baseline_of.find(point_key(r));
    if (it != baseline_of.end()) a.baseline.push_back(it->second);
  }
  if (by_group.empty()) return "";
  std::ostringstream os;
  char line[240];
  std::snprintf(line, sizeof line, "%-12s %-9s %-9s %-11s %-6s %12s %11s %12s %6s\n", "sweep", "pass", "policy",
                "rounding", "format", "flash signed", "flash /rmse", "base signed", "points");
  os << "microbench: signed error (mean_signed: a bias) against the fp64 golden value on repeated_max inputs "
        "(medians over points)\n"
     << line;
  for (const auto& [g, a] : by_group) {
    const auto& [sweep, pass, policy, rounding, format] = g;
    std::snprintf(line, sizeof line, "%-12s %-9s %-9s %-11s %-6s %+12.3e %+11.2f %+12.3e %6zu\n", sweep.c_str(),
                  pass.c_str(), policy.c_str(), rounding.c_str(), format.c_str(), median(a.flash), median(a.share),
                  median(a.baseline), a.flash.size());
    os << line;
  }
  return os.str();
}

}  // namespace

std::string summary_tables(const std::vector<Record>& rows) {
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
  os << signed_error_table(rows);
  return os.str();
}

std::string real_kernel_tables(const std::vector<Record>& rows, std::size_t& failed) {
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
        const std::string_view verdict = to_string(within_2x(fl, rd));
        std::snprintf(line, sizeof line, "%-12s %-9s %-6s %6s %5s %6s %-32s %13.3e %13.3e %8.2f  %.*s\n", k[0].c_str(),
                      k[1].c_str(), k[2].c_str(), k[3].c_str(), k[4].c_str(), k[5].c_str(), reading.c_str(), rd, fl,
                      rd > 0 ? fl / rd : std::nan(""), static_cast<int>(verdict.size()), verdict.data());
        os << line;
      }
    }
  }
  os << agreement_table(rows);
  os << file_table(rows);
  return os.str();
}

}  // namespace fastudy::microbench_table
