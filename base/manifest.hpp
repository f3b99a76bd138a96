// OUT/fastudy.manifest: the files fastudy wrote in a study, so that `--force` deletes those and nothing
// else (never a file fastudy did not write, never the study directory itself).
//
// The study's one writer (the holder of OUT/fastudy.lock; rank 0 of an MPI job) adds entries *before*
// it writes what they name, so a job killed at any moment leaves no file of its own unlisted. The file
// is rewritten atomically and sealed (fastudy.manifest.crc, base/checksum.hpp); `--force` refuses a
// study whose manifest is missing or does not match its checksum, rather than guess.
//
//   fastudy-manifest/1
//   file train status.csv
//   checkpoints train checkpoints/flash-bf16
//   dir train variants/flash-bf16
//
// One entry a line: kind, job (the phase that writes it: study, microbench, train, reduce, report,
// slurm), and the path relative to OUT ('/'-separated; bytes below '!', '%' and DEL written %HH; no
// empty, '.' or '..' component, never absolute). What an entry covers:
//   file         the file, its sidecar <path>.crc, and the temporaries of their atomic writes
//                (<path>.tmp.*, <path>.crc.tmp.*)
//   dir          the directory itself (fastudy made it): removed once it is empty
//   checkpoints  a directory of checkpoints: the files in it named step_<7 digits>.h5, their sidecars
//                and temporaries; the directory once it is empty
//   scratch      a directory fastudy made for its own temporary files (the report's staging): all of it
// Removal never follows a symbolic link: a path reached through one, and anything at a listed name
// that is not what fastudy writes there (a symbolic link, a directory where a file was), is kept.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fastudy::manifest {

inline constexpr const char* kName = "fastudy.manifest";
inline constexpr const char* kFormat = "fastudy-manifest/1";

enum class Kind { file, dir, checkpoints, scratch };

struct Entry {
  Kind kind = Kind::file;
  std::string job;   // the phase that writes it
  std::string path;  // relative to OUT
  bool operator<(const Entry& o) const;
  bool operator==(const Entry& o) const;
};

// OUT/fastudy.manifest
std::string path_of(const std::string& out);

// Adds `entries` (those already listed are kept once), before the files they name are written.
// Throws Error for a path that is not a plain relative path inside OUT (nothing is then written). A
// manifest that does not match its checksum is set aside with a warning and a new one begun: what it
// listed is then never deleted by --force, the safe direction.
void add(const std::string& out, const std::vector<Entry>& entries);

// The entries; nullopt when OUT has no manifest. Throws IntegrityError when it does not match its
// checksum, Error when it is not a manifest fastudy wrote (a bad line is named).
std::optional<std::vector<Entry>> read(const std::string& out);

// Whether `entry` covers the file or directory `rel` (relative to OUT) by the rules above.
bool covers(const Entry& entry, const std::string& rel);

struct Removal {
  std::vector<std::string> removed;  // paths relative to OUT, files first, then directories
  std::vector<std::string> kept;     // listed names that held something fastudy does not write there
};
// Deletes what the `chosen` entries name (e.g. those of one job): files, then the directories left
// empty, deepest first; chosen entries whose paths are gone are dropped from the manifest. Never
// follows a symbolic link, never removes OUT. The caller has read() the manifest first (a missing or
// damaged one is its decision to refuse).
Removal remove(const std::string& out, const std::function<bool(const Entry&)>& chosen);

// Files and directories under OUT that no entry covers (the manifest, its sidecar and their
// temporaries excepted), relative, sorted; symbolic links are listed, never followed.
std::vector<std::string> unlisted(const std::string& out, const std::vector<Entry>& entries);

}  // namespace fastudy::manifest
