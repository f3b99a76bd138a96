// Cross-check of wasserstein1() against scipy.stats.wasserstein_distance itself (Debian's python3-scipy,
// run through FASTUDY_PYTHON_EXE, or $FASTUDY_PYTHON if set): equal and unequal sizes, weights, ties, fp32 inputs. Skipped with a
// message when scipy is not importable. Label "scipy".
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/distance.hpp"

namespace fastudy {
namespace {

constexpr double kU64 = 0x1p-53;  // fp64 unit roundoff

struct Case {
  std::string name;
  std::vector<double> u, v, uw, vw;
  bool as_float = false;  // pass fp32 arrays to both sides
};

// How far two correct fp64 computations of W1 = w on support [lo, hi] can differ. Ours: <= 2^9 u w
// for equal sizes (tests/analysis/test_pairwise.cpp). Both sides compute CDFs as cumulative weights
// over a total: each CDF value is off by <= (m + 2) u absolutely (m = 1 without weights: i/n is one
// rounding; m = the array size with weights: a sequential cumulative sum), so each side's integral is
// off by <= 2 (m + 2) u (hi - lo); scipy's pairwise sum adds <= (log2(2n) + 1) u w < 2^5 u w.
double bound(double w, double lo, double hi, std::size_t m) {
  return 0x1p10 * kU64 * w + 4.0 * static_cast<double>(m + 2) * kU64 * (hi - lo);
}

void write(const std::filesystem::path& p, const std::vector<double>& x) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(double)));
}

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *status = -1;
    return out;
  }
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

TEST(Scipy, Wasserstein1MatchesScipy) {
  const char* env = std::getenv("FASTUDY_PYTHON");
  const std::string python = env && *env ? env : FASTUDY_PYTHON_EXE;
  int status = 0;
  run("'" + python + "' -c 'import scipy.stats' 2>/dev/null", &status);
  if (status != 0)
    GTEST_SKIP() << "scipy is not importable by " << python
                 << " (apt-get install python3-scipy); the scipy cross-check is skipped";

  std::mt19937_64 rng(2405);
  std::normal_distribution<double> normal(0.0, 0.02);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto draw = [&](std::size_t n) {
    std::vector<double> x(n);
    for (auto& v : x) v = normal(rng);
    return x;
  };
  auto weights = [&](std::size_t n) {
    std::vector<double> w(n);
    for (auto& v : w) v = unit(rng);
    return w;
  };
  std::vector<Case> cases;
  cases.push_back({"equal_sizes", draw(20000), draw(20000), {}, {}});
  cases.push_back({"unequal_sizes", draw(1000), draw(777), {}, {}});
  cases.push_back({"weighted", draw(500), draw(300), weights(500), weights(300)});
  cases.push_back({"one_side_weighted", draw(64), draw(64), {}, weights(64)});
  std::vector<double> ti(200), tj(150);
  for (auto& v : ti) v = std::floor(unit(rng) * 10);
  for (auto& v : tj) v = std::floor(unit(rng) * 12) - 1;
  cases.push_back({"ties", ti, tj, weights(200), {}});
  Case f{"fp32", draw(30000), draw(30000), {}, {}, true};
  for (auto& v : f.u) v = static_cast<float>(v);  // the exact fp32 values, stored as fp64
  for (auto& v : f.v) v = static_cast<float>(v);
  cases.push_back(f);

  const auto dir = std::filesystem::temp_directory_path() /
                   ("fastudy_scipy_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ostringstream script;
  script << "import numpy as np, scipy.stats as st\n"
         << "d = '" << dir.string() << "/'\n"
         << "def ld(n):\n"
         << "    import os\n"
         << "    return np.fromfile(d + n, dtype='<f8') if os.path.exists(d + n) else None\n";
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    const std::string p = "c" + std::to_string(k) + "_";
    write(dir / (p + "u"), c.u);
    write(dir / (p + "v"), c.v);
    if (!c.uw.empty()) write(dir / (p + "uw"), c.uw);
    if (!c.vw.empty()) write(dir / (p + "vw"), c.vw);
    const std::string cast = c.as_float ? ".astype(np.float32)" : "";
    script << "print(repr(float(st.wasserstein_distance(ld('" << p << "u')" << cast << ", ld('" << p << "v')"
           << cast << ", ld('" << p << "uw'), ld('" << p << "vw')))))\n";
  }
  std::ofstream(dir / "run.py") << script.str();
  const std::string out = run("'" + python + "' '" + (dir / "run.py").string() + "'", &status);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(status, 0) << "the scipy script failed:\n" << out;

  std::istringstream lines(out);
  for (const Case& c : cases) {
    double want = 0;
    ASSERT_TRUE(lines >> want) << "missing scipy output for " << c.name << ":\n" << out;
    double got;
    if (c.as_float) {
      const std::vector<float> uf(c.u.begin(), c.u.end()), vf(c.v.begin(), c.v.end());
      got = wasserstein1(uf, vf);
    } else {
      got = wasserstein1(c.u, c.v, c.uw, c.vw);
    }
    double lo = c.u[0], hi = c.u[0];
    for (const auto* x : {&c.u, &c.v})
      for (double v : *x) lo = std::min(lo, v), hi = std::max(hi, v);
    const std::size_t m = c.uw.empty() && c.vw.empty() ? 1 : std::max(c.u.size(), c.v.size());
    EXPECT_NEAR(got, want, bound(want, lo, hi, m)) << c.name;
    EXPECT_GT(want, 0.0) << c.name;
  }
}

}  // namespace
}  // namespace fastudy
