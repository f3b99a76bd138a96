// The check of an imported study's files before the reduce, the plan it gives, and imported.csv
// (jobs/reduce_import.hpp).
#include "jobs/reduce_import.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "base/checksum.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"
#include "jobs/reduce_output.hpp"
#include "src/runtime/mpi.hpp"

namespace fs = std::filesystem;

namespace fastudy {
namespace {

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\t') c = ' ';
  return s;
}

// This process's share of the files (index i = v * S + s of layout.paths[v][s], those with
// i % ranks == rank), each as "@\ti\n" and its facts, or "X\ti\tmessage\thint\n" for bad input.
std::string inspect_share(const io::ImportLayout& layout, const ImportConfig& ic, int rank, int ranks) {
  std::ostringstream os;
  const std::size_t S = layout.steps.size();
  for (std::size_t i = static_cast<std::size_t>(rank); i < layout.paths.size() * S; i += static_cast<std::size_t>(ranks)) {
    try {
      const io::ImportedFileFacts facts = io::inspect_import(layout.paths[i / S][i % S], ic);
      os << "@\t" << i << '\n' << facts.pack();
    } catch (const UsageError& e) {
      os << "X\t" << i << '\t' << one_line(e.what()) << '\t' << one_line(e.hint()) << '\n';
    }
  }
  return os.str();
}

// Rank 0: the facts of every file from the ranks' shares, in index order; the first bad input (in
// index order) is thrown.
std::vector<io::ImportedFileFacts> collect_facts(const std::vector<std::string>& parts, std::size_t files) {
  std::vector<io::ImportedFileFacts> facts(files);
  std::map<std::size_t, std::pair<std::string, std::string>> errors;
  for (const auto& part : parts) {
    std::istringstream in(part);
    std::string line, block;
    std::size_t index = files;
    auto flush = [&] {
      if (index < files) facts[index] = io::ImportedFileFacts::unpack(block).at(0);
      block.clear();
    };
    while (std::getline(in, line)) {
      if (line.rfind("@\t", 0) == 0) {
        flush();
        index = std::stoul(line.substr(2));
      } else if (line.rfind("X\t", 0) == 0) {
        std::istringstream fields(line.substr(2));
        std::string i, message, hint;
        std::getline(fields, i, '\t');
        std::getline(fields, message, '\t');
        std::getline(fields, hint, '\t');
        errors.emplace(std::stoul(i), std::make_pair(message, hint));
      } else {
        block += line + '\n';
      }
    }
    flush();
  }
  if (!errors.empty()) throw UsageError(errors.begin()->second.first, errors.begin()->second.second);
  return facts;
}

std::string pack_plan(const ImportCheck& c) {
  std::ostringstream os;
  const ReducePlan& p = c.plan;
  os << "d " << p.f64 << '\n';
  for (const auto* v : p.variants) os << "v " << v->id << '\n';
  for (auto s : p.steps) os << "s " << s << '\n';
  for (const auto& t : p.tensors) os << "t " << t << '\n';
  for (auto n : p.sizes) os << "n " << n << '\n';
  for (const auto& row : p.files)
    for (const auto& f : row) os << "f " << f << '\n';
  return os.str();
}

ReducePlan unpack_plan(const std::string& text, const Study& st) {
  ReducePlan p;
  std::istringstream in(text);
  std::vector<std::string> files;
  for (std::string line; std::getline(in, line);) {
    const std::string body = line.substr(2);
    switch (line[0]) {
      case 'd': p.f64 = body == "1"; break;
      case 'v': p.variants.push_back(st.find_variant(body)); break;
      case 's': p.steps.push_back(std::stoll(body)); break;
      case 't': p.tensors.push_back(body); break;
      case 'n': p.sizes.push_back(std::stoll(body)); break;
      case 'f': files.push_back(body); break;
    }
  }
  for (std::size_t v = 0; v < p.variants.size(); ++v)
    p.files.emplace_back(files.begin() + static_cast<std::ptrdiff_t>(v * p.steps.size()),
                         files.begin() + static_cast<std::ptrdiff_t>((v + 1) * p.steps.size()));
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
    std::ostringstream os;
    for (auto s : layout.steps) os << "s " << s << '\n';
    for (const auto& row : layout.paths)
      for (const auto& f : row) os << "f " << f << '\n';
    packed_layout = os.str();
  });
  world->bcast(packed_layout);
  if (!world->is_root()) {
    std::istringstream in(packed_layout);
    std::vector<std::string> files;
    for (std::string line; std::getline(in, line);) {
      if (line[0] == 's') layout.steps.push_back(std::stoll(line.substr(2)));
      else files.push_back(line.substr(2));
    }
    for (std::size_t v = 0; v < st.variants.size(); ++v)
      layout.paths.emplace_back(files.begin() + static_cast<std::ptrdiff_t>(v * layout.steps.size()),
                                files.begin() + static_cast<std::ptrdiff_t>((v + 1) * layout.steps.size()));
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

void write_imported_csv(const std::string& out, const std::vector<io::ImportedFileRecord>& records, const Provenance& prov) {
  const std::string path = (fs::path(out) / "imported.csv").string();
  std::map<std::string, std::pair<std::uint64_t, std::uint32_t>> before;
  if (fs::exists(path)) {
    std::istringstream in(read_text_file(path));
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#' || line.rfind("path,", 0) == 0) continue;
      const std::size_t b = line.rfind(',', line.rfind(',') - 1), c = line.rfind(',');
      before[line.substr(0, b)] = {std::stoull(line.substr(b + 1, c - b - 1)),
                                   static_cast<std::uint32_t>(std::stoul(line.substr(c + 1), nullptr, 16))};
    }
  }
  std::ostringstream os;
  os << prov.header() << "path,bytes,crc32\n";
  for (const auto& r : records) {
    char crc[9];
    std::snprintf(crc, sizeof crc, "%08x", r.crc);
    os << r.path << ',' << r.bytes << ',' << crc << '\n';
    auto it = before.find(r.path);
    if (it != before.end() && (it->second.first != r.bytes || it->second.second != r.crc))
      log::warn("imported file " + r.path + " changed since the study's last reduce (" + std::to_string(it->second.first) +
                " -> " + std::to_string(r.bytes) + " bytes, crc32 differs): the results are computed from it as it is now");
  }
  atomic_write_sealed(path, os.str());
}

}  // namespace fastudy
