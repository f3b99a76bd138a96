// The dynamic scheduler: every task runs exactly once on one group whatever the ratio of tasks to
// groups, failures and divergences are recorded and the study goes on, resume skips finished tasks
// (and keeps the rows of tasks it does not schedule), status.csv round-trips, and `fastudy status`
// counts per state and axis value. Also the static largest-first deal of tasks to ranks (deal.hpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/checksum.hpp"
#include "base/quote.hpp"
#include "src/runtime/deal.hpp"
#include "src/runtime/scheduler.hpp"
#include "tests/common/mpi_scratch.hpp"

namespace fastudy {
namespace {

using mpi::Comm;
using testing_mpi::scratch_dir;

std::vector<std::string> ids(int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back("task-" + std::to_string(i));
  return v;
}

// Runs a schedule whose tasks record which group ran them; returns, on every rank, how many times
// each task was run (counted once per group).
std::vector<std::int64_t> run_and_count(const Comm& world, int per_group, int tasks, const std::string& csv,
                                        ScheduleResult* result, const ScheduleOptions& opt = {}) {
  std::vector<std::int64_t> runs(static_cast<std::size_t>(tasks), 0);
  TaskFn fn = [&](int task, Comm& group, Progress& progress) {
    EXPECT_EQ(group.size(), per_group);
    // Every rank of the group got the same task.
    EXPECT_EQ(group.allreduce_max(std::int64_t{task}), task);
    if (group.is_root()) ++runs[static_cast<std::size_t>(task)];
    progress.report(5, 1.25);
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * (task % 3)));  // uneven task lengths
    TaskOutcome o;
    o.step = 10 + task;
    o.loss = 1.0 / (1 + task);
    return o;
  };
  *result = run_schedule(world, per_group, ids(tasks), fn, csv, opt);
  world.allreduce_sum(runs.data(), runs.size());
  return runs;
}

class Schedule : public ::testing::TestWithParam<int> {};

TEST_P(Schedule, EveryTaskRunsOnceWithMoreAndFewerTasksThanGroups) {
  Comm world = Comm::world();
  const int per_group = GetParam();
  if (world.size() % per_group != 0) GTEST_SKIP() << "world size not a multiple of " << per_group;
  const int groups = world.size() / per_group;
  const std::string dir = scratch_dir(world, "sched" + std::to_string(per_group));
  for (int tasks : {0, 1, groups + 5, 3 * groups}) {
    const std::string csv = dir + "/status-" + std::to_string(tasks) + ".csv";
    ScheduleResult r;
    std::vector<std::int64_t> runs = run_and_count(world, per_group, tasks, csv, &r);
    for (int t = 0; t < tasks; ++t) EXPECT_EQ(runs[t], 1) << "task " << t << " of " << tasks;
    EXPECT_EQ(r.done, tasks);
    EXPECT_TRUE(r.all_done());
    ASSERT_EQ(r.rows.size(), static_cast<std::size_t>(tasks));
    for (int t = 0; t < tasks; ++t) {
      EXPECT_EQ(r.rows[t].variant, "task-" + std::to_string(t));
      EXPECT_EQ(r.rows[t].state, TaskState::done);
      EXPECT_EQ(r.rows[t].step, 10 + t);
      EXPECT_TRUE(r.rows[t].has_loss);
      EXPECT_DOUBLE_EQ(r.rows[t].loss, 1.0 / (1 + t));
    }
    if (world.is_root()) {
      std::vector<StatusRow> file = read_status_csv(csv);
      ASSERT_EQ(file.size(), r.rows.size());
      for (std::size_t i = 0; i < file.size(); ++i) EXPECT_EQ(file[i].state, TaskState::done);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RanksPerGroup, Schedule, ::testing::Values(1, 2));

TEST(Scheduler, FailuresAreRecordedAndTheStudyGoesOnThenResumeSkipsDone) {
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "fail");
  const std::string csv = dir + "/status.csv";
  std::atomic<int> calls{0};
  bool fail_now = true;
  TaskFn fn = [&](int task, Comm& group, Progress& progress) {
    if (group.is_root()) ++calls;
    TaskOutcome o;
    o.step = 3;
    progress.report(2, 0.75);
    if (task == 1 && fail_now) throw Error("loss is NaN, at step 3: \"giving up\"\nsecond line");
    if (task == 2 && fail_now) {
      o.state = TaskState::diverged;
      o.reason = "loss spike 9.1x the running mean";
    }
    if (task == 4 && fail_now && group.rank() == group.size() - 1) {
      o.state = TaskState::failed;  // only the last rank of the group sees the problem
      o.reason = "non-finite gradient";
    }
    return o;
  };
  ScheduleResult r = run_schedule(world, 1, ids(6), fn, csv);
  EXPECT_EQ(r.done, 3);
  EXPECT_EQ(r.failed, 2);
  EXPECT_EQ(r.diverged, 1);
  EXPECT_FALSE(r.all_done());
  EXPECT_EQ(r.rows[1].state, TaskState::failed);
  // The reason goes through status.csv, whose lines are one line each: the line break becomes a blank.
  EXPECT_EQ(r.rows[1].reason, "loss is NaN, at step 3: \"giving up\" second line");
  EXPECT_EQ(r.rows[1].step, 2);  // a task that threw keeps its last reported progress
  EXPECT_EQ(r.rows[1].loss, 0.75);
  EXPECT_EQ(r.rows[2].state, TaskState::diverged);
  EXPECT_EQ(r.rows[2].reason, "loss spike 9.1x the running mean");
  EXPECT_EQ(r.rows[4].state, TaskState::failed);
  EXPECT_FALSE(r.rows[4].has_loss);
  EXPECT_EQ(world.allreduce_sum(std::int64_t{calls}), 6);

  // Resume: only the tasks not done run again; now they succeed.
  fail_now = false;
  calls = 0;
  r = run_schedule(world, 1, ids(6), fn, csv);
  EXPECT_EQ(world.allreduce_sum(std::int64_t{calls}), 3);
  EXPECT_EQ(r.skipped, 3);
  EXPECT_EQ(r.done, 6);
  EXPECT_TRUE(r.all_done());
  // Without resume everything runs.
  calls = 0;
  ScheduleOptions fresh;
  fresh.resume = false;
  r = run_schedule(world, 1, ids(6), fn, csv, fresh);
  EXPECT_EQ(world.allreduce_sum(std::int64_t{calls}), 6);

  // Resume of a subset (train --variant): the other tasks' rows stay in status.csv as they were, and
  // only the subset is in the result.
  const std::vector<std::string> all = ids(6);
  r = run_schedule(world, 1, {all[2], all[4]}, fn, csv);
  EXPECT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.skipped, 2);
  if (world.rank() == 0) {
    const std::vector<StatusRow> kept = read_status_csv(csv);
    ASSERT_EQ(kept.size(), 6u);
    for (const auto& row : kept) EXPECT_EQ(row.state, TaskState::done) << row.variant;
  }
}

