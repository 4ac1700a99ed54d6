// A fresh directory under GoogleTest's temp dir, for tests that write files
// (never into the repository).
#ifndef MEGATRAIN_TESTS_TESTING_TEMP_DIR_H_
#define MEGATRAIN_TESTS_TESTING_TEMP_DIR_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace megatrain::testing {

// Creates `<TempDir>/<prefix>.XXXXXX` with mkdtemp and returns its path;
// records a test failure if it cannot.
inline std::string MakeTempDir(const std::string& prefix = "megatrain") {
  std::string pattern = ::testing::TempDir() + "/" + prefix + ".XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr) << "mkdtemp " << pattern;
  return pattern;
}

}  // namespace megatrain::testing

#endif  // MEGATRAIN_TESTS_TESTING_TEMP_DIR_H_
