#include "base/checksum.hpp"

#include <zlib.h>
#ifdef FASTUDY_LIBDEFLATE
#include <libdeflate.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "base/atomic_file.hpp"
#include "base/read_file.hpp"

namespace fs = std::filesystem;

namespace fastudy {

namespace {

FileSum sum_of_bytes(std::string_view bytes) {
  return FileSum{bytes.size(), crc32_update(0, bytes.data(), bytes.size())};
}

// Parses one line of a sidecar strictly: the format word, a decimal size, 8 hex digits, a newline.
std::optional<FileSum> parse_line(const std::string& text) {
  const std::string head = std::string(kChecksumFormat) + " ";
  if (text.size() > 64 || text.rfind(head, 0) != 0 || text.back() != '\n') return std::nullopt;
  std::size_t at = head.size();
  FileSum s;
  std::size_t digits = 0;
  while (at < text.size() && text[at] >= '0' && text[at] <= '9' && digits < 19) {
    s.size = s.size * 10 + static_cast<std::uint64_t>(text[at++] - '0');
    ++digits;
  }
  if (digits == 0 || at >= text.size() || text[at++] != ' ') return std::nullopt;
  if (text.size() != at + 9) return std::nullopt;
  for (int i = 0; i < 8; ++i) {
    const char c = text[at++];
    const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return std::nullopt;
    s.crc = (s.crc << 4) | static_cast<std::uint32_t>(v);
  }
  return s;
}

// The sidecar: one line (the file's sum) or two (the file's, then the previous version's).
std::vector<FileSum> parse_checksum(const std::string& text) {
  std::vector<FileSum> sums;
  std::size_t at = 0;
  while (at < text.size() && sums.size() < 3) {
    const std::size_t nl = text.find('\n', at);
    if (nl == std::string::npos) return {};
    const auto s = parse_line(text.substr(at, nl + 1 - at));
    if (!s) return {};
    sums.push_back(*s);
    at = nl + 1;
  }
  if (sums.size() > 2) return {};
  return sums;
}

std::string hex8(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// Reads a small file whole (at most limit + 1 bytes: a longer one is damaged for the parser); nullopt
// when it is missing or not a regular file (a FIFO in its place is not waited for).
std::optional<std::string> read_small(const std::string& path, std::size_t limit) {
  std::string problem;
  const std::optional<RegularFile> f = RegularFile::open(path, &problem);
  if (!f) return std::nullopt;
  std::string s(limit + 1, '\0');
  const long long n = f->read_at(s.data(), s.size(), 0);
  if (n < 0) return std::nullopt;
  s.resize(static_cast<std::size_t>(n));
  return s;
}

// `path` opened for a whole-file read: an Error naming it when it cannot be opened or is not a
// regular file.
RegularFile open_for_sum(const std::string& path) {
  std::string problem;
  std::optional<RegularFile> f = RegularFile::open(path, &problem);
  if (!f) throw Error("'" + path + "' " + problem);
  return std::move(*f);
}

// `sidecar` is the sidecar's text as read before the file (nullopt: there is none).
std::optional<std::string> compare(const std::string& path, const std::optional<std::string>& sidecar,
                                   const FileSum& actual) {
  const std::string side = checksum_path(path);
  if (!sidecar)
    return "no checksum file " + side + " (the write did not complete, or the file was not written by fastudy)";
  const std::vector<FileSum> sums = parse_checksum(*sidecar);
  if (sums.empty()) return "the checksum file " + side + " is damaged";
  for (const auto& s : sums)
    if (s.size == actual.size && s.crc == actual.crc) return std::nullopt;
  const FileSum& want = sums.front();
  if (want.size != actual.size)
    return "size " + std::to_string(actual.size) + " bytes differs from the " + std::to_string(want.size) +
           " recorded in " + side + " (truncated or extended)";
  return "checksum mismatch (crc32 " + hex8(actual.crc) + ", " + side + " records " + hex8(want.crc) +
         "): the file was changed or damaged after it was written";
}

}  // namespace

std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n) {
#ifdef FASTUDY_LIBDEFLATE
  return libdeflate_crc32(crc, data, n);  // zlib's CRC-32 (libdeflate.h), any length
#else
  const auto* p = static_cast<const unsigned char*>(data);
  constexpr std::size_t kPiece = std::size_t{1} << 30;  // zlib takes uInt lengths
  while (n > 0) {
    const std::size_t k = std::min(n, kPiece);
    crc = static_cast<std::uint32_t>(::crc32(crc, p, static_cast<uInt>(k)));
    p += k;
    n -= k;
  }
  return crc;
#endif
}

std::uint32_t crc32_join(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t length_b) {
  static_assert(sizeof(z_off_t) >= 8, "zlib's crc32_combine takes 64-bit lengths here");
  return static_cast<std::uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(length_b)));
}

