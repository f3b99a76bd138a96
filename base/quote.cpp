// Shell words and CSV fields (quote.hpp).
#include "base/quote.hpp"

#include <algorithm>
#include <cstdio>
#include <cctype>
#include <cstring>

#include "base/error.hpp"

namespace fastudy {

namespace {
bool is_control(char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }
}  // namespace

std::string shell_quote(std::string_view s) {
  if (std::none_of(s.begin(), s.end(), is_control)) {
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
    } else if (is_control(c)) {
      q += "\\x";
      q += kHex[u >> 4];
      q += kHex[u & 15];
    } else {
      q += c;
    }
  }
  return q + "'";
}

std::string shell_word(std::string_view s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || (c != '\0' && std::strchr("_@%+=:,./-", c) != nullptr);
  });
  return plain ? std::string(s) : shell_quote(s);
}

std::string csv_field(std::string_view s) {
  const auto bad = std::find_if(s.begin(), s.end(), is_control);
  if (bad != s.end())
    throw Error("cannot write " + shell_quote(s) + " into a CSV field: it holds a control character (byte " +
                    std::to_string(static_cast<unsigned char>(*bad)) + "), and every line of fastudy's CSV files is one line",
                "names in a grid take letters, digits and _ . + - only");
  const bool quote = s.find_first_of(",\"") != std::string_view::npos ||
                     (!s.empty() && (s.front() == '#' || s.front() == ' ' || s.back() == ' '));
  if (!quote) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string one_line(std::string_view s) {
  std::string text(s);
  std::replace_if(text.begin(), text.end(), is_control, ' ');
  return text;
}

std::string escaped(std::string_view s) {
  std::string out;
  auto hex = [&](unsigned char c) {
    char text[8];
    std::snprintf(text, sizeof text, "\\x%02x", c);
    out += text;
  };
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (is_control(static_cast<char>(c))) {
      hex(c);
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      // A UTF-8 sequence is copied whole; a byte that starts none (or a sequence cut short) is \xHH.
      const std::size_t len = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
      bool whole = len > 0 && i + len <= s.size();
      for (std::size_t k = 1; whole && k < len; ++k) whole = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
      if (!whole) {
        hex(c);
        ++i;
        continue;
      }
      out.append(s.substr(i, len));
      i += len;
      continue;
    }
    ++i;
  }
  return out;
}

std::string quoted_name(std::string_view s) {
  constexpr std::size_t kShown = 200;
  return "'" + escaped(s.substr(0, kShown)) + (s.size() > kShown ? "'..." : "'");
}

std::string csv_text_field(std::string_view s) { return csv_field(one_line(s)); }

std::vector<std::string> csv_split_record(std::string_view text, std::size_t& at) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (; at < text.size(); ++at) {
    const char c = text[at];
    if (quoted) {
      if (c == '"' && at + 1 < text.size() && text[at + 1] == '"') {
        fields.back() += '"';
        ++at;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else if (c == '\n') {
      ++at;
      break;
    } else if (c != '\r') {
      fields.back() += c;
    }
  }
  return fields;
}

}  // namespace fastudy
