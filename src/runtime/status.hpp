// OUT/status.csv: one row per variant (task) with its state, latest step and loss, wall time and the
// reason of a failure; and the table `fastudy status OUT` prints from it.
//
// CSV (RFC 4180 quoting, header line first):
//   variant,state,step,loss,wall_time_s,reason
//   flash-bf16-s1,done,200,2.31457,41.2,
//   baseline-fp16-s2,failed,37,,6.1,"loss is NaN at step 37"
// The file is rewritten atomically (a temporary file renamed over it), so a reader never sees half.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

namespace fastudy {

enum class TaskState { queued, running, done, diverged, failed };
std::string_view to_string(TaskState s);
TaskState parse_task_state(const std::string& s);  // throws Error for an unknown word

struct StatusRow {
  std::string variant;
  TaskState state = TaskState::queued;
  std::int64_t step = 0;
  double loss = 0.0;
  bool has_loss = false;      // false: the loss column is empty (nothing trained yet)
  double wall_time_s = 0.0;   // time spent running the variant (the last run, for a resumed one)
  std::string reason;         // why it failed or diverged; empty otherwise
};

// The CSV text of rows (header included) and back; parse errors name `source` and the line.
std::string format_status_csv(const std::vector<StatusRow>& rows);
std::vector<StatusRow> parse_status_csv(const std::string& text, const std::string& source);

// A missing file gives an empty list; one that does not match its checksum sidecar throws
// IntegrityError (base/checksum.hpp) before it is parsed; a malformed one throws Error naming the file
// and line.
std::vector<StatusRow> read_status_csv(const std::string& path);
// Atomic rewrite (temporary file + rename); creates the parent directory.
void write_status_csv(const std::string& path, const std::vector<StatusRow>& rows);

// variant id -> its (axis, value) pairs in grid order (Variant::axes).
using VariantAxes = std::map<std::string, std::vector<std::pair<std::string, std::string>>>;

// The table of every row, then the counts per state, then per grid axis value the counts per state.
// Variants missing from `axes` (e.g. rows left from an older grid) are counted in one extra line.
void print_status(std::ostream& os, const std::vector<StatusRow>& rows, const VariantAxes& axes);
// Reads the file first; throws Error when it does not exist (hint: run the train phase first).
void print_status(std::ostream& os, const std::string& status_csv_path, const VariantAxes& axes);

}  // namespace fastudy
