// The NCCL gradient reducer (see nccl_reducer.hpp). Every NCCL call is wrapped once (FASTUDY_NCCL_CHECK,
// rank and file:line in the message); CUDA calls go through FASTUDY_CUDA_CHECK (cuda_check.hpp).
#include "src/runtime/nccl_reducer.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_ops.hpp"
#include "src/runtime/gpu.hpp"

namespace fastudy::nccl {

NcclError::NcclError(const std::string& call, int rank, const std::string& what, const char* file, int line)
    : Error(call + " failed on rank " + std::to_string(rank) + " (" + file + ":" + std::to_string(line) + "): " + what,
            "NCCL_DEBUG=INFO prints NCCL's view; check one GPU per rank and the network (NCCL_SOCKET_IFNAME), or "
            "use the mpi allreduce backend") {}

namespace {

void check_nccl(ncclResult_t r, const char* call, const char* file, int line) {
  if (r != ncclSuccess) throw NcclError(call, mpi::world_rank(), ncclGetErrorString(r), file, line);
}
#define FASTUDY_NCCL_CHECK(call) check_nccl((call), #call, __FILE__, __LINE__)

class NcclReducer final : public GradientReducer {
 public:
  explicit NcclReducer(const mpi::Comm& group) : size_(group.size()) {
    // The device the caller made current (select_gpu, use_gpu): where the trainer's buffers live.
    std::string why;
    if (visible_gpus(&why) == 0)
      throw UsageError("the nccl allreduce backend needs a CUDA device, but rank " + std::to_string(mpi::world_rank()) +
                           " sees none (" + why + ")",
                       "run with one GPU per rank, or use the mpi allreduce backend");
    ncclUniqueId id{};
    if (group.rank() == 0) FASTUDY_NCCL_CHECK(ncclGetUniqueId(&id));
    group.bcast(&id, sizeof id);
    // A blocking stream: its work waits for what the trainer queued on the legacy default stream
    // (LibTorch's default: the backward that wrote the gradients), and the default stream's later
    // work waits for the allreduce. A non-blocking stream would read gradients still being written.
    FASTUDY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault));
    FASTUDY_NCCL_CHECK(ncclCommInitRank(&comm_, group.size(), id, group.rank()));
  }
  ~NcclReducer() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  NcclReducer(const NcclReducer&) = delete;
  NcclReducer& operator=(const NcclReducer&) = delete;

  void allreduce_mean(float* data, std::size_t n) override { reduce(data, n, ncclFloat32); }
  void allreduce_mean(double* data, std::size_t n) override { reduce(data, n, ncclFloat64); }
  const char* name() const override { return "nccl"; }

 private:
  template <class T>
  void reduce(T* data, std::size_t n, ncclDataType_t type) {
    if (n == 0) return;
    const T size = static_cast<T>(size_);
    if (is_device_pointer(data)) {
      FASTUDY_NCCL_CHECK(ncclAllReduce(data, data, n, type, ncclSum, comm_, stream_));
      if (size_ > 1) cuda::divide_on_device(data, n, size, stream_);
      FASTUDY_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return;
    }
    const std::size_t bytes = n * sizeof(T);
    if (staging_.size() < bytes) staging_ = cuda::DeviceBuffer<unsigned char>(bytes);
    T* dev = reinterpret_cast<T*>(staging_.get());
    FASTUDY_CUDA_CHECK(cudaMemcpyAsync(dev, data, bytes, cudaMemcpyHostToDevice, stream_));
    FASTUDY_NCCL_CHECK(ncclAllReduce(dev, dev, n, type, ncclSum, comm_, stream_));
    FASTUDY_CUDA_CHECK(cudaMemcpyAsync(data, dev, bytes, cudaMemcpyDeviceToHost, stream_));
    FASTUDY_CUDA_CHECK(cudaStreamSynchronize(stream_));
    // Division, not multiplication by 1/size: the same single rounding as the mpi backend.
    if (size_ > 1)
      for (std::size_t i = 0; i < n; ++i) data[i] /= size;
  }

  int size_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cuda::DeviceBuffer<unsigned char> staging_;
};

}  // namespace

std::unique_ptr<GradientReducer> make_nccl_reducer(const mpi::Comm& group) {
  return std::make_unique<NcclReducer>(group);
}

}  // namespace fastudy::nccl
