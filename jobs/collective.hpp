// Helpers that keep the ranks of an MPI job in step when one of them hits an error.
#pragma once

#include <exception>
#include <functional>

namespace fastudy {

namespace mpi {
class Comm;
}

// An error that another rank has already reported: main() exits with code() and prints nothing.
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

// Sets a flag on SIGTERM and SIGUSR1 (what Slurm sends before a time limit); the trainer polls it and
// checkpoints at the next step.
void install_stop_signals();
bool stop_signal_received();

}  // namespace fastudy
