// Finding, checking and reading the files of an imported study (src/io/import_runs.hpp).
#include "src/io/import_runs.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "base/checksum.hpp"
#include "base/error.hpp"
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
      if (fs::exists(pattern)) found[v][ic.steps.front()].push_back(pattern);
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
  std::ostringstream os;
  os << "P\t" << path << '\n' << "B\t" << data_bytes << '\n';
  for (const auto& f : files) os << "F\t" << f.path << '\t' << f.bytes << '\t' << f.crc << '\n';
  for (const auto& t : tensors) {
    os << "T\t" << t.name << '\t' << t.stored << '\t' << t.stored_type << '\t' << t.elements << '\t' << t.f64;
    for (auto d : t.shape) os << '\t' << d;
    os << '\n';
  }
  return os.str();
}

std::vector<ImportedFileFacts> ImportedFileFacts::unpack(const std::string& text) {
  std::vector<ImportedFileFacts> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string x; std::getline(fields, x, '\t');) f.push_back(x);
    if (f.empty()) continue;
    if (f[0] == "P") {
      out.emplace_back();
      out.back().path = f.at(1);
    } else if (f[0] == "B") {
      out.back().data_bytes = std::stoull(f.at(1));
    } else if (f[0] == "F") {
      out.back().files.push_back({f.at(1), std::stoull(f.at(2)), static_cast<std::uint32_t>(std::stoul(f.at(3)))});
    } else if (f[0] == "T") {
      ImportedTensor t{f.at(1), f.at(2), f.at(3), {}, std::stoull(f.at(4)), f.at(5) == "1"};
      for (std::size_t i = 6; i < f.size(); ++i) t.shape.push_back(std::stoll(f[i]));
      out.back().tensors.push_back(std::move(t));
    }
  }
  return out;
}

ImportedFileFacts inspect_import(const std::string& path, const ImportConfig& ic) {
  const TensorFile tf = TensorFile::open(path);
  ImportedFileFacts facts;
  facts.path = path;
  std::map<std::string, std::string> stored_of;  // study name -> stored name
  std::vector<float> f32;
  std::vector<double> f64;
  for (const TensorEntry& e : tf.tensors()) {
    const std::optional<std::string> name = ic.tensor_name(e.name);
    if (!name || e.elements == 0) continue;  // excluded, or nothing to compare
    if (auto [it, fresh] = stored_of.emplace(*name, e.name); !fresh)
      throw UsageError("'" + path + "': tensors " + in_quotes(it->second) + " and " + in_quotes(e.name) + " both become " +
                           in_quotes(*name) + " after [import] strip_prefix and rename",
                       "rename one of them, or exclude one ([import] exclude)");
    if (!e.format)
      throw UsageError("'" + path + "': tensor " + in_quotes(e.name) + " has dtype " + e.stored_type +
                           ", which is not a floating-point format fastudy compares (fp64, fp32, fp16, bf16)",
                       "leave it out: [import] exclude = [\"" + *name + "\"]");
    // Finite values only: a NaN or Inf would make every distance of the run meaningless.
    const bool wide = *e.format == Format::fp64;
    std::uint64_t bad = e.elements;
    double value = 0;
    if (wide) {
      f64.resize(e.elements);
      tf.read(e, f64.data());
      for (std::uint64_t i = 0; i < e.elements && bad == e.elements; ++i)
        if (!std::isfinite(f64[i])) bad = i, value = f64[i];
    } else {
      f32.resize(e.elements);
      tf.read(e, f32.data());
      for (std::uint64_t i = 0; i < e.elements && bad == e.elements; ++i)
        if (!std::isfinite(f32[i])) bad = i, value = f32[i];
    }
    if (bad != e.elements)
      throw UsageError("'" + path + "': tensor " + in_quotes(e.name) + " holds " + (std::isnan(value) ? "NaN" : "Inf") +
                           " (element " + std::to_string(bad) + " of " + std::to_string(e.elements) + ")",
                       "the run diverged or the file is damaged: leave the run out of [grid], or exclude the tensor");
    facts.tensors.push_back({*name, e.name, e.stored_type, e.shape, e.elements, wide});
    facts.data_bytes += e.elements * stored_element_bytes(*e.format);
  }
  if (facts.tensors.empty())
    throw UsageError("'" + path + "': no tensor is left to compare (the file holds " + std::to_string(tf.tensors().size()) +
                         ", all excluded)",
                     "check [import] exclude");
  for (const auto& file : tf.files()) {
    const FileSum sum = file_sum(file);
    facts.files.push_back({file, sum.size, sum.crc});
  }
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
    : ic_(ic), paths_(std::move(paths)), kept_(paths_.size()) {}

void ImportedStep::read(std::size_t v, const std::vector<std::string>& names, const std::vector<std::int64_t>& sizes,
                        std::uint64_t begin, std::uint64_t end, float* dst) {
  read_as(v, names, sizes, begin, end, dst);
}
void ImportedStep::read(std::size_t v, const std::vector<std::string>& names, const std::vector<std::int64_t>& sizes,
                        std::uint64_t begin, std::uint64_t end, double* dst) {
  read_as(v, names, sizes, begin, end, dst);
}

template <class T>
void ImportedStep::read_as(std::size_t v, const std::vector<std::string>& names, const std::vector<std::int64_t>& sizes,
                           std::uint64_t begin, std::uint64_t end, T* dst) {
  std::unique_ptr<TensorFile> opened;
  if (!kept_[v]) {
    opened = std::make_unique<TensorFile>(TensorFile::open(paths_[v]));
    if (!opened->in_place()) kept_[v] = std::move(opened);
  }
  const TensorFile& tf = kept_[v] ? *kept_[v] : *opened;
  const std::string& path = paths_[v];
  std::map<std::string, const TensorEntry*> by_name;
  for (const TensorEntry& e : tf.tensors())
    if (auto name = ic_.tensor_name(e.name)) by_name.emplace(*name, &e);
  std::uint64_t at = 0;  // the first value of names[i] in the concatenation
  for (std::size_t i = 0; i < names.size() && at < end; ++i) {
    const auto n = static_cast<std::uint64_t>(sizes[i]);
    const std::uint64_t lo = std::max(begin, at), hi = std::min(end, at + n);
    if (lo < hi) {
      auto it = by_name.find(names[i]);
      if (it == by_name.end() || it->second->elements != n)
        throw UsageError("'" + path + "' no longer holds tensor '" + names[i] + "' as it was checked (the file changed)",
                         "run the reduce again");
      tf.read_range(*it->second, lo - at, hi - lo, dst + (lo - begin));
    }
    at += n;
  }
}

}  // namespace fastudy::io
