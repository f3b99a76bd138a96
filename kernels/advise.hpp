// The precision advisor (`fastudy advise`): which steps of a reading must stay in fp32 for flash
// attention to be as accurate as the baseline, found by intervention (Qiu & Yao, arXiv 2510.04212: move
// one operation to higher precision at a time and watch the error go). For one microbenchmark point
// (reading, format, shape, inputs, pass) it measures flash's and baseline's error against the fp64
// golden value with every policy step promoted alone to fp32 and demoted alone to the format, then
// keeps steps in fp32 greedily, the one that lowers flash's error most first, until flash is within
// the target: at or below the baseline's error under the reading as given, or `target_ulps` units of
// the format's unit roundoff. Error: rel_l2 = ||d||_2 / ||golden||_2 over O (forward) or dQ|dK|dV
// (backward), as the microbench's column (kernels/microbench.hpp); max |d| is one element, which the
// last storage rounding alone moves by up to a rounding of the output, too coarse to rank steps by.
//
// Against the baseline, two errors closer than the resolution of rel_l2 are equal: rel_l2 is the root
// mean square of n error terms, whose sample estimate has a relative standard error of about
// 1/sqrt(2n) (n the values compared); the target is the baseline's error times 1 + 2/sqrt(2n), two
// standard errors (n = 16384: 1.1%). An explicit target_ulps is taken as given.
#pragma once

#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/microbench.hpp"

namespace fastudy {

// A step is the reading's: promoting or demoting it changes it in the policy of each attention kind
// (ReadingPolicies) that runs it (kPolicySteps: "flash: ..." steps are flash's only, "baseline: ..."
// the baseline's) and has it in the format (promote) or wider (demote).
struct StepAdvice {
  std::string step;           // a kPolicySteps name
  bool in_format = false;     // the reading rounds this step to the point's format in a kind (it can be promoted)
  // Errors with this step alone promoted to fp32 (only when in_format; else the reading's own) and alone
  // demoted to the format (only when the reading keeps it wider; else the reading's own).
  double flash_promoted = 0, baseline_promoted = 0;
  double flash_demoted = 0, baseline_demoted = 0;
  // (flash - flash_promoted) / (flash - target) when flash exceeds the target, at most 1: the share of
  // flash's excess error this step removes alone (1: all of it; negative: it makes flash worse; 0 when
  // flash is within the target; shares need not add up to 1: steps interact).
  double share = 0;
  int order = 0;              // 1-based position in the minimal fp32 set, 0 when not in it
};

struct PointAdvice {
  MicrobenchPoint point;
  ReadingPolicies reading;    // the policies as given
  double flash = 0, baseline = 0;  // errors (rel_l2) under the reading
  double target = 0;               // the error flash has to reach
  double u = 0;                    // the format's unit roundoff (target_ulps is in these units)
  std::vector<StepAdvice> steps;   // kPolicySteps order
  std::vector<std::string> minimal;  // the steps kept in fp32, in the order the greedy search added them
  double reached = 0;              // flash's error with `minimal` in fp32
  bool met = false;                // reached <= target
};

// Advice for one point under `reading` (the point's format and rounding already applied by the caller:
// make_reading or a resolved custom policy, resolve_reading). target_ulps > 0: the target is target_ulps * u; 0: the
// baseline's error (within the resolution above). Runs the point's kernels 1 + 2 x (steps) + (greedy rounds x candidates) times.
PointAdvice advise_point(const MicrobenchPoint& point, const ReadingPolicies& reading, double target_ulps, int threads);

}  // namespace fastudy
