// The check of an imported study's files before the reduce, the plan it gives, and imported.csv
// (jobs/reduce_import.hpp).
#include "jobs/reduce_import.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "base/bytes.hpp"
#include "base/checksum.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "base/quote.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"
#include "jobs/reduce_output.hpp"
#include "src/runtime/mpi.hpp"

namespace fs = std::filesystem;

namespace fastudy {
namespace {

// This process's share of the files (index i = v * S + s of layout.paths[v][s], those with
// i % ranks == rank), as bytes (base/bytes.hpp: a path or name of any content travels whole): per file
// its index, then 1 and its facts, or 0 and the error's message and hint (bad input).
std::string inspect_share(const io::ImportLayout& layout, const ImportConfig& ic, int rank, int ranks) {
  ByteWriter out;
  const std::size_t S = layout.steps.size();
  for (std::size_t i = static_cast<std::size_t>(rank); i < layout.paths.size() * S; i += static_cast<std::size_t>(ranks)) {
    const std::string& path = layout.paths[i / S][i % S];
    out.put<std::uint64_t>(i);
    try {
      const io::ImportedFileFacts facts = io::inspect_import(path, ic);
      out.put<std::uint8_t>(1);
      out.put_string(facts.pack());
    } catch (const UsageError& e) {
      out.put<std::uint8_t>(0);
      out.put_string(e.what());
      out.put_string(e.hint());
    } catch (const std::exception& e) {  // what a reader did not name: named here, still bad input
      out.put<std::uint8_t>(0);
      out.put_string("'" + path + "': cannot be read: " + e.what());
      out.put_string("the file is damaged or not of its kind; write it again");
    }
  }
  return out.take();
}

// Rank 0: the facts of every file from the ranks' shares, in index order; the first bad input (in
// index order) is thrown.
std::vector<io::ImportedFileFacts> collect_facts(const std::vector<std::string>& parts, std::size_t files) {
  std::vector<io::ImportedFileFacts> facts(files);
  std::map<std::size_t, std::pair<std::string, std::string>> errors;
  for (const auto& part : parts) {
    ByteReader in(part, "reduce: the imported files a rank checked");
    while (!in.done()) {
      const auto i = in.get<std::uint64_t>();
      if (i >= files) throw Error("reduce: a rank checked imported file " + std::to_string(i) + " of " + std::to_string(files));
      if (in.get<std::uint8_t>() != 0) {
        facts[i] = io::ImportedFileFacts::unpack(in.get_string());
      } else {
        std::string message = in.get_string();
        errors.emplace(i, std::make_pair(std::move(message), in.get_string()));
      }
    }
  }
  if (!errors.empty()) throw UsageError(errors.begin()->second.first, errors.begin()->second.second);
  return facts;
}

std::string pack_plan(const ImportCheck& c) {
  ByteWriter w;
  const ReducePlan& p = c.plan;
  w.put<std::uint8_t>(p.f64);
  w.put<std::uint64_t>(p.variants.size());
  for (const auto* v : p.variants) w.put_string(v->id);
  w.put<std::uint64_t>(p.steps.size());
  for (auto s : p.steps) w.put<std::int64_t>(s);
  w.put<std::uint64_t>(p.tensors.size());
  for (const auto& t : p.tensors) w.put_string(t);
  for (auto n : p.sizes) w.put<std::int64_t>(n);
  for (const auto& row : p.files)
    for (const auto& f : row) w.put_string(f);
  return w.take();
}

ReducePlan unpack_plan(const std::string& bytes, const Study& st) {
  ReducePlan p;
  ByteReader r(bytes, "reduce: the plan rank 0 sent");
  p.f64 = r.get<std::uint8_t>() != 0;
  for (auto n = r.get<std::uint64_t>(); n > 0; --n) p.variants.push_back(st.find_variant(r.get_string()));
  for (auto n = r.get<std::uint64_t>(); n > 0; --n) p.steps.push_back(r.get<std::int64_t>());
  for (auto n = r.get<std::uint64_t>(); n > 0; --n) p.tensors.push_back(r.get_string());
  for (std::size_t t = 0; t + 1 < p.tensors.size(); ++t) p.sizes.push_back(r.get<std::int64_t>());
  p.files.assign(p.variants.size(), {});
  for (auto& row : p.files)
    for (std::size_t s = 0; s < p.steps.size(); ++s) row.push_back(r.get_string());
  return p;
}

// Rank 0: the plan from the facts of every file (checked to agree).
ImportCheck make_import_plan(const Study& st, const io::ImportLayout& layout, const std::vector<io::ImportedFileFacts>& facts) {
  const std::size_t S = layout.steps.size();
  std::vector<std::string> labels;
  for (std::size_t i = 0; i < facts.size(); ++i)
    labels.push_back("run " + st.variants[i / S].id + " at step " + std::to_string(layout.steps[i % S]));
  io::check_same_tensors(facts, labels);
  ImportCheck c;
  ReducePlan& p = c.plan;
  for (const auto& v : st.variants) p.variants.push_back(&v);
  p.steps = layout.steps;
  for (const auto& t : facts.front().tensors) {
    if (t.name == kModelTensor)
      throw UsageError("'" + facts.front().path + "': tensor '" + t.stored + "' is named '" + t.name +
                           "', the name the reduce gives the whole model",
                       "rename it: [import] rename = { \"" + t.name + "\" = \"" + t.name + "_\" }");
    p.tensors.push_back(t.name);
    p.sizes.push_back(static_cast<std::int64_t>(t.elements));
    p.f64 |= t.f64;
  }
  p.tensors.push_back(kModelTensor);
  p.files = layout.paths;
  for (const auto& f : facts) {
    c.data_bytes += f.data_bytes;
    for (const auto& r : f.files) c.records.push_back(r);
  }
  return c;
}

// [reduce] steps, when given, pick some of the imported steps.
io::ImportLayout only_reduced_steps(const Study& st, io::ImportLayout layout) {
  if (st.reduce.steps.empty()) return layout;
  io::ImportLayout picked;
  picked.paths.assign(layout.paths.size(), {});
  for (auto s : st.reduce.steps) {
    auto it = std::find(layout.steps.begin(), layout.steps.end(), s);
    if (it == layout.steps.end()) {
      std::string have;
      for (auto x : layout.steps) have += (have.empty() ? "" : ", ") + std::to_string(x);
      throw UsageError("[reduce] steps lists step " + std::to_string(s) + ", which the imported runs do not have",
                       "their steps: " + have);
    }
    picked.steps.push_back(s);
    for (std::size_t v = 0; v < layout.paths.size(); ++v)
      picked.paths[v].push_back(layout.paths[v][static_cast<std::size_t>(it - layout.steps.begin())]);
  }
  return picked;
}

}  // namespace

bool imports_torch_files(const Study& st) {
  const std::string& path = st.import.path;
  for (const char* ext : {".pt", ".pth", ".bin"})
    if (path.size() > std::strlen(ext) && path.compare(path.size() - std::strlen(ext), std::strlen(ext), ext) == 0) return true;
  return false;
}

ImportCheck check_imports(const Study& st, mpi::Comm* world) {
  if (st.variants.size() < 2)
    throw UsageError("an imported study needs at least two runs to compare; [grid] gives " + std::to_string(st.variants.size()),
                     "list the values of the axes your runs differ in");
  if (!world) {
    const io::ImportLayout layout = only_reduced_steps(st, io::locate_imports(st));
    return make_import_plan(st, layout, collect_facts({inspect_share(layout, st.import, 0, 1)}, layout.paths.size() * layout.steps.size()));
  }
  std::string packed_layout;
  io::ImportLayout layout;
  on_root(*world, [&] {
    layout = only_reduced_steps(st, io::locate_imports(st));
    ByteWriter w;
    w.put<std::uint64_t>(layout.steps.size());
    for (auto s : layout.steps) w.put<std::int64_t>(s);
    for (const auto& row : layout.paths)
      for (const auto& f : row) w.put_string(f);
    packed_layout = w.take();
  });
  world->bcast(packed_layout);
  if (!world->is_root()) {
    ByteReader r(packed_layout, "reduce: the imported files rank 0 found");
    for (auto n = r.get<std::uint64_t>(); n > 0; --n) layout.steps.push_back(r.get<std::int64_t>());
    layout.paths.assign(st.variants.size(), {});
    for (auto& row : layout.paths)
      for (std::size_t s = 0; s < layout.steps.size(); ++s) row.push_back(r.get_string());
  }
  const std::vector<std::string> parts = world->gather(inspect_share(layout, st.import, world->rank(), world->size()));
  ImportCheck check;
  std::string packed;
  on_root(*world, [&] {
    check = make_import_plan(st, layout, collect_facts(parts, layout.paths.size() * layout.steps.size()));
    packed = pack_plan(check);
  });
  world->bcast(packed);
  if (!world->is_root()) check.plan = unpack_plan(packed, st);
  return check;
}

namespace {

// The rows of the previous imported.csv (escaped path -> bytes, crc), read only when it matches its
// checksum and every row is well formed; nullopt and *problem otherwise.
std::optional<std::map<std::string, std::pair<std::uint64_t, std::uint32_t>>> previous_rows(const std::string& path,
                                                                                          std::string* problem) {
  std::string text;
  try {
    text = read_sealed(path, "");
  } catch (const IntegrityError& e) {
    *problem = e.problem();
    return std::nullopt;
  }
  std::map<std::string, std::pair<std::uint64_t, std::uint32_t>> rows;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t line = at;
    if (text[at] == '#' || text.compare(at, 5, "path,") == 0) {
      at = text.find('\n', at);
      at = at == std::string::npos ? text.size() : at + 1;
      continue;
    }
    const std::vector<std::string> f = csv_split_record(text, at);
    const bool digits = f.size() == 3 && !f[1].empty() && f[1].size() <= 19 &&
                        f[1].find_first_not_of("0123456789") == std::string::npos && f[2].size() == 8 &&
                        f[2].find_first_not_of("0123456789abcdef") == std::string::npos;
    if (!digits) {
      *problem = "its row at byte " + std::to_string(line) + " is not path,bytes,crc32";
      return std::nullopt;
    }
    rows[f[0]] = {std::stoull(f[1]), static_cast<std::uint32_t>(std::stoul(f[2], nullptr, 16))};
  }
  return rows;
}

}  // namespace

