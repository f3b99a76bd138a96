// OUT/fastudy.manifest: reading, adding entries (sealed, atomic rewrite), and removing what it lists.
#include "base/manifest.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <set>
#include <sstream>
#include <tuple>

#include "base/atomic_file.hpp"
#include "base/checksum.hpp"
#include "base/error.hpp"
#include "base/log.hpp"

namespace fs = std::filesystem;

namespace fastudy::manifest {

namespace {

constexpr struct {
  Kind kind;
  const char* word;
} kKinds[] = {{Kind::file, "file"}, {Kind::dir, "dir"}, {Kind::checkpoints, "checkpoints"}, {Kind::scratch, "scratch"}};

const char* word_of(Kind k) {
  for (const auto& e : kKinds)
    if (e.kind == k) return e.word;
  return "?";
}

const char* const kHint =
    "the manifest lists the files fastudy wrote in the study; restore it, or remove the study's files by hand";

bool plain_byte(unsigned char c) { return c > 0x20 && c != '%' && c != 0x7f; }

std::string encode(const std::string& path) {
  static const char* const kHex = "0123456789ABCDEF";
  std::string e;
  for (char c : path) {
    const auto u = static_cast<unsigned char>(c);
    if (plain_byte(u)) {
      e += c;
    } else {
      e += '%';
      e += kHex[u >> 4];
      e += kHex[u & 15];
    }
  }
  return e;
}

std::optional<std::string> decode(const std::string& e) {
  std::string path;
  for (std::size_t i = 0; i < e.size(); ++i) {
    if (e[i] != '%') {
      if (!plain_byte(static_cast<unsigned char>(e[i]))) return std::nullopt;
      path += e[i];
      continue;
    }
    if (i + 2 >= e.size() || !std::isxdigit(static_cast<unsigned char>(e[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(e[i + 2])))
      return std::nullopt;
    path += static_cast<char>(std::stoi(e.substr(i + 1, 2), nullptr, 16));
    i += 2;
  }
  return path;
}

// A plain relative path inside OUT: no empty, "." or ".." component, not absolute, no NUL.
bool inside(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos) return false;
  std::size_t at = 0;
  while (at <= path.size()) {
    const std::size_t slash = std::min(path.find('/', at), path.size());
    const std::string part = path.substr(at, slash - at);
    if (part.empty() || part == "." || part == "..") return false;
    at = slash + 1;
  }
  return true;
}

std::string format(const std::set<Entry>& entries) {
  std::ostringstream os;
  os << kFormat << '\n';
  for (const auto& e : entries) os << word_of(e.kind) << ' ' << e.job << ' ' << encode(e.path) << '\n';
  return os.str();
}

std::vector<Entry> parse(const std::string& text, const std::string& file) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kFormat)
    throw Error(file + ":1: not a fastudy manifest (the first line is not " + std::string(kFormat) + ")", kHint);
  std::vector<Entry> entries;
  for (int n = 2; std::getline(in, line); ++n) {
    std::istringstream words(line);
    std::string kind, job, encoded, extra;
    words >> kind >> job >> encoded;
    const auto known =
        std::find_if(std::begin(kKinds), std::end(kKinds), [&](const auto& k) { return kind == k.word; });
    const auto path = decode(encoded);
    const bool job_ok = !job.empty() && std::all_of(job.begin(), job.end(),
                                                    [](char c) { return std::islower(static_cast<unsigned char>(c)); });
    if (known == std::end(kKinds) || !job_ok || !path || !inside(*path) || (words >> extra))
      throw Error(file + ":" + std::to_string(n) + ": not an entry fastudy writes: " + line, kHint);
    entries.push_back({known->kind, job, *path});
  }
  return entries;
}

// lstat: the file type without following a symbolic link; 0 when nothing is there.
mode_t type_of(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 ? (st.st_mode & S_IFMT) : 0;
}

// Every directory between OUT and `rel`'s parent is a real directory (no symbolic link on the way).
bool reached_directly(const fs::path& out, const std::string& rel) {
  fs::path p = out;
  const fs::path parent = fs::path(rel).parent_path();
  for (const auto& part : parent) {
    p /= part;
    if (type_of(p) != S_IFDIR) return false;
  }
  return true;
}

bool step_file_name(const std::string& name) {
  // step_<7 digits>.h5, then optionally .crc, then optionally .tmp.<anything>
  if (name.size() < 15 || name.compare(0, 5, "step_") != 0 || name.compare(12, 3, ".h5") != 0) return false;
  if (!std::all_of(name.begin() + 5, name.begin() + 12, [](char c) { return c >= '0' && c <= '9'; })) return false;
  std::string rest = name.substr(15);
  if (rest.rfind(".crc", 0) == 0) rest = rest.substr(4);
  return rest.empty() || (rest.size() > 5 && rest.rfind(".tmp.", 0) == 0);
}

}  // namespace

bool Entry::operator<(const Entry& o) const { return std::tie(path, kind, job) < std::tie(o.path, o.kind, o.job); }
bool Entry::operator==(const Entry& o) const { return kind == o.kind && job == o.job && path == o.path; }

std::string path_of(const std::string& out) { return (fs::path(out) / kName).string(); }

