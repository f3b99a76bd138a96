// The jobs that never train (fastudy_jobs_common: no LibTorch), the tail of both programs' tables,
// and the lookup by name over whichever table the program links (registry.cpp or registry_lite.cpp).
#include "jobs/job.hpp"

namespace fastudy {

std::vector<JobInfo> trainer_free_jobs() {
  return {
      {"reduce", "pairwise weight distances between variants, the deviation sources and the per-condition verdict (axes.csv, ranking.csv, verdict.csv)",
       "fastudy reduce GRID.toml|OUT [--allow-missing]", kUsesMpi, kTakesOut, job_reduce, reduce_options, kLocksStudy},
      {"report", "render report.html and report.md from a study's outputs", "fastudy report OUT|GRID.toml",
       kOneProcess, kTakesOut, job_report, nullptr, kLocksStudy},
      {"status", "the state of every variant of a study", "fastudy status OUT|GRID.toml", kOneProcess, kTakesOut,
       job_status, nullptr, kNoLock},
      {"slurm", "write (and submit) an sbatch script for the study",
       "fastudy slurm GRID.toml --nodes N --ntasks-per-node T --time HH:MM:SS [--submit]", kOneProcess, kTakesGrid,
       job_slurm, slurm_options, kLocksStudy},
  };
}

const JobInfo* find_job(const std::string& name) {
  for (const auto& j : job_registry())
    if (j.name == name) return &j;
  return nullptr;
}

}  // namespace fastudy
