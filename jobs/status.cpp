// `fastudy status OUT`: the state of every variant (OUT/status.csv) as a table, with counts per state
// and per grid axis value.
#include <filesystem>
#include <iostream>

#include "base/error.hpp"
#include "jobs/job.hpp"
#include "src/runtime/status.hpp"

namespace fastudy {

int job_status(JobContext& ctx) {
  VariantAxes axes;
  for (const auto& v : ctx.study->variants) axes[v.id] = v.axes;
  const std::string path = (std::filesystem::path(ctx.out_dir) / "status.csv").string();
  print_status(std::cout, path, axes);
  return kExitOk;
}

}  // namespace fastudy
