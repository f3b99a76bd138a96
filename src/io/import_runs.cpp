// Finding, checking and reading the files of an imported study (src/io/import_runs.hpp).
#include "src/io/import_runs.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "base/bytes.hpp"
#include "base/checksum.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "base/quote.hpp"
#include "base/read_file.hpp"
#include "src/io/tensor_file.hpp"

namespace fs = std::filesystem;

namespace fastudy::io {
namespace {

constexpr const char* kStep = "{step}";

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// The steps whose files exist for one run's pattern (its axis values put in, {step} left): step ->
// the paths that match it (more than one is an error for the caller to name).
std::map<std::int64_t, std::vector<std::string>> files_by_step(const std::string& pattern) {
  std::map<std::int64_t, std::vector<std::string>> found;
  const std::size_t at = pattern.find(kStep);
  // The component that holds {step}: its folder is listed, the rest of the path appended.
  const std::size_t begin = pattern.rfind('/', at) + 1;
  const std::size_t end = std::min(pattern.find('/', at), pattern.size());
  const std::string folder = pattern.substr(0, begin), rest = pattern.substr(end);
  const std::string before = pattern.substr(begin, at - begin);
  const std::string after = pattern.substr(at + std::char_traits<char>::length(kStep), end - at - std::char_traits<char>::length(kStep));
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return found;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= before.size() + after.size() || name.compare(0, before.size(), before) != 0 ||
        name.compare(name.size() - after.size(), after.size(), after) != 0)
      continue;
    const std::string digits = name.substr(before.size(), name.size() - before.size() - after.size());
    if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string path = folder + name + rest;
    if (!fs::exists(path, ec)) continue;
    found[std::stoll(digits)].push_back(path);
  }
  for (auto& [step, paths] : found) std::sort(paths.begin(), paths.end());
  return found;
}

std::string with_step(const std::string& pattern, std::int64_t step) {
  std::string out = pattern;
  if (auto at = out.find(kStep); at != std::string::npos) out.replace(at, std::char_traits<char>::length(kStep), std::to_string(step));
  return out;
}

[[noreturn]] void missing(const Variant& v, std::int64_t step, const std::string& expected, const std::string& why) {
  throw UsageError("imported run " + v.id + " has no file for step " + std::to_string(step) + ": " + in_quotes(expected) +
                       " does not exist (" + why + ")",
                   "check [import] path and steps against the files your runs wrote");
}

}  // namespace

ImportLayout locate_imports(const Study& st) {
  const ImportConfig& ic = st.import;
  ImportLayout layout;
  const bool has_step = ic.path.find(kStep) != std::string::npos;
  std::vector<std::map<std::int64_t, std::vector<std::string>>> found(st.variants.size());
  std::set<std::int64_t> all;
  for (std::size_t v = 0; v < st.variants.size(); ++v) {
    const std::string pattern = ic.path_of(st.variants[v].axes);
    if (!has_step) {
      std::error_code ec;
      if (fs::exists(pattern, ec)) found[v][ic.steps.front()].push_back(pattern);
    } else {
      found[v] = files_by_step(pattern);
    }
    for (const auto& [step, paths] : found[v]) {
      if (paths.size() > 1)
        throw UsageError("two files map to imported run " + st.variants[v].id + " at step " + std::to_string(step) + ": " +
                             in_quotes(paths[0]) + " and " + in_quotes(paths[1]),
                         "keep one of them (their step numbers are equal: leading zeros do not count)");
      all.insert(step);
    }
  }
  if (!ic.steps.empty()) {
    layout.steps = ic.steps;
  } else {
    if (all.empty())
      throw UsageError("[import] path matches no file: " + in_quotes(ic.path) + " (the first run's files would be " +
                           in_quotes(ic.path_of(st.variants.front().axes)) + ")",
                       "check the pattern against your files; {AXIS} takes the [grid] values, {step} any number");
    layout.steps.assign(all.begin(), all.end());
  }
  layout.paths.assign(st.variants.size(), {});
  for (std::size_t v = 0; v < st.variants.size(); ++v) {
    const std::string pattern = ic.path_of(st.variants[v].axes);
    for (auto step : layout.steps) {
      auto it = found[v].find(step);
      if (it == found[v].end())
        missing(st.variants[v], step, with_step(pattern, step),
                ic.steps.empty() ? "other runs have this step" : "[import] steps lists it");
      layout.paths[v].push_back(it->second.front());
    }
  }
  return layout;
}

