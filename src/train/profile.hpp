// Where a training step's time goes (fastudy train --profile): the wall time of each phase of the step
// on the host and, on a GPU, the device time between CUDA events recorded at the same points on the
// step's stream (read after the step's one synchronisation, so profiling adds one wait per step and
// moves nothing else). Internal to src/train (the engine and the model's autograd functions time their
// phases with StepProfile::Scope; a null profile times nothing).
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "src/train/trainer.hpp"

namespace fastudy::train {

// The phases, in the order the report lists them; nested ones (depth 1) lie inside the phase above.
enum class Phase : int {
  step,
  data,
  forward,
  attention_forward,
  forward_roundings,
  backward,
  attention_backward,
  backward_roundings,
  graph_replay,
  gradients,
  reducer,
  host_sync,
  optimizer,
  checkpoint,
  log,
  count
};

class EventTimes;  // the device's events (CUDA builds)

class StepProfile {
 public:
  // device: also time on the current CUDA stream (needs a CUDA LibTorch; ignored otherwise).
  explicit StepProfile(bool device);
  ~StepProfile();
  StepProfile(const StepProfile&) = delete;
  StepProfile& operator=(const StepProfile&) = delete;

  // Times one phase while alive (profile may be null: nothing). Thread-safe (the backward pass runs on
  // LibTorch's autograd threads).
  class Scope {
   public:
    Scope(StepProfile* profile, Phase phase);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepProfile* profile_;
    Phase phase_;
    std::chrono::steady_clock::time_point start_;
    int event_ = -1;
  };

  // Called after each step: waits for the device to pass the step's last event, adds the step's phases
  // to the totals (the first step, which allocates and initialises, is left out once there are more).
  void end_step();
  // Phases outside the steps (checkpoint, log): their host time, added to the totals as they come.
  void add_host(Phase phase, double ms);
  TrainProfile result(bool cuda_graph) const;

 private:
  struct Pending {
    Phase phase;
    double host_ms;
    int begin, end;  // events, -1 without device timing
  };
  int record_event();
  void finish(Phase phase, std::chrono::steady_clock::time_point start, int event);

  mutable std::mutex mutex_;
  bool device_;
  std::unique_ptr<EventTimes> events_;
  std::vector<Pending> pending_;
  std::array<double, static_cast<int>(Phase::count)> host_{}, device_ms_{}, first_host_{}, first_device_{};
  std::array<double, static_cast<int>(Phase::count)> outside_{};
  std::int64_t steps_ = 0;
};

}  // namespace fastudy::train
