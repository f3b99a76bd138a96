// Reading one table of a grid.toml (internal to src/core's config files; includes toml++).
//
// Every section is read through a Section, which remembers the keys it consumed; whatever is left is
// an unknown key, reported with a "did you mean" suggestion. Every problem becomes a ConfigError that
// names the file, line, column and the qualified key ("train.lr"). Also here: the word helpers the
// readers share (join, suggestion, the words of an enum, read_word).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <toml++/toml.h>

#include "src/core/config.hpp"

namespace fastudy::config_detail {

std::string join(const std::vector<std::string>& items, const std::string& sep = ", ");

// "did you mean `d_model`?" when a known word is close enough to be a typo ("" when none is).
std::string suggestion(const std::string& word, const std::vector<std::string>& known);

// The words of an enum's values, in order (its name table read through to_string): for messages.
template <class E, std::size_t N>
std::vector<std::string> words(const E (&all)[N]) {
  std::vector<std::string> out;
  for (E e : all) out.emplace_back(to_string(e));
  return out;
}

// Words that are not an enum of their own: the switches of [numerics] recompute and its axis.
inline const std::vector<std::string> kOnOff{"off", "on"};
// [attention] loop_order, its axis and [microbench] loop_orders (kernels/attention.hpp's LoopOrder).
inline const std::vector<std::string> kLoopOrders{"kv_outer", "q_outer"};

// Reads one TOML table, tracks which keys were used, and turns every problem into a ConfigError.
class Section {
 public:
  Section(const std::string& file, std::string name, const toml::table* table, const toml::source_region& where)
      : file_(file), name_(std::move(name)), table_(table), where_(where) {}

  const std::string& name() const { return name_; }
  bool present() const { return table_ != nullptr; }
  const toml::table* table() const { return table_; }

  // A ConfigError at `key` (at the section itself when the key is absent).
  [[noreturn]] void fail(const std::string& key, const std::string& message, const std::string& hint = {}) const;
  // A ConfigError at node n (an element of the array `key`).
  [[noreturn]] void fail_at(const toml::node& n, const std::string& key, const std::string& message,
                            const std::string& hint = {}) const;

  std::string qualified(const std::string& key) const { return name_.empty() ? key : name_ + "." + key; }
  const toml::node* node(const std::string& key) const { return table_ ? table_->get(key) : nullptr; }

  // Marks key as read; whether the table holds it.
  bool has(const std::string& key) {
    used_.insert(key);
    return node(key) != nullptr;
  }

  // The key's value into `out` when present (left unchanged when absent), type-checked.
  void get(const std::string& key, std::string& out);
  void get(const std::string& key, bool& out);
  void get(const std::string& key, std::int64_t& out);
  void get(const std::string& key, int& out);
  void get(const std::string& key, std::uint64_t& out);
  void get(const std::string& key, double& out);  // finite

  // The key's array, non-empty (nullptr when absent).
  const toml::array* array(const std::string& key);
  // An array of strings, each one of `allowed` (if given), without duplicates.
  void get_words(const std::string& key, std::vector<std::string>& out, const std::vector<std::string>& allowed);
  // An array of integers in [min_value, INT32_MAX], without duplicates.
  void get_ints(const std::string& key, std::vector<int>& out, std::int64_t min_value);

  // Every key that was not consumed is an error.
  void finish(const std::vector<std::string>& known_hint = {}) const;

  static std::string type_name(const toml::node& n);  // "a string", "an integer", ...

 private:
  const std::string& file_;
  std::string name_;
  const toml::table* table_;
  toml::source_region where_;
  std::set<std::string> used_;
};

// The table [name] of the file (an absent one reads as empty; anything but a table is an error).
Section open_section(const toml::table& root, const std::string& file, const std::string& name);

inline void require(bool ok, Section& s, const std::string& key, const std::string& message,
                    const std::string& hint = {}) {
  if (!ok) s.fail(key, message, hint);
}

// A name the grid gives (the study's, a custom policy's, a sweep's; names.hpp): nothing when it obeys
// the naming rule, else a ConfigError at `key` (or at `where`, for a name that is itself a key)
// saying what is wrong, with the rule as the hint. `what` names it in the message ("[study] name").
void require_name(Section& s, const std::string& key, const std::string& what, const std::string& name);
void require_name(const std::string& file, const toml::source_region& where, const std::string& key,
                  const std::string& what, const std::string& name);

// A word-valued key of a section (`current` when absent): one of `allowed`, else a ConfigError naming
// the key with the allowed words and the nearest one.
std::string read_word(Section& s, const std::string& key, const std::vector<std::string>& allowed,
                      const std::string& current);

// The value of `all` (an enum's values) whose word is `word`, else a ConfigError at `key`:
// message + "; allowed: " the enum's words, with the nearest one as the hint.
template <class E, std::size_t N>
E require_word(Section& s, const std::string& key, const E (&all)[N], const std::string& word,
               const std::string& message) {
  const std::vector<std::string> allowed = words(all);
  const auto it = std::find(allowed.begin(), allowed.end(), word);
  require(it != allowed.end(), s, key, message + "; allowed: " + join(allowed), suggestion(word, allowed));
  return all[it - allowed.begin()];
}

// read_word for an enum: the key's value among `all` (`current` when absent).
template <class E, std::size_t N>
E read_word(Section& s, const std::string& key, const E (&all)[N], E current) {
  std::string w(to_string(current));
  s.get(key, w);
  return require_word(s, key, all, w, "[" + s.name() + "] " + key + " = \"" + w + "\" is unknown");
}

}  // namespace fastudy::config_detail
