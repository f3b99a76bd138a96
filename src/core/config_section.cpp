// Section (config_section.hpp): reading one grid.toml table strictly, with the "did you mean" of a
// typo and a ConfigError at the file, line and column of every problem.
#include "src/core/config_section.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "src/core/names.hpp"

namespace fastudy::config_detail {
namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string suggestion(const std::string& word, const std::vector<std::string>& known) {
  for (const auto& k : known)  // a truncated or extended word ("accumulator" for "accum")
    if (k.size() >= 3 && word.size() >= 3 && (word.rfind(k, 0) == 0 || k.rfind(word, 0) == 0))
      return "did you mean `" + k + "`?";
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const auto& k : known) {
    std::size_t d = edit_distance(word, k);
    if (d < best_d) best_d = d, best = k;
  }
  if (!best.empty() && best_d <= std::max<std::size_t>(2, word.size() / 3)) return "did you mean `" + best + "`?";
  return "";
}

void Section::fail(const std::string& key, const std::string& message, const std::string& hint) const {
  const toml::node* n = node(key);
  const auto& src = n ? n->source() : where_;
  throw ConfigError(file_, static_cast<int>(src.begin.line), static_cast<int>(src.begin.column), qualified(key),
                    message, hint);
}

void Section::fail_at(const toml::node& n, const std::string& key, const std::string& message,
                      const std::string& hint) const {
  throw ConfigError(file_, static_cast<int>(n.source().begin.line), static_cast<int>(n.source().begin.column),
                    qualified(key), message, hint);
}

void require_name(const std::string& file, const toml::source_region& where, const std::string& key,
                  const std::string& what, const std::string& name) {
  if (const auto problem = name_problem(name))
    throw ConfigError(file, static_cast<int>(where.begin.line), static_cast<int>(where.begin.column), key,
                      what + " " + printable_name(name) + " " + *problem,
                      "a name becomes a folder, a CSV field and a TOML string: use " + naming_rule());
}

void require_name(Section& s, const std::string& key, const std::string& what, const std::string& name) {
  if (const auto problem = name_problem(name))
    s.fail(key, what + " " + printable_name(name) + " " + *problem,
           "a name becomes a folder, a CSV field and a TOML string: use " + naming_rule());
}

void Section::get(const std::string& key, std::string& out) {
  if (!has(key)) return;
  auto v = node(key)->value<std::string>();
  if (!node(key)->is_string() || !v) fail(key, "`" + qualified(key) + "` must be a string", "write it in quotes: " + key + " = \"...\"");
  out = *v;
}

void Section::get(const std::string& key, bool& out) {
  if (!has(key)) return;
  if (!node(key)->is_boolean()) fail(key, "`" + qualified(key) + "` must be true or false");
  out = *node(key)->value<bool>();
}

void Section::get(const std::string& key, std::int64_t& out) {
  if (!has(key)) return;
  if (!node(key)->is_integer()) fail(key, "`" + qualified(key) + "` must be an integer (got " + type_name(*node(key)) + ")");
  out = *node(key)->value<std::int64_t>();
}

void Section::get(const std::string& key, int& out) {
  std::int64_t v = out;
  get(key, v);
  if (v < INT32_MIN || v > INT32_MAX)
    fail(key, "`" + qualified(key) + "` = " + std::to_string(v) + " is out of range: it must be from " +
                  std::to_string(INT32_MIN) + " to " + std::to_string(INT32_MAX) + " (a 32-bit integer)");
  out = static_cast<int>(v);
}

void Section::get(const std::string& key, std::uint64_t& out) {
  std::int64_t v = static_cast<std::int64_t>(out);
  get(key, v);
  if (v < 0) fail(key, "`" + qualified(key) + "` must be >= 0 (got " + std::to_string(v) + ")");
  out = static_cast<std::uint64_t>(v);
}

void Section::get(const std::string& key, double& out) {
  if (!has(key)) return;
  const toml::node* n = node(key);
  if (!n->is_number()) fail(key, "`" + qualified(key) + "` must be a number (got " + type_name(*n) + ")");
  out = *n->value<double>();
  if (!std::isfinite(out)) fail(key, "`" + qualified(key) + "` must be finite");
}

