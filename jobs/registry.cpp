// The one table of jobs: name, summary, usage, entry point and options. main() dispatches through it.
#include "jobs/job.hpp"

namespace fastudy {

const std::vector<JobInfo>& job_registry() {
  static const std::vector<JobInfo> jobs{
      {"run", "run every phase the grid enables ([study] phases), in order", "fastudy [run] GRID.toml [--out DIR]", true,
       false, job_run, run_options, true},
      {"plan", "print the variants, the rank layout and the resource estimates; writes nothing",
       "fastudy plan GRID.toml --ranks N", false, false, job_plan, plan_options},
      {"microbench", "attention kernels x number formats against the fp64 golden value",
       "fastudy microbench GRID.toml [--out DIR]", true, false, job_microbench, nullptr, true},
      {"train", "train the grid's variants and write checkpoints", "fastudy train GRID.toml [--out DIR] [--variant ID]",
       true, false, job_train, train_options, true},
      {"reduce", "pairwise weight distances between variants, the deviation sources and the per-condition verdict (axes.csv, ranking.csv, verdict.csv)",
       "fastudy reduce GRID.toml|OUT [--allow-missing]", true, true, job_reduce, reduce_options, true},
      {"report", "render report.html and report.md from a study's outputs", "fastudy report OUT|GRID.toml", false, true,
       job_report, nullptr, true},
      {"status", "the state of every variant of a study", "fastudy status OUT|GRID.toml", false, true, job_status},
      {"slurm", "write (and submit) an sbatch script for the study",
       "fastudy slurm GRID.toml --nodes N --ntasks-per-node T --time HH:MM:SS [--submit]", false, false, job_slurm, slurm_options, true},
  };
  return jobs;
}

const JobInfo* find_job(const std::string& name) {
  for (const auto& j : job_registry())
    if (j.name == name) return &j;
  return nullptr;
}

}  // namespace fastudy
