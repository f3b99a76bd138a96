// `fastudy train GRID.toml`: train every variant of the grid on groups of ranks, data-parallel inside
// a group, with parallel-HDF5 checkpoints, resumable after a kill.
//
// Layout of the output directory:
//   OUT/status.csv                               state of every variant (kept current by rank 0)
//   OUT/variants/<id>/train_log.csv              per-step log (and shadow.csv when recorded)
//   OUT/checkpoints/<id>/step_<NNNNNNN>.h5       checkpoints (whole or absent)
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <new>
#include <optional>
#include <sstream>

#include <boost/program_options.hpp>

#include "base/checksum.hpp"
#include "base/log.hpp"
#include "base/manifest.hpp"
#include "base/progress.hpp"
#include "jobs/collective.hpp"
#include "jobs/estimate.hpp"
#include "jobs/job.hpp"
#include "jobs/train_progress.hpp"
#include "src/io/checkpoint.hpp"
#include "src/runtime/gpu.hpp"
#include "src/runtime/mpi.hpp"
#include "src/runtime/placement.hpp"
#include "src/runtime/reducer.hpp"
#include "src/runtime/scheduler.hpp"
#include "src/runtime/status.hpp"
#include "src/train/trainer.hpp"

namespace fs = std::filesystem;

namespace po = boost::program_options;

