// Radix sort of floats and doubles by their IEEE bit patterns (radix_sort of analysis/distance.hpp):
// MSD passes while a bucket is larger than the cache, LSD passes inside it; total order, NaNs last.
#include "analysis/distance.hpp"
#include "analysis/radix_sort.hpp"
#include "base/error.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace fastudy {

// ---- radix sort ---------------------------------------------------------------------------------

namespace {

// Monotone map of the IEEE bit pattern to an unsigned key: negative values flip all bits, positive
// ones flip the sign bit. Order: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN.
template <class U>
U to_key(U u) {
  constexpr U sign = U{1} << (sizeof(U) * 8 - 1);
  return (u & sign) ? static_cast<U>(~u) : static_cast<U>(u | sign);
}
template <class U>
U from_key(U k) {
  constexpr U sign = U{1} << (sizeof(U) * 8 - 1);
  return (k & sign) ? static_cast<U>(k & ~sign) : static_cast<U>(~k);
}

// A bucket this small (keys plus as much scratch) sorts inside a core's L2 cache: by LSD passes over
// its remaining bits. A larger one takes one more MSD pass first (each pass reads and writes DRAM
// once; an LSD pass over a bucket larger than the caches scatters into 2048 DRAM streams, and a bucket
// of weights after the first pass holds up to a tenth of the values).
constexpr std::size_t kCacheBytes = std::size_t{1} << 20;
// Below this many keys a comparison sort is cheaper than a pass's 2048 counters.
constexpr std::size_t kSmallBucket = 256;
constexpr int kDigit = 11;
constexpr std::size_t kBuckets = std::size_t{1} << kDigit;
// Counters of an MSD pass: keys i, i + 4, ... count in table i mod 4 and scatter with its offsets.
// Weights fall into few buckets, and one counter per bucket would serialise on store-to-load forwarding.
constexpr std::size_t kStreams = 4;

// The bit length of x (0 for 0).
int bit_length(std::uint64_t x) { return x == 0 ? 0 : 64 - __builtin_clzll(x); }

// LSD radix sort of keys[0, n) by bits [0, bits), 11 bits per pass, tmp as scratch; returns where the
// sorted keys are (keys or tmp). The first read counts the digits of up to three passes at once;
// passes where every key has the same digit are skipped.
template <class U>
U* lsd_sort(U* keys, U* tmp, std::size_t n, int bits) {
  if (n < kSmallBucket) {
    std::sort(keys, keys + n);
    return keys;
  }
  constexpr int kCounted = 3;
  std::size_t hist[kCounted][kBuckets];
  U* src = keys;
  U* dst = tmp;
  for (int first = 0; first < bits; first += kCounted * kDigit) {
    const int passes = std::min(kCounted, (bits - first + kDigit - 1) / kDigit);
    std::size_t mask[kCounted] = {0, 0, 0};
    for (int p = 0; p < passes; ++p) {
      mask[p] = (std::size_t{1} << std::min(kDigit, bits - first - p * kDigit)) - 1;
      std::fill(hist[p], hist[p] + mask[p] + 1, 0);
    }
    if (passes == 1) {
      for (std::size_t i = 0; i < n; ++i) ++hist[0][(src[i] >> first) & mask[0]];
    } else if (passes == 2) {
      for (std::size_t i = 0; i < n; ++i) {
        const U k = src[i] >> first;
        ++hist[0][k & mask[0]];
        ++hist[1][(k >> kDigit) & mask[1]];
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const U k = src[i] >> first;
        ++hist[0][k & mask[0]];
        ++hist[1][(k >> kDigit) & mask[1]];
        ++hist[2][(k >> (2 * kDigit)) & mask[2]];
      }
    }
    for (int p = 0; p < passes; ++p) {
      const int shift = first + p * kDigit;
      std::size_t* h = hist[p];
      // A pass's digit counts do not depend on the order of the keys: counted once, before any pass.
      if (h[(src[0] >> shift) & mask[p]] == n) continue;
      std::size_t offset = 0;
      for (std::size_t d = 0; d <= mask[p]; ++d) {
        const std::size_t c = h[d];
        h[d] = offset;
        offset += c;
      }
      for (std::size_t i = 0; i < n; ++i) dst[h[(src[i] >> shift) & mask[p]]++] = src[i];
      std::swap(src, dst);
    }
  }
  return src;
}

// The sorted keys' values written to the consecutive pieces `outs`, in order of position (each leaf of
// the sort appends its run).
template <class T, class U>
struct Emitter {
  const std::vector<OutSpan<T>>& outs;
  std::size_t piece = 0, at = 0;  // the next position: outs[piece].data[at]
  void put(const U* keys, std::size_t n) {
    for (std::size_t i = 0; i < n;) {
      while (at == outs[piece].size) ++piece, at = 0;
      const std::size_t m = std::min(n - i, outs[piece].size - at);
      T* o = outs[piece].data + at;
      for (std::size_t j = 0; j < m; ++j) {
        const U u = from_key(keys[i + j]);
        std::memcpy(&o[j], &u, sizeof u);
      }
      i += m;
      at += m;
    }
  }
};

// One MSD pass of keys[0, n) on the digit of bits [bits - 11, bits) (fewer at the bottom) into tmp,
// the buckets' starts into start[0, kBuckets + 1); counts[] given (kStreams tables, filled by the
// caller or here when `counted` is false).
template <class U>
void msd_pass(const U* keys, U* tmp, std::size_t n, int shift, std::size_t mask, std::size_t* count, bool counted,
              std::size_t* start) {
  if (!counted) {
    std::fill(count, count + kStreams * kBuckets, 0);
    std::size_t i = 0;
    for (; i + kStreams <= n; i += kStreams)
      for (std::size_t st = 0; st < kStreams; ++st) ++count[st * kBuckets + ((keys[i + st] >> shift) & mask)];
    for (std::size_t st = 0; i < n; ++i, ++st) ++count[st * kBuckets + ((keys[i] >> shift) & mask)];
  }
  std::size_t offset = 0;
  for (std::size_t d = 0; d < kBuckets; ++d) {
    start[d] = offset;
    for (std::size_t st = 0; st < kStreams; ++st) {
      const std::size_t c = count[st * kBuckets + d];
      count[st * kBuckets + d] = offset;
      offset += c;
    }
  }
  start[kBuckets] = n;
  std::size_t i = 0;
  for (; i + kStreams <= n; i += kStreams)
    for (std::size_t st = 0; st < kStreams; ++st) {
      const U k = keys[i + st];
      tmp[count[st * kBuckets + ((k >> shift) & mask)]++] = k;
    }
  for (std::size_t st = 0; i < n; ++i, ++st) tmp[count[st * kBuckets + ((keys[i] >> shift) & mask)]++] = keys[i];
}

// keys[0, n) sorted on their low `bits` bits (the higher ones are equal), emitted in order; tmp (n keys)
// as scratch. In the cache: LSD passes; else one MSD pass on as many top bits of them as split the
// bucket into pieces of about the cache's size (up to 11), then each piece the same way.
template <class T, class U>
void sort_bucket(U* keys, U* tmp, std::size_t n, int bits, Emitter<T, U>& emit) {
  constexpr std::size_t kCacheKeys = kCacheBytes / (2 * sizeof(U));
  if (n <= kCacheKeys || bits <= kDigit) {
    emit.put(lsd_sort(keys, tmp, n, bits), n);
    return;
  }
  const int digit = std::min({kDigit, bits, std::max(1, bit_length((n - 1) / kCacheKeys))});
  const int shift = bits - digit;
  std::vector<std::size_t> count(kStreams * kBuckets), start(kBuckets + 1);
  msd_pass(keys, tmp, n, shift, (std::size_t{1} << digit) - 1, count.data(), false, start.data());
  for (std::size_t d = 0; d < (std::size_t{1} << digit); ++d) {
    const std::size_t len = start[d + 1] - start[d];
    if (len > 0) sort_bucket(tmp + start[d], keys + start[d], len, shift, emit);
  }
}

// The first pass's buckets: ranges of the keys' top 16 bits (65536 fine bins, counted as the keys are
// made), merged in order into at most a few thousand buckets of at most kCacheBytes / (2 key size)
// keys each where the bins allow: one DRAM scatter, after which every bucket sorts in the caches. (Weights
// concentrate in a few dozen values of the sign and exponent bits: a first digit of fixed bits would
// leave buckets of a tenth of the values each, and need a second DRAM pass.)
constexpr int kFineBits = 16;
constexpr std::size_t kFineBins = std::size_t{1} << kFineBits;
constexpr std::size_t kMaxFirstBuckets = 2048;

// The spans' keys sorted (the first pass into balanced buckets of the top bits, then each bucket in the
// caches: sort_bucket), their values written to the consecutive pieces `outs` (which may overlap the
// spans: every value is read before any is written); scratch (2n keys) reused across calls, its pages
// touched once.
template <class T, class U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>
void radix_sort_impl(const std::vector<SortSpan<T>>& spans, const std::vector<OutSpan<T>>& outs, std::size_t n,
                     ValueBuffer<U>& scratch) {
  constexpr int kBits = static_cast<int>(sizeof(U)) * 8;
  constexpr int kFineShift = kBits - kFineBits;
  constexpr std::size_t kCacheKeys = kCacheBytes / (2 * sizeof(U));
  if (n < 2) {
    for (const auto& sp : spans)
      if (sp.size == 1)
        for (const auto& o : outs)
          if (o.size == 1) o.data[0] = sp.data[0];
    return;
  }
  scratch.assign_uninitialized(2 * n);
  U* a = scratch.data();
  U* b = scratch.data() + n;
  Emitter<T, U> emit{outs};
  const auto keys_of_spans = [&](auto&& each) {
    std::size_t at = 0;
    for (const auto& sp : spans)
      for (std::size_t i = 0; i < sp.size; ++i, ++at) {
        U u;
        std::memcpy(&u, &sp.data[i], sizeof u);
        a[at] = to_key(u);
        each(a[at]);
      }
  };
  if (n <= kCacheKeys) {  // in the caches from the start
    keys_of_spans([](U) {});
    emit.put(lsd_sort(a, b, n, kBits), n);
    return;
  }
  std::vector<std::uint64_t> fine(kFineBins, 0);
  keys_of_spans([&](U k) { ++fine[k >> kFineShift]; });
  // Fine bins merged in order: a new bucket where the current one would pass the cap.
  const std::size_t cap = std::max(kCacheKeys, (n + kMaxFirstBuckets - 1) / kMaxFirstBuckets);
  std::vector<std::uint16_t> bucket_of(kFineBins);
  std::vector<std::size_t> offset{0};  // the buckets' starts
  std::vector<std::uint32_t> first_bin{0};
  std::size_t filled = 0;
  for (std::size_t f = 0; f < kFineBins; ++f) {
    if (filled > 0 && filled + fine[f] > cap) {
      offset.push_back(offset.back() + filled);
      first_bin.push_back(static_cast<std::uint32_t>(f));
      filled = 0;
    }
    filled += fine[f];
    bucket_of[f] = static_cast<std::uint16_t>(offset.size() - 1);
  }
  offset.push_back(n);
  first_bin.push_back(static_cast<std::uint32_t>(kFineBins));
  const std::size_t buckets = offset.size() - 1;
  std::vector<std::size_t> next(offset.begin(), offset.end() - 1);
  for (std::size_t i = 0; i < n; ++i) {
    const U k = a[i];
    b[next[bucket_of[k >> kFineShift]]++] = k;
  }
  for (std::size_t c = 0; c < buckets; ++c) {
    const std::size_t len = offset[c + 1] - offset[c];
    if (len == 0) continue;
    // The keys of bins [first, last] agree above the bits where first and last differ.
    const std::uint64_t first = first_bin[c], last = first_bin[c + 1] - 1;
    const int bits = kFineShift + bit_length(first ^ last);
    sort_bucket(b + offset[c], a + offset[c], len, bits, emit);
  }
}

}  // namespace

