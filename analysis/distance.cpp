// Distances between weight distributions: the implementation of analysis/distance.hpp, in four files
// along its parts: exact summation (exact_sum.cpp), radix sort (radix_sort.cpp), the lane kernels
// (lane_kernels.cpp) and, here, one pair with scipy's semantics, SortedSet and the pairwise partials.
//
// Hot loops: for each fixed global block of kPairwiseBlock indices, every pair (i, j) is reduced with
// a lane kernel (kLanes independent fp64 partial sums, fixed lane order, no FMA contraction) that GCC
// vectorises; the kernels are compiled for AVX-512, AVX2 and baseline x86-64 and picked by base's
// cpu_isa() (as the attention kernels are), all rounding identically. The block's sums then go
// exactly into ExactSum limbs.
#include "analysis/distance.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "analysis/lane_kernels.hpp"
#include "analysis/radix_sort.hpp"

namespace fastudy {

using namespace lanes;

namespace {

// Layout of one pair's slot in PairwisePartials::sums.
constexpr std::size_t kSortedAbs = 0;
constexpr std::size_t kSortedSq = kExactLimbs;
constexpr std::size_t kAbs = 2 * kExactLimbs;
constexpr std::size_t kSq = 3 * kExactLimbs;
constexpr std::size_t kCountSorted = 4 * kExactLimbs;
constexpr std::size_t kCount = kCountSorted + 1;
constexpr std::size_t kNonfinite = kCountSorted + 2;
constexpr std::size_t kNonfiniteSorted = kCountSorted + 3;

// The blocks of [begin, end) cut at global multiples of kPairwiseBlock.
template <class F>
void for_each_block(std::size_t begin, std::size_t end, F&& f) {
  std::size_t b0 = begin;
  while (b0 < end) {
    const std::size_t b1 = std::min(end, (b0 / kPairwiseBlock + 1) * kPairwiseBlock);
    f(b0, b1);
    b0 = b1;
  }
}

std::string where(const char* what, std::size_t i) {
  return std::string(what) + "[" + std::to_string(i) + "]";
}

}  // namespace

// ---- one pair, scipy semantics ------------------------------------------------------------------

namespace {

void check_values(ArrayView<double> x, const char* name) {
  if (x.empty())
    throw DistanceError(std::string("wasserstein distance: ") + name + " is empty",
                        "a distribution needs at least one value (scipy raises the same error)");
  for (std::size_t i = 0; i < x.size; ++i)
    if (!std::isfinite(x[i]))
      throw DistanceError("wasserstein distance: " + where(name, i) + " = " + std::to_string(x[i]) +
                              " is not finite",
                          "the distance between distributions with NaN or inf is undefined; "
                          "check the checkpoint for diverged weights");
}

void check_weights(ArrayView<double> w, std::size_t n, const char* name) {
  if (w.empty()) return;
  if (w.size != n)
    throw DistanceError(std::string("wasserstein distance: ") + name + " has " +
                        std::to_string(w.size) + " entries but the values have " + std::to_string(n));
  double sum = 0;
  for (std::size_t i = 0; i < w.size; ++i) {
    if (!(w[i] >= 0) || std::isinf(w[i]))
      throw DistanceError("wasserstein distance: " + where(name, i) + " = " + std::to_string(w[i]),
                          "weights must be non-negative and finite");
    sum += w[i];
  }
  if (!(sum > 0) || !std::isfinite(sum))
    throw DistanceError(std::string("wasserstein distance: ") + name + " sums to " +
                            std::to_string(sum),
                        "the weights must have a positive finite sum; pass no weights for uniform ones");
}

std::vector<double> sorted_copy(ArrayView<double> x) {
  std::vector<double> s(x.data, x.data + x.size);
  radix_sort(s.data(), s.size());
  return s;
}

std::vector<double> widen(ArrayView<float> x) { return std::vector<double>(x.data, x.data + x.size); }

// Equal sizes, already sorted: sum |a-b| (and (a-b)^2) exactly, by the same blocks as the engine.
void sorted_sums(const double* a, const double* b, std::size_t n, ExactSum& abs_sum, ExactSum* sq_sum) {
  for_each_block(0, n, [&](std::size_t b0, std::size_t b1) {
    double s = 0, q = 0;
    sorted_kernel(a + b0, b + b0, b1 - b0, &s, sq_sum ? &q : nullptr);
    abs_sum.add(s);
    if (sq_sum) sq_sum->add(q);
  });
}

}  // namespace

double wasserstein1(ArrayView<double> u, ArrayView<double> v, ArrayView<double> u_weights,
                    ArrayView<double> v_weights) {
  check_values(u, "u_values");
  check_values(v, "v_values");
  check_weights(u_weights, u.size, "u_weights");
  check_weights(v_weights, v.size, "v_weights");

  if (u.size == v.size && u_weights.empty() && v_weights.empty()) {
    const std::vector<double> su = sorted_copy(u), sv = sorted_copy(v);
    ExactSum s;
    sorted_sums(su.data(), sv.data(), su.size(), s, nullptr);
    return s.value() / static_cast<double>(u.size);
  }

  // General case: sort values with their weights, then walk the merged support once. Between two
  // consecutive support points x < x', F_u = (weight of u values <= x) / total weight, the same for
  // v, and the integral gains |F_u - F_v| (x' - x). Ties contribute zero width, as in scipy.
  auto sorted_with_weights = [](ArrayView<double> x, ArrayView<double> w) {
    std::vector<std::pair<double, double>> p(x.size);
    for (std::size_t i = 0; i < x.size; ++i) p[i] = {x[i], w.empty() ? 1.0 : w[i]};
    std::sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return p;
  };
  const auto su = sorted_with_weights(u, u_weights);
  const auto sv = sorted_with_weights(v, v_weights);
  // Totals and running sums as scipy: cumulative sums in order; without weights, counts / size.
  double total_u = 0, total_v = 0;
  for (const auto& p : su) total_u += p.second;
  for (const auto& p : sv) total_v += p.second;
  if (u_weights.empty()) total_u = static_cast<double>(u.size);
  if (v_weights.empty()) total_v = static_cast<double>(v.size);

  ExactSum integral;
  std::size_t iu = 0, iv = 0;
  double cu = 0, cv = 0;
  double x = std::min(su[0].first, sv[0].first);
  for (;;) {
    while (iu < su.size() && su[iu].first <= x) cu += su[iu++].second;
    while (iv < sv.size() && sv[iv].first <= x) cv += sv[iv++].second;
    if (iu == su.size() && iv == sv.size()) break;
    const double next = std::min(iu < su.size() ? su[iu].first : std::numeric_limits<double>::infinity(),
                                 iv < sv.size() ? sv[iv].first : std::numeric_limits<double>::infinity());
    integral.add(std::fabs(cu / total_u - cv / total_v) * (next - x));
    x = next;
  }
  return integral.value();
}

double wasserstein1(ArrayView<float> u, ArrayView<float> v, ArrayView<double> u_weights,
                    ArrayView<double> v_weights) {
  const std::vector<double> du = widen(u), dv = widen(v);
  return wasserstein1(ArrayView<double>(du), ArrayView<double>(dv), u_weights, v_weights);
}

double wasserstein2(ArrayView<double> u, ArrayView<double> v) {
  check_values(u, "u_values");
  check_values(v, "v_values");
  if (u.size != v.size)
    throw DistanceError("wasserstein2: the sizes differ (" + std::to_string(u.size) + " vs " +
                            std::to_string(v.size) + ")",
                        "wasserstein2 is implemented for equal sizes without weights only");
  const std::vector<double> su = sorted_copy(u), sv = sorted_copy(v);
  ExactSum s, q;
  sorted_sums(su.data(), sv.data(), su.size(), s, &q);
  return std::sqrt(q.value() / static_cast<double>(u.size));
}

double wasserstein2(ArrayView<float> u, ArrayView<float> v) {
  const std::vector<double> du = widen(u), dv = widen(v);
  return wasserstein2(ArrayView<double>(du), ArrayView<double>(dv));
}

namespace {

template <class T>
ElementwiseMetrics elementwise_impl(ArrayView<T> a, ArrayView<T> ref) {
  if (a.size != ref.size)
    throw DistanceError("elementwise metrics: the sizes differ (" + std::to_string(a.size) + " vs " +
                            std::to_string(ref.size) + ")",
                        "elementwise metrics compare the same parameter in two variants");
  PairwisePartials p(2);
  accumulate_elementwise<T>({a.data, ref.data}, 0, a.size, p);
  const PairMetrics m = p.finalize().at(0, 1);
  return {m.max_abs, m.mean_abs, m.rel_l2, m.count, m.nonfinite};
}

}  // namespace

ElementwiseMetrics elementwise_metrics(ArrayView<double> a, ArrayView<double> ref) {
  return elementwise_impl(a, ref);
}
ElementwiseMetrics elementwise_metrics(ArrayView<float> a, ArrayView<float> ref) {
  return elementwise_impl(a, ref);
}

// ---- SortedSet ----------------------------------------------------------------------------------

template <class T>
void SortedSet<T>::add(ArrayView<T> values) {
  std::vector<T> s(values.size);
  radix_sort_into(values.data, s.data(), values.size, scratch_);
  add_sorted(std::move(s));
}

template <class T>
void SortedSet<T>::add_sorted(std::vector<T> sorted) {
  const std::size_t n = sorted.size();
  add_sorted_window(std::move(sorted), 0, n);
}

template <class T>
void SortedSet<T>::add_sorted_window(std::vector<T> window, std::size_t offset, std::size_t total) {
  add_sorted_view(window.data(), window.size(), offset, total);  // checks; throws before keeping it
  owned_.push_back(std::move(window));  // the buffer (and the view's pointer into it) stays put
}

template <class T>
void SortedSet<T>::add_sorted_view(const T* window, std::size_t length, std::size_t offset, std::size_t total) {
  const std::string which = "SortedSet: variant " + std::to_string(views_.size());
  if (offset > total || length > total - offset)
    throw DistanceError(which + ": window [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                        ") is outside [0, " + std::to_string(total) + ")");
  if (!views_.empty() && total != n_)
    throw DistanceError(which + " has " + std::to_string(total) + " values, the others " + std::to_string(n_),
                        "every variant of a tensor must have the same number of parameters");
  if (!views_.empty() && (offset != offset_ || length != length_))
    throw DistanceError(which + ": window [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                            ") differs from the others' [" + std::to_string(window_begin()) + ", " +
                            std::to_string(window_end()) + ")",
                        "every variant must hold the same sorted positions");
  // One branch-free pass in blocks that vectorise: the count of non-finite values and whether any value
  // is below its predecessor; the position is looked up only for the message.
  std::uint64_t bad = 0;
  unsigned unsorted = 0;
  if (length > 0) bad += !std::isfinite(window[0]);
  constexpr std::size_t kBlock = 1024;
  for (std::size_t b = 1; b < length; b += kBlock) {
    const std::size_t e = std::min(length, b + kBlock);
    unsigned block_bad = 0, block_unsorted = 0;
    for (std::size_t i = b; i < e; ++i) {
      block_bad += static_cast<unsigned>(!(std::fabs(window[i]) <= std::numeric_limits<T>::max()));
      block_unsorted |= static_cast<unsigned>(window[i] < window[i - 1]);
    }
    bad += block_bad;
    unsorted |= block_unsorted;
  }
  if (unsorted)
    for (std::size_t i = 1; i < length; ++i)
      if (window[i] < window[i - 1]) throw DistanceError(which + " is not sorted at index " + std::to_string(offset + i));
  n_ = total;
  offset_ = offset;
  length_ = length;
  views_.push_back(window);
  nonfinite_.push_back(bad);
}

