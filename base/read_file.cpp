// Whole reads of regular files with a size limit (read_file.hpp).
#include "base/read_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

// Closes the descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::optional<std::string> read_regular_file(const std::string& path, std::size_t max_bytes, std::string* problem) {
  const Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (f.fd < 0) {
    *problem = std::string("cannot be opened: ") + std::strerror(errno);
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    *problem = std::string("cannot be examined: ") + std::strerror(errno);
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    *problem = std::string("is ") + kind_of(st.st_mode) + ", not a regular file";
    return std::nullopt;
  }
  if (static_cast<std::size_t>(st.st_size) > max_bytes) {
    *problem = "is " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) + " it may have";
    return std::nullopt;
  }
  // Read to the end, at most max_bytes + 1 bytes: a file that grows while it is read is refused too.
  std::string bytes(static_cast<std::size_t>(st.st_size) + 1, '\0');
  std::size_t got = 0;
  for (;;) {
    if (got == bytes.size()) bytes.resize(std::min(max_bytes + 1, 2 * bytes.size()));
    if (got == bytes.size()) break;
    const ssize_t n = ::read(f.fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
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