std::uint32_t sort_key(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return to_key(u);
}
std::uint64_t sort_key(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return to_key(u);
}

namespace {

template <class T, class U>
void sort_spans(const std::vector<SortSpan<T>>& spans, const std::vector<OutSpan<T>>& outs, ValueBuffer<U>& scratch) {
  std::size_t n = 0, m = 0;
  for (const auto& sp : spans) n += sp.size;
  for (const auto& o : outs) m += o.size;
  if (m != n) throw Error("radix sort: " + std::to_string(n) + " values for " + std::to_string(m) + " places");
  radix_sort_impl(spans, outs, n, scratch);
}

}  // namespace

void radix_sort_into(const float* in, float* out, std::size_t n, ValueBuffer<std::uint32_t>& scratch) {
  radix_sort_impl<float>({{in, n}}, {{out, n}}, n, scratch);
}
void radix_sort_into(const double* in, double* out, std::size_t n, ValueBuffer<std::uint64_t>& scratch) {
  radix_sort_impl<double>({{in, n}}, {{out, n}}, n, scratch);
}
void radix_sort_spans(const std::vector<SortSpan<float>>& spans, const std::vector<OutSpan<float>>& outs,
                      ValueBuffer<std::uint32_t>& scratch) {
  sort_spans(spans, outs, scratch);
}
void radix_sort_spans(const std::vector<SortSpan<double>>& spans, const std::vector<OutSpan<double>>& outs,
                      ValueBuffer<std::uint64_t>& scratch) {
  sort_spans(spans, outs, scratch);
}

void radix_sort(float* values, std::size_t n) {
  ValueBuffer<std::uint32_t> scratch;
  radix_sort_impl<float>({{values, n}}, {{values, n}}, n, scratch);
}
void radix_sort(double* values, std::size_t n) {
  ValueBuffer<std::uint64_t> scratch;
  radix_sort_impl<double>({{values, n}}, {{values, n}}, n, scratch);
}

}  // namespace fastudy
