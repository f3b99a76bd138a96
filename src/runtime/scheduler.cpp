// The scheduler of tasks onto rank groups: the coordinator (world rank 0), the group leaders' loop
// and the message encoding. See scheduler.hpp for the protocol.
#include "src/runtime/scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <sstream>
#include <thread>

#include "base/log.hpp"
#include "base/number.hpp"

namespace fastudy {
namespace {

enum Tag : int { kRequest = 1, kProgress = 2, kResult = 3, kAssign = 4 };

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}


std::string encode(int task, const TaskOutcome& o) {
  return std::to_string(task) + " " + std::string(to_string(o.state)) + " " + std::to_string(o.step) + " " +
         number_text(o.loss) + "\n" + o.reason;
}

std::pair<int, TaskOutcome> decode(const std::string& s) {
  const auto nl = s.find('\n');
  std::istringstream head(s.substr(0, nl));
  int task = -1;
  std::string state, loss;
  TaskOutcome o;
  head >> task >> state >> o.step >> loss;
  o.state = parse_task_state(state);
  o.loss = std::strtod(loss.c_str(), nullptr);
  o.reason = nl == std::string::npos ? "" : s.substr(nl + 1);
  return {task, o};
}

// The group's outcome from every rank's: the first failed rank wins, then the first diverged one,
// else the leader's.
TaskOutcome combine(const std::vector<std::string>& encoded) {
  std::vector<TaskOutcome> all;
  for (const auto& e : encoded) all.push_back(decode(e).second);
  for (TaskState worst : {TaskState::failed, TaskState::diverged}) {
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (all[r].state == worst) {
        TaskOutcome o = all[r];
        if (all.size() > 1 && r > 0) o.reason = "rank " + std::to_string(r) + " of the group: " + o.reason;
        return o;
      }
    }
  }
  return all.front();
}

// The coordinator's state. Used by exactly one thread (the coordinator thread, or the main thread
// of world rank 0 when there is a single group).
class Coordinator {
 public:
  Coordinator(const std::vector<std::string>& ids, std::string path, const ScheduleOptions& opt)
      : path_(std::move(path)), opt_(opt), start_(ids.size(), 0.0) {
    std::vector<StatusRow> old = opt.resume ? read_status_csv(path_) : std::vector<StatusRow>{};
    for (std::size_t i = 0; i < ids.size(); ++i) {
      StatusRow row;
      row.variant = ids[i];
      auto it = std::find_if(old.begin(), old.end(), [&](const StatusRow& r) { return r.variant == ids[i]; });
      if (it != old.end()) row = *it;
      if (it != old.end() &&
          std::find(opt.skip_states.begin(), opt.skip_states.end(), it->state) != opt.skip_states.end()) {
        ++skipped;
      } else {
        row.state = TaskState::queued;
        row.reason.clear();
        queue_.push_back(static_cast<int>(i));
      }
      rows.push_back(std::move(row));
    }
    // Rows of variants this run does not schedule (train --variant) stay in status.csv as they were.
    for (auto& r : old)
      if (std::find(ids.begin(), ids.end(), r.variant) == ids.end()) others_.push_back(std::move(r));
    write();
  }

  int next(int group) {
    if (queue_.empty()) return -1;
    const int task = queue_.front();
    queue_.pop_front();
    start_[task] = now_s();
    rows[task].state = TaskState::running;
    rows[task].wall_time_s = 0;
    ++running_;
    event(rows[task], group);
    changed();
    write();
    return task;
  }

  void progress(int task, std::int64_t step, double loss) {
    rows[task].step = step;
    rows[task].has_loss = !std::isnan(loss);
    if (rows[task].has_loss) rows[task].loss = loss;
    rows[task].wall_time_s = now_s() - start_[task];
    dirty_ = true;
    changed();
    flush_if_due();
  }

  void result(int task, const TaskOutcome& o, int group) {
    StatusRow& r = rows[task];
    r.state = o.state == TaskState::diverged || o.state == TaskState::failed ? o.state : TaskState::done;
    if (o.step >= 0) {
      r.step = o.step;
      r.has_loss = !std::isnan(o.loss);
      r.loss = r.has_loss ? o.loss : 0.0;
    }
    r.reason = o.reason;
    r.wall_time_s = now_s() - start_[task];
    --running_;
    ++finished_;
    event(r, group);
    changed();
    write();
  }

  void flush_if_due() {
    if (dirty_ && now_s() - last_write_ >= opt_.status_interval_s) write();
  }

