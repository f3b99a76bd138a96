#include "jobs/study_lock.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <fstream>
#include <sstream>

#include "base/atomic_file.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "base/quote.hpp"
#include "base/proc.hpp"
#include "base/read_file.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"

namespace fs = std::filesystem;

namespace fastudy {

namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

std::string start_time_of(long pid) { return proc_stat_field(pid, 22); }

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

LockHolder parse_record(const std::string& text) {
  LockHolder h;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "host") h.host = v;
    else if (k == "pid") h.pid = v;
    else if (k == "start") h.start = v;
    else if (k == "since") h.since = v;
    else if (k == "command") h.command = v;
  }
  return h;
}

// The lock's record; nullopt when it is no regular file of at most 64 KiB (a FIFO in its place is not
// waited for: it reads as unreadable).
std::optional<std::string> read_file(const std::string& path) {
  std::string problem;
  return read_regular_file(path, std::size_t{64} << 10, &problem);
}

// The holder's process is gone for sure: same host and no such pid, or a pid started at another time.
bool holder_is_gone(const LockHolder& h, const std::string& my_host) {
  if (h.host != my_host || h.pid.empty()) return false;
  long pid = 0;
  try {
    pid = std::stol(h.pid);
  } catch (const std::exception&) {
    return false;
  }
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  const std::string state = proc_stat_field(pid, 3);
  if (state == "Z" || state == "X") return true;  // ended; only its exit status waits for its parent
  const std::string now = start_time_of(pid);
  return !h.start.empty() && !now.empty() && now != h.start;
}

// Creates `lock` holding `record` atomically; false when it already exists.
bool create_lock(const std::string& lock, const std::string& record) {
  const std::string tmp = temporary_path(lock);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot create " + tmp + ": " + std::strerror(errno), "check that the output directory is writable");
    out << record;
    out.flush();
    if (!out) {
      const int err = errno;
      std::error_code ec;
      fs::remove(tmp, ec);
      throw Error("cannot write the lock " + lock + ": " + std::strerror(err) + file_system_note(lock),
                  "free space on that file system (or choose another --out) and run again");
    }
  }
  const int rc = ::link(tmp.c_str(), lock.c_str());
  const int err = errno;
  ::unlink(tmp.c_str());
  if (rc == 0) return true;
  if (err == EEXIST) return false;
  // A file system without hard links: exclusive creation instead.
  const int fd = ::open(lock.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    if (errno == EEXIST) return false;
    throw Error("cannot create the lock " + lock + ": " + std::strerror(errno), "check that the output directory is writable");
  }
  const ssize_t n = ::write(fd, record.data(), record.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(record.size())) {
    ::unlink(lock.c_str());
    throw Error("cannot write the lock " + lock, "free space on the file system and run again");
  }
  return true;
}

// The command that removes `path` (a directory needs rm -r).
std::string remove_command(const std::string& path, const struct stat& st) {
  return std::string(S_ISDIR(st.st_mode) ? "rm -r " : "rm ") + shell_quote(path);
}

}  // namespace

bool study_lock_held(const std::string& out_dir) {
  const std::string lock = (fs::path(out_dir) / kLockName).string();
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(lock, ec))) return false;
  const std::optional<std::string> text = read_file(lock);
  return !text || !holder_is_gone(parse_record(*text), host_name());
}

bool LockHolder::complete() const {
  return !host.empty() && !pid.empty() && pid.find_first_not_of("0123456789") == std::string::npos && pid[0] != '0';
}

std::string LockHolder::describe() const {
  return "pid " + (pid.empty() ? std::string("?") : pid) + " on host " + (host.empty() ? std::string("?") : host) +
         " (" + (command.empty() ? std::string("command unknown") : command) + "), since " +
         (since.empty() ? std::string("an unknown time") : since);
}

