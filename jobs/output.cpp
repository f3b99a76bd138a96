// The output directory policy: create, refuse, resume or start over; atomic text files.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <sstream>

#include "base/atomic_file.hpp"
#include "base/checksum.hpp"
#include "base/error.hpp"
#include "jobs/job.hpp"
#include "jobs/study_lock.hpp"

namespace fs = std::filesystem;

namespace fastudy {

const char* const kStudyTomlHint =
    "study.toml was changed or damaged after fastudy wrote it; restore it, or start the study again in "
    "another --out (or with --force)";

bool file_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

std::string shell_quote(const std::string& s) {
  const bool control = std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
  if (!control) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  }
  // bash's $'...': every byte that is not plain printable text as \xHH, so the word is one line.
  static const char* const kHex = "0123456789abcdef";
  std::string q = "$'";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\'' || c == '\\') {
      q += '\\';
      q += c;
    } else if (u < 0x20 || u == 0x7f) {
      q += "\\x";
      q += kHex[u >> 4];
      q += kHex[u & 15];
    } else {
      q += c;
    }
  }
  return q + "'";
}

std::string shell_word(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || (c != '\0' && std::strchr("_@%+=:,./-", c) != nullptr);
  });
  return plain ? s : shell_quote(s);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path, "check that the file exists and is readable");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {
// The study lock (and the temporary names of its creation) is not an output: it does not make a
// directory non-empty and --force keeps it.
bool is_lock_file(const fs::path& p) { return p.filename().string().rfind(kLockName, 0) == 0; }

bool empty_but_lock(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (!is_lock_file(e.path())) return false;
  return true;
}

// OUT/variants.csv: every variant of the grid with its value of every axis (columns in grid order),
// written with study.toml, so that readers (the report) never re-implement the grid's expansion.
void write_variants_csv(const fs::path& out, const Study& st) {
  std::ostringstream os;
  os << "variant,hash";
  for (const auto& axis : st.axes) os << ',' << axis.first;
  os << '\n';
  for (const auto& v : st.variants) {
    os << v.id << ',' << v.hash;
    for (const auto& [axis, value] : v.axes) os << ',' << value;
    os << '\n';
  }
  atomic_write_sealed((out / "variants.csv").string(), os.str());
}

}  // namespace

void prepare_output(JobContext& ctx) {
  const Study& st = *ctx.study;
  const fs::path out(ctx.out_dir);
  const fs::path marker = out / "study.toml";
  std::error_code ec;
  bool exists = fs::exists(out, ec);
  bool empty = exists && fs::is_directory(out, ec) && empty_but_lock(out);
  if (exists && !fs::is_directory(out, ec))
    throw UsageError("output path " + out.string() + " exists and is not a directory", "choose another --out");

  if (exists && !empty) {
    if (!fs::exists(marker)) {
      throw UsageError("output directory " + out.string() + " is not empty and holds no fastudy study (no study.toml)",
                       "choose another --out; fastudy never deletes files it did not write");
    }
    if (ctx.opts.force && !ctx.opts.resume) {
      // Start over: remove what fastudy writes, then recreate.
      for (const auto& entry : fs::directory_iterator(out))
        if (!is_lock_file(entry.path())) fs::remove_all(entry.path(), ec);
      if (ec) throw Error("cannot clear " + out.string() + ": " + ec.message());
    } else if (ctx.opts.resume) {
      Study previous = parse_study(read_sealed(marker.string(), kStudyTomlHint), marker.string());
      std::string changed;
      for (const auto& v : st.variants) {
        const Variant* before = previous.find_variant(v.id);
        if (before && before->hash != v.hash) changed += (changed.empty() ? "" : ", ") + v.id;
      }
      if (!changed.empty() && !ctx.opts.force)
        throw UsageError("the grid changed since " + out.string() + " was started: the configuration of " + changed +
                             " differs from the one in " + marker.string(),
                         "restore the grid, pass --force with --resume to retrain the changed variants from scratch, or "
                         "use another --out");
      atomic_write_sealed(marker.string(), st.resolved_toml);
      write_variants_csv(out, st);
      atomic_write((out / "provenance.txt").string(), ctx.prov.header());
      return;
    } else {
      throw UsageError("output directory " + out.string() + " already holds a study",
                       "pass --resume to continue it, --force to start over (its outputs are deleted), or --out DIR");
    }
  }
  fs::create_directories(out, ec);
  if (ec) throw Error("cannot create output directory " + out.string() + ": " + ec.message(),
                      "check the path and permissions, or pass --out DIR");
  atomic_write_sealed(marker.string(), st.resolved_toml);
  write_variants_csv(out, st);
  atomic_write((out / "provenance.txt").string(), ctx.prov.header());
}

}  // namespace fastudy