  void write() {
    if (others_.empty()) {
      write_status_csv(path_, rows);
      return;
    }
    std::vector<StatusRow> all = rows;
    all.insert(all.end(), others_.begin(), others_.end());
    write_status_csv(path_, all);
    dirty_ = false;
    last_write_ = now_s();
  }

  std::vector<StatusRow> rows;
  int skipped = 0;

 private:
  void changed() {
    if (opt_.on_progress) opt_.on_progress(rows);
  }

  void event(const StatusRow& r, int group) {
    if (opt_.on_event) {
      opt_.on_event(r, group);
      return;
    }
    std::ostringstream line;
    line << "[" << r.variant << "] ";
    if (r.state == TaskState::running) {
      line << "started on group " << group << " (" << queue_.size() << " queued)";
    } else {
      line << to_string(r.state) << " at step " << r.step;
      if (r.has_loss) line << ", loss " << r.loss;
      line << ", " << static_cast<long>(r.wall_time_s) << " s";
      if (!r.reason.empty()) line << ": " << r.reason;
      line << " (" << finished_ << "/" << (finished_ + running_ + queue_.size()) << " finished)";
    }
    log::info(line.str());
  }

  std::string path_;
  std::vector<StatusRow> others_;  // rows of status.csv for variants not scheduled now, kept as they are
  const ScheduleOptions& opt_;
  std::vector<double> start_;
  std::deque<int> queue_;
  int running_ = 0, finished_ = 0;
  bool dirty_ = false;
  double last_write_ = 0;
};

// The coordinator thread: answers the group leaders until every group was told to stop.
void serve(Coordinator& coord, const mpi::Comm& to_coord, const mpi::Comm& to_leader, int groups,
           int ranks_per_group) {
  using namespace std::chrono_literals;
  auto pause = 100us;
  int stopped = 0;
  while (stopped < groups) {
    std::optional<mpi::Message> m = to_coord.try_recv();
    if (!m) {
      coord.flush_if_due();
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, 10ms);
      continue;
    }
    pause = 100us;
    const int group = m->source / ranks_per_group;
    if (m->tag == kRequest) {
      const int task = coord.next(group);
      to_leader.send(m->source, kAssign, std::to_string(task));
      if (task < 0) ++stopped;
    } else if (m->tag == kProgress) {
      std::istringstream in(m->payload);
      int task = -1;
      std::int64_t step = 0;
      std::string loss;
      in >> task >> step >> loss;
      coord.progress(task, step, std::strtod(loss.c_str(), nullptr));
    } else if (m->tag == kResult) {
      auto [task, outcome] = decode(m->payload);
      coord.result(task, outcome, group);
    }
  }
  coord.write();
}

}  // namespace

Progress::Progress(std::function<void(std::int64_t, double)> sink, double interval_s)
    : sink_(std::move(sink)), interval_s_(interval_s) {}

void Progress::report(std::int64_t step, double loss) {
  if (!sink_) return;
  const double t = now_s();
  if (t - last_ < interval_s_) return;
  last_ = t;
  sink_(step, loss);
}

void check_layout(int world_size, int ranks_per_group) {
  if (ranks_per_group < 1) {
    throw UsageError("ranks_per_variant = " + std::to_string(ranks_per_group) + " must be at least 1");
  }
  if (world_size < ranks_per_group) {
    throw UsageError("ranks_per_variant = " + std::to_string(ranks_per_group) + " needs at least that many ranks, "
                     "but the job has " + std::to_string(world_size),
                     "run with mpirun -n " + std::to_string(ranks_per_group) + " (or a multiple), or lower "
                     "[train] ranks_per_variant");
  }
  if (world_size % ranks_per_group != 0) {
    const int lower = world_size / ranks_per_group * ranks_per_group;
    throw UsageError("the job has " + std::to_string(world_size) + " ranks, not a multiple of ranks_per_variant = " +
                         std::to_string(ranks_per_group) + ": " + std::to_string(world_size - lower) +
                         " rank(s) would sit idle",
                     "run with mpirun -n " + std::to_string(lower) + " or -n " +
                         std::to_string(lower + ranks_per_group) + ", or set [train] ranks_per_variant to a divisor of " +
                         std::to_string(world_size));
  }
}

