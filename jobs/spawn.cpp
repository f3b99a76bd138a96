// fastudy-spawn: how fastudy starts a child program (the report's renderer and its module check) so
// that the child dies with fastudy. Plain C library only.
//
//   fastudy-spawn PARENT_PID ERRNO_FD PROGRAM [ARG...]
//
// fastudy starts this program with posix_spawn (jobs/report.cpp): glibc's posix_spawn runs no code
// of fastudy in the child, blocks signals and resets their handlers until the new image runs, and
// copies nothing of a process that may hold a CUDA context, NCCL communicators and MPI's transports.
// This program, a fresh image, then asks the kernel to send it SIGKILL when its parent ends
// (PR_SET_PDEATHSIG, which execve keeps), checks that its parent is still PARENT_PID (a parent gone
// before that call would never send it), and executes PROGRAM with ARGs and its environment. When
// that fails it writes the errno (an int) to ERRNO_FD and exits 127; ERRNO_FD is close-on-exec, so
// a successful execve closes it and fastudy reads end of file.
#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>

extern char** environ;

namespace {

constexpr int kCannotStart = 127;

// A decimal number that fits an int and is >= 0, else -1.
long parse_number(const char* s) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  return errno == 0 && end != s && *end == '\0' && v >= 0 && v <= 0x7fffffff ? v : -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: fastudy-spawn PARENT_PID ERRNO_FD PROGRAM [ARG...] (fastudy starts it)\n");
    return 2;
  }
  const long parent = parse_number(argv[1]), fd = parse_number(argv[2]);
  if (parent <= 0 || fd < 0) {
    std::fprintf(stderr, "fastudy-spawn: PARENT_PID and ERRNO_FD must be numbers (got '%s', '%s')\n", argv[1], argv[2]);
    return 2;
  }
  int err = 0;
  if (::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC) != 0) {
    err = errno;
  } else if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    err = errno;
  } else if (::getppid() != static_cast<pid_t>(parent)) {
    err = ESRCH;  // fastudy ended before the kernel could tie this process to it
  } else {
    ::execve(argv[3], argv + 3, environ);
    err = errno;
  }
  const ssize_t ignored = ::write(static_cast<int>(fd), &err, sizeof err);
  (void)ignored;
  return kCannotStart;
}
