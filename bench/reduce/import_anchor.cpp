// The physical anchor of the imported-study reduce benchmark (bench/reduce/import_bench.py): the time
// to read every file once with plain read()s (from the page cache, after a warm-up read) plus one radix
// sort of as many fp32 values as the files hold tensor elements (sorted file by file, so the memory is
// one file's values). Prints "read_s SECONDS", "sort_s SECONDS", "values N".
//   import_anchor ELEMENT_BYTES FILE...   (ELEMENT_BYTES: 4 for fp32 files, 2 for bf16)
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "analysis/distance.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Reads the whole file into buf (reused); returns its size, or -1.
long long read_all(const char* path, std::vector<char>& buf) {
  const int fd = ::open(path, O_RDONLY);
  if (fd < 0) return -1;
  long long total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n <= 0) break;
    total += n;
  }
  ::close(fd);
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: import_anchor ELEMENT_BYTES FILE...\n");
    return 2;
  }
  const long long element_bytes = std::atoll(argv[1]);
  std::vector<char> buf(std::size_t{1} << 24);
  for (int i = 2; i < argc; ++i) read_all(argv[i], buf);  // warm the page cache
  auto t0 = std::chrono::steady_clock::now();
  std::vector<long long> sizes;
  for (int i = 2; i < argc; ++i) {
    const long long n = read_all(argv[i], buf);
    if (n < 0) {
      std::fprintf(stderr, "import_anchor: cannot read %s\n", argv[i]);
      return 1;
    }
    sizes.push_back(n);
  }
  const double read_s = seconds_since(t0);
  // One file's worth of values at a time, as many in all as the files hold (their size / element bytes).
  long long largest = 0, values = 0;
  for (auto n : sizes) largest = std::max(largest, n / element_bytes), values += n / element_bytes;
  std::vector<float> v(static_cast<std::size_t>(largest));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (auto& x : v) x = normal(rng);
  std::vector<float> work(v.size());
  double sort_s = 0;
  for (auto n : sizes) {
    const auto count = static_cast<std::size_t>(n / element_bytes);
    std::copy(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(count), work.begin());
    t0 = std::chrono::steady_clock::now();
    fastudy::radix_sort(work.data(), count);
    sort_s += seconds_since(t0);
  }
  std::printf("read_s %.6f\nsort_s %.6f\nvalues %lld\n", read_s, sort_s, values);
  return 0;
}
