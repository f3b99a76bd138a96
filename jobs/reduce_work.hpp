// How `fastudy reduce` splits its work over N ranks, and what that costs: the schedule every rank
// computes alike (which tensors are sorted over all ranks, which are dealt whole to one), and the
// estimate of time and memory per rank that `fastudy plan` prints before any work (and reduce logs
// when it starts), from rates measured on this machine.
//
// The work of one checkpoint step (jobs/reduce.cpp; R runs, P parameters, K pairs, N ranks):
//   read      every value once: R P / N values per rank (the tensors dealt to it whole, a window of each
//             split one), converted to fp32 (fp64 when a tensor is stored so), into its share of the
//             whole model;
//   per tensor  the elementwise sums over the values read (K pairs), each tensor's values sorted where
//             they were read (a dealt one on its rank; a split one by the distributed sort: a partition
//             by value range and one all-to-all of its R n / N values per rank, the sort writing this
//             rank's window), each sorted set checked, and the sorted sums (K pairs);
//   whole model  the shares (R P / N values, sorted runs), sorted over the ranks by value range
//             (analysis/sorted_exchange.hpp: the pieces that leave packed by destination, one
//             all-to-all, one variant at a time; the rank's own pieces sorted where they are), the sort
//             writing the rank's window in place, and the sorted sums over it (K pairs).
// After each sort's all-to-all only the values outside the rank's window move once more (the ranges'
// excess over the windows, a few per cent). So a step costs about
//   (R P / N) (t_read + 2 t_sort + 2 t_check + (1 - 1/N) (t_pack + 2 t_copy)) + (K P / N) (t_elementwise + 2 t_sorted)
// per rank, plus t_partition for each split tensor's values (its all-to-all copies what stays once and
// what leaves twice: MPI's shared-memory transport copies through a buffer; across nodes it is the
// network's; one rank packs and copies nothing), and holds R P / N values of the model's shares plus
// the exchange buffers of its largest split tensor or of what leaves and arrives of one run's share,
// whichever is larger; the first step writes every buffer's pages for the first time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "analysis/ranking.hpp"
#include "jobs/reduce_output.hpp"
#include "src/core/config.hpp"

