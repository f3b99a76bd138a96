// What every libFuzzer harness of tests/fuzz shares: a scratch folder of its own (the readers take file
// paths), the input written there as a file, and the rule of a finding. A reader of untrusted bytes may
// refuse them only with the error its callers name for the user (fastudy::UsageError for a file
// another program wrote, fastudy::Error for a damaged study file); any other exception escapes the
// harness and libFuzzer reports it, as it reports a crash, a sanitizer error, a hang or an allocation
// past -rss_limit_mb / -malloc_limit_mb.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fastudy::fuzz {

// This process's scratch folder (under TMPDIR), made once and removed at exit.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/fastudy-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch(), ec);
    });
    return std::filesystem::path(pattern);
  }();
  return dir;
}

// Writes the bytes as scratch()/name and returns its path.
inline std::string write_input(const std::string& name, const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path p = scratch() / name;
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return p.string();
}

}  // namespace fastudy::fuzz
