// The console's progress (issue 30): ProgressLine's rate limits and modes on a fake clock, with
// std::cout captured (base/progress.hpp), the time texts, and the train phase's ETA by plan's rule
// with step times measured as the variants train (jobs/train_progress.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <sstream>

#include "base/log.hpp"
#include "base/progress.hpp"
#include "jobs/train_progress.hpp"

namespace fastudy {
namespace {

// std::cout into a string for the test's life.
class CaptureStdout {
 public:
  CaptureStdout() : old_(std::cout.rdbuf(buf_.rdbuf())) {}
  ~CaptureStdout() { std::cout.rdbuf(old_); }
  std::string text() const { return buf_.str(); }

 private:
  std::ostringstream buf_;
  std::streambuf* old_;
};

TEST(ProgressLine, LinesComeAtMostEveryIntervalAndEventsAtOnce) {
  double now = 100.0;
  CaptureStdout out;
  ProgressLine line(ProgressMode::lines, 10.0, [&] { return now; });
  line.update("a");  // at the start: no line yet
  now += 9.9;
  line.update("b");  // within the interval
  EXPECT_EQ(out.text(), "");
  now += 0.2;
  line.update("c");  // 10.1 s after the start
  now += 1.0;
  line.update("d");  // 1 s after the last line: held back
  line.update("e", true);  // an event: at once
  line.finish();
  EXPECT_EQ(out.text(), "c\ne\n");  // plain lines: no carriage return, no escape sequence
}

TEST(ProgressLine, QuietPrintsNothing) {
  double now = 0.0;
  CaptureStdout out;
  ProgressLine line(ProgressMode::quiet, 1.0, [&] { return now; });
  for (int i = 0; i < 5; ++i, now += 2.0) line.update("x", i % 2 == 0);
  line.finish();
  EXPECT_EQ(out.text(), "");
}

TEST(ProgressLine, TimeTexts) {
  EXPECT_EQ(format_seconds(0.4), "0s");
  EXPECT_EQ(format_seconds(42.0), "42s");
  EXPECT_EQ(format_seconds(185.0), "3m05s");
  EXPECT_EQ(format_seconds(7800.0), "2h10m");
  EXPECT_EQ(eta_text(NAN), "ETA ?");
  EXPECT_EQ(eta_text(-1.0), "ETA ?");
  EXPECT_EQ(rate_text(85.24), "85.2");
  EXPECT_EQ(rate_text(6364.2), "6364");
}

Variant variant(const std::string& id, const std::string& precision, const std::string& seed, std::int64_t steps) {
  Variant v;
  v.id = id;
  v.axes = {{"precision", precision}, {"seed", seed}};
  v.train.steps = steps;
  return v;
}

StatusRow row(const Variant& v, TaskState state, std::int64_t step) {
  StatusRow r;
  r.variant = v.id;
  r.state = state;
  r.step = step;
  return r;
}

TEST(TrainProgress, EtaByPlansRuleWithMeasuredStepTimes) {
  // Two kinds (precision fp32, bf16; seed is a replicate), 100 steps each, on one group.
  const Variant a = variant("fp32-s1", "fp32", "1", 100), b = variant("fp32-s2", "fp32", "2", 100),
                c = variant("bf16-s1", "bf16", "1", 100);
  TrainProgress p({&a, &b, &c}, 1, 0.0);
  std::vector<StatusRow> rows{row(a, TaskState::running, 0), row(b, TaskState::queued, 0), row(c, TaskState::queued, 0)};
  EXPECT_FALSE(p.update(rows, 0.0));
  EXPECT_TRUE(std::isnan(p.eta_s()));  // nothing measured yet
  EXPECT_EQ(p.text(), "train: 0/3 variants, 0/300 steps, 0 steps/s, ETA ?");
  rows[0].step = 1;  // the first report starts the clock (start-up is not a step)
  p.update(rows, 1.0);
  EXPECT_TRUE(std::isnan(p.eta_s()));
  rows[0].step = 51;  // 50 steps in 5 s: 0.1 s per fp32 step
  p.update(rows, 6.0);
  // a: 49 steps left (4.9 s), then b (100 x 0.1) and c (the mean of the kinds seen: 0.1 s/step).
  EXPECT_NEAR(p.eta_s(), 4.9 + 10.0 + 10.0, 1e-9);
  EXPECT_EQ(p.text(), "train: 0/3 variants, 51/300 steps, 8.33 steps/s, ETA 25s");
  rows[0] = row(a, TaskState::done, 100);
  rows[1] = row(b, TaskState::running, 0);
  EXPECT_TRUE(p.update(rows, 10.9));  // a finished
  rows[2].state = TaskState::queued;
  EXPECT_NEAR(p.eta_s(), 10.0 + 10.0, 1e-9);
  // c's kind is measured once it trains: 0.3 s per bf16 step.
  rows[1] = row(b, TaskState::done, 100);
  rows[2] = row(c, TaskState::running, 0);
  p.update(rows, 21.0);
  rows[2].step = 1;
  p.update(rows, 22.0);
  rows[2].step = 11;
  p.update(rows, 25.0);
  EXPECT_NEAR(p.eta_s(), 89 * 0.3, 1e-9);
  // 109 steps timed in 25 s (a's 99 after its first report, c's 10; b reported none between start and end).
  EXPECT_EQ(p.text(), "train: 2/3 variants, 211/300 steps, 4.36 steps/s, ETA 27s");
}

TEST(TrainProgress, AFailedVariantIsNotCountedAsTrained) {
  // b failed before it trained a step (its error recorded in status.csv): neither it nor its steps are done.
  const Variant a = variant("a", "fp32", "1", 100), b = variant("b", "fp32", "2", 100), c = variant("c", "bf16", "1", 100);
  TrainProgress p({&a, &b, &c}, 1, 0.0);
  p.update({row(a, TaskState::done, 100), row(b, TaskState::failed, 0), row(c, TaskState::failed, 40)}, 1.0);
  EXPECT_EQ(p.text().rfind("train: 1/3 variants, 140/300 steps, ", 0), 0u) << p.text();
}

TEST(TrainProgress, GroupsShareTheQueueAndSkippedVariantsCountAsDone) {
  // Two groups; the first variant was done before (resume: skipped, never running); b and c train at
  // once at 0.1 s/step, d waits for the first group that becomes free.
  const Variant a = variant("a", "fp32", "1", 100), b = variant("b", "fp32", "2", 100),
                c = variant("c", "fp32", "3", 100), d = variant("d", "fp32", "4", 100);
  TrainProgress p({&a, &b, &c, &d}, 2, 0.0);
  std::vector<StatusRow> rows{row(a, TaskState::done, 100), row(b, TaskState::running, 0),
                              row(c, TaskState::running, 0), row(d, TaskState::queued, 0)};
  p.update(rows, 0.0);
  rows[1].step = rows[2].step = 1;
  p.update(rows, 0.5);
  rows[1].step = 41;  // 40 steps in 4 s
  rows[2].step = 31;  // 30 steps in 4 s
  p.update(rows, 4.5);
  // 70 steps in 8 s: 8/70 s per step; b frees its group first (59 steps left), then d (100) goes there.
  EXPECT_NEAR(p.eta_s(), (59 + 100) * 8.0 / 70.0, 1e-9);
  EXPECT_EQ(p.text(), "train: 1/4 variants, 172/400 steps, 15.6 steps/s, ETA 18s");
}

}  // namespace
}  // namespace fastudy
