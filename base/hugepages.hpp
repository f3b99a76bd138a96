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
// Loading LibTorch (mapping and relocating it, then its static initialisers) takes about 0.45 s, and
// a re-execution pays it twice, so the `fastudy` command is a small launcher without LibTorch that
// sets the tunable and executes the program, fastudy-main (jobs/launcher.cpp). fastudy-main started
// directly re-executes itself as early as it can: FASTUDY_HUGEPAGES_AT_PREINIT() in its main file
// registers the call in the ELF .preinit_array, which the dynamic loader runs before any shared
// library's initialisers; the call therefore uses only the C library, not the C++ runtime.
//
// Nothing happens when FASTUDY_HUGEPAGES=0, when the tunable is already set, when the kernel has no
// THP or has it "always"/"never", or when /proc/self/exe cannot be executed (the process then runs on
// with 4 KiB pages). Results do not change: only how memory is backed.
#pragma once

namespace fastudy {

// Executes `program` (argv, a copy of envp with the tunable added) when huge pages apply; returns when
// they do not (FASTUDY_HUGEPAGES=0, tunable set already, THP mode not madvise) or execve failed. The
// `fastudy` launcher (jobs/launcher.cpp) starts fastudy-main this way, before LibTorch is loaded at all.
// Uses only the C library: safe before the C++ runtime is initialised.
void exec_with_hugepages(const char* program, char** argv, char** envp);

// Executes the program `name` in this executable's folder (/proc/self/exe's) with argv and envp,
// through exec_with_hugepages first. Returns only on failure, with errno set and `path` (PATH_MAX
// bytes) holding the program's path, or empty when this executable's own path is unknown.
void exec_beside(const char* name, char** argv, char** envp, char* path);
// exec_beside, and where it returns: the error (the program's path and errno) on stderr with a hint
// to install it beside this one; returns 127, the shell's "command not found" status.
int exec_beside_or_fail(const char* name, char** argv, char** envp);

namespace detail {
void hugepages_at_preinit(int argc, char** argv, char** envp);
}  // namespace detail

}  // namespace fastudy

// In the executable's main file, at namespace scope: re-executes the program itself
// (exec_with_hugepages of /proc/self/exe) from the ELF .preinit_array, before every library's
// initialisers (only an executable may have one).
#define FASTUDY_HUGEPAGES_AT_PREINIT()                                                            \
  __attribute__((section(".preinit_array"), used)) static void (*fastudy_hugepages_preinit_)( \
      int, char**, char**) = &fastudy::detail::hugepages_at_preinit