TEST(Scheduler, ProgressReachesStatusCsvWhileRunning) {
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "progress");
  const std::string csv = dir + "/status.csv";
  ScheduleOptions opt;
  opt.status_interval_s = 0;
  opt.progress_interval_s = 0;
  std::vector<StatusRow> seen;
  int watched = -1;  // the first task world rank 0 runs: it watches that task's row
  TaskFn fn = [&](int task, Comm& group, Progress& progress) {
    progress.report(7, 0.5);
    if (watched < 0 && world.is_root()) {
      watched = task;
      // The coordinator may be a thread on this rank: wait until it has written the update.
      for (int i = 0; i < 400 && (seen.empty() || seen[task].step != 7); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        seen = read_status_csv(csv);
      }
    }
    (void)group;
    return TaskOutcome{TaskState::done, 9, 0.25, ""};
  };
  ScheduleResult r = run_schedule(world, 1, ids(2 * world.size()), fn, csv, opt);
  if (world.is_root()) {
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen[watched].state, TaskState::running);
    EXPECT_EQ(seen[watched].step, 7);
    EXPECT_EQ(seen[watched].loss, 0.5);
  }
  for (const auto& row : r.rows) EXPECT_EQ(row.step, 9);
}

TEST(Scheduler, LayoutErrorsBeforeAnythingRuns) {
  EXPECT_NO_THROW(check_layout(4, 2));
  EXPECT_NO_THROW(check_layout(1, 1));
  try {
    check_layout(5, 2);
    FAIL() << "no exception";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of ranks_per_variant = 2"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("mpirun -n 4 or -n 6"), std::string::npos) << e.hint();
  }
  EXPECT_THROW(check_layout(1, 2), UsageError);
  EXPECT_THROW(check_layout(4, 0), UsageError);
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "layout");
  TaskFn never = [](int, Comm&, Progress&) -> TaskOutcome { throw std::logic_error("must not run"); };
  EXPECT_THROW(run_schedule(world, world.size() + 1, ids(2), never, dir + "/s.csv"), UsageError);
  EXPECT_THROW(run_schedule(world, 1, {"a", "b", "a"}, never, dir + "/s.csv"), UsageError);
  EXPECT_FALSE(std::filesystem::exists(dir + "/s.csv"));
}

