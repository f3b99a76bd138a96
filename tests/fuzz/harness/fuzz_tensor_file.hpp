// Opening a tensor file (src/io/tensor_file.hpp) as the import check does and reading every tensor
// fastudy would read, in pieces, as the reducer reads them.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "src/io/tensor_file.hpp"

namespace fastudy::fuzz {

// Reads every floating-point tensor of `path` (at most `budget` elements in all, so that a valid
// file of a huge shape is not a timeout of the harness); UsageError is the only refusal allowed.
inline void read_every_tensor(const std::string& path, std::uint64_t budget = std::uint64_t{1} << 22) {
  try {
    const io::TensorFile tf = io::TensorFile::open(path);
    std::vector<double> piece;
    for (const io::TensorEntry& e : tf.tensors()) {
      if (!e.format || e.elements == 0) continue;
      const std::uint64_t n = std::min<std::uint64_t>(e.elements, budget);
      budget -= n;
      piece.resize(static_cast<std::size_t>(std::min<std::uint64_t>(n, std::uint64_t{1} << 16)));
      for (std::uint64_t at = 0; at < n; at += piece.size())
        tf.read_range(e, at, std::min<std::uint64_t>(piece.size(), n - at), piece.data());
      if (budget == 0) break;
    }
  } catch (const UsageError&) {
  }
}

}  // namespace fastudy::fuzz