std::string ImportedFileFacts::pack() const {
  ByteWriter w;
  w.put_string(path);
  w.put<std::uint64_t>(data_bytes);
  w.put<std::uint64_t>(files.size());
  for (const auto& f : files) {
    w.put_string(f.path);
    w.put<std::uint64_t>(f.bytes);
    w.put<std::uint32_t>(f.crc);
  }
  w.put<std::uint64_t>(tensors.size());
  for (const auto& t : tensors) {
    w.put_string(t.name);
    w.put_string(t.stored);
    w.put_string(t.stored_type);
    w.put<std::uint64_t>(t.elements);
    w.put<std::uint8_t>(t.f64);
    w.put<std::uint64_t>(t.shape.size());
    for (auto d : t.shape) w.put<std::int64_t>(d);
  }
  return w.take();
}

ImportedFileFacts ImportedFileFacts::unpack(const std::string& bytes) {
  ByteReader r(bytes, "the facts of an imported file a rank sent");
  ImportedFileFacts out;
  out.path = r.get_string();
  out.data_bytes = r.get<std::uint64_t>();
  for (auto n = r.get<std::uint64_t>(); n > 0; --n) {
    ImportedFileRecord f;
    f.path = r.get_string();
    f.bytes = r.get<std::uint64_t>();
    f.crc = r.get<std::uint32_t>();
    out.files.push_back(std::move(f));
  }
  for (auto n = r.get<std::uint64_t>(); n > 0; --n) {
    ImportedTensor t;
    t.name = r.get_string();
    t.stored = r.get_string();
    t.stored_type = r.get_string();
    t.elements = r.get<std::uint64_t>();
    t.f64 = r.get<std::uint8_t>() != 0;
    for (auto d = r.get<std::uint64_t>(); d > 0; --d) t.shape.push_back(r.get<std::int64_t>());
    out.tensors.push_back(std::move(t));
  }
  return out;
}

