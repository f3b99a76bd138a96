// Progress of long work on the console (train, microbench, reduce): on a terminal one status line
// updated in place (log::status), elsewhere (a log file, Slurm) a plain line at most every
// lines_interval_s, and nothing with -q or on a rank that does not own the console. Progress is never
// written to a file. The text is the caller's ("train: 3/12 variants, 1200/4800 steps, 85 steps/s,
// ETA 42s"); rate_text, eta_text and format_seconds give the common pieces.
//
//   ProgressLine line;                      // the console's mode
//   for (...) { ...; line.update(text); }   // rate-limited; update(text, true) shows it at once
//   line.finish();                          // erases the terminal line (the destructor does too)
#pragma once

#include <functional>
#include <string>

namespace fastudy {

enum class ProgressMode { quiet, terminal, lines };
// quiet (-q, or a rank that does not own the console), terminal (stdout is a terminal), else lines.
ProgressMode console_progress_mode();

class ProgressLine {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic; default: std::chrono::steady_clock
  static constexpr double kTerminalInterval = 0.2;  // s between redraws in place
  static constexpr double kLinesInterval = 10.0;    // s between plain lines

  explicit ProgressLine(ProgressMode mode = console_progress_mode(), double lines_interval_s = kLinesInterval,
                        Clock clock = {});
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Shows `text`: in place on a terminal when kTerminalInterval has passed since the last draw, as a
  // line when lines_interval_s has passed since the last line (or the start); `now` (an event: a
  // variant finished) skips the wait.
  void update(const std::string& text, bool now = false);
  void finish();
  ProgressMode mode() const { return mode_; }

 private:
  ProgressMode mode_;
  double lines_interval_s_;
  Clock clock_;
  double last_;
  bool shown_ = false;
};

// "42s", "3m05s", "2h10m"; negative or NaN: "?".
std::string format_seconds(double s);
// A speed for people: 3 significant digits below 1000 ("0.5", "85.2"), whole numbers above ("6360").
std::string rate_text(double per_s);
// "ETA 42s", or "ETA ?" when the rate is not measured yet (s negative or NaN).
std::string eta_text(double s);

}  // namespace fastudy
