// The MPI gradient-averaging backend, the backend factory, and the ordered shard sum of the modelled
// data-parallel width (reduce_shards).
#include "src/runtime/reducer.hpp"

#include <algorithm>
#include <vector>

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

std::optional<ReduceOrder> parse_reduce_order(std::string_view name) {
  if (name == "rank") return ReduceOrder::rank;
  if (name == "ring") return ReduceOrder::ring;
  if (name == "tree") return ReduceOrder::tree;
  return std::nullopt;
}

const char* to_string(ReduceOrder order) {
  switch (order) {
    case ReduceOrder::rank: return "rank";
    case ReduceOrder::ring: return "ring";
    case ReduceOrder::tree: return "tree";
  }
  return "rank";
}

namespace {

template <class T>
void reduce_shards_impl(ReduceOrder order, const T* g, int width, std::size_t n, T* out) {
  if (width < 1) throw Error("reduce_shards: width " + std::to_string(width) + " must be >= 1");
  const auto w = static_cast<std::size_t>(width);
  auto shard = [&](std::size_t s) { return g + s * n; };
  switch (order) {
    case ReduceOrder::rank: {
      std::copy(shard(0), shard(0) + n, out);
      for (std::size_t s = 1; s < w; ++s) {
        const T* x = shard(s);
        for (std::size_t i = 0; i < n; ++i) out[i] += x[i];
      }
      break;
    }
    case ReduceOrder::ring: {
      for (std::size_t c = 0; c < w; ++c) {
        const std::size_t lo = c * n / w, hi = (c + 1) * n / w;
        const T* first = shard((c + 1) % w);
        std::copy(first + lo, first + hi, out + lo);
        for (std::size_t j = 2; j <= w; ++j) {  // ranks c+2, ..., c+W = c
          const T* x = shard((c + j) % w);
          for (std::size_t i = lo; i < hi; ++i) out[i] += x[i];
        }
      }
      break;
    }
    case ReduceOrder::tree: {
      std::size_t p = 1;
      while (2 * p <= w) p *= 2;
      const std::size_t extra = w - p;
      std::vector<T> partial(p);
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < p; ++j)
          partial[j] = j < extra ? shard(2 * j)[i] + shard(2 * j + 1)[i] : shard(extra + j)[i];
        for (std::size_t len = p; len > 1; len /= 2)
          for (std::size_t j = 0; j < len / 2; ++j) partial[j] = partial[2 * j] + partial[2 * j + 1];
        out[i] = partial[0];
      }
      break;
    }
  }
  if (width > 1) {
    const T div = static_cast<T>(width);  // a division, as MpiReducer: one rounding
    for (std::size_t i = 0; i < n; ++i) out[i] /= div;
  }
}

}  // namespace

void reduce_shards(ReduceOrder order, const float* shards, int width, std::size_t n, float* out) {
  reduce_shards_impl(order, shards, width, n, out);
}
void reduce_shards(ReduceOrder order, const double* shards, int width, std::size_t n, double* out) {
  reduce_shards_impl(order, shards, width, n, out);
}

}  // namespace fastudy
