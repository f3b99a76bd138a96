// The table of fastudy-lite: the jobs that never train, and so need no LibTorch (registry_common.cpp).
// Its main() hands every other command line to fastudy-main (jobs/main.cpp, FASTUDY_LITE).
#include "jobs/job.hpp"

namespace fastudy {

void register_program_readers() {}  // torch.save files need LibTorch: fastudy-main

const std::vector<JobInfo>& job_registry() {
  static const std::vector<JobInfo> jobs = trainer_free_jobs();
  return jobs;
}

}  // namespace fastudy
