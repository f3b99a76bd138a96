// The one text form of a floating-point number in fastudy's outputs (CSV, logs, TOML): 17 significant
// digits, which read back to the same double ("%.17g"), or fewer for logs meant for people.
#pragma once

#include <string>

namespace fastudy {

// Exact: strtod(number_text(v)) == v for every finite v.
std::string number_text(double v);
// `digits` significant digits ("%.*g"), e.g. 9 for a float read back exactly, 6 for a log line.
std::string number_text(double v, int digits);
// The fewest significant digits that read back to v (grid values in the resolved TOML: 0.001, not
// 0.0010000000000000000208).
std::string shortest_number_text(double v);

}  // namespace fastudy