template class SortedSet<float>;
template class SortedSet<double>;

IndexRange block_aligned_part(std::size_t n, std::size_t parts, std::size_t part) {
  if (parts == 0 || part >= parts) return {0, 0};
  const std::size_t blocks = (n + kPairwiseBlock - 1) / kPairwiseBlock;
  const std::size_t b0 = blocks * part / parts, b1 = blocks * (part + 1) / parts;
  return {std::min(n, b0 * kPairwiseBlock), std::min(n, b1 * kPairwiseBlock)};
}

// ---- PairwisePartials ---------------------------------------------------------------------------

std::vector<VariantPair> all_pairs(std::size_t variants) {
  std::vector<VariantPair> out;
  for (std::size_t i = 0; i < variants; ++i)
    for (std::size_t j = i + 1; j < variants; ++j) out.emplace_back(i, j);
  return out;
}

PairwisePartials::PairwisePartials(std::size_t variants) : PairwisePartials(variants, all_pairs(variants)) {}

PairwisePartials::PairwisePartials(std::size_t variants, std::vector<VariantPair> pairs)
    : variants_(variants), pairs_(std::move(pairs)), used_(variants, 0) {
  std::sort(pairs_.begin(), pairs_.end());
  for (std::size_t p = 0; p < pairs_.size(); ++p) {
    const auto [i, j] = pairs_[p];
    if (!(i < j && j < variants))
      throw DistanceError("PairwisePartials: pair (" + std::to_string(i) + ", " + std::to_string(j) + ") of " +
                          std::to_string(variants) + " variants is not i < j < variants");
    if (p > 0 && pairs_[p - 1] == pairs_[p])
      throw DistanceError("PairwisePartials: pair (" + std::to_string(i) + ", " + std::to_string(j) + ") is listed twice");
    used_[i] = used_[j] = 1;
  }
  sums_.assign(pair_count() * kPairSums + variants * kExactLimbs, 0);
  maxima_.assign(pair_count(), 0.0);
}

