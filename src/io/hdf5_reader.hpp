// HDF5 files other programs wrote, parsed in a process of their own. libhdf5 (1.10) trusts the
// metadata of the files it opens: fuzzing found a crafted file whose group's symbol table sends
// H5Literate into a memcpy from a null pointer (H5F__accum_read), and such bugs are libhdf5's, not
// fixable here. So a program that reads untrusted HDF5 files (fastudy with an [import] of .h5 files or a
// microbenchmark input file) starts a reader process first: a child forked while the program is still
// one thread and before MPI starts, which opens each file, walks it and reads its tensors as
// io::TensorFile would in-process, and answers over a socket. A crash of libhdf5 then ends the reader,
// not the program: the file being read is named in a UsageError (exit 2), as any bad input. So is a
// reader that does not answer within kReaderSeconds (a file crafted to make libhdf5 loop). The reader
// ends when the program closes its socket or dies (PR_SET_PDEATHSIG).
//
//   int main(...) { if (reads_untrusted_hdf5) io::start_hdf5_reader(); ... MPI_Init ... }
//   io::TensorFile::open("run/model.h5");  // then parsed in the reader
//
// Without a started reader (tests of the readers themselves), HDF5 files are read in-process. After a
// crash, a program without MPI starts a new reader for the files it opens next; an MPI process does not
// fork once MPI runs (a fork of a process with RDMA-registered memory is unsafe): its reader stays
// down and every later HDF5 file it opens is refused, naming the file the reader crashed on.
#pragma once

#include <memory>
#include <string>

#include "src/io/tensor_file.hpp"

namespace fastudy::io {

// The seconds one request (a file's walk, or the read of a range) may take before the reader is killed.
inline constexpr int kReaderSeconds = 600;

// Forks the reader. Call before MPI starts and before the program starts threads. Throws Error when
// the socket or the process cannot be made. `in_reader` runs first in the reader process (a fuzz
// harness takes its own crash handling out of it there: a crash of libhdf5 is no finding).
void start_hdf5_reader(void (*in_reader)() = nullptr);
bool hdf5_reader_started();

// `path` opened, walked and read in the reader (TensorFile::open does this for .h5/.hdf5 files when a
// reader was started). Throws UsageError naming the file (and the tensor) for anything the in-process
// reader refuses, and for a crash or a hang of libhdf5.
std::unique_ptr<TensorSource> open_hdf5_in_reader(const std::string& path);

}  // namespace fastudy::io
