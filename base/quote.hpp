// How fastudy writes a string so that its reader takes it back as one unit, unchanged: a word for the
// shell (the commands it prints and the scripts it writes) and a field of a CSV file (every CSV it
// writes, and the reader of those it reads back itself).
//
//   shell_quote("it's")        -> 'it'\''s'          shell_word("a/b.toml") -> a/b.toml
//   csv_field("pc,evil")       -> "pc,evil"          csv_field("#x") -> "#x"   (a row never starts with '#')
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace fastudy {

// A word a shell reads back as `s`, on one line, for commands printed to paste and for scripts:
// '...' with ' written as '\'' (POSIX); when `s` holds a control character (a newline), bash's
// $'...' with it as \xHH instead, so that no quoted word ever spans lines (a comment stays one line).
std::string shell_quote(std::string_view s);
// `s` as is when it is a plain word (letters, digits and _@%+=:,./-), else shell_quote(s): the words
// of a command line as it is recorded (provenance, the lock, the sbatch script's "Regenerate:").
std::string shell_word(std::string_view s);

// One CSV field (RFC 4180) that csv_split_record and Python's csv module read back as `s`: as is when it
// is plain, else in double quotes (a comma, a double quote doubled, a leading '#' that a reader would
// take for a provenance line, a leading or trailing blank). A CSV line fastudy writes is always one
// line of text (readers may split a file into lines first): a control character (a line break, NUL) is
// refused with an Error naming it. Names that reach a CSV obey fastudy's naming rule, which allows none.
std::string csv_field(std::string_view s);
// Free text on one line (a status reason, a note, a lock record's command): every control character
// (a line break, NUL) becomes a blank.
std::string one_line(std::string_view s);
// `s` on one line, unambiguously, as UTF-8 text: a control character as \t, \n or \xHH, a byte that is
// no part of a UTF-8 sequence as \xHH, a backslash doubled (no two strings give the same text).
std::string escaped(std::string_view s);
// A name from a file another program wrote (a tensor's, a link's), for a message on one line: escaped()
// in single quotes, at most 200 bytes of it (then "..."): a name of any length or content never makes
// an error line long, multi-line or ambiguous.
std::string quoted_name(std::string_view s);
// Free text for a CSV field: csv_field(one_line(s)).
std::string csv_text_field(std::string_view s);
// Splits the CSV record that starts at `at` into its fields (quotes removed, "" read as ") and moves
// `at` past the record's line end; a quoted field may hold commas and quotes.
std::vector<std::string> csv_split_record(std::string_view text, std::size_t& at);

}  // namespace fastudy
