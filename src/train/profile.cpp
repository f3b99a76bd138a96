// Phase timings of the training step (see profile.hpp).
#include "src/train/profile.hpp"

#include <cstdio>
#include <string>

#include "fastudy/version.hpp"  // FASTUDY_TORCH_CUDA

#ifdef FASTUDY_HAVE_CUDA_KERNELS
#include "kernels/cuda/event_log.hpp"
#endif
#if FASTUDY_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace fastudy::train {

namespace {

struct PhaseRow {
  const char* name;
  int depth;
};
// One row per Phase, in its order.
constexpr PhaseRow kPhases[] = {
    {"step", 0},          {"data", 1},       {"forward", 1},   {"attention", 2}, {"roundings", 2},
    {"backward", 1},      {"attention", 2},  {"roundings", 2}, {"graph replay (forward + backward)", 1},
    {"gradients", 1},     {"reducer", 1},    {"host sync", 1}, {"optimizer", 1}, {"checkpoint", 0},
    {"log", 0},
};
static_assert(sizeof(kPhases) / sizeof(kPhases[0]) == static_cast<int>(Phase::count), "one row per phase");

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

#if defined(FASTUDY_HAVE_CUDA_KERNELS) && FASTUDY_TORCH_CUDA
class EventTimes {
 public:
  int record() { return log.record(at::cuda::getCurrentCUDAStream().stream()); }
  cuda::EventLog log;
};
#else
class EventTimes {};
#endif

StepProfile::StepProfile(bool device) {
#if defined(FASTUDY_HAVE_CUDA_KERNELS) && FASTUDY_TORCH_CUDA
  device_ = device;
  if (device_) events_ = std::make_unique<EventTimes>();
#else
  (void)device;
  device_ = false;
#endif
}

StepProfile::~StepProfile() = default;

int StepProfile::record_event() {
#if defined(FASTUDY_HAVE_CUDA_KERNELS) && FASTUDY_TORCH_CUDA
  if (device_) return events_->record();
#endif
  return -1;
}

StepProfile::Scope::Scope(StepProfile* profile, Phase phase) : profile_(profile), phase_(phase) {
  if (profile_ == nullptr) return;
  std::lock_guard<std::mutex> lock(profile_->mutex_);
  event_ = profile_->record_event();
  start_ = std::chrono::steady_clock::now();
}

StepProfile::Scope::~Scope() {
  if (profile_ != nullptr) profile_->finish(phase_, start_, event_);
}

void StepProfile::finish(Phase phase, std::chrono::steady_clock::time_point start, int event) {
  const double host = ms_since(start);
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back({phase, host, event, event >= 0 ? record_event() : -1});
}

void StepProfile::end_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::array<double, static_cast<int>(Phase::count)> host{}, device{};
#if defined(FASTUDY_HAVE_CUDA_KERNELS) && FASTUDY_TORCH_CUDA
  if (device_ && !pending_.empty()) events_->log.synchronize(pending_.back().end);
#endif
  for (const Pending& p : pending_) {
    host[static_cast<int>(p.phase)] += p.host_ms;
#if defined(FASTUDY_HAVE_CUDA_KERNELS) && FASTUDY_TORCH_CUDA
    if (p.begin >= 0) device[static_cast<int>(p.phase)] += events_->log.elapsed_ms(p.begin, p.end);
#endif
  }
  pending_.clear();
#if defined(FASTUDY_HAVE_CUDA_KERNELS) && FASTUDY_TORCH_CUDA
  if (device_) events_->log.clear();
#endif
  if (steps_ == 0 && first_host_[0] == 0.0) {  // the warm-up step, kept apart until a second one comes
    first_host_ = host;
    first_device_ = device;
    return;
  }
  for (int i = 0; i < static_cast<int>(Phase::count); ++i) {
    host_[i] += host[i];
    device_ms_[i] += device[i];
  }
  ++steps_;
}

void StepProfile::add_host(Phase phase, double ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  outside_[static_cast<int>(phase)] += ms;
}

TrainProfile StepProfile::result(bool cuda_graph) const {
  std::lock_guard<std::mutex> lock(mutex_);
  TrainProfile out;
  const bool only_first = steps_ == 0;
  out.steps = only_first ? (first_host_[0] > 0.0 ? 1 : 0) : steps_;
  out.warmup_excluded = !only_first;
  out.device = device_;
  out.cuda_graph = cuda_graph;
  const double n = out.steps > 0 ? static_cast<double>(out.steps) : 1.0;
  const double all_steps = static_cast<double>(out.steps + (only_first ? 0 : 1));
  for (int i = 0; i < static_cast<int>(Phase::count); ++i) {
    const double host = only_first ? first_host_[i] : host_[i];
    const double device = only_first ? first_device_[i] : device_ms_[i];
    PhaseTime p;
    p.phase = kPhases[i].name;
    p.depth = kPhases[i].depth;
    p.host_ms = host / n + (all_steps > 0 ? outside_[i] / all_steps : 0.0);
    p.device_ms = device_ ? device / n : -1.0;
    const bool outside = static_cast<Phase>(i) == Phase::checkpoint || static_cast<Phase>(i) == Phase::log;
    if (outside) p.device_ms = -1.0;
    if (p.host_ms > 0.0 || static_cast<Phase>(i) == Phase::step) out.phases.push_back(p);
  }
  return out;
}

}  // namespace fastudy::train
