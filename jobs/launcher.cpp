// `fastudy`: the command users run. It starts the program (fastudy-main, beside it) with the
// environment it needs before any library is loaded, and nothing else: today that is glibc's
// transparent-huge-page tunable (base/hugepages.hpp). Setting it here rather than re-executing the
// program itself saves a second load of LibTorch and its relocations (about 0.45 s of every start,
// measured on the development machine). Plain C library only; the same pid (execve), arguments and
// environment otherwise, so mpirun, srun and signals see no difference.
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/hugepages.hpp"

extern char** environ;

int main(int, char** argv) {
  char self[PATH_MAX];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    std::fprintf(stderr, "error: fastudy cannot find its own path (/proc/self/exe): %s\n", std::strerror(errno));
    return 127;
  }
  self[len] = '\0';
  char* slash = std::strrchr(self, '/');
  const char* name = "fastudy-main";
  if (!slash || static_cast<std::size_t>(slash - self) + 1 + std::strlen(name) + 1 > sizeof self) return 127;
  std::strcpy(slash + 1, name);
  fastudy::exec_with_hugepages(self, argv, environ);  // returns only without huge pages (or on failure)
  ::execve(self, argv, environ);
  std::fprintf(stderr, "error: fastudy cannot start %s: %s\n  hint: build or install fastudy-main beside fastudy\n",
               self, std::strerror(errno));
  return 127;
}
