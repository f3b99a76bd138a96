#include "jobs/collective.hpp"

#include <csignal>
#include <iostream>

#include "base/error.hpp"
#include "base/log.hpp"
#include "src/core/config.hpp"
#include "src/runtime/mpi.hpp"

namespace fastudy {

namespace {
// The only process-wide flag: written by the signal handler, read by the training loop.
volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop_signal(int) { g_stop = 1; }
}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

bool stop_signal_received() { return g_stop != 0; }

int print_error(const std::exception& e) {
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
    } catch (const std::exception& e) {
      code = print_error(e);
    }
  }
  world.bcast(code);
  if (code != kExitOk) throw SilentExit(static_cast<int>(code));
}

}  // namespace fastudy
