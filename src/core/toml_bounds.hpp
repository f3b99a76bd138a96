// The bounds of a grid or study.toml text, checked before the TOML parser sees it: at most kMaxGridBytes
// bytes, and tables nested at most kMaxTomlDepth levels (src/core/config.hpp). toml++ recurses once per
// level of a dotted key or a table header, so a key 100,000 levels deep would overflow its stack.
#pragma once

#include <string>

namespace fastudy {

// Throws ConfigError naming `file` (and the line and column of the deepest level) when `text` breaks a bound.
void check_toml_bounds(const std::string& text, const std::string& file);

}  // namespace fastudy
