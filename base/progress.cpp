// Progress of long work on the console (progress.hpp).
#include "base/progress.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "base/log.hpp"

namespace fastudy {

namespace {
double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ProgressMode console_progress_mode() {
  if (!log::owns_console() || log::level() < log::Level::info) return ProgressMode::quiet;
  return log::status_on_terminal() ? ProgressMode::terminal : ProgressMode::lines;
}

ProgressLine::ProgressLine(ProgressMode mode, double lines_interval_s, Clock clock)
    : mode_(mode), lines_interval_s_(lines_interval_s), clock_(clock ? std::move(clock) : Clock(steady_seconds)) {
  // Terminal: the first update draws at once; lines: the first line comes after one interval.
  last_ = mode_ == ProgressMode::terminal ? -1e300 : clock_();
}

ProgressLine::~ProgressLine() { finish(); }

void ProgressLine::update(const std::string& text, bool now) {
  if (mode_ == ProgressMode::quiet) return;
  const double t = clock_();
  if (mode_ == ProgressMode::terminal) {
    if (!now && t - last_ < kTerminalInterval) return;
    last_ = t;
    shown_ = true;
    log::status(text);
    return;
  }
  if (!now && t - last_ < lines_interval_s_) return;
  last_ = t;
  log::info(text);
}

void ProgressLine::finish() {
  if (shown_) log::clear_status();
  shown_ = false;
}

std::string format_seconds(double s) {
  if (!(s >= 0)) return "?";
  char buf[32];
  const long r = std::lround(s);
  if (r >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", r / 3600, r % 3600 / 60);
  else if (r >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", r / 60, r % 60);
  else std::snprintf(buf, sizeof buf, "%lds", r);
  return buf;
}

std::string rate_text(double per_s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, per_s >= 1000 ? "%.0f" : "%.3g", per_s);
  return buf;
}

std::string eta_text(double s) { return "ETA " + format_seconds(s); }

}  // namespace fastudy
