// The train phase's progress line (train_progress.hpp).
#include "jobs/train_progress.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "base/progress.hpp"
#include "jobs/estimate.hpp"

namespace fastudy {

TrainProgress::TrainProgress(const std::vector<const Variant*>& variants, int groups, double now)
    : groups_(std::max(1, groups)), start_(now), eta_s_(NAN) {
  for (const Variant* v : variants) {
    Task t;
    t.steps = v->train.steps;
    t.kind = variant_kind(*v);
    tasks_.push_back(t);
    steps_total_ += t.steps;
  }
}

bool TrainProgress::update(const std::vector<StatusRow>& rows, double now) {
  bool changed = false;
  for (std::size_t i = 0; i < rows.size() && i < tasks_.size(); ++i) {
    Task& t = tasks_[i];
    const StatusRow& r = rows[i];
    if (r.state == TaskState::running && t.state != TaskState::running) {  // started now
      t.start_step = std::min(r.step, t.steps);
      t.last_t = now;
    }
    const bool ran = t.state == TaskState::running && r.state != TaskState::queued;
    changed |= r.state != t.state && r.state != TaskState::running;
    t.state = r.state;
    t.step = std::min(r.step, t.steps);
    // Timed from its first report of a step (start-up is not a step).
    if (!ran || (!t.timed && t.step == t.start_step)) continue;
    // The first report (or a step behind the base: a resumed variant's stale step) starts the clock.
    if (!t.timed || t.step < t.base_step) {
      t.timed = true;
      t.base_step = t.step;
      t.base_t = now;
    }
    t.last_t = now;
  }

  // Each kind's step time from its variants' steps and seconds in this run.
  std::map<std::string, std::pair<double, double>> per_kind;  // kind -> (steps, seconds)
  double steps_run = 0;
  finished_ = 0;
  steps_done_ = 0;
  for (const Task& t : tasks_) {
    // A variant counts as finished when it trained to its end (done, or stopped by a divergence), and
    // its steps as those it reached: a failed one (never started, or stopped by an error) did not.
    finished_ += t.state == TaskState::done || t.state == TaskState::diverged;
    steps_done_ += t.state == TaskState::done ? t.steps : t.step;
    if (!t.timed || t.step <= t.base_step || t.last_t <= t.base_t) continue;
    auto& k = per_kind[t.kind];
    k.first += static_cast<double>(t.step - t.base_step);
    k.second += t.last_t - t.base_t;
    steps_run += static_cast<double>(t.step - t.base_step);
  }
  steps_per_s_ = now > start_ ? steps_run / (now - start_) : 0;
  std::map<std::string, double> step_s;
  double sum = 0;
  for (const auto& [kind, ks] : per_kind) sum += step_s[kind] = ks.second / ks.first;
  if (step_s.empty()) {
    eta_s_ = NAN;
    return changed;
  }
  const double mean = sum / static_cast<double>(step_s.size());
  auto seconds_per_step = [&](const Task& t) {
    auto it = step_s.find(t.kind);
    return it == step_s.end() ? mean : it->second;
  };

  // plan's rule: the running variants occupy their groups for their remaining time, then the queued
  // ones go, in order, to the group that becomes free first.
  std::vector<double> free_at;
  for (const Task& t : tasks_) {
    if (t.state != TaskState::running) continue;
    const double left = static_cast<double>(t.steps - t.step) * seconds_per_step(t) - (now - t.last_t);
    free_at.push_back(std::max(0.0, left));
  }
  free_at.resize(static_cast<std::size_t>(std::max<int>(groups_, static_cast<int>(free_at.size()))), 0.0);
  for (const Task& t : tasks_)
    if (t.state == TaskState::queued)
      *std::min_element(free_at.begin(), free_at.end()) += static_cast<double>(t.steps - t.step) * seconds_per_step(t);
  eta_s_ = *std::max_element(free_at.begin(), free_at.end());
  return changed;
}

std::string TrainProgress::text() const {
  std::ostringstream os;
  os << "train: " << finished_ << "/" << tasks_.size() << " variants, " << steps_done_ << "/" << steps_total_
     << " steps, " << rate_text(steps_per_s_) << " steps/s, " << eta_text(eta_s_);
  return os.str();
}

}  // namespace fastudy
