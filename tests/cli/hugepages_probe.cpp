// Probe for base/hugepages: re-executes itself like fastudy (FASTUDY_HUGEPAGES_AT_PREINIT, before any
// initialiser runs), then prints the GLIBC_TUNABLES it runs with and how much of 64 MiB of freshly
// touched heap the kernel backs with huge pages (AnonHugePages of /proc/self/smaps_rollup, kB). A
// static initialiser prints "initialiser ran with tunables=..." each time it runs: once, in the
// re-executed process, when the re-execution happens before the initialisers.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "base/hugepages.hpp"

FASTUDY_HUGEPAGES_AT_PREINIT();

namespace {
struct Initialiser {
  Initialiser() {
    const char* t = std::getenv("GLIBC_TUNABLES");
    const std::string line = std::string("initialiser ran with tunables=") + (t ? t : "") + "\n";
    if (::write(1, line.data(), line.size()) < 0) std::abort();  // unbuffered: survives an exec
  }
} initialiser;
}  // namespace

int main() {
  const char* t = std::getenv("GLIBC_TUNABLES");
  std::vector<char> buffer(std::size_t{64} << 20);
  std::memset(buffer.data(), 1, buffer.size());
  long huge_kb = -1;
  std::ifstream in("/proc/self/smaps_rollup");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("AnonHugePages:", 0) == 0) huge_kb = std::strtol(line.c_str() + 14, nullptr, 10);
  const char* mark = std::getenv("HUGEPAGES_PROBE_MARK");  // the rest of the environment survives
  std::printf("tunables=%s\nanon_huge_kb=%ld\nchecksum=%d\nmark=%s\n", t ? t : "", huge_kb, buffer[buffer.size() / 2],
              mark ? mark : "");
  return 0;
}
