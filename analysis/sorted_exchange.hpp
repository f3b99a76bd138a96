// The distributed sort of the reduce job: every variant's values of one distribution (a tensor too
// large for one rank, or the whole model) sorted over the ranks of a communicator, so that rank q ends
// with window q of the sorted positions of every variant (block_aligned_part(n, R, q)) and no rank ever
// holds more than about its share. A sample sort:
//
//   1. splitters from a sample: every rank takes evenly spaced values of its share of each variant
//      (of a share made of sorted runs, a stratified sample of their quantiles); the samples of variant
//      v go to rank v mod R, which picks R - 1 splitters at the sample quantiles of the windows' first
//      positions, and every rank gets every variant's splitters;
//   2. partition and all-to-all: each value goes to the rank whose value range holds it (values equal
//      to a splitter are spread over the ranks whose ranges that splitter bounds, so a value repeated a
//      million times cannot overload one rank), in one MPI_Alltoallv;
//   3. local sort into the windows: the ranks' counts give every value range its global sorted
//      positions; each rank radix-sorts what it received, one value range of each variant, and the
//      sort writes the positions that fall in the rank's own window straight to their places there;
//   4. exact windows: the sorted positions outside the rank's window (the values near each boundary
//      of its range: with a good sample, a few per cent) go in one more all-to-all to the rank whose
//      window holds them. The values that stay are not copied again.
//
// The windows are exactly those of analysis/distance.hpp's block-aligned split, so pairwise sums
// accumulated over them are bit-identical to one process sorting everything
// (tests/analysis/test_pairwise_mpi.cpp), whatever the number of ranks and however good the sample;
// the sample only decides how many values step 4 moves and how far a rank's range exceeds its window.
//
// Memory per rank: sort_windows needs three buffers of the task's V n / R values (the caller's, the
// partition's and the received ranges), the partition's range of each value (a byte up to 256 ranks)
// and the sort's keys of one range; sort_shares (the whole model) holds the V shares and exchanges one
// variant at a time. Of shares made of sorted runs, each is cut into the ranks' value ranges by binary
// searches, only the pieces that leave are packed and exchanged (two buffers of about (R - 1) n / R^2
// values), and the rank's own pieces are read by its sort where they lie in the share, which then
// takes the window in place. The buffers are sized for the largest variant, with a margin that costs
// no memory until written (a page is taken on its first write), so a step allocates each once.
// Exchanges larger than MPI's int counts go in pieces. Part of fastudy_analysis_mpi: the rest of
// analysis/ stays free of MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "analysis/distance.hpp"
#include "analysis/radix_sort.hpp"
#include "analysis/value_buffer.hpp"
#include "src/runtime/mpi.hpp"

namespace fastudy {

// Values per rank and variant the splitters are chosen from: max(1024, 64 R), so that a rank's value
// range exceeds its window by several per cent at most (of unsorted shares the sample quantile's error
// is about sqrt(R / samples) / 2 of a window, 6% at 64 R; a share of sorted runs is sampled
// stratified, with less), while the splitters' owner sorts only 64 R^2 samples per variant.
std::size_t sort_samples(std::size_t ranks);

// What the distributed sorts moved on this rank since construction (the reduce's log and the cost
// model's check).
struct SortTraffic {
  std::uint64_t values_sent = 0;    // by the partitions' all-to-alls (to other ranks)
  std::uint64_t values_moved = 0;   // by the exact windows' all-to-alls (to other ranks)
  double largest_excess = 0;        // the most a received value range exceeded its window (fraction)
};

// An exchange larger than this (bytes sent or received by some rank) goes in several all-to-alls.
inline constexpr std::size_t kExchangeBytes = std::size_t{1} << 30;

// The range the partition assigns to each value, kept between its two passes (one to count, one to
// write): a byte per value up to 256 ranges, two up to 65536, else four; reused from call to call.
struct PartitionScratch {
  ValueBuffer<std::uint8_t> b1;
  ValueBuffer<std::uint16_t> b2;
  ValueBuffer<std::uint32_t> b4;
};

template <class T>
class DistributedSort {
 public:
  // `exchange_bytes`: the largest all-to-all (tests make it small to exercise the pieces).
  explicit DistributedSort(const mpi::Comm& world, std::size_t exchange_bytes = kExchangeBytes)
      : world_(world), exchange_bytes_(exchange_bytes) {}

