// [train] dp_width is the modelled data-parallel width, not the physical one: under mpirun with 1, 2
// and 4 ranks, a dp_width = 4 variant trained by a group of all the ranks (each computes 4 / R shards,
// the shard gradients are exchanged by MPI_Allgather and summed in the declared order on every rank)
// must give bit-identical weights, optimizer state and losses to the same variant trained by one rank
// alone, for every allreduce order and with grad_accum micro-batches too. The group is the whole
// world, as `fastudy train` builds it with ranks_per_variant = world size.
#include <gtest/gtest.h>

#include <string>

#include "src/runtime/mpi.hpp"
#include "src/train/trainer.hpp"
#include "tests/train/tiny.hpp"

namespace fastudy {
namespace {

TrainState train_on(const Variant& v, const mpi::Comm* group, const std::string& dir) {
  TrainState last;
  TrainHooks hooks;
  if (group != nullptr && group->size() > 1) {
    hooks.rank = group->rank();
    hooks.world = group->size();
    hooks.allreduce_mean_f32 = [](float*, std::size_t) { FAIL() << "dp_width set: the shards are gathered, not averaged"; };
    hooks.allreduce_mean_f64 = [](double*, std::size_t) { FAIL() << "dp_width set: the shards are gathered, not averaged"; };
    hooks.allgather_f32 = [group](const float* p, std::size_t n, float* out) { group->allgather(p, n, out); };
    hooks.allgather_f64 = [group](const double* p, std::size_t n, double* out) { group->allgather(p, n, out); };
  }
  hooks.save_checkpoint = [&](const TrainState& s) { last = s; };
  const TrainResult r = train_variant(v, dir, hooks, nullptr);
  EXPECT_EQ(r.outcome, TrainOutcome::done);
  return last;
}

TEST(LoopAxesMpi, DpWidth4GivesTheSameWeightsOnAnyGroupSizeThatDividesIt) {
  const mpi::Comm world = mpi::Comm::world();
  ASSERT_EQ(4 % world.size(), 0) << "run with 1, 2 or 4 ranks";
  const std::string root = (train_test::scratch_root() / ("rank" + std::to_string(world.rank()))).string();
  for (const std::string order : {"rank", "ring", "tree"}) {
    for (int accum : {1, 2}) {
      SCOPED_TRACE(order + ", grad_accum " + std::to_string(accum));
      Variant v = train_test::tiny_variant(AttentionKind::flash, Format::fp32);
      v.train.batch = 8;
      v.train.steps = 4;
      v.train.dp_width = 4;
      v.train.allreduce = *parse_reduce_order(order);
      v.train.grad_accum = accum;
      v.train.ranks_per_variant = world.size();
      const TrainState group = train_on(v, &world, root + "/group");
      const TrainState alone = train_on(v, nullptr, root + "/alone");
      EXPECT_EQ(group.step, 4);
      train_test::expect_identical(group, alone);
    }
  }
}

}  // namespace
}  // namespace fastudy

int main(int argc, char** argv) {
  fastudy::mpi::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const fastudy::mpi::Comm world = fastudy::mpi::Comm::world();
  if (world.rank() != 0) {  // one report: the other ranks still run every test and its collectives
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  std::int64_t failed = RUN_ALL_TESTS();
  return static_cast<int>(world.allreduce_max(failed));  // the session finalises MPI
}
