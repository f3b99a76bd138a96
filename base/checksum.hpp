// Verify before you parse: every file fastudy reads back (checkpoints, deviation.h5, microbench.h5,
// status.csv, study.toml) gets a checksum sidecar "<path>.crc" when it is committed, and is checked
// against it with plain reads before HDF5, the TOML parser or the CSV reader sees a byte of it. A
// flipped byte anywhere in the file (data, attributes, HDF5 metadata) or in the sidecar is then a
// named error, never a crash or hang inside a library, nor a silently different result.
//
// Sidecar (ASCII):  fastudy-crc32/1 <size in bytes> <crc32, 8 lowercase hex digits>
// (zlib CRC-32 of the whole file), and a second such line for the version the file replaced. The
// sidecar is written (atomically) before the new version is renamed into place, so a crash at any
// moment leaves a file that matches one of its lines; a file without a sidecar (written by something
// else, or its sidecar lost) reads as damaged — the caller falls back (an older checkpoint, a rerun),
// it never trusts the file.
//
//   commit_sealed(tmp, "out/checkpoints/v/step_0000010.h5", true);   // rename + sidecar
//   atomic_write_sealed("out/status.csv", text);                      // whole text file + sidecar
//   verify_sealed("out/status.csv", "delete it and rerun with --resume");  // throws IntegrityError
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"

namespace fastudy {

inline constexpr const char* kChecksumSuffix = ".crc";
inline constexpr const char* kChecksumFormat = "fastudy-crc32/1";

// A file that does not match its checksum sidecar (or has none). what() names the file and the
// problem; hint() says what to do.
class IntegrityError : public Error {
 public:
  IntegrityError(std::string file, const std::string& problem, std::string hint);
  const std::string& file() const { return file_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string file_, problem_;
};

// "<path>.crc"
std::string checksum_path(const std::string& path);

// zlib's CRC-32 (crc32() of zlib, Python's zlib.crc32) of p[0, n), continuing from `crc` (0 starts
// one), for any length (zlib takes lengths below 4 GiB; longer buffers go in pieces).
std::uint32_t crc32_update(std::uint32_t crc, const void* p, std::size_t n);
// The CRC-32 of A followed by B from crc(A), crc(B) and B's length (zlib's crc32_combine; named apart from
// zlib's macro of that name).
std::uint32_t crc32_join(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t length_b);

struct FileSum {
  std::uint64_t size = 0;
  std::uint32_t crc = 0;
};
// Size and CRC-32 of a whole file, by plain reads. Throws Error naming the file on an I/O error.
FileSum file_sum(const std::string& path);

// Bytes [offset, offset + size) of a file whose CRC-32 the caller already knows (it wrote them).
struct KnownRange {
  std::uint64_t offset = 0, size = 0;
  std::uint32_t crc = 0;
};
// The file_sum of `path` without reading the `known` ranges back: every other byte is read with plain
// reads and the known ranges' CRCs are spliced in (crc32_join). Equal to file_sum(path) exactly
// when the known ranges hold the bytes their CRCs describe; when they do not (the write went wrong),
// the sum describes the intended bytes and the file reads as damaged. Ranges may come in any order but
// must not overlap (an Error otherwise); a range reaching past the end of the file is read instead.
FileSum file_sum_known(const std::string& path, std::vector<KnownRange> known);
std::string format_checksum(const FileSum& sum);  // the sidecar's line, newline included

// Writes the sidecar of `path` (already in its final place) atomically: for a file sealed after the
// fact (tests, tools); writers use commit_sealed / atomic_write_sealed.
void write_checksum(const std::string& path, bool durable = false);
// Removes the sidecar of `path` (no error when there is none).
void remove_checksum(const std::string& path);
// Moves `path`, whatever it is (a damaged file, a directory someone put in its place), and its sidecar
// to the first free name "<path>.set-aside-<n>" (and "<path>.set-aside-<n>.crc"); returns that name.
// Nothing is deleted: what took a file's place may not be fastudy's. Throws Error when it cannot move.
std::string set_aside(const std::string& path);

// The sidecar of the finished `tmp`, then commit_file(tmp, path, durable).
void commit_sealed(const std::string& tmp, const std::string& path, bool durable = false);
// The same with the sum of `tmp` given (file_sum_known of it): no whole-file read.
void commit_sealed(const std::string& tmp, const std::string& path, const FileSum& sum, bool durable);
// atomic_write / atomic_write_with (base/atomic_file.hpp) with the sidecar.
void atomic_write_sealed(const std::string& path, std::string_view bytes, bool durable = false);
void atomic_write_sealed_with(const std::string& path, const std::function<void(const std::string& tmp)>& write,
                              bool durable = false);

// nullopt when `path` exists and matches its sidecar; otherwise the problem ("no such file",
// "no checksum file ...", "size ... differs", "checksum mismatch ...", "the checksum file is damaged").
std::optional<std::string> checksum_problem(const std::string& path);
// Throws IntegrityError(path, problem, hint) unless checksum_problem(path) is nullopt.
void verify_sealed(const std::string& path, const std::string& hint);
// verify_sealed, then the whole file as bytes (read once, checked in memory).
std::string read_sealed(const std::string& path, const std::string& hint);

}  // namespace fastudy
