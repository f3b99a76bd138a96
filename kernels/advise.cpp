// advise_point(): the precision advisor's measurements and greedy search (see advise.hpp).
#include "kernels/advise.hpp"

#include <algorithm>
#include <cmath>

namespace fastudy {
namespace {

struct Errors {
  double flash = 0, baseline = 0;
};

Errors measure(const MicrobenchPoint& point, const ReadingPolicies& policies, int threads) {
  Errors e;
  for (const MicrobenchRow& row : run_microbench_point(point, policies, threads)) {
    if (row.algorithm == "flash") e.flash = row.rel_l2;
    if (row.algorithm == "baseline") e.baseline = row.rel_l2;
  }
  return e;
}

// Whether attention kind `kind` runs `step`: kPolicySteps marks the steps of one kind in their text
// ("flash: the running O ...", "baseline: S - m ..."); the others are both kinds'.
bool runs(AttentionKind kind, const PolicyStep& step) {
  const std::string_view other = kind == AttentionKind::flash ? "baseline:" : "flash:";
  return step.what.substr(0, other.size()) != other;
}

// `policies` with `step` set to `to` in each kind that runs it and has it at `from` (promote: from the
// format to fp32) or, with `wider`, wider than `to` (demote to the format).
ReadingPolicies with_step(ReadingPolicies policies, const PolicyStep& step, Format from, Format to, bool wider) {
  for (AttentionKind kind : {AttentionKind::flash, AttentionKind::baseline}) {
    PrecisionPolicy& p = kind == AttentionKind::flash ? policies.flash : policies.baseline;
    const bool change = wider ? unit_roundoff(p.*step.member) < unit_roundoff(to) : p.*step.member == from;
    if (runs(kind, step) && change) p.*step.member = to;
  }
  return policies;
}

// Whether some kind that runs `step` has it at `f` (narrow: promotable) or wider than `f` (demotable).
bool some_kind(const ReadingPolicies& r, const PolicyStep& step, Format f, bool wider) {
  for (AttentionKind kind : {AttentionKind::flash, AttentionKind::baseline}) {
    const Format x = r.of(kind).*step.member;
    if (runs(kind, step) && (wider ? unit_roundoff(x) < unit_roundoff(f) : x == f)) return true;
  }
  return false;
}

}  // namespace

PointAdvice advise_point(const MicrobenchPoint& point, const ReadingPolicies& reading, double target_ulps, int threads) {
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
    const bool narrow = unit_roundoff(f) > unit_roundoff(Format::fp32);
    s.in_format = narrow && some_kind(reading, step, f, false);
    const bool wider = some_kind(reading, step, f, true);
    s.flash_promoted = s.flash_demoted = a.flash;
    s.baseline_promoted = s.baseline_demoted = a.baseline;
    if (s.in_format) {
      const Errors e = measure(point, with_step(reading, step, f, Format::fp32, false), threads);
      s.flash_promoted = e.flash;
      s.baseline_promoted = e.baseline;
      if (a.flash > a.target) s.share = std::min(1.0, (a.flash - e.flash) / (a.flash - a.target));
    }
    if (wider) {
      const Errors e = measure(point, with_step(reading, step, f, f, true), threads);
      s.flash_demoted = e.flash;
      s.baseline_demoted = e.baseline;
    }
    a.steps.push_back(s);
  }

  // Greedy: while flash is above the target, keep in fp32 the step that lowers its error most.
  ReadingPolicies current = reading;
  a.reached = a.flash;
  while (a.reached > a.target) {
    int best = -1;
    double best_error = a.reached;
    for (std::size_t i = 0; i < a.steps.size(); ++i) {
      const PolicyStep& step = kPolicySteps[i];
      if (!a.steps[i].in_format || a.steps[i].order > 0) continue;
      const double e = measure(point, with_step(current, step, f, Format::fp32, false), threads).flash;
      if (e < best_error) {
        best_error = e;
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;  // no step lowers flash's error further: the target is out of reach
    current = with_step(current, kPolicySteps[best], f, Format::fp32, false);
    a.minimal.push_back(a.steps[static_cast<std::size_t>(best)].step);
    a.steps[static_cast<std::size_t>(best)].order = static_cast<int>(a.minimal.size());
    a.reached = best_error;
  }
  a.met = a.reached <= a.target;
  return a;
}

}  // namespace fastudy
