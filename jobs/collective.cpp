#include "jobs/collective.hpp"

#include <csignal>

#include "src/config.hpp"
#include "src/runtime/mpi.hpp"
#include "src/util/error.hpp"

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

void on_root(const mpi::Comm& world, const std::function<void()>& fn) {
  std::exception_ptr error;
  std::int64_t code = kExitOk;
  if (world.rank() == 0) {
    try {
      fn();
    } catch (const ConfigError&) {
      error = std::current_exception(), code = kExitUsage;
    } catch (const UsageError&) {
      error = std::current_exception(), code = kExitUsage;
    } catch (...) {
      error = std::current_exception(), code = kExitFailure;
    }
  }
  world.bcast(code);
  if (code == kExitOk) return;
  if (world.rank() == 0) std::rethrow_exception(error);
  throw SilentExit(static_cast<int>(code));
}

}  // namespace fastudy
