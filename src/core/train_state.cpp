#include "src/core/train_state.hpp"

#include <functional>
#include <numeric>

namespace fastudy {

std::int64_t NamedArray::numel() const {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

}  // namespace fastudy