void PairwisePartials::combine(const PairwisePartials& other) {
  if (other.variants_ != variants_ || other.pairs_ != pairs_)
    throw DistanceError("PairwisePartials::combine: " + std::to_string(variants_) + " variants and " +
                        std::to_string(pair_count()) + " pairs vs " + std::to_string(other.variants_) + " and " +
                        std::to_string(other.pair_count()));
  for (std::size_t k = 0; k < sums_.size(); ++k) sums_[k] += other.sums_[k];
  for (std::size_t k = 0; k < maxima_.size(); ++k) maxima_[k] = std::max(maxima_[k], other.maxima_[k]);
  if (w2_ == W2::unknown || other.w2_ == W2::no) w2_ = other.w2_;
}

void PairwisePartials::combine_elementwise(const PairwisePartials& other) {
  if (other.variants_ != variants_ || other.pairs_ != pairs_)
    throw DistanceError("PairwisePartials::combine_elementwise: " + std::to_string(variants_) + " variants and " +
                        std::to_string(pair_count()) + " pairs vs " + std::to_string(other.variants_) + " and " +
                        std::to_string(other.pair_count()));
  for (std::size_t p = 0; p < pair_count(); ++p) {
    std::int64_t* s = &sums_[p * kPairSums];
    const std::int64_t* o = &other.sums_[p * kPairSums];
    for (std::size_t k = kAbs; k < kCountSorted; ++k) s[k] += o[k];  // sum |d| and sum d^2 limbs
    s[kCount] += o[kCount];
    s[kNonfinite] += o[kNonfinite];
    maxima_[p] = std::max(maxima_[p], other.maxima_[p]);
  }
  for (std::size_t k = pair_count() * kPairSums; k < sums_.size(); ++k) sums_[k] += other.sums_[k];
}

