// Test data for the pairwise engine, shared by the single-process and the MPI tests.
#pragma once

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "analysis/distance.hpp"

namespace fastudy::test {

struct Data {
  std::size_t n;
  std::vector<std::vector<float>> x;
  std::vector<const float*> ptrs() const {
    std::vector<const float*> p;
    for (const auto& v : x) p.push_back(v.data());
    return p;
  }
};

// V variants that share a base (like trained weights that drifted apart), n not a block multiple.
// wide: every block of kPairwiseBlock indices scaled by its own power of two in [2^-11, 2^11], so
// that block sums span many binades and fp64 additions of them round differently in different
// groupings (the case where only the exact combination stays bit-identical).
inline Data make_data(std::size_t V, std::size_t n, unsigned seed, bool wide = false) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> base(0.0f, 0.02f), drift(0.0f, 1e-3f);
  std::vector<float> b(n);
  for (auto& v : b) v = base(rng);
  Data d{n, {}};
  for (std::size_t k = 0; k < V; ++k) {
    std::vector<float> x(b);
    const float scale = 1.0f + 0.5f * static_cast<float>(k);
    for (std::size_t i = 0; i < n; ++i) {
      x[i] += scale * drift(rng);
      if (wide) x[i] = std::ldexp(x[i], static_cast<int>((i / kPairwiseBlock) * 7 % 23) - 11);
    }
    d.x.push_back(std::move(x));
  }
  return d;
}

}  // namespace fastudy::test