const toml::array* Section::array(const std::string& key) {
  if (!has(key)) return nullptr;
  const toml::array* a = node(key)->as_array();
  if (!a) fail(key, "`" + qualified(key) + "` must be an array (got " + type_name(*node(key)) + ")",
               "write it as " + key + " = [ ... ]");
  if (a->empty()) fail(key, "`" + qualified(key) + "` is empty", "give at least one value");
  return a;
}

void Section::get_words(const std::string& key, std::vector<std::string>& out, const std::vector<std::string>& allowed) {
  const toml::array* a = array(key);
  if (!a) return;
  out.clear();
  std::set<std::string> seen;  // duplicates found in n log n: a list may be long
  for (const auto& el : *a) {
    auto s = el.value<std::string>();
    if (!el.is_string() || !s) fail_at(el, key, "`" + qualified(key) + "` must hold strings (got " + type_name(el) + ")");
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), *s) == allowed.end())
      fail_at(el, key, "`" + qualified(key) + "` has unknown value " + printable_name(*s) + "; allowed: " + join(allowed),
              suggestion(*s, allowed));
    if (!seen.insert(*s).second)
      fail_at(el, key, "`" + qualified(key) + "` lists " + printable_name(*s) + " twice", "remove the duplicate");
    out.push_back(*s);
  }
}

void Section::get_ints(const std::string& key, std::vector<int>& out, std::int64_t min_value) {
  const toml::array* a = array(key);
  if (!a) return;
  out.clear();
  std::set<std::int64_t> seen;
  for (const auto& el : *a) {
    if (!el.is_integer()) fail_at(el, key, "`" + qualified(key) + "` must hold integers (got " + type_name(el) + ")");
    std::int64_t v = *el.value<std::int64_t>();
    if (v < min_value)
      fail_at(el, key, "`" + qualified(key) + "` value " + std::to_string(v) + " must be >= " + std::to_string(min_value));
    if (v > INT32_MAX)
      fail_at(el, key, "`" + qualified(key) + "` value " + std::to_string(v) + " is larger than " +
                           std::to_string(INT32_MAX) + ", the largest it may be (a 32-bit integer)",
              "use a value from " + std::to_string(min_value) + " to " + std::to_string(INT32_MAX));
    if (!seen.insert(v).second)
      fail_at(el, key, "`" + qualified(key) + "` lists " + std::to_string(v) + " twice", "remove the duplicate");
    out.push_back(static_cast<int>(v));
  }
}

void Section::finish(const std::vector<std::string>& known_hint) const {
  if (!table_) return;
  for (auto&& [k, v] : *table_) {
    std::string key(k.str());
    if (used_.count(key)) continue;
    std::set<std::string> known_set(used_.begin(), used_.end());
    known_set.insert(known_hint.begin(), known_hint.end());
    std::vector<std::string> known(known_set.begin(), known_set.end());
    std::string hint = suggestion(key, known);
    if (hint.empty()) hint = "known keys in [" + name_ + "]: " + join(known);
    throw ConfigError(file_, static_cast<int>(k.source().begin.line), static_cast<int>(k.source().begin.column),
                      qualified(key), "unknown key `" + key + "` in [" + name_ + "]", hint);
  }
}

std::string Section::type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

Section open_section(const toml::table& root, const std::string& file, const std::string& name) {
  static const toml::source_region top{};
  const toml::node* n = root.get(name);
  if (n && !n->is_table())
    throw ConfigError(file, static_cast<int>(n->source().begin.line), static_cast<int>(n->source().begin.column),
                      name, "`" + name + "` must be a table: write [" + name + "] on its own line");
  return Section(file, name, n ? n->as_table() : nullptr, n ? n->source() : top);
}

std::string read_word(Section& s, const std::string& key, const std::vector<std::string>& allowed,
                      const std::string& current) {
  std::string w = current;
  s.get(key, w);
  require(std::find(allowed.begin(), allowed.end(), w) != allowed.end(), s, key,
          "[" + s.name() + "] " + key + " = \"" + w + "\" is unknown; allowed: " + join(allowed), suggestion(w, allowed));
  return w;
}

}  // namespace fastudy::config_detail
