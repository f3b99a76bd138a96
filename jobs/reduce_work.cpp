// The reduce's schedule and cost model (reduce_work.hpp).
#include "jobs/reduce_work.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "analysis/distance.hpp"
#include "analysis/radix_sort.hpp"
#include "analysis/sorted_exchange.hpp"
#include "analysis/value_buffer.hpp"
#include "jobs/estimate.hpp"
#include "src/io/checkpoint.hpp"
#include "src/runtime/deal.hpp"

namespace fastudy {

namespace {

SourceRole source_role(AxisRole role) {
  switch (role) {
    case AxisRole::optimisation: return SourceRole::optimisation;
    case AxisRole::reference: return SourceRole::reference;
    case AxisRole::noise: return SourceRole::noise;
    case AxisRole::setting: return SourceRole::setting;
  }
  return SourceRole::setting;
}

}  // namespace

std::vector<RankingAxis> ranking_axes(const Study& st) {
  std::vector<RankingAxis> axes;
  for (const auto& [name, values] : st.axes) {
    const GridAxisInfo info = study_axis(st, name);
    axes.push_back(RankingAxis{name, values, source_role(info.role), info.baseline, info.replicate});
  }
  return axes;
}

std::vector<RankingVariant> ranking_variants(const std::vector<const Variant*>& variants) {
  std::vector<RankingVariant> rv;
  for (const auto* v : variants) rv.push_back({v->id, v->axes});
  return rv;
}

void choose_reduce_work(const Study& st, ReducePlan& plan) {
  plan.metrics.clear();
  for (std::size_t k = 0; k < kPairMetricCount; ++k)
    if (std::find(st.reduce.metrics.begin(), st.reduce.metrics.end(), kPairMetrics[k].name) != st.reduce.metrics.end())
      plan.metrics.push_back(k);
  plan.per_tensor = st.reduce.per_tensor;
  plan.whole_model = st.reduce.whole_model;
  plan.pairs = reduce_pairs(st, ranking_axes(st), ranking_variants(plan.variants), &plan.pairs_note);
}

ReducePlan planned_reduce(const Study& st) {
  ReducePlan plan;
  for (const auto& v : st.variants) {
    plan.variants.push_back(&v);
    plan.f64 |= v.precision == Format::fp64;
  }
  if (!st.reduce.steps.empty()) plan.steps = st.reduce.steps;
  else plan.steps = checkpoint_schedule(st.train.checkpoint_every, st.train.steps);
  for (const auto& [name, size] : model_tensor_sizes(st.model)) {
    plan.tensors.push_back(name);
    plan.sizes.push_back(size);
  }
  plan.tensors.push_back(kModelTensor);
  choose_reduce_work(st, plan);
  return plan;
}

ReduceShape reduce_shape(const ReducePlan& plan, double stored_bytes) {
  ReduceShape s;
  s.runs = plan.variants.size();
  s.steps = plan.steps.size();
  s.sizes = plan.sizes;
  s.pairs = plan.pairs.size();
  s.value_bytes = plan.f64 ? 8 : 4;
  s.stored_bytes = stored_bytes;
  s.per_tensor = plan.per_tensor;
  s.whole_model = plan.whole_model;
  s.elementwise = plan.needs(MetricPass::elementwise);
  s.w2 = plan.needs(MetricPass::sorted_w2);
  return s;
}

std::vector<std::pair<std::size_t, std::size_t>> reduce_pairs(const Study& st, const std::vector<RankingAxis>& axes,
                                                              const std::vector<RankingVariant>& variants,
                                                              std::string* note) {
  const ReduceConfig& rc = st.reduce;
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  if (rc.pairs == "all") {
    for (std::size_t i = 0; i < variants.size(); ++i)
      for (std::size_t j = i + 1; j < variants.size(); ++j) pairs.emplace_back(i, j);
    *note = "all";
    return pairs;
  }
  pairs = verdict_pairs(axes, variants);
  *note = "the verdict's";
  std::size_t added = 0;
  std::vector<std::string> skipped;
  for (const auto& [a, b] : rc.pair_list) {
    std::size_t ia = variants.size(), ib = variants.size();
    for (std::size_t v = 0; v < variants.size(); ++v) {
      if (variants[v].id == a) ia = v;
      if (variants[v].id == b) ib = v;
    }
    if (ia == variants.size() || ib == variants.size()) {
      skipped.push_back(a + " <-> " + b);
      continue;
    }
    const auto p = std::make_pair(std::min(ia, ib), std::max(ia, ib));
    if (std::find(pairs.begin(), pairs.end(), p) == pairs.end()) pairs.push_back(p), ++added;
  }
  std::sort(pairs.begin(), pairs.end());
  if (!rc.pair_list.empty()) *note += " and " + std::to_string(added) + " listed in [reduce] pairs";
  if (!skipped.empty()) *note += " (left out with their variants: " + std::to_string(skipped.size()) + ")";
  return pairs;
}

namespace {

// The tensors dealt whole when the `k` largest of `splittable` are split: their owners, and whether
// every rank's values (its dealt tensors plus its window of the split ones) stay within kDealBalance of
// the mean.
struct Deal {
  std::vector<int> owner;  // per tensor, -1 when split
  bool balanced = false;
};
Deal deal_unsplit(const std::vector<std::int64_t>& sizes, const std::vector<std::size_t>& splittable, std::size_t k,
                  int ranks) {
  std::vector<char> split(sizes.size(), 0);
  for (std::size_t i = 0; i < k; ++i) split[splittable[i]] = 1;
  std::vector<std::size_t> dealt;
  std::vector<double> costs;
  double total = 0, split_values = 0;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const double n = static_cast<double>(sizes[t]);
    total += n;
    if (split[t]) {
      split_values += n;
    } else {
      dealt.push_back(t);
      costs.push_back(std::max(n, 1.0));
    }
  }
  Deal d;
  d.owner.assign(sizes.size(), -1);
  const std::vector<int> to = deal_largest_first(costs, ranks);
  std::vector<double> load(static_cast<std::size_t>(ranks), split_values / ranks);
  for (std::size_t i = 0; i < dealt.size(); ++i) {
    d.owner[dealt[i]] = to[i];
    load[static_cast<std::size_t>(to[i])] += static_cast<double>(sizes[dealt[i]]);
  }
  d.balanced = *std::max_element(load.begin(), load.end()) <= (1.0 + kDealBalance) * total / ranks;
  return d;
}

}  // namespace

