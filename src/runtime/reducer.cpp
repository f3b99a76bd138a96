// The MPI gradient-averaging backend and the backend factory.
#include "src/runtime/reducer.hpp"

#include <vector>

#include "src/runtime/gpu.hpp"
#include "src/runtime/placement.hpp"

#ifdef FASTUDY_HAVE_NCCL
#include "src/runtime/nccl_reducer.hpp"
#endif

namespace fastudy {
namespace {

class MpiReducer final : public GradientReducer {
 public:
  explicit MpiReducer(const mpi::Comm& group) : group_(group) {}
  void allreduce_mean(float* data, std::size_t n) override { reduce(data, n); }
  void allreduce_mean(double* data, std::size_t n) override { reduce(data, n); }
  const char* name() const override { return "mpi"; }

 private:
  // A device buffer (a group that shares a GPU, or a build without NCCL) is averaged on a host copy:
  // copied to the host, reduced and divided there, copied back.
  template <class T> void reduce(T* data, std::size_t n) {
    if (n == 0) return;
    if (!is_device_pointer(data)) {
      mean_on_host(data, n);
      return;
    }
    const std::size_t bytes = n * sizeof(T);
    if (host_.size() < bytes) host_.resize(bytes);
    T* host = reinterpret_cast<T*>(host_.data());
    copy_device_to_host(host, data, bytes);
    mean_on_host(host, n);
    copy_host_to_device(data, host, bytes);
  }
  template <class T> void mean_on_host(T* data, std::size_t n) {
    group_.allreduce_sum(data, n);
    // Division, not multiplication by 1/size: for a power-of-two size both are exact, otherwise
    // division rounds once where multiplying by a rounded reciprocal would round twice.
    const T size = static_cast<T>(group_.size());
    if (size == T(1)) return;
    for (std::size_t i = 0; i < n; ++i) data[i] /= size;
  }
  const mpi::Comm& group_;
  std::vector<unsigned char> host_;  // the host copy of device buffers, kept between steps
};

#ifdef FASTUDY_HAVE_NCCL
// Every rank of the group's current device (collective over the group).
std::vector<RankPlacement> group_devices(const mpi::Comm& group) {
  const int device = current_gpu();
  const std::string mine = std::to_string(device) + " " + (device >= 0 ? gpu_bus_id(device) : std::string());
  const std::vector<std::string> hosts = group.allgather(mpi::processor_name());
  const std::vector<std::string> devices = group.allgather(mine);
  std::vector<RankPlacement> ranks(hosts.size());
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    const std::size_t space = devices[r].find(' ');
    ranks[r] = {hosts[r], std::stoi(devices[r].substr(0, space)), devices[r].substr(space + 1)};
  }
  return ranks;
}
#endif

}  // namespace

#ifdef FASTUDY_HAVE_NCCL
bool have_nccl() { return true; }
#else
bool have_nccl() { return false; }
#endif

std::unique_ptr<GradientReducer> make_reducer(const mpi::Comm& group, const std::string& backend) {
  if (backend != "auto" && backend != "mpi" && backend != "nccl") {
    throw UsageError("unknown allreduce backend '" + backend + "'", "use one of: auto, mpi, nccl");
  }
  if (backend == "mpi") return std::make_unique<MpiReducer>(group);
#ifndef FASTUDY_HAVE_NCCL
  if (backend == "nccl") {
    throw UsageError("allreduce backend 'nccl' requested, but this build of fastudy has no NCCL",
                     "use backend 'mpi' (or 'auto'), or rebuild on a machine with CUDA and NCCL "
                     "(-DFASTUDY_CUDA=ON)");
  }
  return std::make_unique<MpiReducer>(group);
#else
  // Every rank of the group takes the same branch: the choice is made from every rank's device.
  const std::vector<RankPlacement> ranks = group_devices(group);
  bool all_gpu = true;
  for (const auto& r : ranks) all_gpu = all_gpu && r.device >= 0;
  if (backend == "nccl" && !all_gpu)
    throw UsageError("allreduce backend 'nccl' requested, but a rank of the group sees no CUDA device",
                     "use backend 'mpi' (or 'auto') on machines without GPUs");
  const ReducerChoice choice = choose_reducer(ranks, mpi::world_rank() - group.rank(), all_gpu, true);
  if (backend == "nccl" && choice.backend == "mpi")
    throw UsageError("allreduce backend 'nccl' requested, but " + choice.reason,
                     "use backend 'mpi' or 'auto' (the MPI reducer on host copies), or one GPU per rank");
  if (backend == "nccl" || choice.backend == "nccl") return nccl::make_nccl_reducer(group);
  return std::make_unique<MpiReducer>(group);
#endif
}

}  // namespace fastudy