void write_imported_csv(const std::string& out, const std::vector<io::ImportedFileRecord>& records, const Provenance& prov) {
  const std::string path = (fs::path(out) / "imported.csv").string();
  std::map<std::string, std::pair<std::uint64_t, std::uint32_t>> before;
  if (fs::exists(fs::symlink_status(path))) {
    std::string problem;
    if (auto rows = previous_rows(path, &problem)) {
      before = std::move(*rows);
    } else {
      log::warn("the imported.csv of the study's last reduce cannot be read (" + problem +
                "): the imported files are not compared with the ones it read");
    }
  }
  std::ostringstream os;
  os << prov.header() << "path,bytes,crc32\n";
  for (const auto& r : records) {
    char crc[9];
    std::snprintf(crc, sizeof crc, "%08x", r.crc);
    // A path on one line whatever it holds (escaped: a newline as \n, a backslash doubled), quoted.
    const std::string field = escaped(r.path);
    os << csv_field(field) << ',' << r.bytes << ',' << crc << '\n';
    auto it = before.find(field);
    if (it != before.end() && (it->second.first != r.bytes || it->second.second != r.crc))
      log::warn("imported file " + quoted_name(r.path) + " changed since the study's last reduce (" +
                std::to_string(it->second.first) + " -> " + std::to_string(r.bytes) +
                " bytes, crc32 differs): the results are computed from it as it is now");
  }
  atomic_write_sealed(path, os.str());
}

}  // namespace fastudy
