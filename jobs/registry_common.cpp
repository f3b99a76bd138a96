// The jobs that never train (fastudy_jobs_common: no LibTorch), the tail of both programs' tables,
// and the lookup by name over whichever table the program links (registry.cpp or registry_lite.cpp).
#include "jobs/job.hpp"

namespace fastudy {

std::vector<JobInfo> trainer_free_jobs() {
  return {
      {"reduce", "pairwise weight distances between variants, the deviation sources and the per-condition verdict (axes.csv, ranking.csv, verdict.csv)",
       "fastudy reduce GRID.toml|OUT [--allow-missing]", true, true, job_reduce, reduce_options, true},
      {"report", "render report.html and report.md from a study's outputs", "fastudy report OUT|GRID.toml", false, true,
       job_report, nullptr, true},
      {"status", "the state of every variant of a study", "fastudy status OUT|GRID.toml", false, true, job_status},
      {"slurm", "write (and submit) an sbatch script for the study",
       "fastudy slurm GRID.toml --nodes N --ntasks-per-node T --time HH:MM:SS [--submit]", false, false, job_slurm, slurm_options, true},
  };
}

const JobInfo* find_job(const std::string& name) {
  for (const auto& j : job_registry())
    if (j.name == name) return &j;
  return nullptr;
}

}  // namespace fastudy
