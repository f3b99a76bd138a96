// Helper for test_kill.cpp: calls mpi::abort(3, ...) right after MPI start-up (one rank, no mpirun).
#include "src/runtime/mpi.hpp"

int main(int argc, char** argv) {
  fastudy::mpi::MpiSession session(&argc, &argv);
  fastudy::mpi::abort(3, "variant x: rank lost its data");
}
