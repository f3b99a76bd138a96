// libFuzzer: a grid file (TOML) loaded as `fastudy plan GRID` loads it (load_study: the bounded read,
// the nesting check before toml++ parses, the sections and the grid's expansion). A grid is refused
// only with a ConfigError or UsageError.
#include "base/error.hpp"
#include "fuzz_common.hpp"
#include "src/core/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = fastudy::fuzz::write_input("grid.toml", data, size);
  try {
    (void)fastudy::load_study(path);
  } catch (const fastudy::ConfigError&) {
  } catch (const fastudy::UsageError&) {
  }
  return 0;
}
