// The provenance header (provenance.hpp): every value on its line, the grid path and host names as
// shell words (base/quote.hpp), so that a newline in them cannot end the line or open a CSV row.
#include "src/core/provenance.hpp"

#include <unistd.h>

#include <ctime>
#include <sstream>

#include "base/quote.hpp"
#include "fastudy/version.hpp"

namespace fastudy {

std::string utc_now_iso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string this_host() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

Provenance make_provenance(const std::string& command, const std::string& grid_file, const std::string& config_hash) {
  Provenance p;
  p.version = FASTUDY_VERSION;
  p.git_sha = FASTUDY_GIT_SHA;
  p.command = command;
  p.grid_file = grid_file;
  p.config_hash = config_hash;
  p.hosts = {this_host()};
  p.started_utc = utc_now_iso8601();
  return p;
}

std::string Provenance::header() const {
  std::ostringstream os;
  os << "# " << tool << " " << version << " (git " << git_sha << ")\n";
  os << "# command: " << command << "\n";
  os << "# grid: " << shell_word(grid_file) << "\n";
  os << "# config_hash: " << config_hash << "\n";
  os << "# ranks: " << ranks << "\n";
  os << "# hosts:";
  for (const auto& h : hosts) os << ' ' << shell_word(h);
  os << "\n# started: " << started_utc << "\n";
  return os.str();
}

Provenance Provenance::parse(const std::string& text) {
  Provenance p;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# ", 0) != 0) continue;
    std::string body = line.substr(2);
    auto value_of = [&](const std::string& key) -> std::string { return body.substr(key.size()); };
    if (body.rfind("command: ", 0) == 0) p.command = value_of("command: ");
    else if (body.rfind("grid: ", 0) == 0) p.grid_file = value_of("grid: ");
    else if (body.rfind("config_hash: ", 0) == 0) p.config_hash = value_of("config_hash: ");
    else if (body.rfind("ranks: ", 0) == 0) p.ranks = std::stoi(value_of("ranks: "));
    else if (body.rfind("started: ", 0) == 0) p.started_utc = value_of("started: ");
    else if (body.rfind("hosts:", 0) == 0) {
      std::istringstream hs(body.substr(6));
      std::string h;
      while (hs >> h) p.hosts.push_back(h);
    } else if (body.rfind("fastudy ", 0) == 0) {
      std::istringstream vs(body.substr(8));
      std::string git;
      vs >> p.version >> git >> p.git_sha;
      if (!p.git_sha.empty() && p.git_sha.back() == ')') p.git_sha.pop_back();
    }
  }
  return p;
}

}  // namespace fastudy
