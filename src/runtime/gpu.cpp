// This rank's GPU (see gpu.hpp).
#include "src/runtime/gpu.hpp"

#include <cstdlib>
#include <vector>

#include "base/error.hpp"
#include "fastudy/version.hpp"  // FASTUDY_TORCH_CUDA, FASTUDY_TORCH_VERSION

#ifdef FASTUDY_HAVE_CUDA_KERNELS
#include <cuda_runtime_api.h>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#endif

namespace fastudy {

int local_rank_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end != nullptr && *end == '\0' && r >= 0) return static_cast<int>(r);
    }
  }
  return -1;
}

int visible_gpus(std::string* why) {
#ifdef FASTUDY_HAVE_CUDA_KERNELS
  return cuda::device_count(why);
#else
  if (why) *why = "this build of fastudy has no CUDA (no nvcc was found when it was configured)";
  return 0;
#endif
}

bool rank_has_gpu(std::string* why) {
  if (!FASTUDY_TORCH_CUDA) {
    if (why) *why = std::string("this build links LibTorch ") + FASTUDY_TORCH_VERSION + " without CUDA";
    return false;
  }
  return visible_gpus(why) > 0;
}

int select_gpu(const mpi::Comm& group) {
  std::string why;
  const int count = visible_gpus(&why);
  if (count == 0) {
    throw UsageError("rank " + std::to_string(mpi::world_rank()) + " needs a CUDA device but sees none (" + why + ")",
                     "run with one GPU per rank (nvidia-smi, CUDA_VISIBLE_DEVICES), or train on the CPU "
                     "([train] device = \"cpu\" or --device cpu)");
  }
  int local = local_rank_from_env();
  if (local < 0) {
    const std::vector<std::string> hosts = group.allgather(mpi::processor_name());
    local = 0;
    for (int r = 0; r < group.rank(); ++r) local += hosts[r] == hosts[group.rank()] ? 1 : 0;
  }
  const int device = local % count;
#ifdef FASTUDY_HAVE_CUDA_KERNELS
  FASTUDY_CUDA_CHECK(cudaSetDevice(device));
#endif
  return device;
}

}  // namespace fastudy
