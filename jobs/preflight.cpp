#include "jobs/preflight.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "base/cpu.hpp"
#include "base/error.hpp"
#include "jobs/estimate.hpp"
#include "jobs/job.hpp"
#include "src/core/capabilities.hpp"
#include "src/runtime/gpu.hpp"
#include "src/runtime/scheduler.hpp"
#include "src/train/data.hpp"

namespace fs = std::filesystem;

namespace fastudy {

namespace {

std::string line_of(const Error& e) { return std::string(e.what()) + (e.hint().empty() ? "" : "; hint: " + e.hint()); }

// A number from the first line of a file ("max" or a missing file: 0).
double read_limit(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return 0;
  try {
    return std::stod(word);
  } catch (const std::exception&) {
    return 0;
  }
}

double mem_total() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemTotal:") return kib * 1024.0;
  return 0;
}

// Bytes of checkpoints under OUT/checkpoints already (they count against the plan's total).
double existing_checkpoint_bytes(const std::string& out) {
  double total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(fs::path(out) / "checkpoints", ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) total += static_cast<double>(it->file_size(ec));
  return total;
}

// Free bytes of the file system that holds `path` (or its nearest existing parent); < 0 if unknown.
double free_bytes(const std::string& path) {
  fs::path p = fs::absolute(path);
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec)) {
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  struct statvfs sv {};
  if (::statvfs(p.c_str(), &sv) != 0) return -1;
  return static_cast<double>(sv.f_bavail) * static_cast<double>(sv.f_frsize);
}

}  // namespace

double host_memory_limit() {
  double limit = mem_total();
  for (const char* cg : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const double l = read_limit(cg);
    if (l > 0 && (limit <= 0 || l < limit)) limit = l;
  }
  return limit;
}

std::vector<std::string> preflight_problems(const Study& st, const PreflightScope& scope) {
  std::vector<std::string> problems;
  if (scope.train) {
    try {
      check_layout(scope.ranks, st.train.ranks_per_variant);
    } catch (const Error& e) {
      problems.push_back(line_of(e));
    }
    try {
      torch_threads_from_env();
    } catch (const Error& e) {
      problems.push_back(line_of(e));
    }
    // Where each variant trains (auto: a GPU where this rank can use one) and whether it can there.
    std::string no_gpu;
    const bool gpu = rank_has_gpu(&no_gpu);
    std::map<std::string, std::vector<std::string>> device_problems;  // problem -> variant ids
    for (const auto& v : st.variants) {
      const Device d = v.train.device == Device::auto_ ? (gpu ? Device::cuda : Device::cpu) : v.train.device;
      std::string problem = device_problem(v, d);
      if (problem.empty() && d == Device::cuda && !gpu) {
        problem = "[train] device = \"cuda\", but this rank cannot train on a GPU (" + no_gpu +
                  "); hint: run where every rank sees a GPU, or use device = \"auto\" or \"cpu\"";
      }
      if (!problem.empty()) device_problems[problem].push_back(v.id);
    }
    for (const auto& [problem, ids] : device_problems) {
      problems.push_back("variant " + ids.front() +
                         (ids.size() > 1 ? " (and " + std::to_string(ids.size() - 1) + " more)" : std::string()) + ": " +
                         problem);
    }
    if (st.data.kind != DataKind::synthetic) {
      try {
        const train::DataStream data(st.data, st.model);
        const std::int64_t per_rank = st.model.seq_len + 1;
        const std::int64_t need = per_rank * st.train.ranks_per_variant;
        if (data.file_tokens() < need)
          problems.push_back("data file '" + st.data.path + "' holds " + std::to_string(data.file_tokens()) +
                             " tokens, fewer than one sequence (seq_len + 1 = " + std::to_string(per_rank) +
                             ") for each of the " + std::to_string(st.train.ranks_per_variant) +
                             " data-parallel ranks of a variant; hint: use a longer file, a smaller [model] seq_len "
                             "or fewer [train] ranks_per_variant");
      } catch (const Error& e) {
        problems.push_back(line_of(e));
      }
    }
    if (st.memory_check) {
      const double limit = host_memory_limit();
      const int on_host = std::max(1, scope.ranks_on_host);
      double worst = 0;
      const Variant* worst_v = nullptr;
      for (const auto& v : st.variants) {
        const double m = estimate_variant(v).memory_per_rank;
        if (m > worst) worst = m, worst_v = &v;
      }
      if (limit > 0 && worst_v && worst > limit / on_host)
        problems.push_back("variant " + worst_v->id + " needs about " + human_bytes(worst) +
                           " of memory per rank while training (estimate), more than the " +
                           human_bytes(limit / on_host) + " a rank can have here (" + human_bytes(limit) + " for " +
                           std::to_string(on_host) + " rank(s) on this host); hint: shrink [model] or [train] batch, "
                           "raise [train] ranks_per_variant, run fewer ranks per node, or set [study] memory_check = "
                           "false to run anyway");
    }
    double total = 0;
    for (const auto& v : st.variants) {
      const VariantEstimate e = estimate_variant(v);
      total += e.checkpoint_bytes * static_cast<double>(e.checkpoints);
    }
    const double need = std::max(0.0, total - existing_checkpoint_bytes(scope.out));
    const double free = free_bytes(scope.out);
    if (free >= 0 && need > free)
      problems.push_back("the checkpoints still to write need about " + human_bytes(need) + ", but the file system of " +
                         scope.out + " has " + human_bytes(free) + " free; hint: free space, choose another --out, or "
                         "raise [train] checkpoint_every");
  }
  if (scope.report) {
    if (auto problem = report_modules_problem()) problems.push_back(*problem);
  }
  return problems;
}

void check_output_space(const std::string& out, double bytes, const std::string& what) {
  const double free = free_bytes(out);
  if (free >= 0 && bytes > free)
    throw UsageError(what + " needs about " + human_bytes(bytes) + ", but the file system of " + out + " has " +
                         human_bytes(free) + " free (nothing was run or written)",
                     "free space, or choose another --out");
}

void preflight(const Study& st, const PreflightScope& scope) {
  const std::vector<std::string> problems = preflight_problems(st, scope);
  if (problems.empty()) return;
  std::string msg = "preflight of " + st.file + " found " + std::to_string(problems.size()) + " problem" +
                    (problems.size() == 1 ? "" : "s") + " (nothing was run or written):";
  for (const auto& p : problems) msg += "\n  - " + p;
  throw UsageError(msg, "fix them and run again; `fastudy plan " + st.file + " --ranks " + std::to_string(scope.ranks) +
                            "` runs the same checks");
}

}  // namespace fastudy