std::optional<std::vector<Entry>> read(const std::string& out) {
  const std::string file = path_of(out);
  if (type_of(file) == 0) return std::nullopt;
  return parse(read_sealed(file, kHint), file);
}

void add(const std::string& out, const std::vector<Entry>& entries) {
  for (const auto& e : entries)
    if (!inside(e.path))
      throw Error("refusing to write '" + e.path + "' for the study in " + out + ": it is not a path inside it",
                  "a name that becomes a path (a variant id, a policy name) may not hold '/', '.' or '..' parts");
  const std::string file = path_of(out);
  std::set<Entry> all;
  if (type_of(file) != 0) {
    try {
      std::optional<std::vector<Entry>> listed = read(out);
      if (listed) all.insert(listed->begin(), listed->end());
    } catch (const Error& e) {
      const std::string aside = set_aside(file);
      log::warn(std::string(e.what()) + "; set aside as " + aside +
                ": the files it listed are never deleted by --force");
      all.clear();
    }
  }
  const std::size_t before = all.size();
  for (const auto& e : entries) all.insert(e);
  if (all.size() == before && type_of(file) == S_IFREG) return;
  atomic_write_sealed(file, format(all));
}

bool covers(const Entry& entry, const std::string& rel) {
  const std::string& p = entry.path;
  if (rel == p) return true;
  const auto starts = [&](const std::string& prefix) {
    return rel.size() > prefix.size() && rel.compare(0, prefix.size(), prefix) == 0;
  };
  switch (entry.kind) {
    case Kind::file:
      return rel == p + kChecksumSuffix || starts(p + ".tmp.") || starts(p + kChecksumSuffix + ".tmp.");
    case Kind::dir:
      return false;
    case Kind::checkpoints:
      return starts(p + "/") && rel.find('/', p.size() + 1) == std::string::npos &&
             step_file_name(rel.substr(p.size() + 1));
    case Kind::scratch:
      return starts(p + "/");
  }
  return false;
}

Removal remove(const std::string& out_dir, const std::function<bool(const Entry&)>& chosen) {
  const fs::path out(out_dir);
  std::vector<Entry> entries = read(out_dir).value_or(std::vector<Entry>{});
  Removal r;
  std::error_code ec;
  const auto remove_file = [&](const std::string& rel) {
    if (fs::remove(out / rel, ec)) r.removed.push_back(rel);
  };
  // Files: the names each entry covers in its directory, when they are regular files.
  for (const auto& e : entries) {
    if (!chosen(e) || e.kind == Kind::dir || !reached_directly(out, e.path)) continue;
    const fs::path target = out / e.path;
    if (e.kind == Kind::file) {
      const fs::path parent = target.parent_path();
      const std::string prefix = fs::path(e.path).parent_path().string();
      for (const auto& child : fs::directory_iterator(parent, ec)) {
        const std::string rel = (prefix.empty() ? fs::path() : fs::path(prefix)) / child.path().filename();
        if (!covers(e, rel)) continue;
        if (type_of(child.path()) == S_IFREG)
          remove_file(rel);
        else
          r.kept.push_back(rel);
      }
      continue;
    }
    const mode_t t = type_of(target);
    if (t == 0) continue;
    if (t != S_IFDIR) {
      r.kept.push_back(e.path);
      continue;
    }
    if (e.kind == Kind::scratch) {
      for (auto it = fs::recursive_directory_iterator(target, ec); it != fs::recursive_directory_iterator();
           it.increment(ec))
        if (!it->is_directory(ec) || it->is_symlink(ec))
          r.removed.push_back(it->path().lexically_relative(out).string());
      fs::remove_all(target, ec);  // never follows a symbolic link inside it
      r.removed.push_back(e.path);
      continue;
    }
    for (const auto& child : fs::directory_iterator(target, ec)) {
      const std::string rel = e.path + "/" + child.path().filename().string();
      if (!covers(e, rel)) continue;
      if (type_of(child.path()) == S_IFREG)
        remove_file(rel);
      else
        r.kept.push_back(rel);
    }
  }
  // Directories left empty, deepest first.
  std::vector<std::string> dirs;
  for (const auto& e : entries)
    if (chosen(e) && (e.kind == Kind::dir || e.kind == Kind::checkpoints) && reached_directly(out, e.path))
      dirs.push_back(e.path);
  std::sort(dirs.begin(), dirs.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  for (const auto& d : dirs)
    if (type_of(out / d) == S_IFDIR && ::rmdir((out / d).c_str()) == 0) r.removed.push_back(d);
  // Entries whose paths are gone leave the manifest.
  std::set<Entry> left;
  for (auto& e : entries)
    if (!chosen(e) || type_of(out / e.path) != 0) left.insert(std::move(e));
  atomic_write_sealed(path_of(out_dir), format(left));
  return r;
}

std::vector<std::string> unlisted(const std::string& out_dir, const std::vector<Entry>& entries) {
  const fs::path out(out_dir);
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(out, ec); it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string rel = it->path().lexically_relative(out).string();
    if (covers(Entry{Kind::file, "", kName}, rel)) continue;  // the manifest, its sidecar, their temporaries
    const bool listed = std::any_of(entries.begin(), entries.end(), [&](const Entry& e) { return covers(e, rel); });
    if (!listed) found.push_back(rel);
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace fastudy::manifest
