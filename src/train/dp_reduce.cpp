// The ordered shard sum of the modelled data-parallel width (dp_reduce.hpp).
#include "src/train/dp_reduce.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.hpp"

namespace fastudy {
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
