// Opening and reading files fastudy did not choose (a grid, an imported checkpoint, a checksum
// sidecar, a study's own files that someone may have replaced), safely: only a regular file is read,
// its kind and size come from fstat of the descriptor that was opened without blocking, and reads are
// bounded, so a FIFO, a device (/dev/zero, /dev/null), a directory or a huge file is a named problem
// instead of a hang or an exhausted memory.
//
//   std::string problem;
//   std::optional<std::string> text = read_regular_file("grid.toml", 4 << 20, &problem);
//   std::optional<RegularFile> f = RegularFile::open("model.safetensors", &problem);  // then f->fd(), f->size()
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace fastudy {

// A regular file open for reading (a symbolic link is followed). The open never blocks (O_NONBLOCK: a
// FIFO with no writer is refused, not waited for), and what was opened is examined with fstat, so a
// file swapped for a FIFO or a device between a check and the open is refused too. Move-only; closed
// on destruction.
class RegularFile {
 public:
  // nullopt when `path` cannot be opened or is not a regular file; *problem then says why, without
  // the path ("is a FIFO (named pipe), not a regular file", "cannot be opened: No such file or directory").
  static std::optional<RegularFile> open(const std::string& path, std::string* problem);
  ~RegularFile();
  RegularFile(RegularFile&& o) noexcept;
  RegularFile& operator=(RegularFile&& o) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }  // at the open (fstat)
  // Reads up to n bytes at `offset` (fewer only at the end of the file); -1 with errno on an error.
  long long read_at(void* buf, std::size_t n, std::uint64_t offset) const;

 private:
  RegularFile(int fd, std::uint64_t size) : fd_(fd), size_(size) {}
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// The bytes of `path` when it is a regular file (RegularFile::open) of at most max_bytes; otherwise
// nullopt and *problem says why, without the path ("is 5.0 GiB, more than the 4.0 MiB a grid file may
// have"). The read stops at max_bytes + 1 bytes, so a file that grows while it is read is refused too.
std::optional<std::string> read_regular_file(const std::string& path, std::size_t max_bytes, std::string* problem);

}  // namespace fastudy