ReduceSchedule schedule_reduce(const std::vector<std::int64_t>& sizes, int ranks) {
  ReduceSchedule s;
  const std::size_t T = sizes.size();
  s.split.assign(T, 0);
  s.owner.assign(T, -1);
  // The tensors that may be split, largest first (ties in tensor order); the fewest of them split
  // (found by bisection over how many) that let the rest be dealt within the balance, else all.
  std::vector<std::size_t> splittable;
  if (ranks > 1)
    for (std::size_t t = 0; t < T; ++t)
      if (static_cast<std::size_t>(sizes[t]) >= kSplitElements) splittable.push_back(t);
  std::stable_sort(splittable.begin(), splittable.end(), [&](std::size_t a, std::size_t b) { return sizes[a] > sizes[b]; });
  std::size_t lo = 0, hi = splittable.size();
  Deal best = deal_unsplit(sizes, splittable, hi, ranks);
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    Deal d = deal_unsplit(sizes, splittable, mid, ranks);
    if (d.balanced) {
      hi = mid;
      best = std::move(d);
    } else {
      lo = mid + 1;
    }
  }
  s.owner = best.owner;
  for (std::size_t t = 0; t < T; ++t) s.split[t] = s.owner[t] < 0 ? 1 : 0;
  for (std::size_t t = 0; t < T; ++t) s.order.push_back(t);
  // Split tensors first (every rank takes them together), then the dealt ones; largest first within
  // each, ties in tensor order: the big exchange buffers are needed while the model's shares are small.
  std::stable_sort(s.order.begin(), s.order.end(), [&](std::size_t a, std::size_t b) {
    if (s.split[a] != s.split[b]) return s.split[a] > s.split[b];
    return sizes[a] > sizes[b];
  });
  return s;
}

