// `fastudy`: the command users run. It starts the program beside it with the environment it needs
// before any library is loaded, and nothing else: today that is glibc's transparent-huge-page
// tunable (base/hugepages.hpp). Setting it here rather than re-executing the program itself saves a
// second load of LibTorch and its relocations (about 0.45 s of every start, measured on the
// development machine). The program is fastudy-lite, which runs the jobs that never train (reduce,
// report, status, slurm) without loading LibTorch at all and hands every other command line to
// fastudy-main (jobs/main.cpp); fastudy-main directly where fastudy-lite is missing. Plain C library
// only; the same pid (execve), arguments and environment otherwise, so mpirun, srun and signals see
// no difference.
#include <limits.h>

#include "base/hugepages.hpp"

extern char** environ;

int main(int, char** argv) {
  char path[PATH_MAX];
  fastudy::exec_beside("fastudy-lite", argv, environ, path);  // which hands other jobs to fastudy-main
  return fastudy::exec_beside_or_fail("fastudy-main", argv, environ);  // an installation without fastudy-lite
}
