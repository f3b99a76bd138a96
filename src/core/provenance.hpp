// The provenance header every run prints and stores: version, git SHA, config hash, ranks, hosts.
// Written as "# key: value" lines so it can open a CSV file and be read back by the report.
#pragma once

#include <string>
#include <vector>

namespace fastudy {

struct Provenance {
  std::string tool = "fastudy";
  std::string version;      // FASTUDY_VERSION
  std::string git_sha;      // FASTUDY_GIT_SHA at build time
  std::string command;      // the command line
  std::string grid_file;    // written as a shell word (base/quote.hpp): one line whatever the path holds
  std::string config_hash;  // Study::hash
  int ranks = 1;
  std::vector<std::string> hosts;  // distinct host names, in rank order of first appearance
  std::string started_utc;         // ISO 8601

  // "# fastudy 0.1.0 (git abc123)\n# command: ...\n# config_hash: ...\n# ranks: 2 on host1\n..."
  std::string header() const;
  // Parse a header written by header() (lines starting with "# "); unknown lines are ignored. The grid
  // and the hosts come back as written (shell words).
  static Provenance parse(const std::string& text);
};

// The provenance of this process before any MPI information is known (ranks = 1, this host).
Provenance make_provenance(const std::string& command, const std::string& grid_file, const std::string& config_hash);

std::string utc_now_iso8601();
std::string this_host();

}  // namespace fastudy
