// Radix sort of floats and doubles by their IEEE bit patterns (radix_sort of analysis/distance.hpp):
// one pass into buckets of the top bits (streamed through 64-byte lines when large), then each bucket
// in the caches: by fine bin where its bins are large, MSD passes while a piece is larger than the
// cache, LSD passes inside it; total order, NaNs last.
#include "analysis/distance.hpp"
#include "analysis/radix_sort.hpp"
#include "base/error.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

// LSD radix sort of keys[0, n) by bits [0, bits), tmp as scratch; returns where the sorted keys are
// (keys or tmp). As few passes as 11-bit digits need, their widths balanced (16 bits: two of 8, not 11
// and 5: a pass's counters and scatter streams then stay in the first-level cache). The first read
// counts the digits of up to three passes at once; passes where every key has the same digit are skipped.
template <class U>
U* lsd_sort(U* keys, U* tmp, std::size_t n, int bits) {
  if (n < kSmallBucket) {
    std::sort(keys, keys + n);
    return keys;
  }
  constexpr int kMaxPasses = (static_cast<int>(sizeof(U)) * 8 + kDigit - 1) / kDigit;
  const int total = (bits + kDigit - 1) / kDigit;
  int width[kMaxPasses], shift[kMaxPasses];
  for (int p = 0, at = 0; p < total; ++p) {
    width[p] = bits / total + (p < bits % total ? 1 : 0);
    shift[p] = at;
    at += width[p];
  }
  constexpr int kCounted = 3;
  std::size_t hist[kCounted][kBuckets];
  U* src = keys;
  U* dst = tmp;
  for (int first = 0; first < total; first += kCounted) {
    const int passes = std::min(kCounted, total - first);
    std::size_t mask[kCounted] = {0, 0, 0};
    int sh[kCounted] = {0, 0, 0};
    for (int p = 0; p < passes; ++p) {
      mask[p] = (std::size_t{1} << width[first + p]) - 1;
      sh[p] = shift[first + p];
      std::fill(hist[p], hist[p] + mask[p] + 1, 0);
    }
    if (passes == 1) {
      for (std::size_t i = 0; i < n; ++i) ++hist[0][(src[i] >> sh[0]) & mask[0]];
    } else if (passes == 2) {
      for (std::size_t i = 0; i < n; ++i) {
        const U k = src[i];
        ++hist[0][(k >> sh[0]) & mask[0]];
        ++hist[1][(k >> sh[1]) & mask[1]];
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const U k = src[i];
        ++hist[0][(k >> sh[0]) & mask[0]];
        ++hist[1][(k >> sh[1]) & mask[1]];
        ++hist[2][(k >> sh[2]) & mask[2]];
      }
    }
    for (int p = 0; p < passes; ++p) {
      std::size_t* h = hist[p];
      // A pass's digit counts do not depend on the order of the keys: counted once, before any pass.
      if (h[(src[0] >> sh[p]) & mask[p]] == n) continue;
      std::size_t offset = 0;
      for (std::size_t d = 0; d <= mask[p]; ++d) {
        const std::size_t c = h[d];
        h[d] = offset;
        offset += c;
      }
      for (std::size_t i = 0; i < n; ++i) dst[h[(src[i] >> sh[p]) & mask[p]]++] = src[i];
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
// A bucket's pass by fine bin pays where its bins hold this many keys on average (each then sorts on
// its low bits alone, in fewer and narrower passes); with smaller bins, their sorts' fixed costs win.
constexpr std::size_t kBinPassKeys = 512;

// Keys at least this large scatter through lines (scatter_by_line); smaller ones would still be in
// the caches when their buckets are sorted, and are scattered key by key.
constexpr std::size_t kStreamBytes = std::size_t{4} << 20;

// keys[0, n) scattered to out by bucket (bucket_of[key >> shift]; next[c], bucket c's first place),
// through a 64-byte line per bucket, written out whole when it fills (software write combining) and
// past the caches where the target allows: thousands of streams then cost a DRAM page's translation
// and a write per line, not per key, and no read of the line first. A bucket's first line starts at
// the 64-byte boundary before its first place (the slots before it are the previous bucket's).
template <class U>
void scatter_by_line(const U* keys, U* out, std::size_t n, const std::uint16_t* bucket_of, const std::size_t* next,
                     std::size_t buckets, int shift) {
  constexpr std::size_t kLine = 64 / sizeof(U);
  struct alignas(64) Line {
    U k[kLine];
  };
  std::vector<Line> line(buckets);
  std::vector<std::uint32_t> fill(buckets);
  // at[c]: the place of bucket c's line's slot 0 (before out for a first line that starts before it).
  std::vector<std::ptrdiff_t> at(buckets), first(buckets);
  for (std::size_t c = 0; c < buckets; ++c) {
    const std::size_t skew = (reinterpret_cast<std::uintptr_t>(out + next[c]) % 64) / sizeof(U);
    fill[c] = static_cast<std::uint32_t>(skew);
    first[c] = static_cast<std::ptrdiff_t>(next[c]);
    at[c] = first[c] - static_cast<std::ptrdiff_t>(skew);
  }
  // Slots [from, count) of bucket c's line to their places (from: the slots before the bucket).
  const auto put_part = [&](std::size_t c, std::size_t count) {
    const std::size_t from = at[c] < first[c] ? static_cast<std::size_t>(first[c] - at[c]) : 0;
    if (count > from) std::memcpy(out + (at[c] + static_cast<std::ptrdiff_t>(from)), line[c].k + from, (count - from) * sizeof(U));
  };
  for (std::size_t i = 0; i < n; ++i) {
    const U k = keys[i];
    const std::size_t c = bucket_of[k >> shift];
    std::uint32_t f = fill[c];
    line[c].k[f++] = k;
    if (f == kLine) {
      if (at[c] >= first[c]) {
        U* o = out + at[c];
#if defined(__SSE2__)
        const auto* src = reinterpret_cast<const __m128i*>(line[c].k);
        auto* dst = reinterpret_cast<__m128i*>(o);
        _mm_stream_si128(dst, _mm_load_si128(src));
        _mm_stream_si128(dst + 1, _mm_load_si128(src + 1));
        _mm_stream_si128(dst + 2, _mm_load_si128(src + 2));
        _mm_stream_si128(dst + 3, _mm_load_si128(src + 3));
#else
        std::memcpy(o, line[c].k, 64);
#endif
      } else {
        put_part(c, kLine);
      }
      at[c] += static_cast<std::ptrdiff_t>(kLine);
      f = 0;
    }
    fill[c] = f;
  }
#if defined(__SSE2__)
  _mm_sfence();  // the streamed lines are visible to the loads that follow
#endif
  for (std::size_t c = 0; c < buckets; ++c) put_part(c, fill[c]);
}

// A bucket of the first pass (keys, its fine bins [first, last) with their counts, tmp as scratch)
// sorted and emitted: when it is in the caches, one pass by fine bin with the counts known, then each
// bin on its low bits (sort_bucket); else sort_bucket on the bits where its keys differ.
template <class T, class U, class Count>
void sort_first_bucket(U* keys, U* tmp, std::size_t n, std::size_t first, std::size_t last, const Count* fine,
                       Emitter<T, U>& emit) {
  constexpr int kBits = static_cast<int>(sizeof(U)) * 8;
  constexpr int kFineShift = kBits - kFineBits;
  constexpr std::size_t kCacheKeys = kCacheBytes / (2 * sizeof(U));
  std::size_t occupied = 0;
  for (std::size_t f = first; f < last; ++f) occupied += fine[f] > 0 ? 1 : 0;
  if (occupied == 1 || n > kCacheKeys || n < kBinPassKeys * occupied) {
    // The keys of bins [first, last) agree above the bits where first and last - 1 differ.
    sort_bucket(keys, tmp, n, kFineShift + bit_length(first ^ (last - 1)), emit);
    return;
  }
  std::vector<std::size_t> next(last - first);
  for (std::size_t f = first, o = 0; f < last; ++f) next[f - first] = o, o += fine[f];
  for (std::size_t i = 0; i < n; ++i) tmp[next[(keys[i] >> kFineShift) - first]++] = keys[i];
  for (std::size_t f = first, o = 0; f < last; o += fine[f], ++f)
    if (fine[f] > 0) sort_bucket(tmp + o, keys + o, fine[f], kFineShift, emit);
}

// The keys a[0, n) (fine[f]: the number in fine bin f) into buckets of fine bins (b), each bucket
// sorted in the caches and emitted; a is scratch afterwards.
template <class T, class U, class Count>
void sort_by_fine_bins(U* a, U* b, std::size_t n, const Count* fine, Emitter<T, U>& emit) {
  constexpr int kBits = static_cast<int>(sizeof(U)) * 8;
  constexpr int kFineShift = kBits - kFineBits;
  constexpr std::size_t kCacheKeys = kCacheBytes / (2 * sizeof(U));
  // Fine bins merged in order: a new bucket where the current one would pass the cap. A bin of at least
  // `alone` keys is a bucket of its own (its keys then sort on their low bits alone, with no pass by bin
  // in the cache): at most n / alone such bins, each closing at most one bucket of the others before it,
  // and at most 2 n / cap more (with kMaxFirstBuckets 2048, about 8,200 buckets: bucket_of's 16 bits).
  const std::size_t cap = std::max(kCacheKeys, (n + kMaxFirstBuckets - 1) / kMaxFirstBuckets);
  const std::size_t alone = std::max(kBinPassKeys, (n + kMaxFirstBuckets - 1) / kMaxFirstBuckets);
  std::vector<std::uint16_t> bucket_of(kFineBins);
  std::vector<std::size_t> offset{0};  // the buckets' starts
  std::vector<std::uint32_t> first_bin{0};
  std::size_t filled = 0;
  for (std::size_t f = 0; f < kFineBins; ++f) {
    const bool own = fine[f] >= alone, was_own = f > 0 && fine[f - 1] >= alone;
    if (filled > 0 && (filled + fine[f] > cap || own || was_own)) {
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
  if (n * sizeof(U) >= kStreamBytes) {
    scatter_by_line(a, b, n, bucket_of.data(), offset.data(), buckets, kFineShift);
  } else {
    std::vector<std::size_t> next(offset.begin(), offset.end() - 1);
    for (std::size_t i = 0; i < n; ++i) {
      const U k = a[i];
      b[next[bucket_of[k >> kFineShift]]++] = k;
    }
  }
  for (std::size_t c = 0; c < buckets; ++c) {
    const std::size_t len = offset[c + 1] - offset[c];
    if (len > 0) sort_first_bucket(b + offset[c], a + offset[c], len, first_bin[c], first_bin[c + 1], fine, emit);
  }
}

// The spans' keys sorted (the first pass into balanced buckets of the top bits, then each bucket in the
// caches: sort_first_bucket), their values written to the consecutive pieces `outs` (which may overlap
// the spans: every value is read before any is written); scratch (2n keys) reused across calls, its
// pages touched once.
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
  // Counted in 32 bits where they fit (256 KiB of counters, in the second-level cache).
  if (n <= UINT32_MAX) {
    std::vector<std::uint32_t> fine(kFineBins, 0);
    keys_of_spans([&](U k) { ++fine[k >> kFineShift]; });
    sort_by_fine_bins(a, b, n, fine.data(), emit);
  } else {
    std::vector<std::uint64_t> fine(kFineBins, 0);
    keys_of_spans([&](U k) { ++fine[k >> kFineShift]; });
    sort_by_fine_bins(a, b, n, fine.data(), emit);
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
