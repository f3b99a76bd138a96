// One writer per study: OUT/fastudy.lock, held for the whole life of every job that writes the study
// directory (run, microbench, train, reduce, report), with or without --resume/--force.
//
// The lock file is created atomically with link(2) of a finished temporary file (so a reader never
// sees a half-written record; where the file system refuses hard links, open(O_CREAT|O_EXCL) instead)
// and holds the holder's record, one "key=value" a line:
//   host=node17  pid=4242  start=123456 (the process start time, /proc/PID/stat field 22)
//   since=2026-11-23T11:05:00Z  command=fastudy train grid.toml --resume
// A second writer is refused (UsageError, exit 2) with that record. A lock whose holder is gone is
// stale: on the same host (no process PID, a zombie, or one started at another time) it is taken over
// with a warning; on another host fastudy cannot tell, so it refuses and says how to clear it. A lock
// that is no record (empty, garbage) or no regular file (a symbolic link) is refused as unreadable,
// with the command that removes it: fastudy never clears what it cannot read.
//
// Shared file systems (NFS, Lustre, GPFS): link() and O_EXCL creation are atomic on the server for NFS
// v3+ and on Lustre/GPFS, so two writers on different nodes cannot both take the lock. What is not
// guaranteed: there is no lease or heartbeat, so a lock left by a job killed on another node stays
// until it is removed by hand (the error names the file and the holder), and the time in `since` is the
// holder's clock. Under MPI only rank 0 takes the lock; the decision is broadcast (main.cpp).
#pragma once

#include <string>

namespace fastudy {

inline constexpr const char* kLockName = "fastudy.lock";

struct LockHolder {
  std::string host, pid, start, since, command;
  std::string describe() const;  // "pid 4242 on node17 (fastudy train ...), since 2026-..."
  bool complete() const;         // host and a positive pid: a record fastudy wrote
};

// Whether a job may be writing the study in out_dir now: its lock exists and its holder is not known
// to be gone (a holder on another host, or a lock fastudy cannot read, may be alive).
bool study_lock_held(const std::string& out_dir);

class StudyLock {
 public:
  // Takes OUT/fastudy.lock for `command`, creating OUT when it does not exist; throws UsageError
  // naming the holder when another live writer has it. A non-empty OUT that holds no study is left
  // untouched (prepare_output refuses it).
  static StudyLock acquire(const std::string& out_dir, const std::string& command);
  StudyLock() = default;
  StudyLock(StudyLock&& o) noexcept;
  StudyLock& operator=(StudyLock&& o) noexcept;
  StudyLock(const StudyLock&) = delete;
  StudyLock& operator=(const StudyLock&) = delete;
  ~StudyLock();
  // Removes the lock file if it is still this process's (and OUT when this lock created it and it is
  // empty again: a job refused before writing leaves nothing behind).
  void release();
  const std::string& path() const { return path_; }

 private:
  std::string path_, record_, created_dir_;
};

}  // namespace fastudy
