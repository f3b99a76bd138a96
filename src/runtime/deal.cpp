// Largest-first dealing of tasks to ranks (deal.hpp).
#include "src/runtime/deal.hpp"

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace fastudy {

std::vector<int> deal_largest_first(const std::vector<double>& costs, int ranks) {
  if (ranks < 1) throw std::invalid_argument("deal_largest_first: " + std::to_string(ranks) + " ranks");
  std::vector<std::size_t> order(costs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
  std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
  std::vector<int> owner(costs.size(), 0);
  for (std::size_t i : order) {
    const auto r = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = static_cast<int>(r);
    load[r] += costs[i];
  }
  return owner;
}

}  // namespace fastudy
