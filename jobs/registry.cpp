// The one table of jobs of fastudy-main: name, summary, usage, entry point and options. main()
// dispatches through it. The jobs that never train come from registry_common.cpp.
#include "jobs/job.hpp"
#include "src/train/torch_file.hpp"

namespace fastudy {

void register_program_readers() { train::register_torch_save_reader(); }

const std::vector<JobInfo>& job_registry() {
  static const std::vector<JobInfo> jobs = [] {
    std::vector<JobInfo> all{
        {"run", "run every phase the grid enables ([study] phases), in order", "fastudy [run] GRID.toml [--out DIR]",
         true, false, job_run, run_options, true},
        {"plan",
         "print the variants, the rank layout, each rank group's device and gradient reducer, and the resource "
         "estimates; writes nothing",
         "fastudy plan GRID.toml --ranks N [--gpus-per-node G] [--ranks-per-node R]", false, false, job_plan,
         plan_options},
        {"microbench",
         "attention kernels x number formats against the fp64 golden value; on a GPU also our CUDA kernels and "
         "LibTorch's SDPA backends on the same inputs ([microbench] devices, framework; docs/microbench.md \"Real "
         "kernels\")",
         "fastudy microbench GRID.toml [--out DIR]", true, false, job_microbench, nullptr, true},
        {"train", "train the grid's variants and write checkpoints", "fastudy train GRID.toml [--out DIR] [--variant ID]",
         true, false, job_train, train_options, true},
        {"advise",
         "precision advisor: each attention step promoted alone to fp32 and demoted alone to the format, and the "
         "greedy minimal set kept in fp32 that brings flash within the baseline's error (or --target-ulps)",
         "fastudy advise GRID.toml [--target-ulps X] [--out DIR]", false, false, job_advise, advise_options, true},
        {"replay",
         "counterfactual replay: resume a variant from a checkpoint with axes changed (--set), the same data order; "
         "loss and weight distance to the original per step, and whether its spikes or divergence come back",
         "fastudy replay OUT --variant ID --from STEP [--steps K] [--set AXIS=VALUE ...]", false, true, job_replay,
         replay_options, true},
        {"bisect",
         "first divergent op: one step of two variants from A's checkpoint on the same batch, every op's output "
         "compared against its format's bound",
         "fastudy bisect OUT --variant A --against B --step S", false, true, job_bisect, bisect_options, true},
    };
    for (JobInfo& j : trainer_free_jobs()) all.push_back(std::move(j));
    return all;
  }();
  return jobs;
}

}  // namespace fastudy
