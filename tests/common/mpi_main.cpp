// GoogleTest main for the runner tests, which run whole under mpirun (1, 2 and 4 ranks): MPI is
// initialised here for the whole binary. Rank 0 prints the usual report; the other ranks print only
// their failures, prefixed with their rank. Scratch files are removed when every test passed.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "base/log.hpp"
#include "src/runtime/mpi.hpp"

namespace {

class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::cerr << "[rank " << rank_ << "] " << (r.file_name() ? r.file_name() : "?") << ":" << r.line_number()
              << ": " << r.summary() << std::endl;
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  fastudy::mpi::MpiSession session(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  const int rank = fastudy::mpi::Comm::world().rank();
  fastudy::log::set_console(rank == 0);
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int failed = RUN_ALL_TESTS();
  // Every rank must agree on the exit status, or mpirun may report success for a failing rank.
  fastudy::mpi::Comm world = fastudy::mpi::Comm::world();
  const bool any_failed = world.allreduce_max(static_cast<std::int64_t>(failed)) != 0;
  // The scratch directories of this run (named after rank 0's pid) stay behind only on failure.
  if (rank == 0 && !any_failed) {
    const std::string suffix = "-" + std::to_string(::getpid());
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(std::string(FASTUDY_BINARY_DIR) + "/mpi-test-tmp", ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        std::filesystem::remove_all(e.path(), ec);
      }
    }
  }
  return any_failed ? 1 : 0;
}
