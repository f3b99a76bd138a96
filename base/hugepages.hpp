// Transparent huge pages for the process's heap.
//
// fastudy's big buffers (checkpoint arrays, the sorted weight arrays of reduce, LibTorch's tensors)
// are fresh allocations that the kernel backs page by page: on the machines this was measured on
// (virtual machines, 4 KiB pages) every first touch of a page costs microseconds, and that was half
// of reduce's time and of a demo training step's. glibc backs malloc with transparent huge pages when
// the tunable glibc.malloc.hugetlb=1 is set (it madvises its heap and mmapped chunks, for kernels
// whose THP mode is "madvise", the usual default). Tunables are read when the process starts, so
// the process re-executes itself once with the tunable added to GLIBC_TUNABLES (same pid, same
// arguments and environment otherwise; before MPI or any thread starts).
//
// Nothing happens when FASTUDY_HUGEPAGES=0, when the tunable is already set, when the kernel has no
// THP or has it "always"/"never", or when /proc/self/exe cannot be executed (the process then runs on
// with 4 KiB pages). Results do not change: only how memory is backed.
#pragma once

namespace fastudy {

// Call first thing in main(); returns only when no re-execution happened.
void use_transparent_hugepages(char** argv);

}  // namespace fastudy
