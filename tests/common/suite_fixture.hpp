// A test suite whose files are made once, in SetUpTestSuite (a Python script writing fixtures, special
// files): GoogleTest skips every test of a suite whose SetUpTestSuite records any failure, so a broken
// fixture would pass as "skipped". SuiteFixture keeps the first problem instead, and each test fails
// in SetUp() naming it.
//   class Import : public testing_fixture::SuiteFixture<Import> { static void SetUpTestSuite() {
//     if (!run_fixture_script(cmd)) return; ... if (::mkfifo(...) != 0) return fixture_problem("mkfifo ..."); } };
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace fastudy::testing_fixture {

template <class Suite>  // one set of statics per suite
class SuiteFixture : public ::testing::Test {
 protected:
  // Runs `cmd` with the shell; false (and the problem kept) when it fails.
  static bool run_fixture_script(const std::string& cmd) {
    if (std::system(cmd.c_str()) == 0) return true;
    fixture_problem("the fixture script failed: " + cmd);
    return false;
  }
  // Keeps the first problem of the suite's set-up.
  static void fixture_problem(const std::string& what) {
    if (problem_.empty()) problem_ = what;
  }
  void SetUp() override { ASSERT_TRUE(problem_.empty()) << problem_; }

 private:
  static inline std::string problem_;
};

}  // namespace fastudy::testing_fixture
