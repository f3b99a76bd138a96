#include "base/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
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
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw Error("cannot create " + tmp, "check that the directory exists and is writable");
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        out.close();  // a full disk can fail only at the last write, on close: never rename a short file
        if (!out) throw Error("writing " + path + " failed (disk full?)", "free space on the file system and run again");
      },
      durable);
}

}  // namespace fastudy