ScheduleResult run_schedule(const mpi::Comm& world, int ranks_per_group, const std::vector<std::string>& task_ids,
                            const TaskFn& run_task, const std::string& status_csv_path,
                            const ScheduleOptions& options) {
  check_layout(world.size(), ranks_per_group);
  for (std::size_t i = 0; i < task_ids.size(); ++i) {
    if (std::find(task_ids.begin(), task_ids.begin() + static_cast<std::ptrdiff_t>(i), task_ids[i]) !=
        task_ids.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw UsageError("task id '" + task_ids[i] + "' appears twice in the schedule");
    }
  }
  const int groups = world.size() / ranks_per_group;
  if (groups > 1 && mpi::MpiSession::provided_level() != mpi::ThreadLevel::multiple) {
    throw Error("the scheduler needs MPI_THREAD_MULTIPLE for " + std::to_string(groups) +
                    " rank groups, but MPI provides " + std::string(to_string(mpi::MpiSession::provided_level())),
                "use an MPI library with thread support, or run one group (ranks_per_variant = number of ranks)");
  }
  mpi::Comm group = world.split(world.rank() / ranks_per_group, world.rank());
  mpi::Comm to_coord = world.dup();
  mpi::Comm to_leader = world.dup();
  const int my_group = world.rank() / ranks_per_group;

  // The coordinator on world rank 0. Its constructor reads and writes status.csv: a failure there is
  // shared with every rank before anything runs.
  std::unique_ptr<Coordinator> coord;
  std::string setup_error;
  if (world.is_root()) {
    try {
      coord = std::make_unique<Coordinator>(task_ids, status_csv_path, options);
    } catch (const std::exception& e) {
      setup_error = e.what();
    }
  }
  world.bcast(setup_error);
  if (!setup_error.empty()) throw Error(setup_error, "check the output directory and its status.csv");

  std::thread coordinator;
  if (coord && groups > 1) {
    coordinator = std::thread([&] {
      try {
        serve(*coord, to_coord, to_leader, groups, ranks_per_group);
      } catch (const std::exception& e) {
        mpi::abort(kExitFailure, std::string("scheduler coordinator: ") + e.what());
      }
    });
  }

  try {
    for (;;) {
      std::int64_t task = -1;
      if (group.is_root()) {
        if (groups > 1) {
          to_coord.send(0, kRequest, "");
          task = std::stoll(to_leader.recv(0, kAssign).payload);
        } else {
          task = coord->next(my_group);
        }
      }
      group.bcast(task);
      if (task < 0) break;

      std::function<void(std::int64_t, double)> sink;
      if (group.is_root()) {
        if (groups > 1) {
          sink = [&, task](std::int64_t step, double loss) {
            to_coord.send(0, kProgress, std::to_string(task) + " " + std::to_string(step) + " " + number_text(loss));
          };
        } else {
          sink = [&, task](std::int64_t step, double loss) { coord->progress(static_cast<int>(task), step, loss); };
        }
      }
      Progress progress(sink, options.progress_interval_s);
      TaskOutcome outcome;
      try {
        outcome = run_task(static_cast<int>(task), group, progress);
      } catch (const std::exception& e) {
        outcome.state = TaskState::failed;
        outcome.step = -1;  // unknown: the coordinator keeps the last step reported by progress
        outcome.reason = e.what();
      }
      const std::vector<std::string> all = group.gather(encode(static_cast<int>(task), outcome));
      if (group.is_root()) {
        const TaskOutcome combined = combine(all);
        if (groups > 1) {
          to_coord.send(0, kResult, encode(static_cast<int>(task), combined));
        } else {
          coord->result(static_cast<int>(task), combined, my_group);
        }
      }
    }
  } catch (const std::exception& e) {
    // The other groups and the coordinator would wait for this rank forever.
    if (coordinator.joinable() || world.size() > 1) {
      mpi::abort(kExitFailure, std::string("scheduler worker: ") + e.what());
    }
    throw;
  }
  if (coordinator.joinable()) coordinator.join();

  std::string final_csv;
  ScheduleResult result;
  if (coord) {
    final_csv = format_status_csv(coord->rows);
    result.skipped = coord->skipped;
  }
  world.bcast(final_csv);
  std::int64_t skipped = result.skipped;
  world.bcast(skipped);
  result.skipped = static_cast<int>(skipped);
  result.rows = parse_status_csv(final_csv, "status broadcast");
  for (const auto& r : result.rows) {
    result.done += r.state == TaskState::done;
    result.diverged += r.state == TaskState::diverged;
    result.failed += r.state == TaskState::failed;
  }
  return result;
}

}  // namespace fastudy
