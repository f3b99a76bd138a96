// The train phase's progress line: variants finished / total, steps / total, the measured speed and
// the time left, e.g. "train: 3/12 variants, 1200/4800 steps, 85 steps/s, ETA 42s".
//
// The time left follows plan's estimate (jobs/plan.cpp): every variant still to train takes its
// remaining steps x its kind's step time (a kind: the variant's values of the axes that are not
// replicates, estimate.hpp variant_kind), and the variants are assigned in grid order to the group
// that becomes free first. Where plan times a few steps of each kind before the run, this takes each
// kind's step time from its own variants as they train (a kind not yet seen: the mean of the kinds
// seen), so the estimate is corrected by the speed measured in this run. Fed from the scheduler's
// rows (ScheduleOptions::on_progress) on world rank 0; writes nothing.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "src/core/config.hpp"
#include "src/runtime/status.hpp"

namespace fastudy {

class TrainProgress {
 public:
  // `variants` in the scheduler's task order; `groups` groups train at once; `now` the phase's start (s).
  TrainProgress(const std::vector<const Variant*>& variants, int groups, double now);

  // Folds in every task's row at time `now`; true when a task finished since the last call.
  bool update(const std::vector<StatusRow>& rows, double now);
  // The seconds left (NaN until a step time is measured) and the steps per second of this run.
  double eta_s() const { return eta_s_; }
  double steps_per_s() const { return steps_per_s_; }
  std::string text() const;

 private:
  struct Task {
    std::int64_t steps = 0;  // the variant's total
    std::string kind;
    TaskState state = TaskState::queued;
    std::int64_t step = 0;            // the latest step reported
    std::int64_t start_step = 0;      // the step it started from in this run (its row's, maybe stale)
    bool timed = false;               // seen training in this run: base_* set
    std::int64_t base_step = 0;       // the first step reported in this run, and when
    double base_t = 0, last_t = 0;    // the time of the first and the latest report
  };
  std::vector<Task> tasks_;
  int groups_;
  double start_;
  double eta_s_;
  double steps_per_s_ = 0;
  int finished_ = 0;
  std::int64_t steps_done_ = 0, steps_total_ = 0;
};

}  // namespace fastudy
