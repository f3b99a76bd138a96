// A structure-aware fuzz of grid.toml in process (issue 15): a few hundred mutations (see per_grid) of the ready
// grids must each parse or throw a ConfigError/UsageError (the CLI's exit 2), never another exception
// or a crash. The script bench/reliability/grid_fuzz.py runs thousands through the command line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "base/error.hpp"
#include "src/core/config.hpp"

namespace fastudy {
namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Odd values for the right-hand side of `key = value`: wrong types, extremes, odd strings, lists.
const char* const kValues[] = {"0", "-1", "1", "3", "9223372036854775807", "-9223372036854775808", "1e308",
                               "-1e-308", "nan", "inf", "-inf", "0.5", "true", "\"\"", "\"fp16\"", "\"nope\"",
                               "\"\\u00e9\\u4e2d\"", "[]", "[1, 2, 3]", "[\"flash\", \"flash\"]", "[[8, 8], [0, 1]]",
                               "{ a = 1 }", "[\"fp33\"]", "[0]", "[-4]", "\"../x\"", "65536", "2147483648"};
const char* const kKeys[] = {"vocab", "d_model", "heads", "layers", "seq_len", "steps", "batch", "block_q",
                             "block_kv", "precision", "attention", "seed", "kind", "path", "token_bytes",
                             "memory_check", "ranks_per_variant", "checkpoint_every", "seq_lens", "bogus"};
const char* const kSections[] = {"[study]", "[grid]", "[model]", "[data]", "[train]", "[attention]",
                                 "[microbench]", "[reduce]", "[bogus]", "[attention.policies.p]", "[[microbench.sweeps]]"};

std::string mutate(std::vector<std::string> lines, std::mt19937& rng) {
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  const int edits = 1 + static_cast<int>(pick(3));
  for (int e = 0; e < edits && !lines.empty(); ++e) {
    const std::size_t i = pick(lines.size());
    std::string& line = lines[i];
    const std::size_t eq = line.find(" = ");
    switch (pick(8)) {
      case 0:  // a value of another type or at an extreme
        if (eq != std::string::npos) line = line.substr(0, eq) + " = " + kValues[pick(std::size(kValues))];
        break;
      case 1:  // a key removed
        lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      case 2:  // a key added (known or not, possibly a duplicate)
        lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i),
                     std::string(kKeys[pick(std::size(kKeys))]) + " = " + kValues[pick(std::size(kValues))]);
        break;
      case 3:  // a section header changed or added
        lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), kSections[pick(std::size(kSections))]);
        break;
      case 4:  // a line duplicated
        lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), line);
        break;
      case 5:  // a key misspelt
        if (eq != std::string::npos && eq > 0) line[pick(eq)] = 'x';
        break;
      case 6:  // a byte inserted
        line.insert(pick(line.size() + 1), 1, "\"'[]=\\\t#\x01\xe9"[pick(11)]);
        break;
      default:  // the file cut short
        lines.resize(i);
        if (!lines.empty()) lines.back().resize(pick(lines.back().size() + 1));
        break;
    }
  }
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  return text;
}

// FASTUDY_FUZZ_PER_GRID=N runs N mutations of each grid (default 100: 400 in all) — thousands for a
// longer run, e.g. under a -DFASTUDY_SANITIZE=address,undefined build.
int per_grid() {
  const char* n = std::getenv("FASTUDY_FUZZ_PER_GRID");
  return n && std::atoi(n) > 0 ? std::atoi(n) : 100;
}

TEST(GridFuzz, MutatedGridsParseOrGiveAConfigError) {
  std::mt19937 rng(15);
  const int per = per_grid();
  int parsed = 0, refused = 0;
  for (const char* grid : {"ci.toml", "quick.toml", "microbench.toml", "paper.toml"}) {
    const std::vector<std::string> lines = lines_of(std::string(FASTUDY_CONFIGS) + "/" + grid);
    ASSERT_FALSE(lines.empty()) << grid;
    for (int k = 0; k < per; ++k) {
      const std::string text = mutate(lines, rng);
      try {
        const Study st = parse_study(text, grid);
        ++parsed;
        EXPECT_FALSE(st.variants.empty());
      } catch (const UsageError&) {
        ++refused;
      } catch (const ConfigError&) {
        ++refused;
      } catch (const std::exception& e) {
        ADD_FAILURE() << grid << " mutation " << k << ": " << typeid(e).name() << ": " << e.what() << "\n" << text;
      }
    }
  }
  EXPECT_EQ(parsed + refused, 4 * per);
  EXPECT_GT(refused, per);  // the mutations mostly hit something the validation must refuse
  RecordProperty("parsed", parsed);
  RecordProperty("refused", refused);
}

}  // namespace
}  // namespace fastudy
