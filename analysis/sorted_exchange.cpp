// The reduce job's distributed sample sort (sorted_exchange.hpp).
#include "analysis/sorted_exchange.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "analysis/radix_sort.hpp"
#include "base/error.hpp"
#include "base/hash.hpp"

namespace fastudy {

namespace {

std::size_t overlap(std::size_t a0, std::size_t a1, std::size_t b0, std::size_t b1) {
  const std::size_t lo = std::max(a0, b0), hi = std::min(a1, b1);
  return hi > lo ? hi - lo : 0;
}

// Rank d of R holds the keys in [s[d-1], s[d]) (s[-1] = -inf, s[R-1] = +inf) for sorted splitter keys
// s[0, R-1). A key equal to splitters s[first, last) may go to any of the ranks first..last: each of
// them has it at the end or the start of its range, so the ranks' ranges stay in order; `tie` deals
// such keys round robin.
template <class Key>
struct Partition {
  const Key* s;
  std::size_t m;  // R - 1
  // The upper bound (the number of splitters <= k) by a binary search whose steps depend on m only
  // and whose choices are conditional moves: no branch to mispredict on random values (a search with
  // branches took 150-200 ns per value at 64 ranks, more than sorting it).
  std::size_t dest(Key k, std::size_t& tie) const {
    if (m == 0) return 0;
    const Key* base = s;
    for (std::size_t len = m; len > 1;) {
      const std::size_t half = len / 2;
      base = base[half] <= k ? base + half : base;
      len -= half;
    }
    const std::size_t lo = static_cast<std::size_t>(base - s) + (*base <= k ? 1 : 0);
    if (lo == 0 || s[lo - 1] != k) return lo;
    const std::size_t first = static_cast<std::size_t>(std::lower_bound(s, s + m, k) - s);
    return first + tie++ % (lo - first + 1);
  }
};

template <class T>
auto key_of(T x) {
  return sort_key(x);
}

// Room for n values in b (what it holds is lost where it grows), and an eighth more: a buffer's pages
// cost memory from their first write only, and the next variant's or step's range, a little larger,
// then finds room without a new allocation whose every page is written for the first time again.
template <class U>
void make_room(ValueBuffer<U>& b, std::size_t n) {
  if (n > b.capacity()) b.assign_uninitialized(n + n / 8);
}
// n uninitialised values in b, with make_room's margin where it grows.
template <class U>
void take(ValueBuffer<U>& b, std::size_t n) {
  make_room(b, n);
  b.assign_uninitialized(n);
}

}  // namespace

namespace {

// The splitters by the top 16 bits of the key: below[b], the number of splitters whose top bits are
// less than b (b in [0, 65536]). A key whose top bits hold no splitter (below[b] == below[b + 1]) goes
// to rank below[b] with no search: the splitters before it are all smaller, those after all larger
// (and none equals it, so no tie). Weights fill thousands of such bins, the R - 1 splitters at most
// R - 1 of them: the search runs for few keys.
constexpr int kTableBits = 16;
constexpr std::size_t kTableMin = std::size_t{1} << 15;  // fewer keys than this: the table costs more

template <class Key>
void splitter_table(const Key* s, std::size_t m, std::vector<std::uint16_t>& below) {
  constexpr int shift = static_cast<int>(sizeof(Key)) * 8 - kTableBits;
  below.assign((std::size_t{1} << kTableBits) + 1, 0);
  std::size_t j = 0;
  for (std::size_t b = 0; b <= (std::size_t{1} << kTableBits); ++b) {
    while (j < m && static_cast<std::size_t>(s[j] >> shift) < b) ++j;
    below[b] = static_cast<std::uint16_t>(j);
  }
}

template <class D, class T, class Key>
void partition_as(ValueBuffer<D>& range, const std::vector<const T*>& x, std::size_t L, const Key* splitters,
                  std::size_t R, std::size_t tie, std::size_t* counts, T* out) {
  const std::size_t V = x.size();
  range.assign_uninitialized(V * L);
  std::fill(counts, counts + R * V, 0);
  constexpr int shift = static_cast<int>(sizeof(Key)) * 8 - kTableBits;
  std::vector<std::uint16_t> below;
  for (std::size_t v = 0; v < V; ++v) {
    const Partition<Key> part{splitters + v * (R - 1), R - 1};
    std::size_t t = tie + v;
    const T* xv = x[v];
    D* dv = range.data() + v * L;
    if (L >= kTableMin && R - 1 < (std::size_t{1} << 16)) {
      splitter_table(part.s, part.m, below);
      for (std::size_t i = 0; i < L; ++i) {
        const Key k = key_of(xv[i]);
        const std::size_t b = static_cast<std::size_t>(k >> shift);
        const std::size_t lo = below[b];
        const std::size_t d = lo == below[b + 1] ? lo : part.dest(k, t);
        dv[i] = static_cast<D>(d);
        ++counts[d * V + v];
      }
      continue;
    }
    for (std::size_t i = 0; i < L; ++i) {
      const std::size_t d = part.dest(key_of(xv[i]), t);
      dv[i] = static_cast<D>(d);
      ++counts[d * V + v];
    }
  }
  std::vector<std::size_t> at(R * V);
  std::size_t o = 0;
  for (std::size_t k = 0; k < R * V; ++k) at[k] = o, o += counts[k];
  for (std::size_t v = 0; v < V; ++v) {
    const T* xv = x[v];
    const D* dv = range.data() + v * L;
    for (std::size_t i = 0; i < L; ++i) out[at[dv[i] * V + v]++] = xv[i];
  }
}

}  // namespace

template <class T, class Key>
void partition_values(const std::vector<const T*>& x, std::size_t length, const Key* splitters, std::size_t ranks,
                      std::size_t tie, std::size_t* counts, T* out, PartitionScratch& scratch) {
  if (ranks <= (std::size_t{1} << 8)) partition_as(scratch.b1, x, length, splitters, ranks, tie, counts, out);
  else if (ranks <= (std::size_t{1} << 16)) partition_as(scratch.b2, x, length, splitters, ranks, tie, counts, out);
  else partition_as(scratch.b4, x, length, splitters, ranks, tie, counts, out);
}

std::size_t sort_samples(std::size_t ranks) { return std::max<std::size_t>(1024, 64 * ranks); }

template <class T>
void DistributedSort<T>::exchange(const T* send, const std::vector<std::size_t>& send_counts, T* recv,
                                  const std::vector<std::size_t>& recv_counts) {
  const std::size_t R = send_counts.size();
  std::size_t sent = 0, received = 0;
  for (std::size_t q = 0; q < R; ++q) sent += send_counts[q], received += recv_counts[q];
  const auto most = static_cast<std::size_t>(world_.allreduce_max(static_cast<std::int64_t>(std::max(sent, received) * sizeof(T))));
  const std::size_t phases = std::max<std::size_t>(1, (most + exchange_bytes_ - 1) / exchange_bytes_);
  std::vector<std::size_t> sb(R), rb(R);
  if (phases == 1) {
    for (std::size_t q = 0; q < R; ++q) sb[q] = send_counts[q] * sizeof(T), rb[q] = recv_counts[q] * sizeof(T);
    world_.alltoallv(send, sb, recv, rb);
    return;
  }
  // Phase k moves part k of every count c: [c k / phases, c (k + 1) / phases), packed.
  std::vector<std::size_t> send_at(R, 0), recv_at(R, 0);
  for (std::size_t q = 1; q < R; ++q) {
    send_at[q] = send_at[q - 1] + send_counts[q - 1];
    recv_at[q] = recv_at[q - 1] + recv_counts[q - 1];
  }
  ValueBuffer<T> out, in;
  for (std::size_t k = 0; k < phases; ++k) {
    const auto part = [&](std::size_t c) { return std::make_pair(c * k / phases, c * (k + 1) / phases); };
    std::size_t so = 0, ro = 0;
    for (std::size_t q = 0; q < R; ++q) {
      so += part(send_counts[q]).second - part(send_counts[q]).first;
      ro += part(recv_counts[q]).second - part(recv_counts[q]).first;
    }
    out.assign_uninitialized(so);
    in.assign_uninitialized(ro);
    so = 0;
    for (std::size_t q = 0; q < R; ++q) {
      const auto [a, b] = part(send_counts[q]);
      std::copy(send + send_at[q] + a, send + send_at[q] + b, out.data() + so);
      sb[q] = (b - a) * sizeof(T);
      rb[q] = (part(recv_counts[q]).second - part(recv_counts[q]).first) * sizeof(T);
      so += b - a;
    }
    world_.alltoallv(out.data(), sb, in.data(), rb);
    ro = 0;
    for (std::size_t q = 0; q < R; ++q) {
      const auto [a, b] = part(recv_counts[q]);
      std::copy(in.data() + ro, in.data() + ro + (b - a), recv + recv_at[q] + a);
      ro += b - a;
    }
  }
}

// Every variant's R - 1 splitter keys (variant v's at [v, (v+1) )): a stratified sample of
// `samples` values of each share (one value at a pseudo-random place in each of `samples` equal
// strata, so a tensor's rows or columns cannot alias with the spacing), weighted by the share's length
// over the sample's; the samples of variant v gathered on rank v mod R, which walks their cumulative
// weight to the first position of every rank's window; the splitters then gathered everywhere.
template <class T>
std::vector<typename DistributedSort<T>::Key> DistributedSort<T>::splitters(const std::vector<const T*>& shares,
                                                                           std::size_t length, std::size_t n,
                                                                           std::size_t samples) {
  const std::size_t V = shares.size(), R = static_cast<std::size_t>(world_.size()), r = static_cast<std::size_t>(world_.rank());
  const std::size_t m = std::min(samples, length);
  std::vector<std::int64_t> lengths(R);
  const auto mine = static_cast<std::int64_t>(length);
  world_.allgather(&mine, 1, lengths.data());
  // To rank q: m keys of each variant v = q (mod R), variants ascending.
  std::vector<Key> send(V * m);
  std::vector<std::size_t> send_bytes(R, 0), recv_bytes(R, 0);
  std::size_t at = 0;
  for (std::size_t q = 0; q < R; ++q)
    for (std::size_t v = q; v < V; v += R) {
      SplitMix64 rng{splitmix64(r * 0x10001 + v)};
      for (std::size_t i = 0; i < m; ++i) {
        const std::size_t lo = i * length / m, hi = (i + 1) * length / m;
        send[at++] = key_of(shares[v][lo + rng.below(hi - lo)]);
      }
      send_bytes[q] += m * sizeof(Key);
    }
  const std::size_t owned = V > r ? (V - r + R - 1) / R : 0;  // variants r, r + R, ...
  std::vector<std::size_t> from(R);  // keys per variant from each rank
  std::size_t total = 0;
  for (std::size_t q = 0; q < R; ++q) {
    from[q] = std::min(samples, static_cast<std::size_t>(lengths[q]));
    recv_bytes[q] = owned * from[q] * sizeof(Key);
    total += owned * from[q];
  }
  std::vector<Key> recv(total);
  world_.alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
  // Rank q's keys of my k-th variant: at sum_{q' < q} owned from[q'] + k from[q].
  const std::size_t per = (V + R - 1) / R;  // variants per rank, padded
  std::vector<std::int64_t> mine_splitters(per * (R - 1), 0);
  std::vector<std::size_t> first(R, 0);
  for (std::size_t q = 1; q < R; ++q) first[q] = first[q - 1] + owned * from[q - 1];
  for (std::size_t k = 0; k < owned; ++k) {
    std::vector<std::pair<Key, double>> weighted;
    double weight = 0;
    for (std::size_t q = 0; q < R; ++q) {
      const double w = from[q] ? static_cast<double>(lengths[q]) / static_cast<double>(from[q]) : 0.0;
      for (std::size_t i = 0; i < from[q]; ++i) weighted.emplace_back(recv[first[q] + k * from[q] + i], w);
      weight += w * static_cast<double>(from[q]);
    }
    std::sort(weighted.begin(), weighted.end());
    std::size_t i = 0;
    double below = 0;  // the weight of weighted[0, i)
    for (std::size_t d = 1; d < R; ++d) {
      const double target = static_cast<double>(block_aligned_part(n, R, d).begin) * weight / static_cast<double>(n);
      while (i + 1 < weighted.size() && below + weighted[i].second <= target) below += weighted[i++].second;
      const Key s = weighted.empty() ? Key{0} : weighted[i].first;
      std::int64_t bits = 0;
      std::memcpy(&bits, &s, sizeof s);
      mine_splitters[k * (R - 1) + (d - 1)] = bits;
    }
  }
  std::vector<std::int64_t> all(R * per * (R - 1));
  world_.allgather(mine_splitters.data(), mine_splitters.size(), all.data());
  std::vector<Key> out(V * (R - 1));
  for (std::size_t v = 0; v < V; ++v)
    for (std::size_t d = 0; d + 1 < R; ++d) {
      Key s;
      std::memcpy(&s, &all[((v % R) * per + v / R) * (R - 1) + d], sizeof s);
      out[v * (R - 1) + d] = s;
    }
  return out;
}

// Collective (sorted_exchange.hpp, steps 3 and 4): each variant's range sorted straight into its
// places, the part of it in this rank's window into windows[v], the rest packed by destination rank,
// then variant, into send_ for one exchange of only those values.
template <class T>
void DistributedSort<T>::sort_to_windows(const std::vector<std::vector<SortSpan<T>>>& ranges, std::size_t n,
                                         const std::vector<T*>& windows) {
  const std::size_t V = ranges.size(), R = static_cast<std::size_t>(world_.size()), r = static_cast<std::size_t>(world_.rank());
  std::vector<std::int64_t> mine(V, 0), all(R * V);
  for (std::size_t v = 0; v < V; ++v)
    for (const auto& sp : ranges[v]) mine[v] += static_cast<std::int64_t>(sp.size);
  world_.allgather(mine.data(), V, all.data());
  // Where rank q's range of variant v starts among v's sorted positions (the ranges of the ranks below).
  std::vector<std::size_t> first(R * V, 0);
  for (std::size_t v = 0; v < V; ++v) {
    std::size_t start = 0;
    for (std::size_t q = 0; q < R; ++q) first[q * V + v] = start, start += static_cast<std::size_t>(all[q * V + v]);
    if (start != n)
      throw Error("distributed sort: the ranks hold " + std::to_string(start) + " values of variant " + std::to_string(v) +
                  ", not its " + std::to_string(n));
  }
  std::vector<IndexRange> win;
  for (std::size_t q = 0; q < R; ++q) win.push_back(block_aligned_part(n, R, q));
  const IndexRange w = win[r];
  const auto range_of = [&](std::size_t q, std::size_t v) {
    return std::make_pair(first[q * V + v], first[q * V + v] + static_cast<std::size_t>(all[q * V + v]));
  };
  std::vector<std::size_t> send_counts(R, 0), recv_counts(R, 0), at(R * V, 0);
  std::size_t leaving = 0;
  for (std::size_t q = 0; q < R; ++q)
    for (std::size_t v = 0; v < V; ++v) {
      at[q * V + v] = leaving;
      if (q == r) continue;
      const auto [f, e] = range_of(r, v);
      const std::size_t c = overlap(f, e, win[q].begin, win[q].end);
      send_counts[q] += c;
      leaving += c;
      traffic_.values_moved += c;
      const auto [fq, eq] = range_of(q, v);
      recv_counts[q] += overlap(fq, eq, w.begin, w.end);
    }
  take(send_, leaving);
  for (std::size_t v = 0; v < V; ++v) {
    const auto [f, e] = range_of(r, v);
    std::vector<OutSpan<T>> outs;
    for (std::size_t q = 0; q < R; ++q) {
      const std::size_t lo = std::max(f, win[q].begin), hi = std::min(e, win[q].end);
      if (hi <= lo) continue;
      outs.push_back({q == r ? windows[v] + (lo - w.begin) : send_.data() + at[q * V + v], hi - lo});
    }
    radix_sort_spans(ranges[v], outs, keys_);
  }
  std::size_t arriving = 0;
  for (auto c : recv_counts) arriving += c;
  take(sorted_, arriving);  // the ranges are read
  exchange(send_.data(), send_counts, sorted_.data(), recv_counts);
  // From rank q: its piece of each variant's window, variants in order.
  std::size_t from = 0;
  for (std::size_t q = 0; q < R; ++q) {
    if (q == r) continue;
    for (std::size_t v = 0; v < V; ++v) {
      const auto [fq, eq] = range_of(q, v);
      const std::size_t lo = std::max(fq, w.begin), hi = std::min(eq, w.end);
      if (hi <= lo) continue;
      std::copy(sorted_.data() + from, sorted_.data() + from + (hi - lo), windows[v] + (lo - w.begin));
      from += hi - lo;
    }
  }
}

template <class T>
void DistributedSort<T>::sort_windows(const std::vector<T*>& values, std::size_t n, const std::vector<T*>& windows) {
  const std::size_t V = values.size(), R = static_cast<std::size_t>(world_.size()), r = static_cast<std::size_t>(world_.rank());
  const IndexRange w = block_aligned_part(n, R, r);
  const std::size_t L = w.end - w.begin;
  if (!windows.empty() && windows.size() != V)
    throw Error("distributed sort: " + std::to_string(windows.size()) + " windows for " + std::to_string(V) + " variants");
  if (R == 1) {
    sort_each(values, L, windows);
    return;
  }
  const std::vector<const T*> ptrs(values.begin(), values.end());
  const std::vector<Key> spl = splitters(ptrs, L, n, sort_samples(R));
  // Partition: counts[q V + v] values of variant v go to rank q; send_ holds them by rank, then variant.
  std::vector<std::size_t> part_counts(R * V);
  take(send_, V * L);
  partition_values(ptrs, L, spl.data(), R, r, part_counts.data(), send_.data(), ranges_);
  std::vector<std::int64_t> counts(part_counts.begin(), part_counts.end());
  std::vector<std::int64_t> received(R * V);
  world_.alltoall(counts.data(), V, received.data());
  std::vector<std::size_t> send_counts(R, 0), recv_counts(R, 0), recv_at(R, 0);
  std::size_t total = 0;
  for (std::size_t q = 0; q < R; ++q) {
    for (std::size_t v = 0; v < V; ++v) {
      send_counts[q] += static_cast<std::size_t>(counts[q * V + v]);
      recv_counts[q] += static_cast<std::size_t>(received[q * V + v]);
    }
    recv_at[q] = total;
    total += recv_counts[q];
    if (q != r) traffic_.values_sent += send_counts[q];
  }
  take(sorted_, total);
  exchange(send_.data(), send_counts, sorted_.data(), recv_counts);
  // Each variant's value range: rank q's piece of it, for every q.
  std::vector<std::vector<SortSpan<T>>> ranges(V);
  std::vector<std::size_t> piece_at(recv_at);  // rank q's piece of the current variant
  for (std::size_t v = 0; v < V; ++v) {
    std::size_t m = 0;
    for (std::size_t q = 0; q < R; ++q) {
      const auto c = static_cast<std::size_t>(received[q * V + v]);
      ranges[v].push_back({sorted_.data() + piece_at[q], c});
      piece_at[q] += c;
      m += c;
    }
    if (L > 0) traffic_.largest_excess = std::max(traffic_.largest_excess, static_cast<double>(m) / static_cast<double>(L) - 1.0);
  }
  // The values are in send_ now: their places may take the windows.
  sort_to_windows(ranges, n, windows.empty() ? values : windows);
}

template <class T>
void DistributedSort<T>::sort_shares(std::vector<ValueBuffer<T>>& shares, std::size_t n,
                                     const std::vector<std::size_t>& runs) {
  const std::size_t V = shares.size(), R = static_cast<std::size_t>(world_.size()), r = static_cast<std::size_t>(world_.rank());
  const std::size_t S = V ? shares[0].size() : 0;
  for (const auto& s : shares)
    if (s.size() != S) throw Error("distributed sort: the variants' shares differ in length");
  std::size_t in_runs = 0;
  for (auto len : runs) in_runs += len;
  if (!runs.empty() && in_runs != S)
    throw Error("distributed sort: the sorted runs hold " + std::to_string(in_runs) + " of the share's " + std::to_string(S) + " values");
  if (R == 1) {
    if (S != n) throw Error("distributed sort: one rank holds " + std::to_string(S) + " of " + std::to_string(n) + " values");
    for (auto& s : shares) radix_sort_into(s.data(), s.data(), S, keys_);
    return;
  }
  const IndexRange w = block_aligned_part(n, R, r);
  const std::size_t W = w.end - w.begin;
  // Each share ends as the window: its memory takes the window without moving (the pieces this rank
  // keeps are read from it by the sort, before the sort writes the window there).
  for (auto& s : shares) s.reserve(W);
  std::vector<const T*> ptrs;
  for (const auto& s : shares) ptrs.push_back(s.data());
  const std::vector<Key> spl = splitters(ptrs, S, n, sort_samples(R));
  std::vector<std::size_t> send_counts(R), recv_counts(R);
  // The ranks take one path together: the sorted runs' when every rank's share is made of them (an
  // empty share has none and takes either).
  if (world_.allreduce_max(static_cast<std::int64_t>(runs.empty() && S > 0)) != 0) {
    for (std::size_t v = 0; v < V; ++v) {
      std::fill(send_counts.begin(), send_counts.end(), 0);
      take(send_, S);
      partition_values(std::vector<const T*>{shares[v].data()}, S, spl.data() + v * (R - 1), R, r + v, send_counts.data(),
                       send_.data(), ranges_);
      std::vector<std::int64_t> c64(send_counts.begin(), send_counts.end()), r64(R);
      world_.alltoall(c64.data(), 1, r64.data());
      std::size_t total = 0;
      for (std::size_t q = 0; q < R; ++q) {
        recv_counts[q] = static_cast<std::size_t>(r64[q]);
        total += recv_counts[q];
        if (q != r) traffic_.values_sent += send_counts[q];
      }
      take(sorted_, total);
      exchange(send_.data(), send_counts, sorted_.data(), recv_counts);
      if (W > 0) traffic_.largest_excess = std::max(traffic_.largest_excess, static_cast<double>(total) / static_cast<double>(W) - 1.0);
      shares[v].assign_uninitialized(W);  // its values are in send_ now
      sort_to_windows({{{sorted_.data(), total}}}, n, {shares[v].data()});
    }
    return;
  }
  // Sorted runs: rank d's piece of run u of variant v is [cut[d], cut[d + 1]) of the run, cut at
  // cuts[(v U + u) (R + 1)]; keys equal to a splitter are split evenly between the ranks that splitter
  // bounds (as Partition deals them one by one). Every variant's pieces are cut first, so that the
  // counts go in one all-to-all and the buffers are sized once for the largest variant.
  const std::size_t U = runs.size();
  std::vector<std::size_t> cuts(V * U * (R + 1));
  std::vector<std::int64_t> counts(R * V, 0), received(R * V);  // [d V + v]: variant v's values to / from rank d
  const auto below = [](T a, Key k) { return key_of(a) < k; };
  const auto above = [](Key k, T a) { return k < key_of(a); };
  for (std::size_t v = 0; v < V; ++v) {
    const Key* s = spl.data() + v * (R - 1);
    std::size_t start = 0;
    for (std::size_t u = 0; u < U; ++u) {
      const T* a = shares[v].data() + start;
      const std::size_t len = runs[u];
      std::size_t* cut = &cuts[(v * U + u) * (R + 1)];
      cut[0] = 0;
      cut[R] = len;
      for (std::size_t d = 1; d < R; ++d) {
        const Key k = s[d - 1];
        const std::size_t lo = static_cast<std::size_t>(std::lower_bound(s, s + R - 1, k) - s);
        const std::size_t hi = static_cast<std::size_t>(std::upper_bound(s, s + R - 1, k) - s);
        const std::size_t e0 = static_cast<std::size_t>(std::lower_bound(a, a + len, k, below) - a);
        const std::size_t e1 = static_cast<std::size_t>(std::upper_bound(a, a + len, k, above) - a);
        cut[d] = e0 + (d - lo) * (e1 - e0) / (hi - lo + 1);
      }
      for (std::size_t d = 0; d < R; ++d) counts[d * V + v] += static_cast<std::int64_t>(cut[d + 1] - cut[d]);
      start += len;
    }
  }
  world_.alltoall(counts.data(), V, received.data());
  // This rank's own pieces stay in its shares: only the others' are packed and exchanged (a copy less
  // of each value that stays, and of the one that leaves; the buffers hold only what moves).
  std::size_t most_sent = 0, most_received = 0, most_range = 0;
  for (std::size_t v = 0; v < V; ++v) {
    std::size_t sent = 0, arriving = 0;
    for (std::size_t q = 0; q < R; ++q)
      if (q != r) sent += static_cast<std::size_t>(counts[q * V + v]), arriving += static_cast<std::size_t>(received[q * V + v]);
    most_sent = std::max(most_sent, sent);
    most_received = std::max(most_received, arriving);
    most_range = std::max(most_range, arriving + static_cast<std::size_t>(counts[r * V + v]));
  }
  make_room(send_, most_sent);
  make_room(sorted_, most_received);
  reserve_sort(most_range);
  for (std::size_t v = 0; v < V; ++v) {
    const T* x = shares[v].data();
    std::vector<SortSpan<T>> range;  // this rank's value range of v: its own pieces, then the others'
    std::size_t o = 0, start = 0, total = 0, leaving = 0;
    for (std::size_t q = 0; q < R; ++q)
      if (q != r) leaving += static_cast<std::size_t>(counts[q * V + v]);
    take(send_, leaving);  // within the room made above
    for (std::size_t u = 0; u < U; ++u) {
      const std::size_t* cut = &cuts[(v * U + u) * (R + 1)];
      if (cut[r + 1] > cut[r]) range.push_back({x + start + cut[r], cut[r + 1] - cut[r]});
      total += cut[r + 1] - cut[r];
      start += runs[u];
    }
    for (std::size_t d = 0; d < R; ++d) {
      send_counts[d] = 0;
      recv_counts[d] = 0;
      if (d == r) continue;
      start = 0;
      for (std::size_t u = 0; u < U; ++u) {
        const std::size_t* cut = &cuts[(v * U + u) * (R + 1)];
        std::copy(x + start + cut[d], x + start + cut[d + 1], send_.data() + o);
        o += cut[d + 1] - cut[d];
        start += runs[u];
      }
      send_counts[d] = static_cast<std::size_t>(counts[d * V + v]);
      recv_counts[d] = static_cast<std::size_t>(received[d * V + v]);
      traffic_.values_sent += send_counts[d];
    }
    std::size_t arriving = 0;
    for (auto c : recv_counts) arriving += c;
    take(sorted_, arriving);
    exchange(send_.data(), send_counts, sorted_.data(), recv_counts);
    if (arriving > 0) range.push_back({sorted_.data(), arriving});
    total += arriving;
    if (W > 0) traffic_.largest_excess = std::max(traffic_.largest_excess, static_cast<double>(total) / static_cast<double>(W) - 1.0);
    shares[v].assign_uninitialized(W);  // within its capacity: the pieces it keeps stay where they are
    sort_to_windows({range}, n, {shares[v].data()});
  }
}

template <class T>
void DistributedSort<T>::reserve_sort(std::size_t values) {
  make_room(keys_, 2 * values);
}

template <class T>
void DistributedSort<T>::sort_each(const std::vector<T*>& values, std::size_t length, const std::vector<T*>& windows) {
  if (!windows.empty() && windows.size() != values.size())
    throw Error("distributed sort: " + std::to_string(windows.size()) + " windows for " + std::to_string(values.size()) + " variants");
  for (std::size_t v = 0; v < values.size(); ++v)
    radix_sort_into(values[v], windows.empty() ? values[v] : windows[v], length, keys_);
}

void allreduce_partials(const mpi::Comm& world, PairwisePartials& partials) {
  world.allreduce_sum(partials.sums(), partials.sums_size());
  world.allreduce_max(partials.maxima(), partials.maxima_size());
}

template class DistributedSort<float>;
template class DistributedSort<double>;
template void partition_values(const std::vector<const float*>&, std::size_t, const std::uint32_t*, std::size_t, std::size_t,
                               std::size_t*, float*, PartitionScratch&);
template void partition_values(const std::vector<const double*>&, std::size_t, const std::uint64_t*, std::size_t, std::size_t,
                               std::size_t*, double*, PartitionScratch&);

}  // namespace fastudy
