// The pairwise partial sums (analysis/distance.hpp) of one task — V variants of one tensor, or of the
// whole model, n values each — computed by one rank alone (local_partials) or by every rank of a
// communicator together (SortedExchange::split_partials), the distributed recipe of the reduce job:
//
//   every variant is sorted once in the whole job (or once per node), its sorted array is cut into
//   block-aligned windows (block_aligned_part), and rank q accumulates window q of the sorted positions
//   of every pair (and, for the elementwise metrics, window q of the unsorted indices); the callers
//   combine the ranks' partials with allreduce_partials. Block-aligned windows make the combined sums
//   bit-identical to local_partials on one process, so the results do not depend on the number of
//   ranks (tests/analysis/test_pairwise_mpi.cpp).
//
// How the ranks see each other's sorted arrays (SortedExchange): through memory shared by the ranks of
// a node (each node sorts every variant once, its ranks a share each, and every rank reads the sorted
// windows in place), or, where shared memory is off or too small, by MPI_Alltoallv of the sorted
// windows (each variant sorted once in the whole job, then copied).
//
// The values come from the caller (VariantValues: reduce copies them out of the checkpoints'
// parameters), as float or double; all arithmetic is fp64 either way. Part of fastudy_analysis_mpi:
// the rest of analysis/ stays free of MPI.
#pragma once

#include <cstddef>
#include <functional>

#include "analysis/distance.hpp"
#include "src/runtime/mpi.hpp"

namespace fastudy {

// Writes values [begin, end) of variant `variant` to dst (end - begin values).
template <class T>
using VariantValues = std::function<void(std::size_t variant, std::size_t begin, std::size_t end, T* dst)>;

// The partial sums of one task computed by this rank alone: every variant sorted, every pair over
// [0, n); the elementwise sums too when `elementwise` (without them: the sorted part only, e.g. of the
// whole model, whose elementwise sums are its tensors' added up).
template <class T>
PairwisePartials local_partials(std::size_t variants, std::size_t n, const VariantValues<T>& values,
                                bool elementwise);

class SortedExchange {
 public:
  // One rank: nothing to exchange.
  SortedExchange() = default;
  // Collective over `world`: node-shared memory unless FASTUDY_REDUCE_SHARED=0, or unless the
  // shared-memory directory of some node (Open MPI's osc_sm_backing_directory, /dev/shm by default)
  // has less room than its ranks need for the largest task (`largest_task` values of each of
  // `variants` variants, counted as double). Every rank gets the same answer; the fallback is logged.
  SortedExchange(const mpi::Comm& world, std::size_t variants, std::size_t largest_task);

  bool shared() const { return shared_; }

  // Collective over `world` (the communicator the exchange was made for). This rank's partial sums of
  // one task of `variants` variants of n values: its block-aligned window of the sorted positions and,
  // with `elementwise`, of the unsorted indices. Combine them with allreduce_partials.
  template <class T>
  PairwisePartials split_partials(const mpi::Comm& world, std::size_t variants, std::size_t n,
                                  const VariantValues<T>& values, bool elementwise);

 private:
  template <class T>
  PairwisePartials split_partials_shared(const mpi::Comm& world, std::size_t variants, std::size_t n,
                                         const VariantValues<T>& values, bool elementwise);
  template <class T>
  PairwisePartials split_partials_alltoallv(const mpi::Comm& world, std::size_t variants, std::size_t n,
                                            const VariantValues<T>& values, bool elementwise);

  bool shared_ = false;
  mpi::Comm node_;             // the ranks of this rank's node (shared)
  mpi::SharedWindow window_;   // reused by every split task; grown when a task needs more
};

// Collective: every rank's partials combined (sums by MPI_SUM, maxima by MPI_MAX), on every rank.
void allreduce_partials(const mpi::Comm& world, PairwisePartials& partials);

}  // namespace fastudy
