// A fresh directory under GoogleTest's temp dir, for tests that write files
// (never into the repository).
#ifndef MEGATRAIN_TESTS_TESTING_TEMP_DIR_H_
#define MEGATRAIN_TESTS_TESTING_TEMP_DIR_H_

#include <dirent.h>
#include <ftw.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace megatrain::testing {

// Removes the tree at `path` with nftw(3), depth first, without following
// symbolic links; errors (a part a test made unreadable) are ignored.
// Tests use it, never std::filesystem::remove_all: Note [No
// std::filesystem::remove_all] in engine/fs/mapped_file.h (pip's
// libtorch.so interposes its own std::filesystem, whose remove_all jumped
// to address 0: every test binary that made a directory crashed at exit
// on the GPU machines).
inline void RemoveTestTree(const std::string& path) {
  ::nftw(
      path.c_str(),
      [](const char* name, const struct stat*, int, struct FTW*) {
        ::remove(name);
        return 0;  // go on past an entry that cannot be removed
      },
      /*nopenfd=*/16, FTW_DEPTH | FTW_PHYS);
}

namespace temp_dir_internal {

// The directories MakeTempDir made in this process, removed when the
// process exits (static destruction, after every test and its daemons
// have stopped), so that repeated runs do not fill the temp dir. Only the
// process that made them removes them: a forked child (a death test) that
// exits leaves them. MEGATRAIN_KEEP_TEST_DIRS=1 keeps them for a look.
class Made {
 public:
  void Add(std::string dir) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(std::move(dir));
  }
  ~Made() {
    const char* keep = ::getenv("MEGATRAIN_KEEP_TEST_DIRS");
    if (::getpid() != owner_ || (keep != nullptr && std::string(keep) == "1")) return;
    for (const std::string& dir : dirs_) RemoveTestTree(dir);
  }

 private:
  const pid_t owner_ = ::getpid();
  std::mutex mu_;
  std::vector<std::string> dirs_;
};

inline Made& MadeDirs() {
  static Made made;
  return made;
}

}  // namespace temp_dir_internal

// Creates `<TempDir>/<prefix>.XXXXXX` with mkdtemp and returns its path;
// records a test failure if it cannot. The directory and what is in it
// are removed when the process exits (temp_dir_internal::Made).
inline std::string MakeTempDir(const std::string& prefix = "megatrain") {
  std::string pattern =
      (std::filesystem::path(::testing::TempDir()) / (prefix + ".XXXXXX")).string();
  const bool made = ::mkdtemp(pattern.data()) != nullptr;
  EXPECT_TRUE(made) << "mkdtemp " << pattern;
  if (made) temp_dir_internal::MadeDirs().Add(pattern);
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