namespace {

// The first element of e that is not finite (its index and value), read a piece at a time.
template <class T>
std::optional<std::pair<std::uint64_t, double>> first_not_finite(const TensorFile& tf, const TensorEntry& e) {
  constexpr std::uint64_t kPiece = std::uint64_t{1} << 20;
  std::vector<T> piece(static_cast<std::size_t>(std::min(e.elements, kPiece)));
  for (std::uint64_t at = 0; at < e.elements; at += kPiece) {
    const std::uint64_t n = std::min(kPiece, e.elements - at);
    tf.read_range(e, at, n, piece.data());
    for (std::uint64_t i = 0; i < n; ++i)
      if (!std::isfinite(piece[i])) return std::make_pair(at + i, static_cast<double>(piece[i]));
  }
  return std::nullopt;
}

// The first element of `n` stored values (raw bytes read as this machine's integers) that is not finite:
// its index, and whether it is a NaN (else an Inf); nullopt when all are. A value is not finite when its
// exponent bits are all ones, and a NaN when its mantissa bits are then not all zeros (IEEE 754
// binary64/32/16 and bfloat16 alike). A block is searched only when it holds such a value.
template <class Bits>
std::optional<std::pair<std::uint64_t, bool>> first_not_finite_bits(const char* p, std::uint64_t n, Bits exponent,
                                                                     Bits mantissa) {
  constexpr std::uint64_t kBlock = 1024;
  const auto at_index = [p](std::uint64_t i) {
    Bits v;
    std::memcpy(&v, p + i * sizeof(Bits), sizeof v);
    return v;
  };
  for (std::uint64_t at = 0; at < n; at += kBlock) {
    const std::uint64_t end = std::min(at + kBlock, n);
    // An OR of comparisons, which the compiler vectorises: 36 and 42 GB/s for 32- and 16-bit values on
    // zen5, where an OR of bools or a max of the exponents ran at 4-19 GB/s.
    Bits hits = 0;
    for (std::uint64_t i = at; i < end; ++i) hits |= static_cast<Bits>((at_index(i) & exponent) == exponent);
    if (hits == 0) continue;
    for (std::uint64_t i = at; i < end; ++i)
      if ((at_index(i) & exponent) == exponent) return std::make_pair(i, (at_index(i) & mantissa) != 0);
  }
  return std::nullopt;
}

// first_not_finite_bits for stored values of format f (one of the formats a TensorEntry names).
std::optional<std::pair<std::uint64_t, bool>> first_not_finite_stored(Format f, const char* p, std::uint64_t n) {
  switch (f) {
    case Format::fp64:
      return first_not_finite_bits<std::uint64_t>(p, n, 0x7ff0000000000000ull, 0x000fffffffffffffull);
    case Format::fp32: return first_not_finite_bits<std::uint32_t>(p, n, 0x7f800000u, 0x007fffffu);
    case Format::fp16: return first_not_finite_bits<std::uint16_t>(p, n, 0x7c00u, 0x03ffu);
    case Format::bf16: return first_not_finite_bits<std::uint16_t>(p, n, 0x7f80u, 0x007fu);
    default: break;
  }
  throw Error("import: no finite check for stored " + std::string(to_string(f)) + " values");
}

const char* const kChangedHint = "check the file (it changed or became unreadable while it was read)";

[[noreturn]] void not_finite(const std::string& path, const TensorEntry& e, std::uint64_t index, bool nan) {
  throw UsageError("'" + path + "': tensor " + quoted_name(e.name) + " holds " + (nan ? "NaN" : "Inf") + " (element " +
                       std::to_string(index) + " of " + std::to_string(e.elements) + ")",
                   "the run diverged or the file is damaged: leave the run out of [grid], or exclude the tensor");
}

// A tensor to check whose bytes lie in the file being read (TensorFile::stored_bytes).
struct StoredTensor {
  std::uint64_t offset = 0, bytes = 0;
  const TensorEntry* entry = nullptr;
};

// One read of `file` (of the tensor file `path`): its size and CRC-32, equal to file_sum's, and in the same
// pass the values of `tensors` (not overlapping) checked to be finite. The check then copies each byte
// out of the page cache once instead of twice (a read for the values, another for the sum).
FileSum sum_and_check(const std::string& path, const std::string& file, std::vector<StoredTensor> tensors) {
  std::string problem;
  const std::optional<RegularFile> f = RegularFile::open(file, &problem);
  if (!f) throw UsageError("'" + file + "' " + problem, kChangedHint);
  std::sort(tensors.begin(), tensors.end(), [](const StoredTensor& a, const StoredTensor& b) { return a.offset < b.offset; });
  std::vector<char> buf(std::size_t{1} << 20);
  FileSum sum;
  // Up to n bytes at sum.size into buf and the sum; fewer only at the end of the file.
  const auto read = [&](std::size_t n) {
    const long long got = f->read_at(buf.data(), n, sum.size);
    if (got < 0) throw UsageError("cannot read '" + file + "': " + std::strerror(errno), kChangedHint);
    sum.crc = crc32_update(sum.crc, buf.data(), static_cast<std::size_t>(got));
    sum.size += static_cast<std::uint64_t>(got);
    return static_cast<std::size_t>(got);
  };
  for (const StoredTensor& t : tensors) {
    const auto shorter = [&] {
      throw UsageError("'" + file + "': tensor " + quoted_name(t.entry->name) +
                           ": it changed while it was read (it is now shorter than its header says)",
                       "run again once nothing writes it");
    };
    while (sum.size < t.offset)
      if (read(static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), t.offset - sum.size))) == 0) shorter();
    if (sum.size != t.offset) throw Error("import: the tensors of '" + file + "' overlap");
    const Format format = *t.entry->format;
    const std::size_t element = stored_element_bytes(format);
    const std::size_t piece = buf.size() / element * element;  // whole elements only
    for (std::uint64_t done = 0; done < t.bytes;) {
      const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(piece, t.bytes - done));
      if (read(want) != want) shorter();
      if (const auto bad = first_not_finite_stored(format, buf.data(), want / element))
        not_finite(path, *t.entry, done / element + bad->first, bad->second);
      done += want;
    }
  }
  while (read(buf.size()) > 0) {
  }
  return sum;
}