namespace fastudy {

namespace {

std::vector<const Variant*> select_variants(const Study& st, const std::vector<std::string>& ids) {
  std::vector<const Variant*> out;
  if (ids.empty()) {
    for (const auto& v : st.variants) out.push_back(&v);
    return out;
  }
  for (const auto& id : ids) {
    const Variant* v = st.find_variant(id);
    if (!v) {
      std::string known;
      for (const auto& w : st.variants) known += (known.empty() ? "" : ", ") + w.id;
      throw UsageError("--variant " + id + " is not a variant of " + st.file, "variants: " + known);
    }
    out.push_back(v);
  }
  return out;
}

// Before a resumed schedule (rank 0 only), resume repairs:
//  - a status.csv that does not match its checksum or cannot be read back (a directory in its place,
//    malformed rows) is set aside, never deleted (the state of every variant is then rebuilt from its
//    checkpoints by the schedule);
//  - every checkpoint of every variant is checked against its checksum and its root attributes (its
//    variant, step and configuration hash; no tensor is read); a variant with a missing or damaged one,
//    or one that is another variant's or another step's (copied or moved there with its sidecar), loses
//    it and every later one, and trains again from the last good checkpoint before it (training resumes
//    bit for bit, so the files come back the same). A checkpoint of another configuration counts as
//    misplaced when the variant's latest checkpoint has the grid's configuration; when the latest has
//    another one too, the variant's configuration changed (the schedule refuses it, or retrains it
//    from scratch with --force);
//  - a variant recorded as done whose final checkpoint is missing, invalid or was trained with
//    another configuration goes back to the queue.
void repair_for_resume(const std::string& out, const std::vector<const Variant*>& variants,
                       const std::string& status_path) {
  std::vector<StatusRow> rows;
  if (fs::exists(fs::symlink_status(status_path))) {
    std::optional<std::string> problem = checksum_problem(status_path);
    if (!problem) {
      try {
        rows = read_status_csv(status_path);
      } catch (const Error& e) {
        problem = e.what();  // sealed, but not a status file fastudy can read back
      }
    }
    if (problem) {
      const std::string aside = set_aside(status_path);
      log::warn(status_path + ": " + *problem + "; set aside as " + aside +
                " (not read again), the state of every variant is rebuilt from its checkpoints");
    }
  }
  bool changed = false;
  auto requeue = [&](const std::string& id, const std::string& why) {
    log::info("requeue " + id + ": " + why);
    for (auto& row : rows) {
      if (row.variant != id || row.state == TaskState::queued) continue;
      row.state = TaskState::queued;
      row.reason = why;
      changed = true;
    }
  };
  using Kind = CheckpointDamage::Kind;
  for (const auto* v : variants) {
    const std::vector<std::int64_t> have = list_checkpoint_steps(checkpoint_dir(out, v->id));
    if (have.empty()) continue;
    const std::string latest = checkpoint_path(out, v->id, have.back());
    std::string hash;  // compared only when the latest checkpoint has the grid's configuration
    try {
      if (!checksum_problem(latest) && read_checkpoint_info(latest, WholeFile::checked_before).attrs["config_hash"] == v->hash)
        hash = v->hash;
    } catch (const CheckpointError&) {
      // not a checkpoint: first_damaged_checkpoint names it
    }
    const auto damage =
        first_damaged_checkpoint(out, v->id, checkpoint_schedule(v->train.checkpoint_every, v->train.steps), have.back(), hash);
    if (!damage) continue;
    for (const auto& p : remove_checkpoints_from(out, v->id, damage->step)) log::warn(v->id + ": removed " + p);
    const std::string what = damage->kind == Kind::missing ? std::string("was missing")
                             : damage->kind == Kind::damaged ? "was damaged (" + damage->problem + ")"
                                                             : "was not this variant's (" + damage->problem + ")";
    requeue(v->id, "checkpoint of step " + std::to_string(damage->step) + " " + what +
                       "; training again from the last good checkpoint before it");
  }
  for (auto& row : rows) {
    if (row.state != TaskState::done) continue;
    const Variant* v = nullptr;
    for (const auto* w : variants)
      if (w->id == row.variant) v = w;
    if (!v) continue;
    auto ref = latest_valid_checkpoint(checkpoint_dir(out, v->id), nullptr, v->id);
    std::string why;
    if (!ref || ref->step < v->train.steps) why = "its final checkpoint is missing";
    else if (read_checkpoint_info(ref->path).attrs["config_hash"] != v->hash) why = "its configuration changed";
    if (!why.empty()) requeue(v->id, why);
  }
  if (changed) write_status_csv(status_path, rows);
}

// One line for a failure inside a variant's training: the first line of the message (LibTorch's
// errors carry a C++ backtrace of hundreds of lines after it, kept for -v), or "out of memory".
std::string one_line_reason(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return "out of memory (an allocation failed)";
  std::string what = e.what();
  log::debug("full error: " + what);
  const std::size_t nl = what.find('\n');
  if (nl != std::string::npos) what.resize(nl);
  const std::size_t hint = what.find(" (most recent call first)");  // c10::Error's backtrace marker
  if (hint != std::string::npos) what.resize(hint);
  return what;
}

// HDF5 reports a failed write without the errno text; when the output's file system is full, say so.
std::string disk_full_note(const std::string& out) {
  struct statvfs sv {};
  if (::statvfs(out.c_str(), &sv) != 0) return "";
  const double free = static_cast<double>(sv.f_bavail) * static_cast<double>(sv.f_frsize);
  if (free >= 1024.0 * 1024.0) return "";
  return " [No space left on device: " + human_bytes(free) + " free on the file system of " + out + "]";
}

}  // namespace

void train_options(po::options_description& d, CliOptions& o) {
  d.add_options()("variant", po::value<std::vector<std::string>>(&o.train.variants),
                  "train only this variant id (repeatable; default: all)")(
      "device", po::value<std::string>(&o.train.device),
      "where the variants train: auto, cpu or cuda (overrides [train] device; a checkpoint resumes on either)")(
      "profile", po::bool_switch(&o.train.profile),
      "print where each variant's steps spend their time: forward, backward, attention, roundings, optimizer, "
      "reducer, host syncs, checkpoints (host wall time; on a GPU also device time)")(
      "cuda-graph", po::bool_switch(&o.train.cuda_graph),
      "on a GPU, replay each step's forward and backward pass from a CUDA graph (the same bits, fewer launches)");
}

namespace {

// Rank 0, before any training: the layout checked, the variants chosen, the output prepared, the
// variants' files registered in the manifest (before anything of theirs is written: a kill at any
// moment leaves no file unlisted), and status.csv repaired for --resume or set aside without it.
std::vector<const Variant*> prepare_train_output(JobContext& ctx, const std::string& status_path) {
  const Study& st = *ctx.study;
  const std::string& out = ctx.out_dir;
  check_layout(ctx.world->size(), st.train.ranks_per_variant);
  std::vector<const Variant*> variants = select_variants(st, ctx.opts.train.variants);
  prepare_output(ctx);
  std::vector<manifest::Entry> files;
  for (const auto* v : variants) {
    const std::string vdir = "variants/" + v->id;
    files.push_back({manifest::Kind::dir, "train", vdir});
    files.push_back({manifest::Kind::file, "train", vdir + "/train_log.csv"});
    files.push_back({manifest::Kind::file, "train", vdir + "/shadow.csv"});
    files.push_back({manifest::Kind::checkpoints, "train", "checkpoints/" + v->id});
  }
  manifest::add(out, files);
  if (ctx.opts.resume) {
    repair_for_resume(out, variants, status_path);
  } else if (fs::exists(fs::symlink_status(status_path))) {
    // Not resuming: the state starts afresh, and what holds status.csv's name is not read.
    log::warn(status_path + " is set aside as " + set_aside(status_path) + " (not read again)");
  }
  return variants;
}

// Where this rank trains and which reducer its group gets, decided on every rank before any work.
struct GroupPlacement {
  ReducerChoice reducer;  // this rank's group's
  int device = -1;        // this rank's GPU, -1: none
  bool group_on_gpu = false;
  std::string no_gpu;  // why this rank has no GPU, for a variant that needs one
};

// A group on GPUs averages with NCCL when each of its ranks has a GPU of its own, else with MPI on
// host copies (NCCL refuses two ranks of one communicator on one GPU; src/runtime/placement.hpp).
// Rank 0 names the reducer of the groups on GPUs (a group on the CPU has MPI, as always).
GroupPlacement place_groups(mpi::Comm& world, const Study& st) {
  const int rpv = st.train.ranks_per_variant;
  const bool want_gpu = st.train.device != Device::cpu;
  const std::vector<RankPlacement> placements = gather_placements(world, want_gpu);
  const std::vector<ReducerChoice> reducers = choose_reducers(placements, rpv, want_gpu, have_nccl());
  const int my_group = world.rank() / rpv;
  GroupPlacement g;
  g.reducer = reducers[static_cast<std::size_t>(my_group)];
  g.device = placements[static_cast<std::size_t>(world.rank())].device;
  g.group_on_gpu = want_gpu;
  for (int r = my_group * rpv; r < (my_group + 1) * rpv; ++r)
    g.group_on_gpu = g.group_on_gpu && placements[static_cast<std::size_t>(r)].device >= 0;
  if (want_gpu && g.device < 0) rank_has_gpu(&g.no_gpu);
  const auto on_gpus = [](const ReducerChoice& c) { return c.backend == "nccl" || c.host_copies; };
  if (std::any_of(reducers.begin(), reducers.end(), on_gpus))
    for (const std::string& line : describe_reducers(reducers, rpv)) log::info("train: reducer of " + line);
  return g;
}

// The console's line for a variant's change of state in the schedule.
std::string schedule_event_line(const StatusRow& row, int group) {
  std::ostringstream os;
  if (row.state == TaskState::running) {
    os << "[group " << group << "] start  " << row.variant;
  } else {
    os << "[group " << group << "] " << to_string(row.state) << " " << row.variant << " at step " << row.step;
    if (row.has_loss) os << ", loss " << row.loss;
    if (!row.reason.empty()) os << " (" << row.reason << ")";
  }
  return os.str();
}

// The variant's latest valid checkpoint, chosen by the group's rank 0 so that every rank resumes the
// same one, into `resume`; an outcome when the variant must not train: its checkpoint is of another
// configuration and --force was not given. With --force the variant trains from scratch; only its
// checkpoints go (files of fastudy's checkpoint names, base/manifest.hpp), nothing else in the folder.
std::optional<TaskOutcome> find_resume_point(mpi::Comm& group, const Variant& v, const std::string& cdir, bool force,
                                             std::optional<TrainState>& resume) {
  std::string path;
  if (group.rank() == 0) {
    std::vector<std::string> skipped;
    if (auto ref = latest_valid_checkpoint(cdir, &skipped, v.id)) path = ref->path;
    for (const auto& s : skipped) log::warn(v.id + ": ignoring checkpoint " + s);
  }
  group.bcast(path);
  if (path.empty()) return std::nullopt;
  TrainState s = read_checkpoint(group, path);
  if (s.attrs["config_hash"] == v.hash) {
    resume = std::move(s);
  } else if (!force) {
    return TaskOutcome{TaskState::failed, 0, NAN,
                       "checkpoint " + path + " was written with another configuration (hash " + s.attrs["config_hash"] +
                           "); pass --resume --force to retrain it"};
  } else if (group.rank() == 0) {
    const manifest::Entry own{manifest::Kind::checkpoints, "train", "checkpoints/" + v.id};
    for (const auto& e : fs::directory_iterator(cdir))
      if (e.is_regular_file() && !e.is_symlink() && manifest::covers(own, own.path + "/" + e.path().filename().string()))
        fs::remove(e.path());
  }
  return std::nullopt;
}

// The console's line for a step: every log_every steps in a log; on a terminal, where the progress
// line stands for them, at -v only (train_log.csv has every step); skipped steps and loss spikes
// always. Empty: no line.
std::string step_line(const Variant& v, const StepLog& l, ProgressMode mode) {
  const bool periodic =
      l.step % v.train.log_every == 0 && (mode != ProgressMode::terminal || log::level() >= log::Level::debug);
  if (!periodic && !l.skipped && !l.spike) return "";
  std::ostringstream os;
  os << "  " << v.id << " step " << l.step << "/" << v.train.steps << " loss " << l.loss << " lr " << l.lr << " "
     << static_cast<long long>(l.tokens_per_s) << " tok/s";
  if (l.skipped) os << " (fp16 overflow: step skipped, loss scale " << l.loss_scale << ")";
  if (l.spike) os << " (loss spike)";
  return os.str();
}

// What the schedule records for a finished train_variant.
TaskOutcome outcome_of(const TrainResult& r) {
  switch (r.outcome) {
    case TrainOutcome::done: return {TaskState::done, r.step, r.final_loss, ""};
    case TrainOutcome::diverged: return {TaskState::diverged, r.step, r.final_loss, r.reason};
    case TrainOutcome::stopped:
      return {TaskState::failed, r.step, r.final_loss, "stopped by a signal at step " + std::to_string(r.step) +
                                                           " (checkpointed); continue with --resume"};
  }
  return {TaskState::failed, r.step, r.final_loss, "unknown outcome"};
}

// One variant on one group of ranks: its folders, its resume point, its device and reducer, the
// trainer's hooks (allreduce, checkpoints, stop signals, the step lines), the training, its outcome.
TaskOutcome train_one_variant(const JobContext& ctx, const Variant& v, mpi::Comm& group, Progress& progress,
                              const GroupPlacement& place, const ProgressLine& progress_line) {
  if (stop_signal_received()) return {TaskState::failed, 0, NAN, "not started: a stop signal was received"};
  const std::string& out = ctx.out_dir;
  const std::string vdir = (fs::path(out) / "variants" / v.id).string();
  const std::string cdir = checkpoint_dir(out, v.id);
  if (group.rank() == 0) {
    fs::create_directories(vdir);
    fs::create_directories(cdir);
  }
  group.barrier();

  std::optional<TrainState> resume;
  if (auto refused = find_resume_point(group, v, cdir, ctx.opts.force, resume)) return *refused;
  if (resume && resume->step >= v.train.steps) {
    double loss = resume->loss_history.empty() ? NAN : resume->loss_history.back();
    return {TaskState::done, resume->step, loss, ""};
  }

  // The group's device (decided for every group by place_groups): a GPU when the variant allows one
  // and every rank of the group has one, else the CPU.
  const bool on_gpu = v.train.device != Device::cpu && place.group_on_gpu;
  if (v.train.device == Device::cuda && !on_gpu) {
    const std::string reason = v.id + ": [train] device = \"cuda\", but a rank of its group cannot train on a GPU" +
                               (place.no_gpu.empty() ? std::string()
                                                     : " (rank " + std::to_string(ctx.world->rank()) + ": " + place.no_gpu + ")");
    return {TaskState::failed, 0, NAN, reason};
  }
  TrainHooks hooks;
  hooks.cuda_device = on_gpu ? place.device : -1;
  if (on_gpu) use_gpu(hooks.cuda_device);
  if (on_gpu && group.rank() == 0) log::info(v.id + ": training on CUDA device " + std::to_string(hooks.cuda_device));
  // Groups of one rank average nothing; the others take the reducer chosen for their group (on the
  // CPU: MPI).
  std::unique_ptr<GradientReducer> reducer;
  if (group.size() > 1) reducer = make_reducer(group, on_gpu ? place.reducer.backend : std::string("mpi"));
  hooks.rank = group.rank();
  hooks.world = group.size();
  hooks.profile = ctx.opts.train.profile;
  hooks.cuda_graph = ctx.opts.train.cuda_graph;
  if (group.size() > 1) {
    hooks.allreduce_mean_f32 = [&](float* p, std::size_t n) { reducer->allreduce_mean(p, n); };
    hooks.allreduce_mean_f64 = [&](double* p, std::size_t n) { reducer->allreduce_mean(p, n); };
    // [train] dp_width: the shards' gradients travel to every rank, which sums them in the declared order.
    hooks.allgather_f32 = [&](const float* p, std::size_t n, float* out) { group.allgather(p, n, out); };
    hooks.allgather_f64 = [&](const double* p, std::size_t n, double* out) { group.allgather(p, n, out); };
  }
  hooks.save_checkpoint = [&](const TrainState& s) { write_checkpoint(group, checkpoint_path(out, v.id, s.step), s); };
  hooks.stop_requested = [&] {
    std::int64_t flag = stop_signal_received() ? 1 : 0;
    return (group.size() > 1 ? group.allreduce_max(flag) : flag) != 0;
  };
  const bool world_root = ctx.world->rank() == 0;
  std::int64_t last_step = resume ? resume->step : 0;
  hooks.on_step = [&](const StepLog& l) {
    last_step = l.step;
    progress.report(l.step, l.loss);
    if (!world_root) return;
    const std::string line = step_line(v, l, progress_line.mode());
    if (!line.empty()) log::info(line);
  };
  TrainResult r;
  try {
    r = train_variant(v, vdir, hooks, resume ? &*resume : nullptr);
  } catch (const std::exception& e) {
    // Allocation failures, disk full, I/O errors: one line naming the variant and the step (the
    // message names the file and the errno text where there is one); the whole error with -v.
    const std::string reason =
        v.id + " failed after step " + std::to_string(last_step) + ": " + one_line_reason(e) + disk_full_note(out);
    if (group.rank() == 0) log::error(reason);
    return {TaskState::failed, last_step, NAN, reason};
  }
  if (ctx.opts.train.profile && group.rank() == 0) {
    std::string table = format_profile(v.id, r.profile);
    if (!table.empty() && table.back() == '\n') table.pop_back();
    log::info(table);
  }
  return outcome_of(r);
}

// The train phase's last lines and exit code: a summary; on failures it and the first variants that
// failed or diverged are error lines (which -q does not hide), exit 1.
int finish_train(const ScheduleResult& res, double elapsed, const std::string& status_path, const std::string& out) {
  std::ostringstream os;
  os << "train: " << res.done << " done, " << res.diverged << " diverged, " << res.failed << " failed";
  if (res.skipped) os << ", " << res.skipped << " already done";
  os << " in " << format_seconds(elapsed) << " (status: " << status_path << ")";
  if (stop_signal_received()) {
    log::info(os.str());
    log::warn("stopped by a signal; run the same command with --resume to continue");
    return kExitFailure;
  }
  if (res.all_done()) {
    log::info(os.str());
    return kExitOk;
  }
  log::error(os.str());
  constexpr std::size_t kNamed = 10;  // the rest are in status.csv
  std::size_t named = 0;
  for (const auto& row : res.rows) {
    if (row.state != TaskState::failed && row.state != TaskState::diverged) continue;
    if (++named > kNamed) continue;
    log::error("  " + row.variant + " " + std::string(to_string(row.state)) + " at step " + std::to_string(row.step) +
               (row.reason.empty() ? std::string() : ": " + row.reason));
  }
  if (named > kNamed)
    log::error("  ... and " + std::to_string(named - kNamed) + " more (fastudy status " + shell_quote(out) + ")");
  return kExitFailure;
}

}  // namespace

int job_train(JobContext& ctx) {
  const Study& st = *ctx.study;
  mpi::Comm& world = *ctx.world;
  const std::string status_path = (fs::path(ctx.out_dir) / "status.csv").string();
  // Every rank's LibTorch threads (FASTUDY_TORCH_THREADS or its share of the CPUs), checked before
  // anything is written: a bad value is a usage error on every rank alike.
  const int threads = configure_torch_threads();

  std::vector<const Variant*> variants;
  on_root(world, [&] { variants = prepare_train_output(ctx, status_path); });
  if (world.rank() != 0) variants = select_variants(st, ctx.opts.train.variants);

  std::vector<std::string> ids;
  for (const auto* v : variants) ids.push_back(v->id);
  const int groups = world.size() / st.train.ranks_per_variant;
  log::info("train: " + std::to_string(ids.size()) + " variants on " + std::to_string(groups) +
            " group(s) of " + std::to_string(st.train.ranks_per_variant) + " rank(s), " + std::to_string(threads) +
            " LibTorch thread(s) on rank 0 (the same results on any count)");
  const GroupPlacement place = place_groups(world, st);

  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  // The console's progress (rank 0): one line in place on a terminal, a line every 10 s in a log.
  std::mutex event_mutex;
  ProgressLine progress_line;
  TrainProgress train_progress(variants, groups, 0.0);
  ScheduleOptions opts;
  opts.resume = ctx.opts.resume;
  opts.on_event = [&](const StatusRow& row, int group) {
    std::lock_guard<std::mutex> lock(event_mutex);
    log::info(schedule_event_line(row, group));
  };
  opts.on_progress = [&](const std::vector<StatusRow>& rows) {
    std::lock_guard<std::mutex> lock(event_mutex);
    const bool event = train_progress.update(rows, seconds());
    progress_line.update(train_progress.text(), event);
  };
  TaskFn run_task = [&](int task, mpi::Comm& group, Progress& progress) {
    return train_one_variant(ctx, *variants[static_cast<std::size_t>(task)], group, progress, place, progress_line);
  };

  ScheduleResult res = run_schedule(world, st.train.ranks_per_variant, ids, run_task, status_path, opts);
  progress_line.finish();
  return finish_train(res, seconds(), status_path, ctx.out_dir);
}

}  // namespace fastudy