namespace fastudy {

// Each grid axis with its role, baseline and replicate flag (the ranking's input): the study's
// [axes.NAME], else the axis table (kGridAxes, src/core/grid.cpp), else a setting (study_axis).
std::vector<RankingAxis> ranking_axes(const Study& st);
std::vector<RankingVariant> ranking_variants(const std::vector<const Variant*>& variants);

// What the study asks reduce to compute ([reduce] metrics, per_tensor, whole_model) and between which
// variants (reduce_pairs), into the plan: the same on every rank.
void choose_reduce_work(const Study& st, ReducePlan& plan);
// A trained study's reduce as `fastudy plan` sees it before any checkpoint exists: every variant, the
// checkpoint steps ([reduce] steps or the schedule), the model's tensors (model_tensor_sizes), and the
// work chosen as reduce chooses it.
ReducePlan planned_reduce(const Study& st);

// The pairs of variants reduce computes (ReducePlan::pairs; indices into `variants`, i < j,
// ascending): with [reduce] pairs = "verdict" (the default) those the ranking and the verdict use
// (verdict_pairs: the pairs that differ in one axis), with "all" every pair; a list adds its pairs to the
// verdict's (a pair naming a variant that is left out is skipped, said in *note). *note says which.
std::vector<std::pair<std::size_t, std::size_t>> reduce_pairs(const Study& st, const std::vector<RankingAxis>& axes,
                                                              const std::vector<RankingVariant>& variants,
                                                              std::string* note);

// Only a tensor at least this large (elements) may be sorted over all ranks rather than dealt whole to
// one: below it the exchanges cost more than they save.
inline constexpr std::size_t kSplitElements = std::size_t{1} << 18;
// Tensors are dealt whole (no partition, no exchange) as long as every rank's values stay within this
// fraction of the mean; the largest ones are split over all ranks only as far as the balance needs.
inline constexpr double kDealBalance = 0.03;

// What one reduce compares and computes.
struct ReduceShape {
  std::size_t runs = 0;              // R: variants (runs) compared
  std::size_t steps = 0;             // checkpoint steps
  std::vector<std::int64_t> sizes;   // elements of every tensor
  std::size_t pairs = 0;             // K: pairs of runs computed
  std::size_t value_bytes = 4;       // 4 (compared as fp32) or 8 (fp64)
  double stored_bytes = 4;           // bytes per value in the files (bf16 2, fp32 4, fp64 8)
  bool per_tensor = true;            // [reduce] per_tensor
  bool whole_model = true;           // [reduce] whole_model
  bool elementwise = true;           // some of max_abs, mean_abs, rel_l2 in [reduce] metrics
  bool w2 = false;                   // w2 in [reduce] metrics
};

// Which tensors are split over the ranks and who computes the others: the same on every rank.
struct ReduceSchedule {
  std::vector<char> split;          // per tensor: sorted over every rank (the distributed sort)
  std::vector<int> owner;           // per tensor: the rank that computes it whole (-1 when split)
  std::vector<std::size_t> order;   // tensors in the order the ranks take them: split ones, largest
                                    // first (every rank at once), then the dealt ones, largest first
  // The values rank q reads and keeps as its share of the whole model (windows of split tensors, its
  // dealt tensors whole).
  std::size_t share(std::size_t q, const std::vector<std::int64_t>& sizes, int ranks) const;
};
// The tensors are dealt largest first to the least loaded rank (src/runtime/deal.hpp); when that leaves
// a rank more than kDealBalance above the mean, the largest tensors (of at least kSplitElements) are
// split over all ranks instead, the fewest that restore the balance (or all of them).
ReduceSchedule schedule_reduce(const std::vector<std::int64_t>& sizes, int ranks);

// The shape of a plan's work; stored_bytes: bytes per value in its files.
ReduceShape reduce_shape(const ReducePlan& plan, double stored_bytes);

// Seconds per unit of work on one core of this machine (measure_reduce_rates).
struct ReduceRates {
  double read_byte = 0;          // converting stored bytes to values (a file in the page cache)
  double read_call = 0;          // each read of a tensor's range of one run (opening, finding it)
  double sort_value = 0;         // the radix sort
  double partition_value = 0;    // the distributed sort's partition of an unsorted value
  double move_byte = 0;          // one memory copy of a byte (buffers larger than the caches)
  double sorted_view = 0;        // a sorted set's check of its windows, per variant and position
  double sorted_pair = 0;        // W1 sums, per pair and sorted position (W2 with them: sorted_pair_w2)
  double sorted_pair_w2 = 0;
  double elementwise_pair = 0;   // max |d|, sum |d|, sum d^2, per pair and position
  double touch_byte = 0;         // the first write of a byte of fresh memory (the kernel zeroes its page)
  double base_bytes = 0;         // this process's resident memory before any reduce buffer
  std::string source;            // what was measured ("fp32, ..."), for the printout
};
// Times each kind of work (about a second in all; the partition for `ranks` ranks, the pairwise sums
// on `variants` runs and `pairs` pairs, at most 8 and 28) in CPU time (thread_cpu_seconds, which holds
// the kernel's time of the thread's page faults): the rates of a core of its own, as the estimate
// assumes, also while other work shares the machine. The read rates are set to a memory copy's, for
// the caller to measure on the study's own files where it has some (by the same clock).
ReduceRates measure_reduce_rates(std::size_t value_bytes, int ranks, std::size_t variants, std::size_t pairs);
// This thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID): the clock of the rates.
double thread_cpu_seconds();

struct ReduceEstimate {
  double step_seconds = 0;      // one checkpoint step, the slowest rank
  double seconds = 0;           // every step
  double read_seconds = 0;      // of a step: reading
  double sort_seconds = 0;      //   sorting (per tensor and whole model)
  double move_seconds = 0;      //   partitions, packing and all-to-alls
  double pair_seconds = 0;      //   the pairwise sums
  double touch_seconds = 0;     // once, in the first step: the first write of every buffer's pages (what
                                // of it the reads' overlap does not hide)
  double peak_bytes = 0;        // resident memory of the largest rank
  double share_bytes = 0;       //   of it, the whole model's shares
  std::size_t share_values = 0; // values per run in the largest share
};
// `cores` is the cores the N ranks share (N when each rank has its own core; fewer: they take turns; at
// least 2N: each rank's reader thread has a core too, and the reads overlap the work).
ReduceEstimate estimate_reduce(const ReduceShape& shape, int ranks, int cores, const ReduceRates& rates);

}  // namespace fastudy
