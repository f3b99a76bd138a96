// The NCCL gradient-averaging backend (CUDA builds with NCCL): ncclAllReduce with ncclAvg on the
// device buffers of the group's ranks. The ncclUniqueId is made by the group's rank 0 and broadcast
// over the group's MPI communicator. Every raw CUDA/NCCL call of the project is made here, once;
// failures become Errors naming the call, the rank and file:line.
//
// Only compiled when CMake finds CUDA and NCCL (FASTUDY_HAVE_NCCL). This machine class has no GPU:
// the code compiles in CI, and at run time make_reducer("nccl") reports that no device exists.
#include <cuda_runtime.h>
#include <nccl.h>

#include "src/runtime/reducer.hpp"

namespace fastudy {
namespace {

[[noreturn]] void fail(const std::string& call, const std::string& what, const char* file, int line) {
  throw Error(call + " failed on rank " + std::to_string(mpi::world_rank()) + " (" + file + ":" +
                  std::to_string(line) + "): " + what,
              "check the CUDA driver and NCCL installation (NCCL_DEBUG=INFO prints details), or use "
              "the mpi allreduce backend");
}

void check_cuda(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) fail(call, cudaGetErrorString(e), file, line);
}
void check_nccl(ncclResult_t r, const char* call, const char* file, int line) {
  if (r != ncclSuccess) fail(call, ncclGetErrorString(r), file, line);
}
#define FASTUDY_CUDA(call, ...) check_cuda(call(__VA_ARGS__), #call, __FILE__, __LINE__)
#define FASTUDY_NCCL(call, ...) check_nccl(call(__VA_ARGS__), #call, __FILE__, __LINE__)

class NcclReducer final : public GradientReducer {
 public:
  explicit NcclReducer(const mpi::Comm& group) {
    ncclUniqueId id{};
    if (group.is_root()) FASTUDY_NCCL(ncclGetUniqueId, &id);
    group.bcast(&id, sizeof id);
    FASTUDY_CUDA(cudaStreamCreateWithFlags, &stream_, cudaStreamNonBlocking);
    FASTUDY_NCCL(ncclCommInitRank, &comm_, group.size(), id, group.rank());
  }
  ~NcclReducer() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  NcclReducer(const NcclReducer&) = delete;
  NcclReducer& operator=(const NcclReducer&) = delete;

  // data: device memory on the current CUDA device.
  void allreduce_mean(float* data, std::size_t n) override { reduce(data, n, ncclFloat32); }
  void allreduce_mean(double* data, std::size_t n) override { reduce(data, n, ncclFloat64); }
  const char* name() const override { return "nccl"; }

 private:
  void reduce(void* data, std::size_t n, ncclDataType_t type) {
    FASTUDY_NCCL(ncclAllReduce, data, data, n, type, ncclAvg, comm_, stream_);
    FASTUDY_CUDA(cudaStreamSynchronize, stream_);
  }
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  // No driver or no device: zero devices, not an error.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<GradientReducer> make_nccl_reducer(const mpi::Comm& group) {
  return std::make_unique<NcclReducer>(group);
}

}  // namespace fastudy
