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

#include <cstdint>
#include <string>
#include <vector>

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

  // The contents of regular file `name` (opened O_NOFOLLOW | O_NONBLOCK,
  // so a link or FIFO is refused without blocking), at most `max_bytes`.
  // NOT_FOUND when missing; FAILED_PRECONDITION for a link or a
  // non-regular file; INVALID_ARGUMENT when larger than `max_bytes`.
  absl::StatusOr<std::string> ReadFileAt(absl::string_view name, int64_t max_bytes) const;

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

// Note [Confined reads]
// The daemon checks a job's input paths (model.hf_dir, data.*) at submission
// and at start, but the engine opens them later, by path. A user who can
// write inside a data root could swap a checked file or directory for a
// symbolic link in between and make the job read another user's data (or
// a FIFO, which would block the open). So the job's thread carries a
// ReadConfinement while it builds and runs the job (ScopedReadConfinement),
// and every input file the engine reads is opened with OpenInputFile,
// which, under a confinement:
//   - finds the root the path lies in (lexically: the daemon hands the
//     engine paths already resolved below their roots);
//   - opens it relative to that root's descriptor, held open since the job
//     started, with openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), plus
//     RESOLVE_NO_SYMLINKS for a root that allows no links (the job's
//     output_dir): a link that leads out of the root fails the open, and
//     nothing outside is ever opened. Where the kernel lacks openat2 the
//     file is opened by path and the descriptor's own path
//     (/proc/self/fd/N) must lie below the root, which checks the opened
//     file itself and so has no race either;
//   - refuses a path that lies below no root (PERMISSION_DENIED).
// Always (with or without a confinement) the open is O_NONBLOCK | O_NOCTTY
// and the descriptor must be a regular file (INVALID_ARGUMENT otherwise),
// so a FIFO, socket or device node never blocks the job nor is read.
// Symbolic links inside a data root that stay inside it (a Hugging Face
// cache's snapshots/ -> blobs/) keep working; absolute links are refused
// by RESOLVE_BENEATH. Readers that hand a path to a library (SentencePiece)
// pass "/proc/self/fd/N" of the opened file, which reopens that very file.
class ReadConfinement {
 public:
  // One directory reads may reach: `path` absolute and already resolved
  // (no symbolic link on the way, as PathPolicy resolves roots); with
  // `follow_links`, links below it that stay below it are followed.
  struct Root {
    std::string path;
    bool follow_links = true;
  };

  // Opens every root (O_DIRECTORY; its final component must not be a link)
  // and holds the descriptors, so that later renames of the roots' paths
  // change nothing. Errors as DirFd::Open, naming the root.
  static absl::StatusOr<ReadConfinement> Create(const std::vector<Root>& roots);

  ReadConfinement(ReadConfinement&&) noexcept = default;
  ReadConfinement& operator=(ReadConfinement&&) noexcept = default;

  // Opens regular file `path` (absolute, lexically below a root) read-only
  // as Note [Confined reads] describes; the caller owns the descriptor
  // (blocking mode, O_CLOEXEC). PERMISSION_DENIED naming the path when it
  // lies below no root or resolves out of its root (a link swapped in);
  // INVALID_ARGUMENT when it is not a regular file; NOT_FOUND when
  // missing; others from errno.
  absl::StatusOr<int> OpenFile(const std::string& path) const;

  // The roots, for messages.
  std::string RootList() const;

 private:
  struct Grant {
    std::string path;  // the root, without a trailing '/' (except "/")
    DirFd dir;
    bool follow_links = true;
  };
  explicit ReadConfinement(std::vector<Grant> grants) : grants_(std::move(grants)) {}

  std::vector<Grant> grants_;
};

// The status for errno `error` of operation `what` on `path`, with the
// message "<path>: <what>: <strerror>". The one errno-to-code table of file
// operations: ENOENT NOT_FOUND; ELOOP, ENOTDIR, EXDEV FAILED_PRECONDITION (a
// symbolic link or a non-directory in the way); EEXIST ALREADY_EXISTS;
// EACCES, EPERM, EROFS PERMISSION_DENIED; ENOSPC, EDQUOT, EFBIG
// RESOURCE_EXHAUSTED (disk full, quota, file size limit); anything else
// INTERNAL. Thread-safe.
absl::Status FileErrnoStatus(int error, absl::string_view path, absl::string_view what);

// Makes `confinement` the calling thread's for OpenInputFile until
// destroyed (then the previous one is restored). `confinement` must
// outlive the scope. Not copyable; use on one thread.
class ScopedReadConfinement {
 public:
  explicit ScopedReadConfinement(const ReadConfinement* confinement);
  ~ScopedReadConfinement();
  ScopedReadConfinement(const ScopedReadConfinement&) = delete;
  ScopedReadConfinement& operator=(const ScopedReadConfinement&) = delete;

 private:
  const ReadConfinement* previous_;
};

// Opens input file `path` for reading (Note [Confined reads]): through the
// calling thread's ReadConfinement when one is set, else by path; always
// non-blocking at open and refused unless a regular file. The caller owns
// the descriptor. Errors: NOT_FOUND, PERMISSION_DENIED ("<path>: open:
// ..." from errno, or outside the job's roots), INVALID_ARGUMENT ("<path>:
// not a regular file (a FIFO)"), others from errno; messages start with
// `path`.
absl::StatusOr<int> OpenInputFile(const std::string& path);

// The whole of input file `path` (OpenInputFile), at most `max_bytes`
// (INVALID_ARGUMENT naming the size and the cap beyond). Errors as
// OpenInputFile, or from read(2).
absl::StatusOr<std::string> ReadInputFile(const std::string& path, int64_t max_bytes);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIR_FD_H_
