// `fastudy [run] GRID.toml`: every phase the grid enables, in order (microbench, train, reduce,
// report). Each phase reads only what the previous ones wrote, so any of them can also run alone.
#include <boost/program_options.hpp>

#include "base/error.hpp"
#include "base/log.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"

namespace po = boost::program_options;

namespace fastudy {

void run_options(po::options_description& d, CliOptions& o) {
  // `run` runs the phases of train and reduce, so it takes their options.
  train_options(d, o);
  reduce_options(d, o);
}

int job_run(JobContext& ctx) {
  const Study& st = *ctx.study;
  int status = kExitOk;
  struct Phase {
    const char* name;
    JobFn fn;
  };
  const Phase phases[] = {{"microbench", job_microbench}, {"train", job_train}, {"reduce", job_reduce}, {"report", job_report}};
  bool first = true;
  for (const auto& ph : phases) {
    if (!st.has_phase(ph.name)) continue;
    log::info("== phase " + std::string(ph.name));
    // The first phase applies the output-directory policy; later ones continue the same study.
    if (!first) ctx.opts.resume = true, ctx.opts.force = false;
    first = false;
    int rc = ph.fn(ctx);
    if (rc != kExitOk) status = rc;
    if (stop_signal_received()) {
      log::warn("stopped by a signal after the " + std::string(ph.name) + " phase; the later phases did not run");
      break;
    }
  }
  return status;
}

}  // namespace fastudy
