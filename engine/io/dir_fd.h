// DirFd: an open directory through which a job's files are created,
// renamed and deleted without following symbolic links, so that a link
// swapped into a job's directory cannot send a write or a delete outside it.
//
// Note [Directory descriptors]
// The daemon writes with its own permissions into directories that users
// may also write (their output directories). Path strings are resolved
// again by every system call, so a user who replaces `checkpoints/` or a
// temporary directory with a symbolic link between two calls could make the
// daemon write or delete anywhere it may. DirFd holds a descriptor of the
// directory instead and reaches every entry below it one component at a
// time relative to that descriptor (openat / mkdirat / renameat2 /
// unlinkat) with O_NOFOLLOW: a symbolic link met on the way fails the call
// (ELOOP / ENOTDIR, reported as FAILED_PRECONDITION naming the path) and is
// never followed. Where the kernel has openat2 (Linux 5.6), OpenBeneath
// resolves its whole relative path in one call with RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS; elsewhere it walks the
// components with O_NOFOLLOW, which refuses the same paths.
//
// Code that must open a file by path (AtomicFileWriter, mkdtemp) uses
// IoPath(): "/proc/self/fd/<fd>/<name>" resolves through the descriptor, not
// through the directory's path, so a later swap of that path changes
// nothing. The final component is still resolved by the callee; create new
// files with O_EXCL (which does not follow a final symbolic link).
//
// RemoveTreeAt deletes with unlinkat below descriptors opened O_NOFOLLOW,
// so a symbolic link inside the tree is removed as a link, never followed.
//
// Thread-safety: a DirFd is move-only and not synchronised; distinct
// objects may be used from distinct threads. Errors never throw; the
// destructor closes the descriptor and ignores a failure.
#ifndef MEGATRAIN_ENGINE_DIR_FD_H_
#define MEGATRAIN_ENGINE_DIR_FD_H_

#include <sys/stat.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace megatrain::engine {

class DirFd {
 public:
  // Whether OpenBeneath / OpenChild create missing directories (mode 0755
  // before umask).
  enum class Create { kNo, kYes };

  // Opens the existing directory `path` (absolute). Its ancestors are
  // resolved as usual (they are the operator's and were checked by the
  // daemon's path policy); its final component must not be a symbolic link.
  // NOT_FOUND when missing; FAILED_PRECONDITION when it is a symbolic link
  // or not a directory; PERMISSION_DENIED / INTERNAL for other errno.
  static absl::StatusOr<DirFd> Open(const std::string& path);

  // Opens (with Create::kYes, creating as needed) `relative` below the
  // directory `root`, never following a symbolic link below `root`.
  // `relative` is a '/'-separated path without "..", "." or empty
  // components (INVALID_ARGUMENT otherwise). Errors as Open, naming the
  // component that failed.
  //
  // Example:
  //   MEGATRAIN_ASSIGN_OR_RETURN(DirFd checkpoints,
  //       DirFd::OpenBeneath(output_dir, "checkpoints", DirFd::Create::kYes));
  static absl::StatusOr<DirFd> OpenBeneath(const std::string& root, absl::string_view relative,
                                           Create create);

  DirFd(DirFd&& other) noexcept;
  DirFd& operator=(DirFd&& other) noexcept;
  DirFd(const DirFd&) = delete;
  DirFd& operator=(const DirFd&) = delete;
  ~DirFd();

  // Opens child directory `name` (one component), without following a
  // symbolic link. Errors as OpenBeneath.
  absl::StatusOr<DirFd> OpenChild(absl::string_view name, Create create) const;

  // Creates regular file `name` (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0644
  // before umask) and returns its descriptor, which the caller owns.
  // ALREADY_EXISTS when `name` exists (also as a symbolic link).
  absl::StatusOr<int> CreateFileAt(absl::string_view name) const;

  // Renames entry `from` of this directory to `to` of `to_dir` (renameat2;
  // with `exchange`, RENAME_EXCHANGE swaps two existing entries). Symbolic
  // links are renamed as links, never followed.
  absl::Status RenameAt(absl::string_view from, const DirFd& to_dir, absl::string_view to,
                        bool exchange = false) const;

  // Removes entry `name`: a directory (must be empty) with `directory`,
  // else a file or symbolic link. A missing entry is OK.
  absl::Status UnlinkAt(absl::string_view name, bool directory) const;

  // Removes entry `name` and, for a directory, everything below it,
  // without following symbolic links. A missing entry is OK.
  absl::Status RemoveTreeAt(absl::string_view name) const;

  // lstat of entry `name` (fstatat with AT_SYMLINK_NOFOLLOW); NOT_FOUND
  // when missing.
  absl::StatusOr<struct stat> StatAt(absl::string_view name) const;

  // fsync(2) of the directory: its entries' changes become durable.
  absl::Status Fsync() const;

  // "/proc/self/fd/<fd>", or that followed by "/" `name`: a path that
  // resolves through this descriptor (Note [Directory descriptors]).
  std::string IoPath(absl::string_view name = "") const;

  // The path it was opened as, for messages.
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  DirFd(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  int fd_ = -1;
  std::string path_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIR_FD_H_