  // Collective. values[v] points at variant v's unsorted window of a distribution of n values per
  // variant: its values at positions block_aligned_part(n, R, r) of the unsorted distribution (L, the
  // window's length, of them). On return the same positions of every variant's sorted distribution are
  // at windows[v] (L values each; empty `windows`, or windows that are `values`: in place of the
  // unsorted ones). `values`' contents are lost either way.
  void sort_windows(const std::vector<T*>& values, std::size_t n, const std::vector<T*>& windows = {});

  // Collective. shares[v] is this rank's share of variant v's n values (the ranks' shares together hold
  // every value once; any split will do; the same length for every variant). `runs` lists the lengths
  // of the share's sorted runs (shares made of per-tensor sorted windows), or is empty when the shares
  // are unsorted. On return shares[v] holds the window block_aligned_part(n, R, r) of variant v's
  // sorted values.
  void sort_shares(std::vector<ValueBuffer<T>>& shares, std::size_t n, const std::vector<std::size_t>& runs);

  // This rank alone: each of the V runs values[v] (`length` values each) sorted to windows[v] (empty,
  // or windows[v] == values[v]: in place), with the sort's scratch kept for the next call.
  void sort_each(const std::vector<T*>& values, std::size_t length, const std::vector<T*>& windows = {});

  // Room for the radix sort's scratch of sorts of up to `values` values: a caller that knows its largest
  // sort asks for it first, so that the scratch is allocated once and each of its pages written for the
  // first time once, not again by a larger sort after a smaller one.
  void reserve_sort(std::size_t values);

  const SortTraffic& traffic() const { return traffic_; }

  using Key = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;

 private:
  std::vector<Key> splitters(const std::vector<const T*>& shares, std::size_t length, std::size_t n,
                             std::size_t samples);
  // Collective: ranges[v] are the pieces of this rank's value range of variant v (the ranges of ranks 0,
  // 1, ... in order hold each variant's n values); on return windows[v] holds the window
  // block_aligned_part(n, R, r) of v's sorted values. The pieces may lie in sorted_ (all are read
  // before it receives); send_ is overwritten.
  void sort_to_windows(const std::vector<std::vector<SortSpan<T>>>& ranges, std::size_t n, const std::vector<T*>& windows);
  void exchange(const T* send, const std::vector<std::size_t>& send_counts, T* recv,
                const std::vector<std::size_t>& recv_counts);

  const mpi::Comm& world_;
  const std::size_t exchange_bytes_;
  ValueBuffer<T> send_;    // partitioned values (by destination rank)
  ValueBuffer<T> sorted_;  // the received value ranges (then the values arriving for the windows)
  PartitionScratch ranges_;  // the partition's range of each value
  ValueBuffer<Key> keys_;  // the radix sort's scratch
  SortTraffic traffic_;
};

// The partition of the distributed sort: the `length` values of each of the V arrays x[v] into `ranks`
// value ranges, bounded for variant v by the ranks - 1 sorted splitter keys at splitters[v (ranks - 1),
// (v + 1) (ranks - 1)) (sort_key order; a value equal to splitters goes round robin to the ranks they
// bound, starting at tie + v), written to out by range, then variant: counts[d V + v] of variant v's
// values to range d. One search per value (its range kept in `scratch` for the writing pass).
template <class T, class Key>
void partition_values(const std::vector<const T*>& x, std::size_t length, const Key* splitters, std::size_t ranks,
                      std::size_t tie, std::size_t* counts, T* out, PartitionScratch& scratch);

// Collective: every rank's partials combined (sums by MPI_SUM, maxima by MPI_MAX), on every rank.
void allreduce_partials(const mpi::Comm& world, PairwisePartials& partials);

}  // namespace fastudy
