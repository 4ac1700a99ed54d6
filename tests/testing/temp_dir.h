// A fresh directory under GoogleTest's temp dir, for tests that write files
// (never into the repository).
#ifndef MEGATRAIN_TESTS_TESTING_TEMP_DIR_H_
#define MEGATRAIN_TESTS_TESTING_TEMP_DIR_H_

#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

namespace megatrain::testing {

// Creates `<TempDir>/<prefix>.XXXXXX` with mkdtemp and returns its path;
// records a test failure if it cannot.
inline std::string MakeTempDir(const std::string& prefix = "megatrain") {
  std::string pattern = ::testing::TempDir() + "/" + prefix + ".XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr) << "mkdtemp " << pattern;
  return pattern;
}

// Names in `dir` (not "." and ".."), sorted; empty if it cannot be read.
inline std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// Writes `size` bytes at `data` to `path` (truncating); records a failure
// if the write fails.
inline void WriteFileBytes(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  EXPECT_TRUE(out.good()) << path;
}
inline void WriteFileBytes(const std::string& path, const std::string& bytes) {
  WriteFileBytes(path, bytes.data(), bytes.size());
}
inline void WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  WriteFileBytes(path, bytes.data(), bytes.size());
}

}  // namespace megatrain::testing

#endif  // MEGATRAIN_TESTS_TESTING_TEMP_DIR_H_
