// /proc/PID/stat fields.
#include "base/proc.hpp"

#include <fstream>
#include <sstream>

namespace fastudy {

std::string proc_stat_field(long pid, int n) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!in || !std::getline(in, text)) return "";
  const std::size_t close = text.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return "";
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= n && rest >> field; ++i)
    if (i == n) return field;
  return "";
}

}  // namespace fastudy
