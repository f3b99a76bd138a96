// Regular files opened without blocking and read with bounds (read_file.hpp).
#include "base/read_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace fastudy {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device (such as /dev/null or /dev/zero)";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::optional<RegularFile> RegularFile::open(const std::string& path, std::string* problem) {
  // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer (and has no
  // effect on the reads of a regular file); O_NOCTTY: a terminal never becomes ours.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    *problem = std::string("cannot be opened: ") + std::strerror(errno);
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *problem = std::string("cannot be examined: ") + std::strerror(errno);
    ::close(fd);
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    *problem = std::string("is ") + kind_of(st.st_mode) + ", not a regular file";
    ::close(fd);
    return std::nullopt;
  }
  return RegularFile(fd, static_cast<std::uint64_t>(st.st_size));
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

RegularFile::RegularFile(RegularFile&& o) noexcept : fd_(std::exchange(o.fd_, -1)), size_(o.size_) {}

RegularFile& RegularFile::operator=(RegularFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = o.size_;
  }
  return *this;
}

long long RegularFile::read_at(void* buf, std::size_t n, std::uint64_t offset) const {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t k = ::pread(fd_, static_cast<char*>(buf) + got, n - got, static_cast<off_t>(offset + got));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -1;
    if (k == 0) break;
    got += static_cast<std::size_t>(k);
  }
  return static_cast<long long>(got);
}

std::optional<std::string> read_regular_file(const std::string& path, std::size_t max_bytes, std::string* problem) {
  const std::optional<RegularFile> f = RegularFile::open(path, problem);
  if (!f) return std::nullopt;
  if (f->size() > max_bytes) {
    *problem = "is " + std::to_string(f->size()) + " bytes, more than the " + std::to_string(max_bytes) + " it may have";
    return std::nullopt;
  }
  // Read to the end, at most max_bytes + 1 bytes: a file that grows while it is read is refused too.
  std::string bytes(static_cast<std::size_t>(f->size()) + 1, '\0');
  std::size_t got = 0;
  for (;;) {
    if (got == bytes.size()) bytes.resize(std::min(max_bytes + 1, 2 * bytes.size()));
    if (got == bytes.size()) break;
    const long long n = f->read_at(bytes.data() + got, bytes.size() - got, got);
    if (n < 0) {
      *problem = std::string("cannot be read: ") + std::strerror(errno);
      return std::nullopt;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > max_bytes) {
    *problem = "grew past the " + std::to_string(max_bytes) + " bytes it may have while it was read";
    return std::nullopt;
  }
  bytes.resize(got);
  return bytes;
}

}  // namespace fastudy