void PairwisePartials::note_sorted_metrics(SortedMetrics which) {
  const W2 w = which == SortedMetrics::w1_w2 ? W2::yes : W2::no;
  if (w2_ == W2::unknown || w == W2::no) w2_ = w;
}

PairwiseMatrix PairwisePartials::finalize() const {
  const std::size_t V = variants_;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  PairwiseMatrix out;
  out.variants = V;
  out.pairs.assign(V * V, PairMetrics{});
  std::vector<double> norm2(V);
  for (std::size_t v = 0; v < V; ++v) norm2[v] = exact_value(&sums_[pair_count() * kPairSums + v * kExactLimbs]);
  auto ratio = [](double num, double den) {
    if (den > 0) return std::sqrt(num) / std::sqrt(den);
    return num > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  };
  PairMetrics missing;
  for (const PairMetric& metric : kPairMetrics) missing.*metric.value = nan;
  for (std::size_t i = 0; i < V; ++i)
    for (std::size_t j = 0; j < V; ++j)
      if (i != j) out.pairs[i * V + j] = missing;
  for (std::size_t p = 0; p < pair_count(); ++p) {
    const auto [i, j] = pairs_[p];
    const std::int64_t* s = &sums_[p * kPairSums];
    PairMetrics m;
    m.count_sorted = static_cast<std::uint64_t>(s[kCountSorted]);
    m.count = static_cast<std::uint64_t>(s[kCount]);
    m.nonfinite = static_cast<std::uint64_t>(s[kNonfinite]);
    m.nonfinite_sorted = static_cast<std::uint64_t>(s[kNonfiniteSorted]);
    const bool sorted_ok = m.count_sorted > 0 && m.nonfinite_sorted == 0;
    const double ns = static_cast<double>(m.count_sorted);
    m.w1 = sorted_ok ? exact_value(s + kSortedAbs) / ns : nan;
    m.w2 = sorted_ok && has_w2() ? std::sqrt(exact_value(s + kSortedSq) / ns) : nan;
    const double sq = exact_value(s + kSq);
    if (m.count > 0) {
      m.max_abs = maxima_[p];
      m.mean_abs = exact_value(s + kAbs) / static_cast<double>(m.count);
    } else {
      m.max_abs = m.mean_abs = nan;
    }
    PairMetrics mt = m;
    m.rel_l2 = m.count > 0 ? ratio(sq, norm2[j]) : nan;
    mt.rel_l2 = m.count > 0 ? ratio(sq, norm2[i]) : nan;
    out.pairs[i * V + j] = m;
    out.pairs[j * V + i] = mt;
  }
  return out;
}

