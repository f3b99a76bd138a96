#include "base/hugepages.hpp"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fastudy {

namespace {

constexpr const char* kTunable = "glibc.malloc.hugetlb";

// Whether the kernel's THP mode (the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled)
// is "madvise". Plain system calls: this may run before the C++ runtime is initialised.
bool thp_mode_is_madvise() {
  const int fd = ::open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char line[256] = {};
  const ssize_t got = ::read(fd, line, sizeof line - 1);
  ::close(fd);
  if (got <= 0) return false;
  return std::strstr(line, "[madvise]") != nullptr;
}

// The value of NAME in `envp` ("NAME=value" entries), or nullptr.
const char* find_env(char** envp, const char* name) {
  const std::size_t len = std::strlen(name);
  for (char** e = envp; e && *e; ++e)
    if (std::strncmp(*e, name, len) == 0 && (*e)[len] == '=') return *e + len + 1;
  return nullptr;
}

}  // namespace

// Executes `program` with GLIBC_TUNABLES extended in a copy of `envp` (the process's own environment
// is not touched: in the .preinit_array, getenv/setenv do not see it yet). Returns when nothing is
// to be done or execve failed.
void exec_with_hugepages(const char* program, char** argv, char** envp) {
  const char* opt = find_env(envp, "FASTUDY_HUGEPAGES");
  if (opt && std::strcmp(opt, "0") == 0) return;
  const char* current = find_env(envp, "GLIBC_TUNABLES");
  if (current && std::strstr(current, kTunable)) return;  // set already (by us or the user)
  if (!thp_mode_is_madvise()) return;
  // "GLIBC_TUNABLES=<current>:glibc.malloc.hugetlb=1"
  static char entry[4096];
  const std::size_t have = current ? std::strlen(current) : 0;
  if (have + std::strlen(kTunable) + 32 > sizeof entry) return;
  std::strcpy(entry, "GLIBC_TUNABLES=");
  if (current && *current) {
    std::strcat(entry, current);
    std::strcat(entry, ":");
  }
  std::strcat(entry, kTunable);
  std::strcat(entry, "=1");
  std::size_t count = 0;
  while (envp && envp[count]) ++count;
  char** env = static_cast<char**>(std::calloc(count + 2, sizeof(char*)));
  if (!env) return;
  std::size_t k = 0;
  for (std::size_t i = 0; i < count; ++i)
    if (std::strncmp(envp[i], "GLIBC_TUNABLES=", 15) != 0) env[k++] = envp[i];
  env[k++] = entry;
  env[k] = nullptr;
  ::execve(program, argv, env);
  std::free(env);  // execve returned: it failed; run on with 4 KiB pages
}

void exec_beside(const char* name, char** argv, char** envp, char* path) {
  path[0] = '\0';
  const ssize_t len = ::readlink("/proc/self/exe", path, PATH_MAX - 1);
  if (len <= 0) return;
  path[len] = '\0';
  char* slash = std::strrchr(path, '/');
  if (!slash || static_cast<std::size_t>(slash - path) + 1 + std::strlen(name) + 1 > PATH_MAX) {
    errno = ENAMETOOLONG;
    return;
  }
  std::strcpy(slash + 1, name);
  exec_with_hugepages(path, argv, envp);  // returns only without huge pages (or on failure)
  ::execve(path, argv, envp);
}

int exec_beside_or_fail(const char* name, char** argv, char** envp) {
  char path[PATH_MAX];
  exec_beside(name, argv, envp, path);
  std::fprintf(stderr, "error: fastudy cannot start %s: %s\n  hint: build or install %s beside fastudy\n",
               path[0] ? path : name, std::strerror(errno), name);
  return 127;
}

namespace detail {
void hugepages_at_preinit(int, char** argv, char** envp) { exec_with_hugepages("/proc/self/exe", argv, envp); }
}  // namespace detail

}  // namespace fastudy
