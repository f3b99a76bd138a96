// The modelled data-parallel reduction ([train] dp_width and allreduce; docs/configuration.md "Training-loop axes"):
// the gradients of W data-parallel shards summed in a declared order (ReduceOrder, src/core/settings.hpp),
// then divided by W, so that a variant's arithmetic is that of a W-rank run with that allreduce
// algorithm whatever ranks compute it. Plain arithmetic on host buffers (no MPI, no LibTorch).
//
// Notation: g_s is shard s's gradient (s = 0..W-1, the data-parallel rank that computes it); fp addition
// is commutative, so only the association (the bracketing) matters.
//   rank: ((g_0 + g_1) + g_2) + ... + g_{W-1}, every element (a reduce to rank 0 in rank order).
//   ring: the ring reduce-scatter of NCCL's ring allreduce: the n values are cut into W chunks,
//         chunk c = [floor(c n / W), floor((c+1) n / W)); chunk c starts at rank c+1, travels the ring
//         and ends, fully reduced, at rank c: ((g_{c+1} + g_{c+2}) + ...) + g_c (indices mod W). Open
//         MPI's ring allreduce is the same ring with chunk c starting at rank c (a relabelling of the
//         chunks); real NCCL cuts the buffer into slices of a fixed byte size and rotates every slice
//         group this way, so which element gets which rotation depends on the buffer size there.
//   tree: recursive doubling (Open MPI's allreduce for small buffers; a balanced binary tree): with P
//         the largest power of two <= W and e = W - P, shards 2i and 2i+1 (i < e) are first added
//         pairwise, leaving P partial sums in order; then adjacent partials are added pairwise,
//         level by level: W = 4: (g_0 + g_1) + (g_2 + g_3); W = 3: (g_0 + g_1) + g_2 (= rank);
//         W = 5: ((g_0 + g_1) + g_2) + (g_3 + g_4); W = 6: ((g_0 + g_1) + (g_2 + g_3)) + (g_4 + g_5).
// For W = 1 and W = 2 the three orders are the same bits (a single value; a + b == b + a).
#pragma once

#include <cstddef>

#include "src/core/settings.hpp"

namespace fastudy {

// shards holds W buffers of n values, shard s at shards + s * n. Writes out[i] = (the sum of the W
// values of element i in `order`) / W: a division (rounding once), none for W = 1. out must not overlap
// shards.
void reduce_shards(ReduceOrder order, const float* shards, int width, std::size_t n, float* out);
void reduce_shards(ReduceOrder order, const double* shards, int width, std::size_t n, double* out);

}  // namespace fastudy
