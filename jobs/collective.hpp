// Helpers that keep the ranks of an MPI job in step when one of them hits an error.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace fastudy {

namespace mpi {
class Comm;
}

// An error that another rank (or a child process, such as the report's renderer) has already
// reported: main() exits with code() and prints nothing.
class SilentExit : public std::exception {
 public:
  explicit SilentExit(int code) : code_(code) {}
  int code() const { return code_; }
  const char* what() const noexcept override { return "error reported by another rank"; }

 private:
  int code_;
};

// Prints "error: <message>" and, for a fastudy::Error with a hint, "hint: <hint>" to stderr; returns the
// exit code of the error (2 for configuration and usage errors, 1 otherwise).
int print_error(const std::exception& e);

// Runs fn on rank 0 only. If it throws, rank 0 prints the error and every rank throws SilentExit with
// its exit code, so all ranks leave together and the message is printed once.
void on_root(const mpi::Comm& world, const std::function<void()>& fn);

// Sets a flag on SIGTERM, SIGINT and SIGUSR1 (what Slurm sends before a time limit); the trainer polls
// it and checkpoints at the next step. Signals always stop the tool: a second SIGTERM/SIGINT, or the
// end of a grace period after the first (FASTUDY_STOP_GRACE_S, default 60 s; not after SIGUSR1), ends
// the process at once even inside a library call, with exit code 143 (128 + SIGTERM): the child
// process (set_child_to_stop) is killed and the study lock (set_lock_to_release) removed first.
void install_stop_signals();
// FASTUDY_STOP_GRACE_S in seconds (60 when unset); UsageError for anything but 0 to 86399. main()
// checks it with the command line, before anything runs.
unsigned stop_grace_seconds();
bool stop_signal_received();
// The process the first stop signal is forwarded to (SIGTERM) and the hard stop kills; 0: none.
void set_child_to_stop(long pid);
// The lock file the hard stop removes; "" for none. (StudyLock sets it.)
void set_lock_to_release(const std::string& path);

}  // namespace fastudy
