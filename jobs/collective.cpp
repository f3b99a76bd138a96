#include "jobs/collective.hpp"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "base/error.hpp"
#include "base/log.hpp"
#include "src/core/config.hpp"
#include "src/runtime/mpi.hpp"

namespace fastudy {

namespace {
// The process-wide state of the stop signals: written by the handlers (and set_* below), read by the
// training loop. Only async-signal-safe calls in the handlers: kill, unlink, write, alarm, _exit.
volatile std::sig_atomic_t g_stop = 0;
volatile std::sig_atomic_t g_terms = 0;          // SIGTERM/SIGINT received
volatile std::sig_atomic_t g_child = 0;          // pid of the child to stop, 0 for none
unsigned g_grace_s = 60;                          // set before the handlers are installed
char g_lock_path[4096] = {};                      // the lock to remove on a hard stop

extern "C" void hard_stop(int) {
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), SIGKILL);
  if (g_lock_path[0] != '\0') ::unlink(g_lock_path);
  static const char msg[] = "error: stopped by a signal (second signal or grace period over); run again with --resume\n";
  const ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
  ::_exit(128 + SIGTERM);
}

extern "C" void on_stop_signal(int sig) {
  g_stop = 1;
  if (sig == SIGUSR1) return;
  if (g_terms > 0) hard_stop(sig);
  g_terms = 1;
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), SIGTERM);
  if (g_grace_s > 0) ::alarm(g_grace_s);
}
}  // namespace

unsigned stop_grace_seconds() {
  const char* g = std::getenv("FASTUDY_STOP_GRACE_S");
  if (g == nullptr) return 60;
  const std::string text(g);
  constexpr std::size_t kMaxDigits = 5;  // up to 86399 s: a day
  const bool digits = !text.empty() && text.size() <= kMaxDigits &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  const unsigned long v = digits ? std::stoul(text) : 0;
  if (!digits || v >= 86400)
    throw UsageError(
        "FASTUDY_STOP_GRACE_S = '" + text + "' is not a number of seconds from 0 to 86399",
        "set it to the seconds a stopping job may take to checkpoint (default 60; 0: no deadline), or unset it");
  return static_cast<unsigned>(v);
}

void install_stop_signals() {
  g_grace_s = stop_grace_seconds();
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  struct sigaction alarm_sa {};
  alarm_sa.sa_handler = hard_stop;
  sigemptyset(&alarm_sa.sa_mask);
  sigaction(SIGALRM, &alarm_sa, nullptr);
}

bool stop_signal_received() { return g_stop != 0; }

void set_child_to_stop(long pid) { g_child = static_cast<std::sig_atomic_t>(pid); }

void set_lock_to_release(const std::string& path) {
  g_lock_path[0] = '\0';
  if (path.size() < sizeof g_lock_path) {
    std::memcpy(g_lock_path, path.c_str(), path.size() + 1);
  }
}

int print_error(const std::exception& e) {
  log::clear_status();  // the error starts its own line, not after a progress line
  log::error(e.what());
  const auto* fe = dynamic_cast<const Error*>(&e);
  if (fe && !fe->hint().empty()) std::cerr << "hint: " << fe->hint() << "\n" << std::flush;
  if (dynamic_cast<const ConfigError*>(&e) || dynamic_cast<const UsageError*>(&e)) return kExitUsage;
  return kExitFailure;
}

void on_root(const mpi::Comm& world, const std::function<void()>& fn) {
  std::int64_t code = kExitOk;
  if (world.rank() == 0) {
    try {
      fn();
    } catch (const SilentExit& e) {
      code = e.code();  // already reported (by a child process that printed its own line)
    } catch (const std::exception& e) {
      code = print_error(e);
    }
  }
  world.bcast(code);
  if (code != kExitOk) throw SilentExit(static_cast<int>(code));
}

}  // namespace fastudy
