// Probe for base/hugepages: calls use_transparent_hugepages() first thing (as fastudy's main does),
// then prints the GLIBC_TUNABLES it runs with and how much of 64 MiB of freshly touched heap the
// kernel backs with huge pages (AnonHugePages of /proc/self/smaps_rollup, kB).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "base/hugepages.hpp"

int main(int, char** argv) {
  fastudy::use_transparent_hugepages(argv);
  const char* t = std::getenv("GLIBC_TUNABLES");
  std::vector<char> buffer(std::size_t{64} << 20);
  std::memset(buffer.data(), 1, buffer.size());
  long huge_kb = -1;
  std::ifstream in("/proc/self/smaps_rollup");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("AnonHugePages:", 0) == 0) huge_kb = std::strtol(line.c_str() + 14, nullptr, 10);
  std::printf("tunables=%s\nanon_huge_kb=%ld\nchecksum=%d\n", t ? t : "", huge_kb, buffer[buffer.size() / 2]);
  return 0;
}