// Why `name` cannot be written into the results whole ("" when it can): each of them (deviation.csv,
// deviation.h5's name attributes, the report) holds UTF-8 text on one line.
std::string name_problem(const std::string& name) {
  if (name.empty()) return "is empty";
  for (std::size_t i = 0; i < name.size();) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) return "holds a control character";
    const std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > name.size()) return "is not valid UTF-8";
    for (std::size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(name[i + k]) >> 6) != 0x2) return "is not valid UTF-8";
    i += len;
  }
  return "";
}

}  // namespace

ImportedFileFacts inspect_import(const std::string& path, const ImportConfig& ic) {
  const TensorFile tf = TensorFile::open(path);
  ImportedFileFacts facts;
  facts.path = path;
  std::map<std::string, std::string> stored_of;  // study name -> stored name
  std::vector<const TensorEntry*> checked;       // the tensors compared, in the file's order
  for (const TensorEntry& e : tf.tensors()) {
    const std::optional<std::string> name = ic.tensor_name(e.name);
    if (!name || e.elements == 0) continue;  // excluded, or nothing to compare
    if (const std::string problem = name_problem(*name); !problem.empty())
      throw UsageError("'" + path + "': tensor " + quoted_name(e.name) + (*name == e.name ? "" : " (as " + quoted_name(*name) + ")") +
                           ": its name " + problem + ", which the results cannot hold",
                       "rename it ([import] rename, a TOML string may hold \\t, \\n and \\uXXXX escapes) or exclude it ([import] exclude)");
    if (auto [it, fresh] = stored_of.emplace(*name, e.name); !fresh)
      throw UsageError("'" + path + "': tensors " + quoted_name(it->second) + " and " + quoted_name(e.name) + " both become " +
                           quoted_name(*name) + " after [import] strip_prefix and rename",
                       "rename one of them, or exclude one ([import] exclude)");
    if (!e.format)
      throw UsageError("'" + path + "': tensor " + quoted_name(e.name) + " has dtype " + e.stored_type +
                           ", which is not a floating-point format fastudy compares (fp64, fp32, fp16, bf16)",
                       "leave it out: [import] exclude = [\"" + *name + "\"]");
    facts.tensors.push_back({*name, e.name, e.stored_type, e.shape, e.elements, e.format == Format::fp64});
    facts.data_bytes += e.elements * stored_element_bytes(*e.format);
    checked.push_back(&e);
  }
  if (facts.tensors.empty())
    throw UsageError("'" + path + "': no tensor is left to compare (the file holds " + std::to_string(tf.tensors().size()) +
                         ", all excluded)",
                     "check [import] exclude");
  // Finite values only: a NaN or Inf would make every distance of the run meaningless. Where the reader
  // says where each tensor's bytes lie, one read of each file checks them and sums it; otherwise the
  // values are read through the reader, then the files summed.
  std::map<std::string, std::vector<StoredTensor>> stored;  // file -> its tensors to check
  bool all_stored = true;
  for (const TensorEntry* e : checked) {
    const std::optional<StoredBytes> at = tf.stored_bytes(*e);
    if (!at) {
      all_stored = false;
      break;
    }
    stored[at->file].push_back({at->offset, e->elements * stored_element_bytes(*e->format), e});
  }
  if (!all_stored) {
    for (const TensorEntry* e : checked) {
      const auto bad = *e->format == Format::fp64 ? first_not_finite<double>(tf, *e) : first_not_finite<float>(tf, *e);
      if (bad) not_finite(path, *e, bad->first, std::isnan(bad->second));
    }
  }
  for (const auto& file : tf.files()) {
    FileSum sum;
    if (all_stored) {
      const auto it = stored.find(file);
      sum = sum_and_check(path, file, it == stored.end() ? std::vector<StoredTensor>{} : std::move(it->second));
      if (it != stored.end()) stored.erase(it);
    } else {
      try {
        sum = file_sum(file);
      } catch (const Error& e) {
        throw UsageError(e.what(), kChangedHint);
      }
    }
    facts.files.push_back({file, sum.size, sum.crc});
  }
  if (!stored.empty()) throw Error("import: '" + path + "' has tensors in '" + stored.begin()->first + "', a file its reader does not list");
  return facts;
}

