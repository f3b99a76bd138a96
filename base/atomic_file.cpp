#include "base/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "base/error.hpp"

namespace fs = std::filesystem;

namespace fastudy {

std::string temporary_path(const std::string& path) {
  static std::atomic<unsigned long> counter{0};
  std::ostringstream s;
  s << path << ".tmp." << std::hex << ::getpid() << '-' << counter.fetch_add(1);
  return s.str();
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open '" + path + "' to fsync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error("fsync of '" + path + "' failed: " + std::strerror(err));
}

void commit_file(const std::string& tmp, const std::string& path, bool durable) {
  std::error_code ec;
  try {
    if (durable) fsync_path(tmp);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw Error("cannot rename " + tmp + " to " + path + ": " + why, "check that the directory is writable");
  }
  if (durable) {
    const fs::path dir = fs::path(path).parent_path();
    fsync_path(dir.empty() ? "." : dir.string());
  }
}

std::string write_temporary(const std::string& path, const std::function<void(const std::string& tmp)>& write) {
  const std::string tmp = temporary_path(path);
  try {
    write(tmp);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  return tmp;
}

void atomic_write_with(const std::string& path, const std::function<void(const std::string& tmp)>& write,
                       bool durable) {
  commit_file(write_temporary(path, write), path, durable);
}

void atomic_write(const std::string& path, std::string_view bytes, bool durable) {
  atomic_write_with(
      path,
      [&](const std::string& tmp) {
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
          throw Error("cannot create " + tmp + ": " + std::strerror(errno),
                      "check that the directory exists and is writable");
        std::size_t done = 0;
        int err = 0;
        while (done < bytes.size() && err == 0) {
          const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
          if (n > 0) done += static_cast<std::size_t>(n);
          else if (n < 0 && errno != EINTR) err = errno;
        }
        // A full disk can fail only at close (NFS): never rename a short file.
        if (::close(fd) != 0 && err == 0) err = errno;
        if (err != 0)
          throw Error("cannot write " + path + ": " + std::strerror(err) + file_system_note(path),
                      "free space on that file system (or choose another --out) and run again");
      },
      durable);
}

std::string file_system_note(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec).parent_path();
  struct stat here {};
  if (ec || ::stat(p.c_str(), &here) != 0) return "";
  // The mount point: the highest ancestor on the same device.
  while (p.has_parent_path() && p.parent_path() != p) {
    struct stat up {};
    if (::stat(p.parent_path().c_str(), &up) != 0 || up.st_dev != here.st_dev) break;
    p = p.parent_path();
  }
  struct statvfs vfs {};
  if (::statvfs(p.c_str(), &vfs) != 0) return "";
  const double free = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize);
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = free;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(u == 0 ? 0 : 1);
  os << " (the file system mounted at " << p.string() << " has " << v << " " << units[u] << " free)";
  return os.str();
}

}  // namespace fastudy
