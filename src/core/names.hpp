// fastudy's one naming rule, for every name that reaches a path, a CSV field, a TOML string, a shell
// script or an HDF5 attribute: the study's name, custom policy names, microbenchmark sweep names, the
// variant ids built from axis values, and any name or axis value a future section defines (an import's
// name, the values of a user-defined axis). Checked when the grid loads, so nothing of a study is
// written with a name that could leave the study's folder, break a CSV row or a TOML line, or end a
// comment in a script.
//
// The rule: 1 to kMaxNameLength characters (variant ids: kMaxVariantIdLength) from A-Z a-z 0-9 and
// _ . + -, the first a letter or a digit. So no '/', '\', '..' as a whole name, blank, quote, comma,
// semicolon, '=', '#', control character (a newline, NUL) or non-ASCII byte ever reaches an output.
//
//   if (auto problem = name_problem(policy)) fail("attention.policies." + policy, "policy " + *problem);
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace fastudy {

inline constexpr std::size_t kMaxNameLength = 64;
// A variant id joins one token per axis; it is a folder name (OUT/checkpoints/<id>), which file systems
// allow up to 255 bytes.
inline constexpr std::size_t kMaxVariantIdLength = 200;

// nullopt when `name` obeys the rule; otherwise what is wrong with it, as the end of a sentence that
// starts with the name shown by printable_name ("is empty", "has 70 characters, more than 64",
// "holds '/' (character 3), which names may not"; "must begin with a letter or a digit").
std::optional<std::string> name_problem(std::string_view name, std::size_t max_length = kMaxNameLength);

// `name` quoted for a message on one line: "...", a control or non-ASCII byte as \xHH, a quote or a
// backslash escaped, the middle of a very long name left out.
std::string printable_name(std::string_view name);

// The rule in words, for hints: "1 to 64 characters from A-Z a-z 0-9 _ . + -, beginning with a letter or
// a digit".
std::string naming_rule(std::size_t max_length = kMaxNameLength);

}  // namespace fastudy