void check_same_tensors(const std::vector<ImportedFileFacts>& runs, const std::vector<std::string>& labels) {
  const ImportedFileFacts& first = runs.front();
  const auto only_in = [&](const std::string& name, std::size_t has, std::size_t lacks) {
    throw UsageError("tensor " + in_quotes(name) + " is in " + labels[has] + " ('" + runs[has].path + "') but not in " +
                         labels[lacks] + " ('" + runs[lacks].path + "')",
                     "every run must hold the same tensors: exclude it ([import] exclude = [\"" + name +
                         "\"]) or map the names with strip_prefix and rename");
  };
  std::map<std::string, const ImportedTensor*> ref;
  for (const auto& t : first.tensors) ref.emplace(t.name, &t);
  for (std::size_t r = 1; r < runs.size(); ++r) {
    std::set<std::string> seen;
    for (const auto& t : runs[r].tensors) {
      seen.insert(t.name);
      auto it = ref.find(t.name);
      if (it == ref.end()) only_in(t.name, r, 0);
      const ImportedTensor& a = *it->second;
      if (a.stored_type != t.stored_type)
        throw UsageError("tensor " + in_quotes(t.name) + " is " + a.stored_type + " in " + labels[0] + " ('" + first.path +
                             "') and " + t.stored_type + " in " + labels[r] + " ('" + runs[r].path + "')",
                         "save every run's weights in one dtype (e.g. the fp32 master weights of a bf16 run)");
      if (a.shape != t.shape) {
        auto text = [](const std::vector<std::int64_t>& s) {
          std::string out = "[";
          for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
          return out + "]";
        };
        throw UsageError("tensor " + in_quotes(t.name) + " has shape " + text(a.shape) + " in " + labels[0] + " ('" + first.path +
                             "') and " + text(t.shape) + " in " + labels[r] + " ('" + runs[r].path + "')",
                         "the runs must be of one model");
      }
    }
    for (const auto& t : first.tensors)
      if (!seen.count(t.name)) only_in(t.name, 0, r);
  }
}

ImportedStep::ImportedStep(const ImportConfig& ic, std::vector<std::string> paths)
    : ic_(ic), paths_(std::move(paths)), opened_(paths_.size()) {}

void ImportedStep::read(std::size_t v, const std::vector<std::string>& names, const std::vector<std::int64_t>& sizes,
                        std::uint64_t begin, std::uint64_t end, float* dst) {
  read_as(v, names, sizes, begin, end, dst);
}
void ImportedStep::read(std::size_t v, const std::vector<std::string>& names, const std::vector<std::int64_t>& sizes,
                        std::uint64_t begin, std::uint64_t end, double* dst) {
  read_as(v, names, sizes, begin, end, dst);
}

const ImportedStep::Opened& ImportedStep::opened(std::size_t v) {
  Opened& o = opened_.at(v);
  if (!o.file) {
    o.file = std::make_unique<TensorFile>(TensorFile::open(paths_[v]));
    for (const TensorEntry& e : o.file->tensors())
      if (auto name = ic_.tensor_name(e.name)) o.by_name.emplace(*name, &e);
    log::debug("reduce: opened " + paths_[v] + " (" + std::to_string(o.file->tensors().size()) + " tensors)");
  }
  return o;
}

template <class T>
void ImportedStep::read_as(std::size_t v, const std::vector<std::string>& names, const std::vector<std::int64_t>& sizes,
                           std::uint64_t begin, std::uint64_t end, T* dst) {
  const Opened& o = opened(v);
  const std::string& path = paths_[v];
  std::uint64_t at = 0;  // the first value of names[i] in the concatenation
  for (std::size_t i = 0; i < names.size() && at < end; ++i) {
    const auto n = static_cast<std::uint64_t>(sizes[i]);
    const std::uint64_t lo = std::max(begin, at), hi = std::min(end, at + n);
    if (lo < hi) {
      auto it = o.by_name.find(names[i]);
      if (it == o.by_name.end() || it->second->elements != n || !it->second->format)
        throw UsageError("'" + path + "' no longer holds tensor " + quoted_name(names[i]) + " as it was checked (the file changed)",
                         "run the reduce again");
      o.file->read_range(*it->second, lo - at, hi - lo, dst + (lo - begin));
    }
    at += n;
  }
}

}  // namespace fastudy::io
