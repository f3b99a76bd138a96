// train_variant() and initial_state(): drive the Engine over a variant's steps, write train_log.csv
// and shadow.csv, call the checkpoint, stop and progress hooks (see trainer.hpp).
#include "src/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "base/error.hpp"
#include "base/number.hpp"
#include "src/io/checkpoint.hpp"
#include "src/train/engine.hpp"
#include "src/train/profile.hpp"

namespace fastudy {
namespace {

constexpr const char* kTrainLogHeader = "step,loss,grad_norm,lr,loss_scale,skipped,spike,tokens_per_s";
constexpr const char* kShadowHeader = "step,layer,max_abs,mean_abs";

// Opens <dir>/<name> for the run: a fresh file with `header`, or on resume the old file cut back to the
// rows with step <= resumed_step (rows written after the checkpoint belong to steps that are redone).
std::ofstream open_log(const std::filesystem::path& path, const char* header, const TrainState* resume) {
  std::vector<std::string> kept;
  if (resume != nullptr) {
    std::ifstream in(path);
    std::string line;
    bool first = true;
    while (std::getline(in, line)) {
      if (first) {
        first = false;
        continue;
      }
      const auto comma = line.find(',');
      if (comma == std::string::npos || line.find_first_not_of("0123456789") != comma) continue;
      if (std::stoll(line.substr(0, comma)) <= resume->step) kept.push_back(line);
    }
  }
  std::ofstream out(path, std::ios::trunc);
  if (!out) {
    throw Error("cannot write " + path.string(), "check that the output directory is writable");
  }
  out << header << '\n';
  for (const auto& line : kept) out << line << '\n';
  return out;
}


}  // namespace

std::string_view to_string(TrainOutcome o) {
  switch (o) {
    case TrainOutcome::done: return "done";
    case TrainOutcome::diverged: return "diverged";
    case TrainOutcome::stopped: return "stopped";
  }
  return "?";
}

TrainState initial_state(const Variant& v) {
  return train::initial_train_state(v);
}

double measure_step_seconds(const Variant& v, int warmup, int timed, int threads) {
  if (warmup < 0 || timed < 1 || threads < 1) {
    throw UsageError("measure_step_seconds: warmup >= 0, timed >= 1 steps and threads >= 1");
  }
  Variant w = v;
  w.train.steps = std::max<std::int64_t>(w.train.steps, warmup + timed);  // the schedule's first steps
  w.train.checkpoint_every = 0;
  const TrainHooks hooks;
  train::Engine engine(w, hooks, nullptr);
  at::set_num_threads(threads);  // after the engine's own configure_torch_threads
  for (int i = 0; i < warmup; ++i) engine.step();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < timed; ++i) engine.step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / timed;
}

