// The bounds of a TOML text checked before toml++ parses it (toml_bounds.hpp): its size, and the depth of
// its tables found by a scan of the text.
#include "src/core/toml_bounds.hpp"

#include <cstddef>
#include <string_view>
#include <vector>

#include "src/core/config.hpp"

namespace fastudy {
namespace {

// The deepest table a TOML text builds, and where, found by a scan of the text before it is parsed
// (toml++ recurses once per level of a dotted key or a table header: a key 100,000 levels deep
// overflows the stack). A level is a part of a table header ([a.b.c]: 3), a part of a dotted key
// (x.y = 1 in [a.b.c]: 5), an array or an inline table; strings and comments are skipped. An over-
// estimate never matters: a study's grid is a few levels deep.
struct TomlDepth {
  std::size_t depth = 0;
  int line = 1, column = 1;
};

TomlDepth toml_max_depth(std::string_view t) {
  TomlDepth worst;
  int line = 1;
  std::size_t line_start = 0;
  struct Open {
    char kind;        // '[' an array, '{' an inline table
    std::size_t at;   // the depth of the value it opens
  };
  std::vector<Open> open;
  std::size_t header = 0;  // the parts of the current [table] header
  std::size_t parts = 1;   // the parts of the key being read
  std::size_t cur = 0;     // the depth of the value being read
  bool key = true, line_head = true;
  auto note = [&](std::size_t depth, std::size_t at) {
    if (depth > worst.depth) worst = {depth, line, static_cast<int>(at - line_start + 1)};
  };
  auto newline = [&](std::size_t at) {
    ++line;
    line_start = at + 1;
  };
  // Skips the string that opens at i (basic or literal, one line or multi-line); i ends on its last quote.
  auto skip_string = [&](std::size_t& i) {
    const char q = t[i];
    const bool multi = t.substr(i, 3) == std::string_view(q == '"' ? "\"\"\"" : "'''");
    i += multi ? 3 : 1;
    for (; i < t.size(); ++i) {
      if (t[i] == '\n') {
        if (!multi) return;  // an unterminated string: the parser names it
        newline(i);
      } else if (q == '"' && t[i] == '\\') {
        if (i + 1 < t.size() && t[i + 1] == '\n') newline(i + 1);
        ++i;
      } else if (t[i] == q && (!multi || t.substr(i, 3) == std::string_view(q == '"' ? "\"\"\"" : "'''"))) {
        if (multi) i += 2;
        while (multi && i + 1 < t.size() && t[i + 1] == q) ++i;  // up to two quotes may end the content
        return;
      }
    }
  };
  for (std::size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '\n') {
      newline(i);
      if (open.empty()) key = true, line_head = true, parts = 1, cur = header;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') continue;
    if (c == '#') {
      while (i + 1 < t.size() && t[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '"' || c == '\'') {
      skip_string(i);
      line_head = false;
      continue;
    }
    if (line_head && open.empty() && c == '[') {  // a table header: [a.b.c] or [[a.b.c]]
      std::size_t p = 1;
      for (++i; i < t.size() && t[i] != '\n'; ++i) {
        if (t[i] == '"' || t[i] == '\'') skip_string(i);
        else if (t[i] == '.') ++p;
        else if (t[i] == ']') break;
      }
      header = p;
      note(header, i);
      while (i + 1 < t.size() && t[i + 1] == ']') ++i;
      line_head = key = false;
      continue;
    }
    line_head = false;
    if (key) {
      if (c == '.') {
        ++parts;
      } else if (c == '=') {
        cur = (open.empty() ? header : open.back().at) + parts;
        note(cur, i);
        key = false;
      } else if (c == '}' && !open.empty()) {  // an empty inline table, or a trailing comma
        cur = open.back().at;
        open.pop_back();
        key = false;
      }
      continue;
    }
    if (c == '[' || c == '{') {
      open.push_back({c, cur});
      if (c == '[') cur += 1, note(cur, i);
      else key = true, parts = 1;
    } else if ((c == ']' || c == '}') && !open.empty()) {
      cur = open.back().at;
      open.pop_back();
    } else if (c == ',' && !open.empty() && open.back().kind == '{') {
      key = true;
      parts = 1;
    }
  }
  return worst;
}

}  // namespace

void check_toml_bounds(const std::string& text, const std::string& file) {
  if (text.size() > kMaxGridBytes)
    throw ConfigError(file, 0, 0, "", "the grid has " + std::to_string(text.size()) + " bytes, more than the " +
                                          std::to_string(kMaxGridBytes) + " a grid may have",
                      "a grid lists settings and axis values; it is never this large");
  const TomlDepth d = toml_max_depth(text);
  if (d.depth > kMaxTomlDepth)
    throw ConfigError(file, d.line, d.column, "",
                      "TOML nested " + std::to_string(d.depth) + " levels deep (table headers, dotted keys, arrays and "
                      "inline tables), more than the " + std::to_string(kMaxTomlDepth) + " a grid may have",
                      "a grid's sections are a few levels deep, e.g. [attention.policies.NAME]");
}

}  // namespace fastudy
