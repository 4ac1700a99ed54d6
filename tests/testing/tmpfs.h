// A small tmpfs mounted for one test, so that a write really fails with
// ENOSPC (disk-full tests of checkpoints and jobs). Mounting needs root with
// CAP_SYS_ADMIN; elsewhere Mount() says why not, and the test skips.
#ifndef MEGATRAIN_TESTS_TESTING_TMPFS_H_
#define MEGATRAIN_TESTS_TESTING_TMPFS_H_

#include <errno.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "tests/testing/temp_dir.h"

namespace megatrain::testing {

// Owns a tmpfs mount on a fresh temporary directory; the destructor
// unmounts it (lazily, MNT_DETACH) and removes the directory. Move-only by
// unique_ptr; not thread-safe.
//
// Example:
//   std::string why_not;
//   std::unique_ptr<ScopedTmpfs> disk = ScopedTmpfs::Mount(16 << 20, &why_not);
//   if (disk == nullptr) GTEST_SKIP() << why_not;
//   ... write under disk->path() until ENOSPC ...
class ScopedTmpfs {
 public:
  // Mounts a tmpfs of `size_bytes` (rounded up to pages by the kernel).
  // Returns nullptr and sets *why_not when this process may not mount
  // (not root, or no CAP_SYS_ADMIN in a container).
  static std::unique_ptr<ScopedTmpfs> Mount(int64_t size_bytes, std::string* why_not) {
    if (::geteuid() != 0) {
      *why_not = "needs root to mount a small tmpfs (a real ENOSPC); running as uid " +
                 std::to_string(::geteuid());
      return nullptr;
    }
    const std::string dir = MakeTempDir("tmpfs");
    const std::string options = "size=" + std::to_string(size_bytes) + ",mode=0755";
    if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
      *why_not = "mount -t tmpfs on " + dir + " failed: " + std::strerror(errno) +
                 " (no CAP_SYS_ADMIN in this container?)";
      ::rmdir(dir.c_str());
      return nullptr;
    }
    return std::unique_ptr<ScopedTmpfs>(new ScopedTmpfs(dir));
  }

  ScopedTmpfs(const ScopedTmpfs&) = delete;
  ScopedTmpfs& operator=(const ScopedTmpfs&) = delete;
  ~ScopedTmpfs() {
    ::umount2(path_.c_str(), MNT_DETACH);
    ::rmdir(path_.c_str());
  }

  // The mount point.
  const std::string& path() const { return path_; }

 private:
  explicit ScopedTmpfs(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace megatrain::testing

#endif  // MEGATRAIN_TESTS_TESTING_TMPFS_H_
