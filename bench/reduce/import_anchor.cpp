// The physical anchor of the imported-study reduce benchmark (bench/reduce/import_bench.py): the time
// to read every file once with plain read()s (from the page cache, after a warm-up read) plus one radix
// sort of as many fp32 values as the files hold tensor elements (sorted file by file, so the memory is
// one file's values). Prints "read_s SECONDS", "sort_s SECONDS", "values N".
//   import_anchor ELEMENT_BYTES FILE...   (ELEMENT_BYTES: 4 for fp32 files, 2 for bf16)
//
// With --processes P first, P processes (forked) take the files dealt round-robin, each the same work
// on its part; each warms its files and makes its values, says it is ready on a pipe, and starts the
// timed read and sort only when every one is ready. Prints "together_s SECONDS": from the release to
// the last one's end. `--processes 1` is the same path with one process, so the two runs' ratio is
// what P cores give this machine on the anchor's memory-bound work (not a bound on P ranks: the reduce's
// sorts are mostly of tensors that fit the caches).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
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

// The anchor's work on `files`: warm-up reads, the values made, then `ready()` (which returns when the
// timed part may start), the timed reads and sorts. Returns the exit status.
template <class Ready>
int anchor(long long element_bytes, const std::vector<const char*>& files, bool print, Ready ready) {
  std::vector<char> buf(std::size_t{1} << 24);
  std::vector<long long> sizes;
  for (const char* f : files) {  // warm the page cache
    const long long n = read_all(f, buf);
    if (n < 0) {
      std::fprintf(stderr, "import_anchor: cannot read %s\n", f);
      return 1;
    }
    sizes.push_back(n);
  }
  long long largest = 0;
  for (auto n : sizes) largest = std::max(largest, n / element_bytes);
  std::vector<float> v(static_cast<std::size_t>(largest));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (auto& x : v) x = normal(rng);
  std::vector<float> work(v.size());
  std::copy(v.begin(), v.end(), work.begin());  // its pages written before the timing
  if (!ready()) return 1;
  auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < files.size(); ++i) sizes[i] = read_all(files[i], buf);
  const double read_s = seconds_since(t0);
  // One file's worth of values at a time, as many in all as the files hold (their size / element bytes).
  long long values = 0;
  for (auto n : sizes) values += n / element_bytes;
  double sort_s = 0;
  for (auto n : sizes) {
    const auto count = static_cast<std::size_t>(n / element_bytes);
    std::copy(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(count), work.begin());
    t0 = std::chrono::steady_clock::now();
    fastudy::radix_sort(work.data(), count);
    sort_s += seconds_since(t0);
  }
  if (print) std::printf("read_s %.6f\nsort_s %.6f\nvalues %lld\n", read_s, sort_s, values);
  return 0;
}

// P forked processes, the files dealt round-robin; prints the time from their common start to the end
// of the last one.
int together(int processes, long long element_bytes, const std::vector<const char*>& files) {
  int ready[2], go[2];
  if (::pipe(ready) != 0 || ::pipe(go) != 0) {
    std::perror("import_anchor: pipe");
    return 1;
  }
  std::vector<pid_t> children;
  for (int p = 0; p < processes; ++p) {
    std::vector<const char*> part;
    for (std::size_t i = static_cast<std::size_t>(p); i < files.size(); i += static_cast<std::size_t>(processes))
      part.push_back(files[i]);
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("import_anchor: fork");
      return 1;
    }
    if (pid == 0) {
      ::close(ready[0]);
      ::close(go[1]);
      const int rc = anchor(element_bytes, part, false, [&] {
        // The ready end is closed once written: a process that failed before it closed it by exiting,
        // so the parent's reads end when every one has written or exited.
        char c = 1, g = 0;
        const bool said = ::write(ready[1], &c, 1) == 1;
        ::close(ready[1]);
        return said && ::read(go[0], &g, 1) == 1;
      });
      std::fflush(stdout);
      ::_exit(rc);
    }
    children.push_back(pid);
  }
  ::close(ready[1]);
  ::close(go[0]);
  // With every process gone the release's write fails (EPIPE) instead of ending this one unnamed.
  ::signal(SIGPIPE, SIG_IGN);
  for (int p = 0; p < processes; ++p) {  // every child ready (or gone: read returns 0)
    char c = 0;
    if (::read(ready[0], &c, 1) != 1) break;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<char> release(static_cast<std::size_t>(processes), 1);
  const bool released = ::write(go[1], release.data(), release.size()) == static_cast<ssize_t>(release.size());
  int failed = released ? 0 : 1;
  for (pid_t pid : children) {
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  const double s = seconds_since(t0);
  if (failed) {
    std::fprintf(stderr, "import_anchor: a process failed\n");
    return 1;
  }
  std::printf("together_s %.6f\nprocesses %d\n", s, processes);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int first = 1, processes = 0;
  if (argc > 2 && std::string(argv[1]) == "--processes") {
    processes = std::atoi(argv[2]);
    first = 3;
  }
  if (argc < first + 2 || (first == 3 && processes < 1)) {
    std::fprintf(stderr, "usage: import_anchor [--processes P] ELEMENT_BYTES FILE...\n");
    return 2;
  }
  const std::string element = argv[first];
  if (element != "4" && element != "2") {
    std::fprintf(stderr, "import_anchor: ELEMENT_BYTES is %s; it must be 4 (fp32 files) or 2 (bf16)\n", element.c_str());
    return 2;
  }
  const long long element_bytes = std::atoll(element.c_str());
  const std::vector<const char*> files(argv + first + 1, argv + argc);
  if (processes > 0) return together(processes, element_bytes, files);
  return anchor(element_bytes, files, true, [] { return true; });
}
