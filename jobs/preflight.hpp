// Preflight: every check that does not need training, made before any phase runs and before anything
// is written, with all problems reported at once (UsageError, exit 2). `fastudy plan` runs the same
// checks and prints what would fail.
//   rank layout   the ranks split into groups of [train] ranks_per_variant
//   data          [data] path exists, is a regular file, is readable, holds at least one sequence
//                 (seq_len + 1 tokens) per data-parallel rank, its ids are below [model] vocab and
//                 its width is [data] token_bytes
//   memory        each variant's training memory per rank (estimate.hpp) fits what a rank can have:
//                 min(physical memory, cgroup limit) / ranks on the host; [study] memory_check = false
//                 overrides it
//   disk          the checkpoints still to write fit the free space of the output's file system (the
//                 jobs check their other outputs the same way: check_output_space)
//   report        the renderer's Python modules import, when the report phase is on
#pragma once

#include <string>
#include <vector>

#include "src/core/config.hpp"

namespace fastudy {

struct PreflightScope {
  bool train = false;      // the train phase will run
  bool report = false;     // the report phase will run
  int ranks = 1;           // ranks of the job
  int ranks_on_host = 1;   // of those, on the host that checks
  std::string out;         // the output directory
};

// One line per problem ("what; hint: how to fix it"); empty when everything checks out.
std::vector<std::string> preflight_problems(const Study& st, const PreflightScope& scope);
// Throws UsageError naming every problem.
void preflight(const Study& st, const PreflightScope& scope);

// Bytes of memory one process on this host may use: min(MemTotal, cgroup memory limit); 0 if unknown.
double host_memory_limit();

// The disk check of a job's own outputs, before it works: a UsageError (exit 2) when `bytes` (what it
// will write: `what`) do not fit the free space of the file system that holds `out`.
void check_output_space(const std::string& out, double bytes, const std::string& what);

}  // namespace fastudy
