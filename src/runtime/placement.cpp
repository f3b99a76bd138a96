// Ranks' placements and the reducer of each rank group (placement.hpp).
#include "src/runtime/placement.hpp"

#include <map>
#include <stdexcept>

#include "src/runtime/gpu.hpp"

namespace fastudy {

std::string ReducerChoice::name() const { return backend == "mpi" && host_copies ? "mpi on host copies" : backend; }

std::string ReducerChoice::text() const { return reason.empty() ? name() : name() + " (" + reason + ")"; }

ReducerChoice choose_reducer(const std::vector<RankPlacement>& group, int first_rank, bool on_gpu, bool nccl_built) {
  if (group.size() <= 1) return {"none", false, "one rank: nothing to average"};
  if (!on_gpu) return {"mpi", false, "the group trains on the CPU"};
  // NCCL's rule (src/init.cc): no two ranks of a communicator on the same host and GPU.
  std::map<std::pair<std::string, std::string>, std::size_t> first_on;
  for (std::size_t i = 0; i < group.size(); ++i) {
    const auto key = std::make_pair(group[i].host, group[i].gpu);
    const auto [it, fresh] = first_on.emplace(key, i);
    if (fresh) continue;
    const std::string a = std::to_string(first_rank + static_cast<int>(it->second));
    const std::string b = std::to_string(first_rank + static_cast<int>(i));
    const std::string device = std::to_string(group[i].device);
    const std::string bus = group[i].gpu == device ? std::string() : " (PCI " + group[i].gpu + ")";
    return {"mpi", true,
            "ranks " + a + " and " + b + " share GPU " + device + bus + " on " + group[i].host +
                "; NCCL takes one GPU per rank"};
  }
  if (!nccl_built) return {"mpi", true, "this build has no NCCL"};
  return {"nccl", false, "every rank on its own GPU"};
}

int device_of_local_rank(int local_rank, int count) {
  if (count < 1 || local_rank < 0) throw std::invalid_argument("device_of_local_rank: no device");
  return local_rank % count;
}

std::vector<int> local_ranks(const std::vector<std::string>& hosts) {
  std::map<std::string, int> seen;
  std::vector<int> local;
  local.reserve(hosts.size());
  for (const auto& h : hosts) local.push_back(seen[h]++);
  return local;
}

std::vector<RankPlacement> modelled_placements(int ranks, int ranks_per_node, int gpus_per_node) {
  std::vector<RankPlacement> out(static_cast<std::size_t>(ranks));
  const int per_node = ranks_per_node > 0 ? ranks_per_node : ranks;
  for (int r = 0; r < ranks; ++r) {
    RankPlacement& p = out[static_cast<std::size_t>(r)];
    p.host = "node" + std::to_string(r / per_node);
    if (gpus_per_node > 0) {
      p.device = device_of_local_rank(r % per_node, gpus_per_node);
      p.gpu = std::to_string(p.device);  // a modelled GPU is known by its index on its node
    }
  }
  return out;
}

std::vector<ReducerChoice> choose_reducers(const std::vector<RankPlacement>& ranks, int ranks_per_group, bool on_gpu,
                                           bool nccl_built) {
  if (ranks_per_group < 1) throw std::invalid_argument("choose_reducers: ranks_per_group < 1");
  std::vector<ReducerChoice> out;
  for (std::size_t first = 0; first + static_cast<std::size_t>(ranks_per_group) <= ranks.size();
       first += static_cast<std::size_t>(ranks_per_group)) {
    const std::vector<RankPlacement> group(ranks.begin() + static_cast<std::ptrdiff_t>(first),
                                           ranks.begin() + static_cast<std::ptrdiff_t>(first) + ranks_per_group);
    bool all_gpu = on_gpu;
    for (const auto& p : group) all_gpu = all_gpu && p.device >= 0;
    out.push_back(choose_reducer(group, static_cast<int>(first), all_gpu, nccl_built));
  }
  return out;
}

namespace {

std::string ranks_text(int first, int count) {
  return count == 1 ? "rank " + std::to_string(first)
                    : "ranks " + std::to_string(first) + "-" + std::to_string(first + count - 1);
}

// "0-3, 6, 8-9"
std::string ranges_text(const std::vector<int>& groups) {
  std::string out;
  for (std::size_t i = 0; i < groups.size();) {
    std::size_t j = i;
    while (j + 1 < groups.size() && groups[j + 1] == groups[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(groups[i]) + (j > i ? "-" + std::to_string(groups[j]) : "");
    i = j + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> describe_reducers(const std::vector<ReducerChoice>& choices, int ranks_per_group) {
  std::vector<std::string> lines;
  constexpr std::size_t kGroupsOneLineEach = 8;
  if (choices.size() <= kGroupsOneLineEach) {
    for (std::size_t g = 0; g < choices.size(); ++g)
      lines.push_back("group " + std::to_string(g) + " (" + ranks_text(static_cast<int>(g) * ranks_per_group, ranks_per_group) +
                      "): " + choices[g].text());
    return lines;
  }
  // One line per kind of choice (backend and host copies), with the first group's reason.
  std::vector<std::pair<std::string, std::vector<int>>> kinds;
  for (std::size_t g = 0; g < choices.size(); ++g) {
    const std::string kind = choices[g].backend + (choices[g].host_copies ? "+host" : "");
    auto it = kinds.begin();
    while (it != kinds.end() && it->first != kind) ++it;
    if (it == kinds.end()) {
      kinds.push_back({kind, {}});
      it = kinds.end() - 1;
    }
    it->second.push_back(static_cast<int>(g));
  }
  for (const auto& [kind, groups] : kinds) {
    const ReducerChoice& c = choices[static_cast<std::size_t>(groups.front())];
    lines.push_back("groups " + ranges_text(groups) + " (" + std::to_string(groups.size()) + " of " +
                    std::to_string(choices.size()) + "): " + c.name() + " (group " + std::to_string(groups.front()) +
                    ": " + c.reason + ")");
  }
  return lines;
}

std::vector<RankPlacement> gather_placements(const mpi::Comm& world, bool want_gpu) {
  const std::vector<std::string> hosts = world.allgather(mpi::processor_name());
  RankPlacement mine;
  mine.host = hosts[static_cast<std::size_t>(world.rank())];
  if (want_gpu && rank_has_gpu()) {
    int local = local_rank_from_env();
    if (local < 0) local = local_ranks(hosts)[static_cast<std::size_t>(world.rank())];
    mine.device = device_of_local_rank(local, visible_gpus());
    mine.gpu = gpu_bus_id(mine.device);
  }
  const std::vector<std::string> devices = world.allgather(std::to_string(mine.device) + " " + mine.gpu);
  std::vector<RankPlacement> out(hosts.size());
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    out[r].host = hosts[r];
    const std::string& d = devices[r];
    const std::size_t space = d.find(' ');
    out[r].device = std::stoi(d.substr(0, space));
    out[r].gpu = d.substr(space + 1);
  }
  return out;
}

}  // namespace fastudy
