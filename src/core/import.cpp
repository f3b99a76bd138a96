// Imported studies: [import] (the path pattern over the grid's axes and the step, the steps, the
// tensor-name mapping) and [axes.NAME] (axes of the user's own choosing, judged by the same rules as
// the table's), read strictly and checked against the grid at load, so that a mistake is an exit 2
// naming the key before any file is opened. Finding and reading the files is src/io/import_runs.hpp.
#include "src/core/import.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <sstream>

namespace fs = std::filesystem;

namespace fastudy {

using namespace config_detail;

namespace {

const std::vector<std::string> kDeclaredRoles{"optimisation", "reference", "setting"};
// The sections that configure fastudy's own training, which an imported study does not run.
const std::vector<std::string> kTrainingSections{"model", "data", "train", "attention", "numerics", "microbench"};

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// The placeholders of a pattern; a problem (an unclosed brace, a name that is no identifier) as the
// second member.
std::pair<std::vector<std::string>, std::string> parse_placeholders(const std::string& pattern) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '}') return {names, "a `}` without its `{` at character " + std::to_string(i + 1)};
    if (pattern[i] != '{') continue;
    const std::size_t close = pattern.find('}', i);
    if (close == std::string::npos) return {names, "a `{` without its `}` at character " + std::to_string(i + 1)};
    const std::string name = pattern.substr(i + 1, close - i - 1);
    if (!is_identifier(name)) return {names, "`{" + name + "}` is not a placeholder (an axis name or step)"};
    names.push_back(name);
    i = close;
  }
  return {names, ""};
}

// A value of an [axes.NAME] key or of the grid as text: a string as it is, an integer in decimal.
std::optional<std::string> word_or_integer(const toml::node& n) {
  if (auto s = n.value<std::string>(); n.is_string() && s) return *s;
  if (n.is_integer()) return std::to_string(*n.value<std::int64_t>());
  return std::nullopt;
}

}  // namespace

std::vector<std::string> import_placeholders(const std::string& pattern) { return parse_placeholders(pattern).first; }

bool glob_match(const std::string& pattern, const std::string& name) {
  // Iterative matching with one backtrack point (the last *): linear in practice.
  std::size_t p = 0, n = 0, star = std::string::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::optional<std::string> ImportConfig::tensor_name(const std::string& stored) const {
  std::string name = stored;
  for (bool stripped = true; stripped;) {
    stripped = false;
    for (const auto& prefix : strip_prefix)
      if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0) {
        name.erase(0, prefix.size());
        stripped = true;
      }
  }
  if (auto it = rename.find(name); it != rename.end()) name = it->second;
  for (const auto& pattern : exclude)
    if (glob_match(pattern, name)) return std::nullopt;
  return name;
}

std::string ImportConfig::path_of(const std::vector<std::pair<std::string, std::string>>& axes) const {
  std::string out = path;
  for (const auto& [axis, value] : axes) {
    const std::string key = "{" + axis + "}";
    for (std::size_t at = out.find(key); at != std::string::npos; at = out.find(key, at + value.size()))
      out.replace(at, key.size(), value);
  }
  return out;
}

GridAxisInfo study_axis(const Study& st, const std::string& name) {
  for (const auto& a : st.declared_axes)
    if (a.name == name) return a;
  if (const GridAxisInfo* row = find_grid_axis(name)) return *row;
  return GridAxisInfo{name, "", AxisRole::setting, "", false};
}

const std::vector<std::string>& import_phases() {
  static const std::vector<std::string> phases{"reduce", "report"};
  return phases;
}

