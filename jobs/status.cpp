// `fastudy status OUT`: the state of every variant (OUT/status.csv) as a table, with counts per state
// and per grid axis value. A variant recorded as done is shown as failed when any of its checkpoints
// is missing, does not match its checksum (checked with plain reads), or is not that variant's
// checkpoint of that step trained with the configuration in study.toml (its root attributes), with the
// command that repairs it; one recorded as running while no job holds the study's lock is shown as
// failed too (its job ended without recording how). Exit code: 0 when no variant failed or diverged, 1 otherwise (as the train phase's).
#include <filesystem>
#include <iostream>

#include "base/error.hpp"
#include "base/log.hpp"
#include "jobs/job.hpp"
#include "jobs/study_lock.hpp"
#include "src/io/checkpoint.hpp"
#include "src/runtime/status.hpp"

namespace fastudy {

int job_status(JobContext& ctx) {
  const Study& st = *ctx.study;
  VariantAxes axes;
  for (const auto& v : st.variants) axes[v.id] = v.axes;
  if (st.imported()) {
    // Nothing trains: the runs are files, checked and recorded (imported.csv) by each reduce.
    const bool reduced = file_exists((std::filesystem::path(ctx.out_dir) / "verdict.csv").string());
    std::cout << "imported study: " << st.variants.size() << " runs from " << st.import.path << "\n";
    for (const auto& v : st.variants) std::cout << "  " << v.id << "\n";
    std::cout << (reduced ? "reduce: done (imported.csv lists the files it read, with their sizes and CRC-32)\n"
                          : "reduce: not run yet (fastudy reduce " + shell_quote(ctx.out_dir) + ")\n");
    return kExitOk;
  }
  const std::string path = (std::filesystem::path(ctx.out_dir) / "status.csv").string();
  if (!file_exists(path)) {
    throw Error("no status file at '" + path + "'",
                "run the train phase first (fastudy train GRID.toml), or pass the study's output directory");
  }
  std::vector<StatusRow> rows = read_status_csv(path);
  const std::string repair = "fastudy train " + shell_quote(st.file) + " --out " + shell_quote(ctx.out_dir) + " --resume";
  std::vector<std::pair<std::string, std::string>> damaged;  // (variant, reason): error lines after the table
  // A variant recorded as running while no job holds the study's lock: the job that trained it ended
  // without recording how (killed, or an I/O error such as a full disk when it wrote status.csv).
  const bool job_running = study_lock_held(ctx.out_dir);
  for (auto& row : rows) {
    if (row.state == TaskState::running && !job_running) {
      row.state = TaskState::failed;
      row.reason = "recorded as running at step " + std::to_string(row.step) +
                   ", but no job runs the study: the job that trained it ended without recording its end (killed, or "
                   "an I/O error); repair: " + repair;
      damaged.emplace_back(row.variant, row.reason);
      continue;
    }
    if (row.state != TaskState::done) continue;
    const Variant* v = st.find_variant(row.variant);
    if (!v) continue;
    const auto damage = first_damaged_checkpoint(ctx.out_dir, v->id, checkpoint_schedule(v->train.checkpoint_every, v->train.steps),
                                                 v->train.steps, v->hash);
    if (!damage) continue;
    row.state = TaskState::failed;
    row.reason = "recorded as done, but " + damage->path + ": " + damage->problem + "; repair: " + repair +
                 (damage->kind == CheckpointDamage::Kind::other_configuration
                      ? " --force (retrains the variants whose configuration differs), or restore the study.toml "
                        "they were trained with"
                      : "");
    damaged.emplace_back(row.variant, row.reason);
  }
  print_status(std::cout, rows, axes);
  for (const auto& [id, reason] : damaged) log::error(id + " " + reason);
  std::size_t bad = 0;
  for (const auto& row : rows) bad += row.state == TaskState::failed || row.state == TaskState::diverged;
  if (bad == 0) return kExitOk;
  log::error(std::to_string(bad) + " of " + std::to_string(rows.size()) +
             " variants failed or diverged (their reasons are in the table above)");
  return kExitFailure;
}

}  // namespace fastudy
