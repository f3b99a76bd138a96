#include "base/number.hpp"

#include <cstdio>
#include <cstdlib>

namespace fastudy {

std::string number_text(double v, int digits) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string number_text(double v) { return number_text(v, 17); }

std::string shortest_number_text(double v) {
  for (int digits = 1; digits < 17; ++digits) {
    const std::string s = number_text(v, digits);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return number_text(v);
}

}  // namespace fastudy
