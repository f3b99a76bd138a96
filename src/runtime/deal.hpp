// Static dealing of independent tasks to ranks by cost, for jobs whose work is known up front (the
// microbenchmark's points, reduce's unsplit (step, tensor) tasks); the dynamic scheduler
// (scheduler.hpp) is for tasks whose cost is not. Pure arithmetic: every rank computes the same deal
// from the same costs, so no message is needed.
#pragma once

#include <vector>

namespace fastudy {

// The rank of each task: largest cost first (ties: task order), each to the rank with the least cost
// so far (ties: the lower rank) — the longest-processing-time rule, deterministic. ranks >= 1.
std::vector<int> deal_largest_first(const std::vector<double>& costs, int ranks);

}  // namespace fastudy
