// This rank's GPU (see gpu.hpp).
#include "src/runtime/gpu.hpp"

#include <cstdlib>
#include <vector>

#include "base/error.hpp"
#include "fastudy/version.hpp"  // FASTUDY_TORCH_CUDA, FASTUDY_TORCH_VERSION
#include "src/runtime/placement.hpp"

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

int select_gpu(const mpi::Comm& comm) {
  std::string why;
  const int count = visible_gpus(&why);
  if (count == 0) {
    throw UsageError("rank " + std::to_string(mpi::world_rank()) + " needs a CUDA device but sees none (" + why + ")",
                     "run with one GPU per rank (nvidia-smi, CUDA_VISIBLE_DEVICES), or train on the CPU "
                     "([train] device = \"cpu\" or --device cpu)");
  }
  int local = local_rank_from_env();
  if (local < 0) local = local_ranks(comm.allgather(mpi::processor_name()))[static_cast<std::size_t>(comm.rank())];
  const int device = device_of_local_rank(local, count);
  use_gpu(device);
  return device;
}

void use_gpu(int device) {
  std::string why;
  const int count = visible_gpus(&why);
  if (device < 0 || device >= count)
    throw UsageError("rank " + std::to_string(mpi::world_rank()) + ": CUDA device " + std::to_string(device) +
                         " is not visible (" + (count == 0 ? why : std::to_string(count) + " visible") + ")",
                     "check CUDA_VISIBLE_DEVICES and nvidia-smi");
#ifdef FASTUDY_HAVE_CUDA_KERNELS
  FASTUDY_CUDA_CHECK(cudaSetDevice(device));
#endif
}

std::string gpu_bus_id(int device) {
#ifdef FASTUDY_HAVE_CUDA_KERNELS
  char id[32] = {};  // "0000:00:00.0" and its terminator; CUDA asks for at least 13 bytes
  FASTUDY_CUDA_CHECK(cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof id), device));
  return id;
#else
  (void)device;
  return "";
#endif
}

int current_gpu() {
#ifdef FASTUDY_HAVE_CUDA_KERNELS
  if (visible_gpus() == 0) return -1;
  int device = -1;
  FASTUDY_CUDA_CHECK(cudaGetDevice(&device));
  return device;
#else
  return -1;
#endif
}

bool is_device_pointer(const void* p) {
#ifdef FASTUDY_HAVE_CUDA_KERNELS
  if (visible_gpus() == 0) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // older runtimes report plain host memory as an error
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
#else
  (void)p;
  return false;
#endif
}

void copy_device_to_host(void* host, const void* device, std::size_t bytes) {
#ifdef FASTUDY_HAVE_CUDA_KERNELS
  FASTUDY_CUDA_CHECK(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
#else
  (void)host, (void)device, (void)bytes;
  throw Error("copy_device_to_host: this build has no CUDA");
#endif
}

void copy_host_to_device(void* device, const void* host, std::size_t bytes) {
#ifdef FASTUDY_HAVE_CUDA_KERNELS
  FASTUDY_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
#else
  (void)host, (void)device, (void)bytes;
  throw Error("copy_host_to_device: this build has no CUDA");
#endif
}

}  // namespace fastudy
