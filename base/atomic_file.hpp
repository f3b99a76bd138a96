// Files that readers see whole or not at all: the content goes to a temporary file beside the target
// ("<path>.tmp.<pid>-<n>", never taken for a result), is flushed (and fsync'ed when asked), and is then
// renamed over the target. On any failure the temporary file is removed and an Error names the target.
//
//   atomic_write("out/ranking.csv", text);                            // bytes in memory
//   atomic_write_with("out/deviation.h5", [&](const std::string& tmp) {  // a writer that needs a path
//     h5::File f = h5::File::create(tmp, nullptr); ...; f.close();
//   });
// Collective writers (every rank writes one file, one rank renames it) use the two halves:
// temporary_path() for the shared name, commit_file() on the renaming rank.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace fastudy {

// A fresh temporary name beside `path`, unique in this process and across processes.
std::string temporary_path(const std::string& path);

// Renames the finished `tmp` over `path`; with `durable`, fsyncs the file before and its directory
// after the rename. Removes `tmp` and throws an Error naming both when that fails.
void commit_file(const std::string& tmp, const std::string& path, bool durable = false);

// Runs write(tmp) on a fresh temporary_path(path) and returns tmp; removes tmp and rethrows when
// write throws. The caller commits it (commit_file, or a sealed commit).
std::string write_temporary(const std::string& path, const std::function<void(const std::string& tmp)>& write);

void atomic_write(const std::string& path, std::string_view bytes, bool durable = false);
void atomic_write_with(const std::string& path, const std::function<void(const std::string& tmp)>& write,
                       bool durable = false);

// " (the file system mounted at /scratch has 12.0 KiB free)" for the file system that holds `path`'s
// folder, for the messages of failed writes ("" when it cannot be told).
std::string file_system_note(const std::string& path);

// fsync(2) of a file or directory; throws an Error naming it.
void fsync_path(const std::string& path);

}  // namespace fastudy