// ---- accumulation -------------------------------------------------------------------------------

template <class T>
void accumulate_sorted(const SortedSet<T>& set, std::size_t begin, std::size_t end,
                       PairwisePartials& partials, SortedMetrics which) {
  const std::size_t V = set.variants();
  if (partials.variants() != V)
    throw DistanceError("accumulate_sorted: the partials are for " + std::to_string(partials.variants()) +
                        " variants, the set has " + std::to_string(V));
  if (begin > end || begin < set.window_begin() || end > set.window_end())
    throw DistanceError("accumulate_sorted: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") is outside the set's sorted positions [" + std::to_string(set.window_begin()) +
                        ", " + std::to_string(set.window_end()) + ")");
  const std::size_t w0 = set.window_begin();
  const bool w2 = which == SortedMetrics::w1_w2;
  partials.note_sorted_metrics(which);
  std::int64_t* sums = partials.sums();
  const std::vector<VariantPair>& pairs = partials.pairs();
  std::vector<char> finite(V);
  for_each_block(begin, end, [&](std::size_t b0, std::size_t b1) {
    const std::size_t len = b1 - b0;
    for (std::size_t v = 0; v < V; ++v)
      finite[v] = partials.uses(v) && (set.nonfinite(v) == 0 || all_finite(set.window(v) + (b0 - w0), len));
    for (std::size_t p = 0; p < pairs.size(); ++p) {
      const auto [i, j] = pairs[p];
      const T* a = set.window(i) + (b0 - w0);
      std::int64_t* s = sums + p * PairwisePartials::kPairSums;
      double sa = 0, sq = 0;
      std::uint64_t skipped = 0;
      const T* b = set.window(j) + (b0 - w0);
      if (finite[i] && finite[j]) sorted_kernel(a, b, len, &sa, w2 ? &sq : nullptr);
      if (!(finite[i] && finite[j]) || !std::isfinite(sa) || !std::isfinite(sq))
        sorted_slow(a, b, len, &sa, w2 ? &sq : nullptr, &skipped);
      if (!std::isfinite(sa) || !std::isfinite(sq)) {
        skipped = len;
        sa = sq = 0;
      }
      s[kNonfiniteSorted] += static_cast<std::int64_t>(skipped);
      exact_add(s + kSortedAbs, sa);
      if (w2) exact_add(s + kSortedSq, sq);
      s[kCountSorted] += static_cast<std::int64_t>(len);
    }
  });
  for (std::size_t p = 0; p < partials.pair_count(); ++p) {
    exact_normalize(sums + p * PairwisePartials::kPairSums + kSortedAbs);
    exact_normalize(sums + p * PairwisePartials::kPairSums + kSortedSq);
  }
}

