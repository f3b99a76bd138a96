// `fastudy advise GRID.toml [--target-ulps X]`: the precision advisor (kernels/advise.hpp) on every
// point of the grid's [[microbench.sweeps]] (expand_points: each pass, format narrower than fp32, reading
// or custom policy, rounding, N, d, tiles, loop order and causal setting; the first trial's inputs;
// captured and framework points are left out). Per point it prints each step's error promoted alone to fp32 and
// demoted alone to the format, the greedy minimal set of steps kept in fp32 that brings flash within
// the target (default: the baseline's error in the same format and reading; --target-ulps X: X
// roundings of the largest output), and one sentence; it writes OUT/advice.csv (one row per point and
// step) for the report.
#include <algorithm>
#include <filesystem>
#include <sstream>
#include <thread>

#include <boost/program_options.hpp>

#include "base/checksum.hpp"
#include "base/log.hpp"
#include "base/number.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"
#include "jobs/microbench/points.hpp"
#include "kernels/advise.hpp"

namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace fastudy {
namespace {

// The points the advisor runs: the microbenchmark's, the first trial of each, in formats narrower than
// fp32 (nothing to keep in fp32 otherwise); captured and framework points are left out.
std::vector<std::pair<std::string, MicrobenchPoint>> advice_points(const Study& st) {
  std::vector<std::pair<std::string, MicrobenchPoint>> pts;
  for (const SweepPoint& sp : expand_points(st)) {
    const MicrobenchPoint& p = sp.point;
    if (p.trial != 0 || p.distribution == InputDistribution::captured || !sp.framework.empty()) continue;
    if (unit_roundoff(p.format) <= unit_roundoff(Format::fp32)) continue;
    pts.emplace_back(sp.sweep, p);
  }
  return pts;
}

std::string t3(double x) { return number_text(x, 3); }

// "Under eager at bf16 (forward, N 256, d 64, 8 KV tiles): flash's error is 3.1x the baseline's; keeping
// o_running, stats_running in fp32 brings it to 0.92x (target met); o_running alone removes 81% of the
// excess."
std::string advice_sentence(const PointAdvice& a) {
  const MicrobenchPoint& p = a.point;
  std::ostringstream os;
  os << "Under " << p.policy << " at " << to_string(p.format) << " (" << to_string(p.pass) << ", N " << p.seq_len << ", d "
     << p.head_dim << ", " << (p.seq_len + p.block_kv - 1) / p.block_kv << " KV tiles" << (p.causal ? ", causal" : "")
     << "): flash's error is " << t3(a.baseline > 0 ? a.flash / a.baseline : 0) << "x the baseline's";
  if (a.flash <= a.target) {
    os << ", within the target (" << t3(a.target) << "): no step needs fp32.";
    return os.str();
  }
  std::string set;
  for (const auto& s : a.minimal) set += (set.empty() ? "" : ", ") + s;
  os << "; keeping " << set << " in fp32 brings it to " << t3(a.baseline > 0 ? a.reached / a.baseline : 0) << "x ("
     << (a.met ? "target met" : "target NOT met: no further step lowers it") << ")";
  const auto top = std::max_element(a.steps.begin(), a.steps.end(), [](const auto& x, const auto& y) { return x.share < y.share; });
  if (top != a.steps.end() && top->share > 0)
    os << "; " << top->step << " alone removes " << t3(100 * top->share) << "% of the excess";
  os << ".";
  return os.str();
}

}  // namespace

void advise_options(po::options_description& d, CliOptions& o) {
  d.add_options()("target-ulps", po::value<double>(&o.advise.target_ulps),
                  "the target: flash's error (rel_l2 against fp64) at most this many units of the format's unit roundoff "
                  "(default: the baseline's error in the same format and reading)");
}

int job_advise(JobContext& ctx) {
  const Study& st = *ctx.study;
  if (ctx.opts.advise.target_ulps < 0) throw UsageError("--target-ulps must be > 0", "e.g. --target-ulps 2");
  const auto points = advice_points(st);
  if (points.empty())
    throw UsageError(st.file + ": [microbench] has no point in a format narrower than fp32 to advise on",
                     "list fp16 or bf16 in [microbench] formats");
  prepare_output(ctx);
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::string target_text = ctx.opts.advise.target_ulps > 0 ? number_text(ctx.opts.advise.target_ulps, 6) + " u (rel_l2)"
                                                            : std::string("the baseline's error in the same format");
  log::info("advise: " + std::to_string(points.size()) + " points; target: " + target_text);

  std::ostringstream csv;
  csv << ctx.prov.header();
  csv << "sweep,pass,format,policy,rounding,seq_len,head_dim,block_q,block_kv,loop_order,causal,distribution,"
         "flash,baseline,target,u,reached,met,step,in_format,flash_promoted,baseline_promoted,flash_demoted,"
         "baseline_demoted,share,order\n";
  for (const auto& [sweep, point] : points) {
    if (stop_signal_received()) throw Error("advise: stopped by a signal; advice.csv was not written");
    ReadingPolicies reading = resolve_reading(st.attention, point.policy, point.format);
    if (point.rounding) reading.flash.rounding = reading.baseline.rounding = *point.rounding;
    const PointAdvice a = advise_point(point, reading, ctx.opts.advise.target_ulps, threads);
    std::ostringstream table;
    table << "  step           flash (fp32 alone)  baseline (fp32 alone)  flash (format alone)  share  order\n";
    for (const StepAdvice& s : a.steps) {
      char line[200];
      std::snprintf(line, sizeof line, "  %-13s  %-18s  %-21s  %-20s  %-5s  %s\n", s.step.c_str(),
                    s.in_format ? t3(s.flash_promoted).c_str() : "(fp32 already)", s.in_format ? t3(s.baseline_promoted).c_str() : "",
                    !s.in_format && s.flash_demoted != a.flash ? t3(s.flash_demoted).c_str() : "",
                    s.share != 0 ? t3(s.share).c_str() : "", s.order > 0 ? std::to_string(s.order).c_str() : "");
      table << line;
    }
    log::info("advise [" + sweep + "] flash " + t3(a.flash) + ", baseline " + t3(a.baseline) + ", target " + t3(a.target) +
              " (rel_l2 against fp64; u = " + t3(a.u) + ")\n" + table.str() + advice_sentence(a));
    const MicrobenchPoint& p = a.point;
    for (const StepAdvice& s : a.steps) {
      csv << sweep << ',' << to_string(p.pass) << ',' << to_string(p.format) << ',' << p.policy << ','
          << to_string(reading.flash.rounding) << ',' << p.seq_len << ',' << p.head_dim << ',' << p.block_q << ',' << p.block_kv << ','
          << to_string(p.loop_order) << ',' << p.causal << ',' << to_string(p.distribution) << ',' << number_text(a.flash, 9) << ','
          << number_text(a.baseline, 9) << ',' << number_text(a.target, 9) << ',' << number_text(a.u, 9) << ','
          << number_text(a.reached, 9) << ',' << a.met << ',' << s.step << ',' << s.in_format << ','
          << number_text(s.flash_promoted, 9) << ',' << number_text(s.baseline_promoted, 9) << ','
          << number_text(s.flash_demoted, 9) << ',' << number_text(s.baseline_demoted, 9) << ',' << number_text(s.share, 9)
          << ',' << s.order << '\n';
    }
  }
  const std::string path = (fs::path(ctx.out_dir) / "advice.csv").string();
  atomic_write_sealed(path, csv.str());
  log::info("advise: wrote " + path);
  return kExitOk;
}

}  // namespace fastudy
