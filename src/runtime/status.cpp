// status.csv reading/writing (RFC 4180 quoting, base/quote.hpp) and the `fastudy status` table.
#include "src/runtime/status.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "base/atomic_file.hpp"
#include "base/checksum.hpp"
#include "base/error.hpp"
#include "base/quote.hpp"

namespace fastudy {
namespace fs = std::filesystem;
namespace {

const char* kStatusHint =
    "status.csv was changed or damaged after fastudy wrote it (or something else took its name); run the train "
    "phase with --resume: it sets status.csv aside and rebuilds the state of every variant from its checkpoints";

constexpr const char* kHeader = "variant,state,step,loss,wall_time_s,reason";
constexpr TaskState kStates[] = {TaskState::queued, TaskState::running, TaskState::done, TaskState::diverged,
                                 TaskState::failed};

std::string format_number(double v, int precision) {
  std::ostringstream o;
  o << std::setprecision(precision) << v;
  return o.str();
}

// The shortest decimal that reads back as exactly v (at most 17 significant digits).
std::string exact_number(double v) {
  for (int p = 6; p < 17; ++p) {
    std::string s = format_number(v, p);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return format_number(v, 17);
}

}  // namespace

std::string_view to_string(TaskState s) {
  switch (s) {
    case TaskState::queued: return "queued";
    case TaskState::running: return "running";
    case TaskState::done: return "done";
    case TaskState::diverged: return "diverged";
    case TaskState::failed: return "failed";
  }
  return "?";
}

TaskState parse_task_state(const std::string& s) {
  for (TaskState t : kStates) {
    if (s == to_string(t)) return t;
  }
  throw Error("unknown variant state '" + s + "'", "states are queued, running, done, diverged, failed");
}

std::vector<StatusRow> read_status_csv(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return {};
  return parse_status_csv(read_sealed(path, kStatusHint), path);
}

std::vector<StatusRow> parse_status_csv(const std::string& text, const std::string& path) {
  std::vector<StatusRow> rows;
  std::size_t at = 0;
  int line = 0;
  while (at < text.size()) {
    ++line;
    const std::vector<std::string> f = csv_split_record(text, at);
    if (line == 1) {
      std::size_t h = 0;
      if (csv_split_record(kHeader, h) != f) {
        throw Error(path + ":1: not a fastudy status.csv (header is not '" + std::string(kHeader) + "')",
                    "run the train phase with --resume: it sets the file aside and rebuilds it");
      }
      continue;
    }
    if (f.size() == 1 && f[0].empty()) continue;
    if (f.size() != 6) {
      throw Error(path + ":" + std::to_string(line) + ": expected 6 fields, found " + std::to_string(f.size()),
                  "the file was edited by hand or damaged; run the train phase with --resume: it sets the file aside and rebuilds it");
    }
    try {
      StatusRow r;
      r.variant = f[0];
      r.state = parse_task_state(f[1]);
      r.step = std::stoll(f[2]);
      r.has_loss = !f[3].empty();
      r.loss = r.has_loss ? std::stod(f[3]) : 0.0;
      r.wall_time_s = std::stod(f[4]);
      r.reason = f[5];
      rows.push_back(std::move(r));
    } catch (const std::exception& e) {
      throw Error(path + ":" + std::to_string(line) + ": malformed row (" + e.what() + ")",
                  "the file was edited by hand or damaged; run the train phase with --resume: it sets the file aside and rebuilds it");
    }
  }
  return rows;
}

std::string format_status_csv(const std::vector<StatusRow>& rows) {
  std::ostringstream out;
  out << kHeader << '\n';
  for (const auto& r : rows) {
    out << csv_field(r.variant) << ',' << to_string(r.state) << ',' << r.step << ','
        << (r.has_loss ? exact_number(r.loss) : "") << ',' << format_number(r.wall_time_s, 6) << ','
        << csv_text_field(r.reason) << '\n';
  }
  return out.str();
}

void write_status_csv(const std::string& path, const std::vector<StatusRow>& rows) {
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  atomic_write_sealed(path, format_status_csv(rows));
}

void print_status(std::ostream& os, const std::vector<StatusRow>& rows, const VariantAxes& axes) {
  std::size_t w = std::string("variant").size();
  for (const auto& r : rows) w = std::max(w, r.variant.size());
  os << std::left << std::setw(static_cast<int>(w)) << "variant" << "  " << std::setw(8) << "state" << "  "
     << std::right << std::setw(8) << "step" << "  " << std::setw(12) << "loss" << "  " << std::setw(10) << "wall_s"
     << "  reason\n";
  for (const auto& r : rows) {
    os << std::left << std::setw(static_cast<int>(w)) << r.variant << "  " << std::setw(8) << to_string(r.state)
       << "  " << std::right << std::setw(8) << r.step << "  " << std::setw(12)
       << (r.has_loss ? format_number(r.loss, 6) : "-") << "  " << std::setw(10) << format_number(r.wall_time_s, 4)
       << "  " << r.reason << '\n';
  }

  auto counts_line = [](const std::map<TaskState, int>& c) {
    std::string s;
    for (TaskState t : kStates) {
      auto it = c.find(t);
      if (it == c.end()) continue;
      if (!s.empty()) s += ", ";
      s += std::to_string(it->second) + " " + std::string(to_string(t));
    }
    return s.empty() ? std::string("none") : s;
  };
  std::map<TaskState, int> total;
  for (const auto& r : rows) ++total[r.state];
  os << "\n" << rows.size() << " variants: " << counts_line(total) << '\n';

  // Axis -> value -> state counts, axes and values in first-seen (grid) order.
  std::vector<std::string> axis_order;
  std::map<std::string, std::vector<std::string>> value_order;
  std::map<std::string, std::map<std::string, std::map<TaskState, int>>> by_axis;
  for (const auto& r : rows) {
    auto it = axes.find(r.variant);
    if (it == axes.end()) continue;
    for (const auto& [axis, value] : it->second) {
      if (!by_axis.count(axis)) axis_order.push_back(axis);
      auto& values = by_axis[axis];
      if (!values.count(value)) value_order[axis].push_back(value);
      ++values[value][r.state];
    }
  }
  for (const auto& axis : axis_order) {
    os << "by " << axis << ":\n";
    for (const auto& value : value_order[axis]) {
      os << "  " << std::left << std::setw(14) << value << std::right << " " << counts_line(by_axis[axis][value])
         << '\n';
    }
  }
  std::size_t unknown = 0;
  for (const auto& r : rows) unknown += axes.count(r.variant) ? 0 : 1;
  if (unknown > 0 && !axes.empty()) {
    os << unknown << " variant(s) of status.csv are not in the current grid (axis value ?)\n";
  }
}

void print_status(std::ostream& os, const std::string& status_csv_path, const VariantAxes& axes) {
  if (!fs::exists(status_csv_path)) {
    throw Error("no status file at '" + status_csv_path + "'",
                "run the train phase first (fastudy train GRID.toml), or pass the study's output directory");
  }
  print_status(os, read_status_csv(status_csv_path), axes);
}

}  // namespace fastudy