IntegrityError::IntegrityError(std::string file, const std::string& problem, std::string hint)
    : Error("'" + file + "': " + problem, std::move(hint)), file_(std::move(file)), problem_(problem) {}

std::string checksum_path(const std::string& path) { return path + kChecksumSuffix; }

FileSum file_sum(const std::string& path) {
  const RegularFile f = open_for_sum(path);
  std::vector<char> buf(std::size_t{1} << 20);
  FileSum s;
  for (;;) {
    const long long n = f.read_at(buf.data(), buf.size(), s.size);
    if (n < 0) throw Error("cannot read '" + path + "': " + std::strerror(errno));
    if (n == 0) break;
    s.crc = crc32_update(s.crc, buf.data(), static_cast<std::size_t>(n));
    s.size += static_cast<std::uint64_t>(n);
  }
  return s;
}

FileSum file_sum_known(const std::string& path, std::vector<KnownRange> known) {
  const RegularFile f = open_for_sum(path);
  const std::uint64_t size = f.size();
  std::sort(known.begin(), known.end(), [](const KnownRange& a, const KnownRange& b) { return a.offset < b.offset; });
  // A range past the end of the file is read instead (it then ends early, as the file does); empty
  // ranges have nothing to splice.
  known.erase(std::remove_if(known.begin(), known.end(),
                             [&](const KnownRange& r) { return r.size == 0 || r.offset + r.size > size; }),
              known.end());
  for (std::size_t i = 1; i < known.size(); ++i) {
    if (known[i].offset < known[i - 1].offset + known[i - 1].size) {
      throw Error("file_sum_known('" + path + "'): the known byte ranges overlap at offset " +
                  std::to_string(known[i].offset));
    }
  }
  FileSum s;
  std::vector<char> buf(std::size_t{1} << 20);
  // Reads [s.size, end) into the sum; stops early at the end of the file.
  auto read_to = [&](std::uint64_t end) {
    while (s.size < end) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), end - s.size));
      const long long n = f.read_at(buf.data(), want, s.size);
      if (n < 0) throw Error("cannot read '" + path + "': " + std::strerror(errno));
      if (n == 0) return;  // the end of the file
      s.crc = crc32_update(s.crc, buf.data(), static_cast<std::size_t>(n));
      s.size += static_cast<std::uint64_t>(n);
    }
  };
  for (const KnownRange& r : known) {
    read_to(r.offset);
    if (s.size != r.offset) return s;  // the file ended before the range: the bytes read are the sum
    s.crc = crc32_join(s.crc, r.crc, r.size);
    s.size += r.size;
  }
  read_to(std::numeric_limits<std::uint64_t>::max());
  return s;
}

std::string format_checksum(const FileSum& sum) {
  return std::string(kChecksumFormat) + " " + std::to_string(sum.size) + " " + hex8(sum.crc) + "\n";
}

void write_checksum(const std::string& path, bool durable) {
  atomic_write(checksum_path(path), format_checksum(file_sum(path)), durable);
}

void remove_checksum(const std::string& path) {
  std::error_code ec;
  fs::remove(checksum_path(path), ec);
}

std::string set_aside(const std::string& path) {
  std::error_code ec;
  std::string aside;
  for (int n = 1;; ++n) {
    aside = path + ".set-aside-" + std::to_string(n);
    if (!fs::exists(fs::symlink_status(aside, ec)) && !fs::exists(fs::symlink_status(checksum_path(aside), ec))) break;
  }
  fs::rename(path, aside, ec);
  if (ec)
    throw Error("cannot move " + path + " aside to " + aside + ": " + ec.message(),
                "move or remove it by hand (it is not read again), then run again");
  if (fs::exists(fs::symlink_status(checksum_path(path), ec))) fs::rename(checksum_path(path), checksum_path(aside), ec);
  return aside;
}