TrainResult train_variant(const Variant& v, const std::string& variant_dir, const TrainHooks& hooks,
                          const TrainState* resume) {
  train::Engine engine(v, hooks, resume);
  const TrainConfig& t = v.train;
  TrainResult result{TrainOutcome::done, engine.steps_done(), std::numeric_limits<double>::quiet_NaN(), {}, {}, {}};
  if (resume != nullptr && !resume->loss_history.empty()) result.final_loss = resume->loss_history.back();

  const bool writer = hooks.rank == 0;
  std::ofstream log, shadow;
  if (writer) {
    std::error_code ec;
    std::filesystem::create_directories(variant_dir, ec);
    if (ec) throw Error("cannot create " + variant_dir + ": " + ec.message(), "check the output directory");
    log = open_log(std::filesystem::path(variant_dir) / "train_log.csv", kTrainLogHeader, resume);
    if (t.shadow_attention) {
      shadow = open_log(std::filesystem::path(variant_dir) / "shadow.csv", kShadowHeader, resume);
    }
  }
  // --profile: the work between steps (checkpoints, the logs) counted too.
  auto timed = [&](train::Phase phase, const auto& work) {
    const auto t0 = std::chrono::steady_clock::now();
    work();
    if (engine.profiler() != nullptr)
      engine.profiler()->add_host(phase, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  };
  auto save = [&]() {
    timed(train::Phase::checkpoint, [&] {
      if (log.is_open()) log.flush();
      if (shadow.is_open()) shadow.flush();
      if (hooks.save_checkpoint) hooks.save_checkpoint(engine.state());
    });
  };

  while (engine.steps_done() < t.steps) {
    const train::Engine::Step s = engine.step();
    const StepLog& l = s.log;
    if (!s.event.empty()) result.events.emplace_back(l.step, s.event);
    if (writer) {
      timed(train::Phase::log, [&] {
        log << l.step << ',' << number_text(l.loss, 9) << ',' << number_text(l.grad_norm, 9) << ','
            << number_text(l.lr, 9) << ',' << number_text(l.loss_scale, 9) << ',' << (l.skipped ? 1 : 0) << ','
            << (l.spike ? 1 : 0) << ',' << number_text(l.tokens_per_s, 9) << '\n';
        for (const auto& r : engine.shadow()) {
          shadow << l.step << ',' << r.layer << ',' << number_text(r.max_abs, 9) << ',' << number_text(r.mean_abs, 9)
                 << '\n';
        }
      });
    }
    result.final_loss = l.loss;
    if (s.diverged) {
      result.outcome = TrainOutcome::diverged;
      result.step = engine.steps_done();
      result.reason = s.event;
      result.profile = engine.profile();
      if (log.is_open()) log.flush();
      return result;
    }
    if (hooks.on_step) hooks.on_step(l);
    const bool at_checkpoint = is_checkpoint_step(t.checkpoint_every, t.steps, l.step);
    if (at_checkpoint) save();
    if (hooks.stop_requested && hooks.stop_requested()) {
      if (!at_checkpoint) save();
      result.outcome = TrainOutcome::stopped;
      result.step = engine.steps_done();
      result.reason = "stop requested after step " + std::to_string(l.step);
      result.profile = engine.profile();
      return result;
    }
    if (t.log_every > 0 && l.step % t.log_every == 0 && log.is_open()) log.flush();
  }
  result.step = engine.steps_done();
  result.profile = engine.profile();
  return result;
}

std::string format_profile(const std::string& variant, const TrainProfile& p) {
  std::ostringstream os;
  os << "profile of " << variant << ": ms per step over " << p.steps << " step(s)"
     << (p.warmup_excluded ? " after the first" : "") << (p.cuda_graph ? ", forward and backward from a CUDA graph" : "")
     << "; host = wall time of the phase" << (p.device ? ", device = GPU time between its events" : "") << '\n';
  double step_ms = 0.0;
  for (const PhaseTime& ph : p.phases)
    if (ph.phase == "step") step_ms = ph.host_ms;
  char line[160];
  std::snprintf(line, sizeof line, "  %-40s %10s %10s %7s\n", "phase", "host", p.device ? "device" : "", "share");
  os << line;
  for (const PhaseTime& ph : p.phases) {
    const std::string name = std::string(static_cast<std::size_t>(2 * ph.depth), ' ') + ph.phase;
    char device[32] = "";
    if (ph.device_ms >= 0.0) std::snprintf(device, sizeof device, "%10.3f", ph.device_ms);
    std::snprintf(line, sizeof line, "  %-40s %10.3f %10s %6.1f%%\n", name.c_str(), ph.host_ms, device,
                  step_ms > 0.0 ? 100.0 * ph.host_ms / step_ms : 0.0);
    os << line;
  }
  return os.str();
}

CapturedAttention capture_attention_inputs(const Variant& v, const TrainState& state, int layer, std::int64_t batch) {
  train::Engine engine(v, TrainHooks{}, &state);
  return engine.capture(layer, batch);
}

}  // namespace fastudy
