// The dynamic scheduler: fans a list of tasks (the grid's variants) over groups of ranks.
//
// The world is split into groups of `ranks_per_group` consecutive ranks (group g = world ranks
// [g*k, (g+1)*k)). A coordinator on world rank 0 hands the next queued task to whichever group asks
// first, so a slow task (fp64) does not stall the others. Rank 0 is also a worker in group 0: with
// more than one group the coordinator runs as a thread on rank 0 (needs MPI_THREAD_MULTIPLE; it polls
// with MPI_Iprobe and sleeps between polls, so it costs no core) and talks to the group leaders over
// its own duplicated communicators. With a single group (a single rank included) there is no thread
// and no message: the group runs the tasks in order.
//
// Message protocol (group leader = rank 0 of a group; payloads are short text):
//   leader -> coordinator  kRequest  ""                          ask for the next task
//                          kProgress "<task> <step> <loss>"      at most every progress_interval_s
//                          kResult   "<task> <state> <step> <loss>\n<reason>"  (loss nan: none)
//   coordinator -> leader  kAssign   "<task>" or "-1"            -1: no more tasks, leave the loop
// The leader broadcasts each assignment to its group; every rank of the group calls run_task.
//
// status.csv is kept current by the coordinator: rewritten atomically on every state change and at
// most every status_interval_s for progress.
//
// Example (the train job; every rank of the world calls it):
//   ScheduleResult r = run_schedule(world, study.train.ranks_per_variant, variant_ids,
//       [&](int task, mpi::Comm& group, Progress& progress) {
//         auto reducer = make_reducer(group, "auto");
//         ...train, calling progress.report(step, loss) and, every checkpoint_every steps,
//         write_checkpoint(group, checkpoint_path(out, variant_ids[task], step), state)...
//         return TaskOutcome{TaskState::done, step, loss, ""};
//       },
//       out + "/status.csv");
//   exit code: r.all_done() ? 0 : 1
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "src/runtime/mpi.hpp"
#include "src/runtime/status.hpp"

namespace fastudy {

// What one task ended as. run_task returns it on every rank of the group (the group leader's counts,
// except that any rank's failed/diverged wins, with that rank's reason). Throwing from run_task is the
// same as returning failed with e.what() as the reason (and the step/loss of the last progress report) — but only when every rank of the group throws
// or returns: a rank that throws while the others wait in a collective hangs the group (let such
// errors reach main(), which aborts the job).
struct TaskOutcome {
  TaskState state = TaskState::done;  // done, diverged or failed
  std::int64_t step = 0;
  double loss = NAN;                  // NaN: no loss to report
  std::string reason;
};

// Passed to run_task: report(step, loss) forwards progress to the coordinator (only the group
// leader's calls are sent, rate-limited; other ranks' calls are free).
class Progress {
 public:
  explicit Progress(std::function<void(std::int64_t, double)> sink = {}, double interval_s = 0.5);
  void report(std::int64_t step, double loss);

 private:
  std::function<void(std::int64_t, double)> sink_;
  double interval_s_;
  double last_ = -1e300;
};

struct ScheduleOptions {
  // Keep the states already in status.csv and skip tasks whose state is in skip_states (rows of
  // status.csv for other ids are kept as they are); otherwise start every task from "queued".
  bool resume = true;
  std::vector<TaskState> skip_states{TaskState::done};
  double status_interval_s = 1.0;    // rewrite status.csv for progress at most this often
  double progress_interval_s = 0.5;  // a leader sends progress at most this often
  // Called on world rank 0 when a task starts or ends (row.state says which), possibly from the
  // coordinator thread: keep it short and thread-safe (the log:: functions are). When empty, the
  // scheduler prints one log::info line per event.
  std::function<void(const StatusRow& row, int group)> on_event;
  // Called on world rank 0 after every change of a task's state or step (start, progress report,
  // end) with every task's row, after on_event and from the same thread: the console's progress.
  std::function<void(const std::vector<StatusRow>& rows)> on_progress;
};

struct ScheduleResult {
  std::vector<StatusRow> rows;  // final status of every task, in task order (the same on every rank)
  int done = 0, diverged = 0, failed = 0;
  int skipped = 0;              // tasks not run because their state was already in skip_states
  bool all_done() const { return diverged == 0 && failed == 0; }
};

// Throws UsageError when world_size ranks cannot form groups of ranks_per_group (not a multiple, or
// fewer ranks than one group needs). Call it before any work; run_schedule calls it too.
void check_layout(int world_size, int ranks_per_group);

using TaskFn = std::function<TaskOutcome(int task, mpi::Comm& group, Progress& progress)>;

// Collective over `world`. Runs run_task(task, group, progress) for every task index of task_ids not
// skipped, on the rank groups, and returns the final status on every rank. task_ids are the variant
// ids (status.csv's first column); they must be unique. Needs MPI_THREAD_MULTIPLE when there is more
// than one group (throws Error otherwise). A failure of the coordinator itself (status.csv not
// writable) aborts the job with mpi::abort, since the other ranks would wait forever.
ScheduleResult run_schedule(const mpi::Comm& world, int ranks_per_group, const std::vector<std::string>& task_ids,
                            const TaskFn& run_task, const std::string& status_csv_path,
                            const ScheduleOptions& options = {});

}  // namespace fastudy
