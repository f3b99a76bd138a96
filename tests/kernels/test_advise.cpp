// The precision advisor (kernels/advise.hpp) on constructed cases whose answers are known: the mixed
// reading (a GPU kernel) needs no step in fp32; mixed with only flash's running O stored in bf16 needs
// exactly that step back; the eager reading's excess comes first from flash's state between KV tiles
// (the running O, then the running max and sum), which the baseline does not have; an unreachable
// target is reported as not met.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "kernels/advise.hpp"

namespace fastudy {
namespace {

// bf16, N 256 in 16 KV tiles of 16: flash's running state is rounded 15 times per row under eager.
MicrobenchPoint point(const std::string& policy, Pass pass = Pass::forward) {
  MicrobenchPoint p;
  p.pass = pass;
  p.format = Format::bf16;
  p.policy = policy;
  p.seq_len = 256;
  p.head_dim = 32;
  p.block_q = 16;
  p.block_kv = 16;
  p.heads = 2;
  return p;
}

const StepAdvice& step(const PointAdvice& a, const std::string& name) {
  for (const auto& s : a.steps)
    if (s.step == name) return s;
  throw std::runtime_error("no step " + name);
}

TEST(Advise, MixedNeedsNoStepInFp32) {
  const PointAdvice a = advise_point(point("mixed"), make_reading("mixed", Format::bf16), 0, 2);
  EXPECT_LE(a.flash, a.target);
  EXPECT_TRUE(a.minimal.empty());
  EXPECT_TRUE(a.met);
  // Mixed stores Q, K, V, S, P, O and the gradients in bf16: those are the steps it could promote.
  std::set<std::string> in_format;
  for (const auto& s : a.steps)
    if (s.in_format) in_format.insert(s.step);
  EXPECT_EQ(in_format, (std::set<std::string>{"q", "k", "v", "s", "p", "o", "grad"}));
}

TEST(Advise, APlantedBf16RunningOutputIsTheOneStepToKeep) {
  ReadingPolicies planted = make_reading("mixed", Format::bf16);
  planted.flash.name = planted.baseline.name = "mixed_o_running";
  planted.flash.o_running = Format::bf16;
  const PointAdvice a = advise_point(point("mixed_o_running"), planted, 0, 2);
  ASSERT_GT(a.flash, a.baseline);
  EXPECT_EQ(a.minimal, std::vector<std::string>{"o_running"});
  EXPECT_TRUE(a.met);
  // With o_running back in fp32 the policy is mixed again: flash's error is mixed's.
  const PointAdvice mixed = advise_point(point("mixed"), make_reading("mixed", Format::bf16), 0, 2);
  EXPECT_EQ(a.reached, mixed.flash);
  EXPECT_EQ(step(a, "o_running").flash_promoted, mixed.flash);
  EXPECT_GT(step(a, "o_running").share, 0.5);
  // The baseline has no running O: promoting it leaves the baseline's error as it is.
  EXPECT_EQ(step(a, "o_running").baseline_promoted, a.baseline);
}

TEST(Advise, EagersExcessComesFromFlashsStateBetweenTiles) {
  const PointAdvice a = advise_point(point("eager"), make_reading("eager", Format::bf16), 0, 2);
  ASSERT_GT(a.flash, a.target);
  EXPECT_TRUE(a.met);
  // Eager's flash computes S = (Q K^T) * scale as two ops (`after`; 1/sqrt(32) is not a bf16 value, so
  // S is rounded twice), and keeps its running O in bf16, rounded after each of the 15 rescales of a
  // row: with those two in fp32 flash is within the target, S the larger single cause.
  std::string chosen;
  for (const std::string& s : a.minimal) chosen += s + " ";
  ASSERT_EQ(a.minimal.size(), 2u) << chosen;
  EXPECT_EQ(a.minimal[0], "s") << chosen;
  EXPECT_EQ(a.minimal[1], "o_running") << chosen;
  // The baseline keeps no state between tiles: promoting a state step leaves its error exactly as it is,
  // and lowers flash's.
  for (const char* name : {"o_running", "stats_running", "rescale", "exp_arg"}) {
    EXPECT_EQ(step(a, name).baseline_promoted, a.baseline) << name;
    EXPECT_LT(step(a, name).flash_promoted, a.flash) << name;
  }
  // Demoting a step eager keeps in fp32 (the accumulator) makes flash worse.
  EXPECT_GT(step(a, "accum").flash_demoted, a.flash);
}

TEST(Advise, BackwardAndAnUnreachableTargetAreReported) {
  // A target of 1e-6 u of bf16 (2^-28, below fp32's unit roundoff): bf16 storage of Q, K, V alone
  // exceeds it, and promoting every step leaves the error of fp32 arithmetic, above it.
  MicrobenchPoint p = point("pure", Pass::backward);
  p.seq_len = 64;
  p.heads = 1;
  const PointAdvice a = advise_point(p, make_reading("pure", Format::bf16), 1e-6, 2);
  EXPECT_FALSE(a.met);
  EXPECT_GT(a.reached, a.target);
  EXPECT_LT(a.reached, a.flash);
  EXPECT_DOUBLE_EQ(a.target, 1e-6 * std::ldexp(1.0, -8));
}

}  // namespace
}  // namespace fastudy
