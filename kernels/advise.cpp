// advise_point(): the precision advisor's measurements and greedy search (see advise.hpp).
#include "kernels/advise.hpp"

#include <algorithm>
#include <cmath>

namespace fastudy {
namespace {

struct Errors {
  double flash = 0, baseline = 0;
};

Errors measure(const MicrobenchPoint& point, const PrecisionPolicy& policy, int threads) {
  Errors e;
  for (const MicrobenchRow& row : run_microbench_point(point, policy, threads)) {
    if (row.algorithm == "flash") e.flash = row.rel_l2;
    if (row.algorithm == "baseline") e.baseline = row.rel_l2;
  }
  return e;
}

}  // namespace

PointAdvice advise_point(const MicrobenchPoint& point, const PrecisionPolicy& reading, double target_ulps, int threads) {
  PointAdvice a;
  a.point = point;
  a.reading = reading;
  const Errors base = measure(point, reading, threads);
  a.flash = base.flash;
  a.baseline = base.baseline;
  a.u = unit_roundoff(point.format);
  // The values rel_l2 runs over: O (forward) or dQ, dK, dV (backward).
  const double n = static_cast<double>(point.batch) * point.heads * point.seq_len * point.head_dim *
                   (point.pass == Pass::backward ? 3 : 1);
  a.target = target_ulps > 0 ? target_ulps * a.u : a.baseline * (1.0 + 2.0 / std::sqrt(2.0 * n));

  const Format f = point.format;
  for (const PolicyStep& step : kPolicySteps) {
    StepAdvice s;
    s.step = std::string(step.name);
    s.in_format = reading.*step.member == f && f != Format::fp32 && f != Format::fp64;
    s.flash_promoted = s.flash_demoted = a.flash;
    s.baseline_promoted = s.baseline_demoted = a.baseline;
    if (s.in_format) {
      PrecisionPolicy p = reading;
      p.*step.member = Format::fp32;
      const Errors e = measure(point, p, threads);
      s.flash_promoted = e.flash;
      s.baseline_promoted = e.baseline;
      if (a.flash > a.target) s.share = std::min(1.0, (a.flash - e.flash) / (a.flash - a.target));
    } else if (reading.*step.member != f && unit_roundoff(reading.*step.member) < unit_roundoff(f)) {
      PrecisionPolicy p = reading;
      p.*step.member = f;
      const Errors e = measure(point, p, threads);
      s.flash_demoted = e.flash;
      s.baseline_demoted = e.baseline;
    }
    a.steps.push_back(s);
  }

  // Greedy: while flash is above the target, keep in fp32 the step that lowers its error most.
  PrecisionPolicy current = reading;
  a.reached = a.flash;
  while (a.reached > a.target) {
    int best = -1;
    double best_error = a.reached;
    for (std::size_t i = 0; i < a.steps.size(); ++i) {
      const PolicyStep& step = kPolicySteps[i];
      if (!a.steps[i].in_format || a.steps[i].order > 0) continue;
      PrecisionPolicy p = current;
      p.*step.member = Format::fp32;
      const double e = measure(point, p, threads).flash;
      if (e < best_error) {
        best_error = e;
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;  // no step lowers flash's error further: the target is out of reach
    current.*kPolicySteps[best].member = Format::fp32;
    a.minimal.push_back(a.steps[static_cast<std::size_t>(best)].step);
    a.steps[static_cast<std::size_t>(best)].order = static_cast<int>(a.minimal.size());
    a.reached = best_error;
  }
  a.met = a.reached <= a.target;
  return a;
}

}  // namespace fastudy