namespace config_detail {

void read_import(Section imp, Study& st, const std::string& file) {
  if (!imp.present()) return;
  ImportConfig& ic = st.import;
  imp.get("path", ic.path);
  require(!ic.path.empty(), imp, "path", "[import] needs path, the pattern of the files of every run and step",
          "e.g. path = \"runs/{attention}-{precision}-s{seed}/step_{step}.safetensors\"");
  const std::string problem = parse_placeholders(ic.path).second;
  require(problem.empty(), imp, "path", "[import] path \"" + ic.path + "\": " + problem,
          "placeholders are {AXIS} (an axis of [grid]) and {step}; a path cannot hold other braces");
  if (const toml::array* steps = imp.array("steps")) {
    for (const auto& el : *steps) {
      if (!el.is_integer() || *el.value<std::int64_t>() < 0)
        imp.fail_at(el, "steps", "[import] steps must hold non-negative integers (the checkpoint steps to read)");
      const std::int64_t s = *el.value<std::int64_t>();
      if (std::find(ic.steps.begin(), ic.steps.end(), s) != ic.steps.end())
        imp.fail_at(el, "steps", "[import] steps lists " + std::to_string(s) + " twice", "remove the duplicate");
      ic.steps.push_back(s);
    }
    std::sort(ic.steps.begin(), ic.steps.end());
  }
  if (imp.has("strip_prefix") && imp.node("strip_prefix")->is_string()) {
    std::string one;
    imp.get("strip_prefix", one);
    ic.strip_prefix = {one};
  } else {
    imp.get_words("strip_prefix", ic.strip_prefix, {});
  }
  for (const auto& prefix : ic.strip_prefix)
    require(!prefix.empty(), imp, "strip_prefix", "[import] strip_prefix holds an empty prefix", "remove it");
  if (imp.has("rename")) {
    const toml::table* table = imp.node("rename")->as_table();
    if (!table)
      imp.fail("rename", "[import] rename must be a table of \"stored name\" = \"name in the study\"",
               "e.g. rename = { \"lm_head.weight\" = \"head.weight\" }");
    for (auto&& [k, v] : *table) {
      auto to = v.value<std::string>();
      if (!v.is_string() || !to || to->empty())
        throw ConfigError(file, static_cast<int>(v.source().begin.line), static_cast<int>(v.source().begin.column),
                          "import.rename." + std::string(k.str()), "[import] rename: each entry maps a name to a non-empty name");
      ic.rename.emplace(std::string(k.str()), *to);
    }
  }
  imp.get_words("exclude", ic.exclude, {});
  imp.finish({"path", "steps", "strip_prefix", "rename", "exclude"});
  fs::path p(ic.path);
  if (p.is_relative()) p = fs::path(file).parent_path() / p;
  ic.path = fs::absolute(p).lexically_normal().string();
}

void read_declared_axes(Section axes, Study& st, const std::string& file) {
  if (!axes.present()) return;
  if (!st.imported())
    axes.fail("", "[axes] declares the axes of imported runs, and this study has no [import]",
              "fastudy trains only the axes of its table (`fastudy --help`); add an [import] section to judge runs "
              "trained elsewhere");
  for (auto&& [k, v] : *axes.table()) {
    const std::string name(k.str());
    const toml::table* table = v.as_table();
    if (!table)
      throw ConfigError(file, static_cast<int>(k.source().begin.line), static_cast<int>(k.source().begin.column), "axes." + name,
                        "[axes] entries are tables: [axes." + name + "] with role, baseline and replicate");
    Section sec(file, "axes." + name, table, v.source());
    const GridAxisInfo* row = find_grid_axis(name);
    GridAxisInfo info = row ? *row : GridAxisInfo{name, "", AxisRole::setting, "", false};
    if (row) {
      for (const char* fixed : {"role", "replicate"})
        if (sec.node(fixed))
          sec.fail(fixed, "[axes." + name + "] " + fixed + ": `" + name + "` is an axis of fastudy's table, whose role (" +
                              axis_role_name(row->role) + ") and replicate flag are fixed",
                   "declare only its baseline here, or name your axis differently");
    } else {
      require(is_identifier(name), sec, "", "[axes." + name + "]: an axis name is letters, digits and _",
              "e.g. [axes.tp_size]");
      std::string role;
      sec.get("role", role);
      require(!role.empty(), sec, "role", "[axes." + name + "] needs role = \"optimisation\", \"reference\" or \"setting\"",
              "optimisation: judged against its baseline; reference: an accepted source of deviation (the yardstick); "
              "setting: defines the conditions the others are compared under");
      const auto it = std::find(kDeclaredRoles.begin(), kDeclaredRoles.end(), role);
      require(it != kDeclaredRoles.end(), sec, "role",
              "[axes." + name + "] role = \"" + role + "\" is unknown; allowed: " + join(kDeclaredRoles),
              suggestion(role, kDeclaredRoles));
      const AxisRole roles[] = {AxisRole::optimisation, AxisRole::reference, AxisRole::setting};
      info.role = roles[it - kDeclaredRoles.begin()];
      sec.get("replicate", info.replicate);
    }
    if (sec.has("baseline")) {
      const std::optional<std::string> baseline = word_or_integer(*sec.node("baseline"));
      if (!baseline) sec.fail("baseline", "[axes." + name + "] baseline must be one of the axis's values (a string or an integer)");
      info.baseline = *baseline;
    }
    sec.finish({"role", "baseline", "replicate"});
    st.declared_axes.push_back(std::move(info));
  }
}

void check_import_against_grid(const Study& st, const toml::table& root, const std::string& file) {
  Section imp = open_section(root, file, "import");
  const std::vector<std::string> names = import_placeholders(st.import.path);
  auto value_count = [&](const std::string& axis) -> std::size_t {
    for (const auto& [name, values] : st.axes)
      if (name == axis) return values.size();
    return 0;
  };
  for (const auto& name : names) {
    if (name == "step") continue;
    if (value_count(name) == 0) {
      std::vector<std::string> axes{"step"};
      for (const auto& a : st.axes) axes.push_back(a.first);
      imp.fail("path", "[import] path has the placeholder {" + name + "}, which is neither an axis of [grid] nor {step}",
               "the placeholders: " + join(axes) + "; add " + name + " to [grid] with the values your runs take");
    }
  }
  if (std::count(names.begin(), names.end(), "step") > 1)
    imp.fail("path", "[import] path has {step} twice", "name the step once in the pattern");
  if (std::find(names.begin(), names.end(), "step") == names.end() && st.import.steps.size() != 1)
    imp.fail("path", "[import] path has no {step}, so every run has one file: list its step",
             "add steps = [N] (the step the files hold), or put {step} in the path");
  for (const auto& [axis, values] : st.axes)
    if (values.size() > 1 && std::find(names.begin(), names.end(), axis) == names.end())
      imp.fail("path", "[import] path lacks {" + axis + "}, so the " + std::to_string(values.size()) +
                           " values of `" + axis + "` would read the same files",
               "put {" + axis + "} where the value appears in your runs' file names");
  const toml::table* axes = root.get_as<toml::table>("axes");
  for (const auto& declared : st.declared_axes) {
    const toml::table* table = axes->get_as<toml::table>(declared.name);
    Section sec(file, "axes." + declared.name, table, table->source());
    const std::size_t n = value_count(declared.name);
    if (n == 0)
      sec.fail("", "[axes." + declared.name + "] declares an axis that [grid] does not list",
               "add " + declared.name + " = [...] to [grid], or remove the declaration");
    if (declared.baseline.empty()) continue;
    for (const auto& [axis, values] : st.axes)
      if (axis == declared.name && std::find(values.begin(), values.end(), declared.baseline) == values.end())
        sec.fail("baseline", "[axes." + axis + "] baseline \"" + declared.baseline + "\" is not one of its values in [grid]: " +
                                 join(values),
                 "name the value your reference runs have");
  }
}

void refuse_training_sections(const toml::table& root, const std::string& file) {
  for (const auto& name : kTrainingSections)
    if (const toml::node* n = root.get(name))
      throw ConfigError(file, static_cast<int>(n->source().begin.line), static_cast<int>(n->source().begin.column), name,
                        "[" + name + "] configures fastudy's own training, and this study imports its runs ([import])",
                        "remove [" + name + "]: the imported checkpoints are compared as they are");
}

void add_import_tables(const Study& st, toml::table& resolved) {
  const ImportConfig& ic = st.import;
  toml::table imp{{"path", ic.path}};
  if (!ic.steps.empty()) {
    toml::array steps;
    for (auto s : ic.steps) steps.push_back(s);
    imp.insert("steps", steps);
  }
  auto list = [](const std::vector<std::string>& v) {
    toml::array a;
    for (const auto& s : v) a.push_back(s);
    return a;
  };
  if (!ic.strip_prefix.empty()) imp.insert("strip_prefix", list(ic.strip_prefix));
  if (!ic.rename.empty()) {
    toml::table rename;
    for (const auto& [from, to] : ic.rename) rename.insert(from, to);
    imp.insert("rename", rename);
  }
  if (!ic.exclude.empty()) imp.insert("exclude", list(ic.exclude));
  resolved.insert("import", imp);
  if (st.declared_axes.empty()) return;
  toml::table axes;
  for (const auto& a : st.declared_axes) {
    toml::table t;
    if (!find_grid_axis(a.name)) {
      t.insert("role", std::string(axis_role_name(a.role)));
      t.insert("replicate", a.replicate);
    }
    if (!a.baseline.empty()) t.insert("baseline", a.baseline);
    axes.insert(a.name, t);
  }
  resolved.insert("axes", axes);
}

std::string imported_variant_toml(const Study& st, const Variant& var) {
  toml::table axes;
  for (const auto& [axis, value] : var.axes) axes.insert(axis, value);
  toml::table vt{{"variant", toml::table{{"id", var.id}, {"axes", axes}}},
                 {"import", toml::table{{"path", st.import.path_of(var.axes)}}}};
  std::ostringstream os;
  os << vt;
  return os.str();
}

}  // namespace config_detail
}  // namespace fastudy
