#include "base/number.hpp"

#include <cstdio>

namespace fastudy {

std::string number_text(double v, int digits) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string number_text(double v) { return number_text(v, 17); }

}  // namespace fastudy