// Largest first, each to the least loaded rank, ties to the lower rank and in task order. Worked by
// hand for costs 2 5 1 3 2 3 on 2 ranks, in dealing order (cost, task -> rank, loads after):
// 5, 1 -> 0 (5 0); 3, 3 -> 1 (5 3); 3, 5 -> 1 (5 6); 2, 0 -> 0 (7 6); 2, 4 -> 1 (7 8); 1, 2 -> 0 (8 8).
TEST(Deal, LargestFirstToTheLeastLoadedRank) {
  EXPECT_EQ(deal_largest_first({2, 5, 1, 3, 2, 3}, 2), (std::vector<int>{0, 0, 0, 1, 1, 1}));
  // Equal costs go round-robin in task order; one rank takes everything; no tasks, no owners.
  EXPECT_EQ(deal_largest_first({1, 1, 1, 1, 1}, 3), (std::vector<int>{0, 1, 2, 0, 1}));
  EXPECT_EQ(deal_largest_first({4, 0, 9}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_TRUE(deal_largest_first({}, 4).empty());
  // More ranks than tasks: each task alone on the lowest ranks.
  EXPECT_EQ(deal_largest_first({1, 2}, 4), (std::vector<int>{1, 0}));
  EXPECT_THROW(deal_largest_first({1}, 0), std::invalid_argument);
}

TEST(Status, CsvRoundTripWithQuotingAndATable) {
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "status");
  if (!world.is_root()) return;
  std::vector<StatusRow> rows(4);
  rows[0] = {"flash-bf16-s1", TaskState::done, 200, 2.5, true, 41.25, ""};
  rows[1] = {"baseline-bf16-s1", TaskState::failed, 37, 0, false, 6.5, "bad, \"really\"\nbad"};
  rows[2] = {"flash-fp32-s1", TaskState::running, 120, 3.125, true, 20, ""};
  rows[3] = {"baseline-fp32-s1", TaskState::diverged, 80, 9.5, true, 12, "spike"};
  write_status_csv(dir + "/sub/status.csv", rows);
  std::vector<StatusRow> back = read_status_csv(dir + "/sub/status.csv");
  ASSERT_EQ(back.size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(back[i].variant, rows[i].variant);
    EXPECT_EQ(back[i].state, rows[i].state);
    EXPECT_EQ(back[i].step, rows[i].step);
    EXPECT_EQ(back[i].has_loss, rows[i].has_loss);
    EXPECT_EQ(back[i].loss, rows[i].loss);
    EXPECT_EQ(back[i].wall_time_s, rows[i].wall_time_s);
    EXPECT_EQ(back[i].reason, one_line(rows[i].reason));  // quotes and commas kept, a line break a blank
  }
  EXPECT_EQ(back[1].reason, "bad, \"really\" bad");
  VariantAxes axes;
  axes["flash-bf16-s1"] = {{"attention", "flash"}, {"precision", "bf16"}};
  axes["baseline-bf16-s1"] = {{"attention", "baseline"}, {"precision", "bf16"}};
  axes["flash-fp32-s1"] = {{"attention", "flash"}, {"precision", "fp32"}};
  axes["baseline-fp32-s1"] = {{"attention", "baseline"}, {"precision", "fp32"}};
  std::ostringstream os;
  print_status(os, dir + "/sub/status.csv", axes);
  const std::string t = os.str();
  for (const char* want : {"4 variants: 1 running, 1 done, 1 diverged, 1 failed", "by attention:",
                           "  flash          1 running, 1 done", "  baseline       1 diverged, 1 failed",
                           "by precision:", "  bf16           1 done, 1 failed", "flash-bf16-s1     done"}) {
    EXPECT_NE(t.find(want), std::string::npos) << "missing '" << want << "' in\n" << t;
  }
  EXPECT_THROW(print_status(os, dir + "/none.csv", axes), Error);
  { std::ofstream(dir + "/bad.csv") << "variant,state,step,loss,wall_time_s,reason\nx,sleeping,1,2,3,\n"; }
  // Not written by fastudy: refused before it is parsed.
  try {
    read_status_csv(dir + "/bad.csv");
    FAIL() << "no exception";
  } catch (const IntegrityError& e) {
    EXPECT_NE(std::string(e.what()).find("no checksum file"), std::string::npos) << e.what();
  }
  // Sealed but malformed: the parser names the line.
  write_checksum(dir + "/bad.csv");
  try {
    read_status_csv(dir + "/bad.csv");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.csv:2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fastudy
