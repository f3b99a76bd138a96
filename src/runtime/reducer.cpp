// The MPI gradient-averaging backend and the backend factory.
#include "src/runtime/reducer.hpp"

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

bool have_nccl() { return false; }

std::unique_ptr<GradientReducer> make_reducer(const mpi::Comm& group, const std::string& backend) {
  if (backend == "mpi" || backend == "auto") return std::make_unique<MpiReducer>(group);
  if (backend == "nccl") {
    throw UsageError("allreduce backend 'nccl' requested, but this build of fastudy has no NCCL",
                     "use backend 'mpi' (or 'auto'), or rebuild on a machine with CUDA and NCCL "
                     "(-DFASTUDY_CUDA=ON)");
  }
  throw UsageError("unknown allreduce backend '" + backend + "'", "use one of: auto, mpi, nccl");
}

}  // namespace fastudy