std::size_t ReduceSchedule::share(std::size_t q, const std::vector<std::int64_t>& sizes, int ranks) const {
  std::size_t n = 0;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const auto size = static_cast<std::size_t>(sizes[t]);
    if (split[t]) {
      const IndexRange w = block_aligned_part(size, static_cast<std::size_t>(ranks), q);
      n += w.end - w.begin;
    } else if (owner[t] == static_cast<int>(q)) {
      n += size;
    }
  }
  return n;
}

namespace {

// The median of three timings of f in this thread's CPU time: a core's speed, which the estimate
// assumes for every rank, whatever else the machine runs meanwhile.
template <class F>
double median3(F&& f) {
  double t[3];
  for (double& x : t) {
    const double t0 = thread_cpu_seconds();
    f();
    x = thread_cpu_seconds() - t0;
  }
  std::sort(t, t + 3);
  return t[1];
}

double resident_bytes() {
  std::ifstream in("/proc/self/statm");
  double pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

// Each rate on buffers of 2^22 values (16 or 32 MiB each, several of them at once): larger than the
// last-level caches of most machines, as the reduce's buffers are, so that a copy is timed at the
// speed of memory, not of a cache that holds both its ends. The pairwise sums are timed on as many
// variants and pairs as the study has, up to 8 and 28 (per pair they cost less the more pairs share a
// variant's values).
template <class T>
ReduceRates measure(std::size_t value_bytes, int ranks, std::size_t variants, std::size_t pairs) {
  constexpr std::size_t n = std::size_t{1} << 22;
  ReduceRates r;
  r.base_bytes = resident_bytes();
  std::mt19937 rng(11);
  std::normal_distribution<double> normal(0.0, 0.02);
  const std::size_t V = std::clamp<std::size_t>(variants, 2, 8);
  const std::size_t K = std::clamp<std::size_t>(pairs, 1, V * (V - 1) / 2);
  std::vector<std::vector<T>> runs(V, std::vector<T>(n));
  for (std::size_t i = 0; i < n; ++i) {
    runs[0][i] = static_cast<T>(normal(rng));
    for (std::size_t v = 1; v < V; ++v) runs[v][i] = runs[0][i] + static_cast<T>(1e-4 * normal(rng));
  }
  std::vector<T>& a = runs[0];
  std::vector<T> c(n);
  ValueBuffer<std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>> keys;
  // The sort on 2^24 values (its rate grows a little with the size: a reduce sorts a run's tensor or
  // share, millions of values), the keys' pages written once before the timing. (Its buffers are kept
  // to the end: see the fresh pages' timing.)
  const std::size_t big = n * 4;
  std::vector<T> in(big), sorted(big);
  for (std::size_t i = 0; i < big; ++i) in[i] = runs[i % V][(i * 2654435761u) % n];
  radix_sort_into(in.data(), sorted.data(), big, keys);
  r.sort_value = median3([&] { radix_sort_into(in.data(), sorted.data(), big, keys); }) / static_cast<double>(big);
  radix_sort_into(a.data(), c.data(), n, keys);
  // The partition into the ranks' value ranges (a binary search over R - 1 splitters per value).
  const auto R = static_cast<std::size_t>(std::max(ranks, 2));
  std::vector<typename DistributedSort<T>::Key> splitters;
  for (std::size_t d = 1; d < R; ++d) splitters.push_back(sort_key(c[d * n / R]));
  std::vector<std::size_t> counts(R);
  ValueBuffer<T> out;
  out.assign_uninitialized(n);
  PartitionScratch scratch;
  const std::vector<const T*> unsorted{a.data()};
  r.partition_value = median3([&] { partition_values(unsorted, n, splitters.data(), R, 0, counts.data(), out.data(), scratch); }) /
                      static_cast<double>(n);
  r.move_byte = median3([&] { std::memcpy(c.data(), a.data(), n * sizeof(T)); }) / static_cast<double>(n * sizeof(T));
  std::vector<VariantPair> some;
  for (std::size_t i = 0; i < V && some.size() < K; ++i)
    for (std::size_t j = i + 1; j < V && some.size() < K; ++j) some.emplace_back(i, j);
  std::vector<const T*> each;
  for (const auto& x : runs) each.push_back(x.data());
  r.elementwise_pair = median3([&] {
                         PairwisePartials p(V, some);
                         accumulate_elementwise(each, 0, n, p);
                       }) / static_cast<double>(n * K);
  for (auto& x : runs) radix_sort_into(x.data(), x.data(), n, keys);
  SortedSet<T> set;
  // Each task's set of sorted windows checks every value once (its order, the non-finite count).
  r.sorted_view = median3([&] {
                    SortedSet<T> s;
                    for (const auto& x : runs) s.add_sorted_view(x.data(), n, 0, n);
                  }) / static_cast<double>(n * V);
  for (const auto& x : runs) set.add_sorted_view(x.data(), n, 0, n);
  r.sorted_pair = median3([&] {
                    PairwisePartials p(V, some);
                    accumulate_sorted(set, 0, n, p, SortedMetrics::w1);
                  }) / static_cast<double>(n * K);
  r.sorted_pair_w2 = median3([&] {
                       PairwisePartials p(V, some);
                       accumulate_sorted(set, 0, n, p, SortedMetrics::w1_w2);
                     }) / static_cast<double>(n * K);
  // A fresh buffer's first write: the kernel's zeroing of its pages (the reduce writes each page of its
  // buffers once, in the first step). 256 MiB: on a virtual machine a page's first write costs more
  // where the host has not backed it before, and this averages over many pages. Timed last, while every
  // buffer above is held: on a guest whose free memory goes back to its host a few seconds after it is
  // freed (Linux's free page reporting), pages freed a moment ago come back at memory speed and the
  // others at the host's. A reduce's gigabytes are mostly the others; this process's own buffers, freed
  // now, would give the first kind.
  {
    const std::size_t bytes = std::size_t{1} << 28;
    ValueBuffer<T> fresh;
    fresh.assign_uninitialized(bytes / sizeof(T));
    const double t0 = thread_cpu_seconds();
    std::fill(fresh.data(), fresh.data() + bytes / sizeof(T), T(1));
    r.touch_byte = (thread_cpu_seconds() - t0) / static_cast<double>(bytes);
  }
  r.read_byte = r.move_byte;  // the caller measures the study's own files where there are some
  char what[512];
  std::snprintf(what, sizeof what,
                "%s values, %zu per timing: sort %.3g ns (of %zu), partition into %zu ranges %.3g ns, sorted sets' checks "
                "%.3g ns, per value; pairwise sums %.3g ns (sorted) and %.3g ns (elementwise) per value and pair (%zu "
                "pairs of %zu runs); copies %.3g GB/s, fresh pages %.3g GB/s",
                value_bytes == 8 ? "fp64" : "fp32", n, 1e9 * r.sort_value, 4 * n, R, 1e9 * r.partition_value,
                1e9 * r.sorted_view, 1e9 * r.sorted_pair, 1e9 * r.elementwise_pair, K, V, 1e-9 / r.move_byte,
                1e-9 / r.touch_byte);
  r.source = what;
  return r;
}

}  // namespace

double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

ReduceRates measure_reduce_rates(std::size_t value_bytes, int ranks, std::size_t variants, std::size_t pairs) {
  return value_bytes == 8 ? measure<double>(8, ranks, variants, pairs) : measure<float>(4, ranks, variants, pairs);
}

ReduceEstimate estimate_reduce(const ReduceShape& shape, int ranks, int cores, const ReduceRates& rates) {
  ReduceEstimate e;
  const ReduceSchedule s = schedule_reduce(shape.sizes, ranks);
  const auto N = static_cast<std::size_t>(ranks);
  const double V = static_cast<double>(shape.runs), K = static_cast<double>(shape.pairs);
  const double vb = static_cast<double>(shape.value_bytes);
  // A received value range over its window (the sample's error, sort_samples); none on one rank.
  const double excess = N > 1 ? 1.05 : 1.0;
  std::size_t P = 0;
  for (auto n : shape.sizes) P += static_cast<std::size_t>(n);
  // The slowest rank: the one with the largest share (windows of the split tensors plus its dealt ones).
  std::size_t q = 0;
  for (std::size_t r = 1; r < N; ++r)
    if (s.share(r, shape.sizes, ranks) > s.share(q, shape.sizes, ranks)) q = r;
  // This rank's tasks in order, and the values of each (its window of a split tensor, or the whole).
  std::vector<double> lengths;
  std::vector<char> split;
  for (std::size_t t : s.order) {
    if (!s.split[t] && s.owner[t] != static_cast<int>(q)) continue;
    const IndexRange w = s.split[t] ? block_aligned_part(static_cast<std::size_t>(shape.sizes[t]), N, q)
                                    : IndexRange{0, static_cast<std::size_t>(shape.sizes[t])};
    lengths.push_back(static_cast<double>(w.end - w.begin));
    split.push_back(s.split[t]);
  }
  double S = 0;
  for (double L : lengths) S += L;
  const IndexRange wm = block_aligned_part(P, N, q);
  const double W = static_cast<double>(wm.end - wm.begin);
  // An all-to-all copies what stays once and what leaves twice (through shared memory).
  const double copies = N > 1 ? 2.0 - 1.0 / static_cast<double>(N) : 0.0;
  const double sorted_pair = shape.w2 ? rates.sorted_pair_w2 : rates.sorted_pair;
  // The values outside their windows after a sort's all-to-all (sort_to_windows): about the ranges'
  // excess, moved once more.
  const double exchanged = (copies + 3 * (excess - 1)) * vb * rates.move_byte;
  // Each task's read and work (for the step's pipeline below), summed into the step's parts.
  std::vector<double> task_read(lengths.size()), task_work(lengths.size());
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    const double L = lengths[k];
    task_read[k] = V * L * shape.stored_bytes * rates.read_byte + V * rates.read_call;
    e.read_seconds += task_read[k];
    double sort = 0, move = 0, pair = shape.elementwise ? K * L * rates.elementwise_pair : 0.0;
    if (shape.per_tensor) {
      sort = V * L * rates.sort_value;
      pair += V * L * rates.sorted_view + K * L * sorted_pair;
      // The partition and the all-to-all (the sort writes the windows: the shares, with the whole model).
      if (split[k]) move = V * L * (rates.partition_value + exchanged);
    }
    task_work[k] = sort + move + pair;
    e.sort_seconds += sort, e.move_seconds += move, e.pair_seconds += pair;
  }
  // The work after the tasks: the whole model's sort and sums.
  double after_tasks = 0;
  // Of a share, the part that leaves the rank in the whole model's sort (about all but 1/N of it; what
  // stays is sorted where it is), and of a value range, the part that arrives.
  const double away = N > 1 ? 1.0 - 1.0 / static_cast<double>(N) : 0.0;
  if (shape.whole_model) {
    const double sort = V * W * excess * rates.sort_value;
    // From the sorted runs: the pieces that leave packed by destination, then the all-to-all (through
    // shared memory: copied twice); the rank's own pieces are read by its sort where they are.
    // Unsorted shares: partitioned, every value, and what stays copied once by the all-to-all. One rank
    // sorts its share in place. (The values were read straight into the shares.)
    const double moved = shape.per_tensor ? (3 * away + 3 * (excess - 1)) * vb * rates.move_byte
                                          : rates.partition_value + exchanged;
    const double move = N > 1 ? V * S * moved : 0.0;
    const double pair = V * W * rates.sorted_view + K * W * sorted_pair;
    after_tasks = sort + move + pair;
    e.sort_seconds += sort, e.move_seconds += move, e.pair_seconds += pair;
  }
  const double slower = (ranks > cores && cores > 0) ? static_cast<double>(ranks) / cores : 1.0;
  e.read_seconds *= slower, e.sort_seconds *= slower, e.move_seconds *= slower, e.pair_seconds *= slower;
  after_tasks *= slower;
  for (std::size_t k = 0; k < lengths.size(); ++k) task_read[k] *= slower, task_work[k] *= slower;
  const double compute = e.sort_seconds + e.move_seconds + e.pair_seconds;
  // With a core of its own for each rank's reader thread (cores >= 2 ranks), the reads run beside the
  // work as jobs/reduce.cpp's TaskReader does them: read k starts when read k - 1 has ended and the
  // work is done with read k - 2 (two reads in flight), task k's work when read k has ended and task
  // k - 1's work is done. The first read has nothing beside it, and the reader stops before the whole
  // model's sort. Without that core the reader thread takes turns with the work: their sum.
  const bool reader_core = cores >= 2 * ranks;
  // `first_read`/`other_first`: the extra seconds of the first step's first writes (see below).
  const auto pipeline = [&](const std::vector<double>& first_read, double other_first) {
    std::vector<double> work_end(task_read.size(), 0.0);
    double read_end = 0;
    for (std::size_t k = 0; k < task_read.size(); ++k) {
      const double may_start = std::max(read_end, k >= 2 ? work_end[k - 2] : 0.0);
      read_end = may_start + task_read[k] + first_read[k];
      work_end[k] = std::max(k >= 1 ? work_end[k - 1] : 0.0, read_end) + task_work[k];
    }
    return (work_end.empty() ? 0.0 : work_end.back()) + after_tasks + other_first;
  };
  const std::vector<double> no_first(task_read.size(), 0.0);
  e.step_seconds = reader_core ? pipeline(no_first, 0.0) : e.read_seconds + compute;
  e.seconds = e.step_seconds * static_cast<double>(shape.steps);
  // Memory: the buffers as jobs/reduce.cpp keeps them, each grown to the most any task or step asks of
  // it and kept to the end (analysis/value_buffer.hpp). With the whole model: the shares, which every
  // task's values are read into and sorted in (then hold the model's window); without: the reader's
  // two slots of a task's values. The distributed sort's: the partition (send), the received ranges
  // (sorted), the partition's range of each value and the radix sort's keys (two per value of the
  // largest range it sorts). Pass 2 on several ranks packs one run's share (send), receives its value
  // range (sorted) and sorts it; on one rank it sorts each share in place.
  const double kb = vb;  // a radix-sort key is as wide as the value
  const double db = N <= 256 ? 1 : N <= 65536 ? 2 : 4;  // the partition's range of a value (PartitionScratch)
  double slot = 0, send = 0, sorted = 0, keys = 0, ranges = 0, shares = 0;
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    const double L = lengths[k];
    if (!shape.whole_model) slot = std::max(slot, V * L * vb);
    if (!shape.per_tensor) continue;
    if (split[k]) {
      send = std::max(send, V * L * vb);
      ranges = std::max(ranges, V * L * db);
      sorted = std::max(sorted, V * L * excess * vb);
      keys = std::max(keys, 2 * L * excess * kb);
    } else {
      keys = std::max(keys, 2 * L * kb);
    }
  }
  e.share_values = static_cast<std::size_t>(S);
  if (shape.whole_model) {
    e.share_bytes = V * std::max(S, W) * vb;
    shares = e.share_bytes;
    if (N > 1) {
      // From sorted runs only what leaves is packed and only what arrives received (the rest stays in
      // the shares); unsorted shares are partitioned whole.
      const double moving = shape.per_tensor ? away : 1.0;
      send = std::max(send, S * moving * vb);
      sorted = std::max(sorted, W * excess * moving * vb);
      keys = std::max(keys, 2 * W * excess * kb);
      if (!shape.per_tensor) ranges = std::max(ranges, S * db);  // unsorted shares are partitioned
    } else {
      keys = std::max(keys, 2 * S * kb);
    }
  }
  const double peak = 2 * slot + send + sorted + keys + ranges + shares;
  e.peak_bytes = rates.base_bytes + peak;
  // Every buffer's pages are written for the first time in the first step: the kernel zeroes them. The
  // shares are first written by the reads (by the reader thread, beside the work when it has a core).
  e.touch_seconds = peak * rates.touch_byte * slower;
  if (reader_core) {
    // Each read writes its part of the shares (or its slot: the first two reads) for the first time;
    // the other buffers' first writes are the work's (counted after the tasks: most are the whole
    // model's sort's, and a task's work mostly waits for its read in the first step).
    std::vector<double> first_read(task_read.size(), 0.0);
    double read_touched = 0;
    for (std::size_t k = 0; k < task_read.size(); ++k) {
      const double bytes = shape.whole_model ? V * lengths[k] * vb : (k < 2 ? slot : 0.0);
      first_read[k] = std::min(bytes, std::max(0.0, peak - read_touched)) * rates.touch_byte;
      read_touched += bytes;
    }
    const double other_touch = std::max(0.0, peak - std::min(peak, read_touched)) * rates.touch_byte;
    e.touch_seconds = pipeline(first_read, other_touch) - e.step_seconds;
  }
  e.seconds += e.touch_seconds;
  return e;
}

}  // namespace fastudy
