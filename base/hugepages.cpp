#include "base/hugepages.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

extern char** environ;

namespace fastudy {

namespace {

constexpr const char* kTunable = "glibc.malloc.hugetlb";

// The kernel's THP mode: the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled.
std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return {};
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return {};
  return line.substr(open + 1, close - open - 1);
}

}  // namespace

void use_transparent_hugepages(char** argv) {
  const char* opt = std::getenv("FASTUDY_HUGEPAGES");
  if (opt && std::string(opt) == "0") return;
  const char* current = std::getenv("GLIBC_TUNABLES");
  const std::string tunables = current ? current : "";
  if (tunables.find(kTunable) != std::string::npos) return;  // set already (by us or the user)
  if (thp_mode() != "madvise") return;
  const std::string value = (tunables.empty() ? "" : tunables + ":") + kTunable + "=1";
  if (::setenv("GLIBC_TUNABLES", value.c_str(), 1) != 0) return;
  ::execve("/proc/self/exe", argv, environ);
  // execve returned: it failed; run on without (and do not leave the variable to children).
  if (current) ::setenv("GLIBC_TUNABLES", current, 1);
  else ::unsetenv("GLIBC_TUNABLES");
}

}  // namespace fastudy
