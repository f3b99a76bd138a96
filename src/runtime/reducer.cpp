// The MPI gradient-averaging backend and the backend factory.
#include "src/runtime/reducer.hpp"

#ifdef FASTUDY_HAVE_NCCL
#include "kernels/cuda/attention_cuda.hpp"
#include "src/runtime/nccl_reducer.hpp"
#endif

namespace fastudy {
namespace {

class MpiReducer final : public GradientReducer {
 public:
  explicit MpiReducer(const mpi::Comm& group) : group_(group) {}
  void allreduce_mean(float* data, std::size_t n) override {
    group_.allreduce_sum(data, n);
    scale(data, n, static_cast<float>(group_.size()));
  }
  void allreduce_mean(double* data, std::size_t n) override {
    group_.allreduce_sum(data, n);
    scale(data, n, static_cast<double>(group_.size()));
  }
  const char* name() const override { return "mpi"; }

 private:
  // Division, not multiplication by 1/size: for a power-of-two size both are exact, otherwise
  // division rounds once where multiplying by a rounded reciprocal would round twice.
  template <class T> static void scale(T* data, std::size_t n, T size) {
    if (size == T(1)) return;
    for (std::size_t i = 0; i < n; ++i) data[i] /= size;
  }
  const mpi::Comm& group_;
};

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
#ifdef FASTUDY_HAVE_NCCL
  // Every rank of the group must take the same branch: decide on the device count of all of them.
  const bool devices_everywhere = group.allreduce_max(cuda::device_count() > 0 ? 0 : 1) == 0;
  if (backend == "nccl" && !devices_everywhere) {
    throw UsageError("allreduce backend 'nccl' requested, but a rank of the group sees no CUDA device",
                     "use backend 'mpi' (or 'auto') on machines without GPUs");
  }
  if (backend == "nccl" || (backend == "auto" && devices_everywhere)) return nccl::make_nccl_reducer(group);
#else
  if (backend == "nccl") {
    throw UsageError("allreduce backend 'nccl' requested, but this build of fastudy has no NCCL",
                     "use backend 'mpi' (or 'auto'), or rebuild on a machine with CUDA and NCCL "
                     "(-DFASTUDY_CUDA=ON)");
  }
#endif
  return std::make_unique<MpiReducer>(group);
}

}  // namespace fastudy