namespace {
// The sidecar of a new version `sum` of `path`, written before the new version is renamed into place:
// it also keeps the current version's line, so that every moment (old file, new sidecar; new file,
// new sidecar) reads as whole.
void write_sidecar_before(const std::string& path, const FileSum& sum, bool durable) {
  std::string text = format_checksum(sum);
  if (const auto old = read_small(checksum_path(path), 128)) {
    const std::vector<FileSum> sums = parse_checksum(*old);
    if (!sums.empty()) text += format_checksum(sums.front());
  }
  atomic_write(checksum_path(path), text, durable);
}
}  // namespace

void commit_sealed(const std::string& tmp, const std::string& path, bool durable) {
  FileSum sum;
  try {
    sum = file_sum(tmp);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  commit_sealed(tmp, path, sum, durable);
}

void commit_sealed(const std::string& tmp, const std::string& path, const FileSum& sum, bool durable) {
  try {
    write_sidecar_before(path, sum, durable);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  commit_file(tmp, path, durable);
}

void atomic_write_sealed(const std::string& path, std::string_view bytes, bool durable) {
  write_sidecar_before(path, sum_of_bytes(bytes), durable);
  atomic_write(path, bytes, durable);
}

void atomic_write_sealed_with(const std::string& path, const std::function<void(const std::string& tmp)>& write,
                              bool durable) {
  commit_sealed(write_temporary(path, write), path, durable);
}

namespace {
// Reads the sidecar, then the file (through `sum`), then the sidecar again: a writer that replaced
// the file twice meanwhile (status.csv while training) changes the sidecar, and the check is made
// again; a damaged file gives the same answer every time.
template <class Sum>
std::optional<std::string> check(const std::string& path, Sum sum) {
  std::optional<std::string> problem;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const auto before = read_small(checksum_path(path), 128);
    const FileSum actual = sum();
    const auto after = read_small(checksum_path(path), 128);
    problem = compare(path, before, actual);
    if (!problem || before == after) return problem;
  }
  return problem;
}
}  // namespace

std::optional<std::string> checksum_problem(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::string("no such file");
  if (!fs::is_regular_file(path, ec)) return std::string("not a regular file");
  try {
    return check(path, [&] { return file_sum(path); });
  } catch (const Error& e) {
    return std::string(e.what());
  }
}

void verify_sealed(const std::string& path, const std::string& hint) {
  if (auto problem = checksum_problem(path)) throw IntegrityError(path, *problem, hint);
}

std::string read_sealed(const std::string& path, const std::string& hint) {
  std::string problem;
  const std::optional<RegularFile> f = RegularFile::open(path, &problem);
  if (!f) {
    std::error_code ec;
    throw IntegrityError(path, fs::exists(path, ec) ? "not a regular file" : "no such file", hint);
  }
  std::string bytes;
  const auto mismatch = check(path, [&] {
    // The whole file as it is now (it may have been replaced since the open: read it by name again),
    // unless it is larger than every size its sidecar records: then it is not read into memory (a
    // huge file in the place of a small one) and compares as of another size.
    const RegularFile now = open_for_sum(path);
    std::uint64_t largest = 0;
    if (const auto side = read_small(checksum_path(path), 128))
      for (const FileSum& s : parse_checksum(*side)) largest = std::max(largest, s.size);
    if (now.size() > largest) return FileSum{now.size(), 0};
    bytes.assign(static_cast<std::size_t>(now.size()), '\0');
    const long long n = now.read_at(bytes.data(), bytes.size(), 0);
    if (n < 0) throw IntegrityError(path, std::string("cannot be read: ") + std::strerror(errno), hint);
    bytes.resize(static_cast<std::size_t>(n));
    return sum_of_bytes(bytes);
  });
  if (mismatch) throw IntegrityError(path, *mismatch, hint);
  return bytes;
}

}  // namespace fastudy
