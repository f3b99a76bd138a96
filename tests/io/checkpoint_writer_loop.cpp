// Helper for the kill test: writes checkpoints of an ~4 MB state to OUT/checkpoints/v/ in a loop,
// step 1, 2, 3, ... until killed. Started by test_kill.cpp without mpirun (one rank).
//   checkpoint_writer_loop OUT
#include <cstdio>
#include <string>

#include "src/io/checkpoint.hpp"
#include "tests/common/mpi_scratch.hpp"

int main(int argc, char** argv) {
  fastudy::mpi::MpiSession session(&argc, &argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_writer_loop OUT\n");
    return 2;
  }
  fastudy::mpi::Comm world = fastudy::mpi::Comm::world();
  fastudy::TrainState s = fastudy::testing_mpi::make_state(1);
  s.params.push_back(fastudy::testing_mpi::make_array("big.weight", {1024, 1024}, fastudy::DType::f32, 7));
  for (std::int64_t step = 1;; ++step) {
    s.step = step;
    fastudy::write_checkpoint(world, fastudy::checkpoint_path(argv[1], "v", step), s);
  }
}
