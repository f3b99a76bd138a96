// The naming rule (names.hpp).
#include "src/core/names.hpp"

#include <cctype>

namespace fastudy {

namespace {

bool allowed(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u < 0x80 && (std::isalnum(u) || c == '_' || c == '.' || c == '+' || c == '-');
}

std::string hex_byte(unsigned char u) {
  static const char* const kHex = "0123456789abcdef";
  return std::string("\\x") + kHex[u >> 4] + kHex[u & 15];
}

}  // namespace

std::optional<std::string> name_problem(std::string_view name, std::size_t max_length) {
  if (name.empty()) return std::string("is empty");
  if (name.size() > max_length)
    return "has " + std::to_string(name.size()) + " characters, more than " + std::to_string(max_length);
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (allowed(name[i])) continue;
    const auto u = static_cast<unsigned char>(name[i]);
    const std::string what = u < 0x20 || u == 0x7f ? "a control character (" + hex_byte(u) + ")"
                             : u >= 0x80          ? "a non-ASCII byte (" + hex_byte(u) + ")"
                             : name[i] == ' '     ? std::string("a blank")
                                                  : "'" + std::string(1, name[i]) + "'";
    return "holds " + what + " at character " + std::to_string(i + 1) + ", which names may not";
  }
  if (!std::isalnum(static_cast<unsigned char>(name.front()))) return std::string("must begin with a letter or a digit");
  return std::nullopt;
}

std::string printable_name(std::string_view name) {
  constexpr std::size_t kShown = 40;  // characters kept at each end of a longer name
  std::string out = "\"";
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name.size() > 2 * kShown + 10 && i == kShown) {
      out += "...(" + std::to_string(name.size()) + " characters)...";
      i = name.size() - kShown;
    }
    const auto u = static_cast<unsigned char>(name[i]);
    if (name[i] == '"' || name[i] == '\\') out += std::string("\\") + name[i];
    else if (u < 0x20 || u >= 0x7f) out += hex_byte(u);
    else out += name[i];
  }
  return out + "\"";
}

std::string naming_rule(std::size_t max_length) {
  return "1 to " + std::to_string(max_length) + " characters from A-Z a-z 0-9 _ . + -, beginning with a letter or a digit";
}

}  // namespace fastudy