StudyLock StudyLock::acquire(const std::string& out_dir, const std::string& command) {
  const fs::path out(out_dir);
  std::error_code ec;
  StudyLock lock;
  if (!fs::exists(out, ec)) {
    fs::create_directories(out, ec);
    if (ec) throw Error("cannot create output directory " + out.string() + ": " + ec.message(),
                        "check the path and permissions, or pass --out DIR");
    lock.created_dir_ = out.string();
  } else if (fs::is_directory(out, ec) && !fs::exists(out / "study.toml", ec) &&
             !fs::exists(fs::symlink_status(out / kLockName, ec)) && !fs::is_empty(out, ec)) {
    return lock;  // not a study: prepare_output refuses it, and nothing is written into it
  } else if (!fs::is_directory(out, ec)) {
    return lock;  // prepare_output names the problem
  }
  const std::string path = (out / kLockName).string();
  const std::string host = host_name();
  const long pid = static_cast<long>(::getpid());
  std::ostringstream rec;
  rec << "host=" << host << "\npid=" << pid << "\nstart=" << start_time_of(pid) << "\nsince=" << utc_now()
      << "\ncommand=" << one_line(command) << "\n";
  lock.record_ = rec.str();

  for (int attempt = 0; attempt < 3; ++attempt) {
    if (create_lock(path, lock.record_)) {
      lock.path_ = path;
      set_lock_to_release(path);
      return lock;
    }
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;  // released meanwhile: try again
    if (!S_ISREG(st.st_mode)) {
      lock.release();
      throw UsageError("the lock " + path + " is " + (S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file") +
                           ", so fastudy did not write it and cannot tell who holds the study",
                       "if no fastudy job writes " + out.string() + ", remove it (" + remove_command(path, st) +
                           ") and run again");
    }
    const auto text = read_file(path);
    if (!text) continue;  // released meanwhile: try again
    const LockHolder holder = parse_record(*text);
    if (!holder.complete()) {
      lock.release();
      throw UsageError(
          "the lock " + path + " is unreadable (" +
              (text->empty() ? std::string("empty") : "not a record of host, pid and command") +
              "), so fastudy cannot tell whether a job still writes the study",
          "if no fastudy job writes " + out.string() + ", remove it (" + remove_command(path, st) + ") and run again");
    }
    if (!holder_is_gone(holder, host)) {
      lock.release();
      if (holder.host != host && !holder.host.empty())
        throw UsageError("study " + out.string() + " is locked by another writer: " + holder.describe(),
                         "one job at a time writes a study; if no fastudy job of this study runs on " + holder.host +
                             " any more, remove " + path + " and run again");
      throw UsageError("study " + out.string() + " is being written by another fastudy job: " + holder.describe(),
                       "wait for it to finish (or stop it: kill " + holder.pid + "), or pass another --out");
    }
    // Stale: move it aside under a name of our own, and check that what moved is what we judged.
    const std::string aside = temporary_path(path + ".stale");
    if (::rename(path.c_str(), aside.c_str()) != 0) continue;
    const auto moved = read_file(aside);
    if (moved && *moved == *text) {
      ::unlink(aside.c_str());
      log::warn("taking over the lock of " + out.string() + " left by a job that is gone: " + holder.describe());
      continue;
    }
    // Another writer took the lock between our look and the rename: put its lock back, and refuse.
    if (::link(aside.c_str(), path.c_str()) == 0) ::unlink(aside.c_str());
    lock.release();
    throw UsageError("study " + out.string() + " is being written by another fastudy job (it took the lock just now)",
                     "wait for it to finish, or pass another --out");
  }
  lock.release();
  throw Error("cannot take the lock " + path + " (it changed three times while fastudy looked)", "run again");
}

StudyLock::StudyLock(StudyLock&& o) noexcept
    : path_(std::move(o.path_)), record_(std::move(o.record_)), created_dir_(std::move(o.created_dir_)) {
  o.path_.clear();
  o.created_dir_.clear();
}

StudyLock& StudyLock::operator=(StudyLock&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    record_ = std::move(o.record_);
    created_dir_ = std::move(o.created_dir_);
    o.path_.clear();
    o.created_dir_.clear();
  }
  return *this;
}

StudyLock::~StudyLock() { release(); }

void StudyLock::release() {
  std::error_code ec;
  if (!path_.empty()) {
    const auto text = read_file(path_);
    if (text && *text == record_) ::unlink(path_.c_str());
    set_lock_to_release("");
    path_.clear();
  }
  if (!created_dir_.empty()) {
    if (fs::is_directory(created_dir_, ec) && fs::is_empty(created_dir_, ec)) fs::remove(created_dir_, ec);
    created_dir_.clear();
  }
}

}  // namespace fastudy