template <class T>
void accumulate_elementwise(const std::vector<const T*>& values, std::size_t begin, std::size_t end,
                            PairwisePartials& partials, std::size_t offset) {
  const std::size_t V = values.size();
  if (partials.variants() != V)
    throw DistanceError("accumulate_elementwise: the partials are for " +
                        std::to_string(partials.variants()) + " variants, got " + std::to_string(V));
  if (begin > end || begin < offset)
    throw DistanceError("accumulate_elementwise: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") does not start at or after the arrays' first index " + std::to_string(offset));
  std::int64_t* sums = partials.sums();
  std::int64_t* norms = sums + partials.pair_count() * PairwisePartials::kPairSums;
  double* maxima = partials.maxima();
  const std::vector<VariantPair>& pairs = partials.pairs();
  std::vector<char> finite(V);
  for_each_block(begin, end, [&](std::size_t b0, std::size_t b1) {
    const std::size_t len = b1 - b0;
    for (std::size_t v = 0; v < V; ++v) {
      if (!partials.uses(v)) continue;
      finite[v] = all_finite(values[v] + (b0 - offset), len);
      double q = finite[v] ? squares_kernel(values[v] + (b0 - offset), len) : 0.0;
      if (!finite[v] || !std::isfinite(q)) q = squares_slow(values[v] + (b0 - offset), len);
      if (std::isfinite(q)) exact_add(norms + v * kExactLimbs, q);
    }
    for (std::size_t p = 0; p < pairs.size(); ++p) {
      const auto [i, j] = pairs[p];
      const T* a = values[i] + (b0 - offset);
      std::int64_t* s = sums + p * PairwisePartials::kPairSums;
      double sa = 0, sq = 0, mx = 0;
      std::uint64_t skipped = 0;
      if (finite[i] && finite[j]) elementwise_kernel(a, values[j] + (b0 - offset), len, &sa, &sq, &mx);
      if (!(finite[i] && finite[j]) || !std::isfinite(sq))
        elementwise_slow(a, values[j] + (b0 - offset), len, &sa, &sq, &mx, &skipped);
      if (!std::isfinite(sq)) {  // 2048 squares near DBL_MAX: the whole block is out of range
        skipped = len;
        sa = sq = mx = 0;
      }
      exact_add(s + kAbs, sa);
      exact_add(s + kSq, sq);
      maxima[p] = std::max(maxima[p], mx);
      s[kCount] += static_cast<std::int64_t>(len - skipped);
      s[kNonfinite] += static_cast<std::int64_t>(skipped);
    }
  });
  for (std::size_t p = 0; p < partials.pair_count(); ++p) {
    exact_normalize(sums + p * PairwisePartials::kPairSums + kAbs);
    exact_normalize(sums + p * PairwisePartials::kPairSums + kSq);
  }
  for (std::size_t v = 0; v < V; ++v)
    if (partials.uses(v)) exact_normalize(norms + v * kExactLimbs);
}

template <class T>
PairwisePartials pairwise_partials(const std::vector<const T*>& values, std::size_t n) {
  SortedSet<T> set;
  for (const T* v : values) set.add(ArrayView<T>(v, n));
  PairwisePartials p(values.size());
  accumulate_sorted(set, 0, n, p);
  accumulate_elementwise(values, 0, n, p);
  return p;
}

template <class T>
PairwiseMatrix pairwise_matrix(const std::vector<const T*>& values, std::size_t n) {
  return pairwise_partials(values, n).finalize();
}

template void accumulate_sorted(const SortedSet<float>&, std::size_t, std::size_t, PairwisePartials&,
                                SortedMetrics);
template void accumulate_sorted(const SortedSet<double>&, std::size_t, std::size_t, PairwisePartials&,
                                SortedMetrics);
template void accumulate_elementwise(const std::vector<const float*>&, std::size_t, std::size_t,
                                     PairwisePartials&, std::size_t);
template void accumulate_elementwise(const std::vector<const double*>&, std::size_t, std::size_t,
                                     PairwisePartials&, std::size_t);
template PairwisePartials pairwise_partials(const std::vector<const float*>&, std::size_t);
template PairwisePartials pairwise_partials(const std::vector<const double*>&, std::size_t);
template PairwiseMatrix pairwise_matrix(const std::vector<const float*>&, std::size_t);
template PairwiseMatrix pairwise_matrix(const std::vector<const double*>&, std::size_t);

}  // namespace fastudy
