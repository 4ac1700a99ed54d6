// See dir_fd.h.
#include "engine/fs/dir_fd.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {
namespace {

// Trees deeper than this are not removed (a guard against a hostile tree
// exhausting the stack or the descriptors).
constexpr int kMaxTreeDepth = 64;

// FileErrnoStatus with, for a link or a non-directory in the way, the
// reason it is refused (Note [Directory descriptors]).
absl::Status FromErrno(int error, const std::string& path, absl::string_view what) {
  absl::Status status = FileErrnoStatus(error, path, what);
  if (error == ELOOP || error == ENOTDIR || error == EXDEV) {
    return absl::FailedPreconditionError(
        absl::StrCat(status.message(),
                     " (a symbolic link or non-directory is in the way; links are "
                     "never followed in a job's directory)"));
  }
  return status;
}

// INVALID_ARGUMENT unless `name` is one plain path component.
absl::Status CheckComponent(absl::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "': expected one path component (no '/', '.' or '..')"));
  }
  return absl::OkStatus();
}

std::string Join(const std::string& dir, absl::string_view name) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

// openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS; -1 with errno
// ENOSYS where the kernel (or a seccomp filter) does not have it.
int OpenAt2Beneath(int dir_fd, const std::string& relative) {
#ifdef SYS_openat2
  struct open_how how {};
  how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(::syscall(SYS_openat2, dir_fd, relative.c_str(), &how, sizeof(how)));
#else
  (void)dir_fd;
  (void)relative;
  errno = ENOSYS;
  return -1;
#endif
}

// Removes everything inside the directory open as `dir_fd` (which it
// closes), `depth` levels below the tree's top.
absl::Status RemoveContents(int dir_fd, const std::string& path, int depth) {
  if (depth > kMaxTreeDepth) {
    ::close(dir_fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": more than ", kMaxTreeDepth, " levels deep; not removed"));
  }
  DIR* dir = ::fdopendir(dir_fd);
  if (dir == nullptr) {
    const int error = errno;
    ::close(dir_fd);
    return FromErrno(error, path, "open directory");
  }
  std::vector<std::pair<std::string, bool>> entries;  // name, is a directory
  while (dirent* entry = ::readdir(dir)) {
    const absl::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat info {};
    if (::fstatat(::dirfd(dir), entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0) continue;
    entries.emplace_back(std::string(name), S_ISDIR(info.st_mode));
  }
  absl::Status status;
  for (const auto& [name, is_dir] : entries) {
    const std::string child_path = Join(path, name);
    if (is_dir) {
      const int child =
          ::openat(::dirfd(dir), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (child < 0) {
        if (errno != ENOENT) status.Update(FromErrno(errno, child_path, "open directory"));
        continue;
      }
      status.Update(RemoveContents(child, child_path, depth + 1));
    }
    if (::unlinkat(::dirfd(dir), name.c_str(), is_dir ? AT_REMOVEDIR : 0) != 0 && errno != ENOENT) {
      status.Update(FromErrno(errno, child_path, "remove"));
    }
  }
  ::closedir(dir);  // closes dir_fd
  return status;
}

// The calling thread's confinement (ScopedReadConfinement); nullptr: none.
thread_local const ReadConfinement* current_confinement = nullptr;

// `status`, or on a descriptor that is not a regular file, INVALID_ARGUMENT
// (and the descriptor closed). Clears O_NONBLOCK on success.
absl::StatusOr<int> RegularFileOnly(int fd, const std::string& path) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::ErrnoToStatus(error, absl::StrCat(path, ": fstat"));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    const char* kind = S_ISFIFO(info.st_mode)                           ? "a FIFO"
                       : S_ISSOCK(info.st_mode)                         ? "a socket"
                       : S_ISDIR(info.st_mode)                          ? "a directory"
                       : S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode) ? "a device node"
                                                                        : "not a file";
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file (", kind, ")"));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

constexpr int kInputOpenFlags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;

// True when `path` is `root` or lies below it (lexically).
bool IsBelow(absl::string_view path, absl::string_view root) {
  if (root == "/") return absl::StartsWith(path, "/");
  return path == root || (absl::StartsWith(path, root) && path[root.size()] == '/');
}

}  // namespace

absl::Status FileErrnoStatus(int error, absl::string_view path, absl::string_view what) {
  const std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(message);
    case ELOOP:
    case ENOTDIR:
    case EXDEV:
      return absl::FailedPreconditionError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<DirFd> DirFd::Open(const std::string& path) {
  if (path.empty() || path.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': must be an absolute path"));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return FromErrno(errno, path, "open directory");
  return DirFd(fd, path);
}

absl::StatusOr<DirFd> DirFd::OpenBeneath(const std::string& root, absl::string_view relative,
                                         Create create) {
  std::vector<absl::string_view> components = absl::StrSplit(relative, '/');
  for (absl::string_view component : components) {
    if (absl::Status status = CheckComponent(component); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(Join(root, relative), ": ", status.message()));
    }
  }
  absl::StatusOr<DirFd> dir = Open(root);
  if (!dir.ok()) return dir.status();
  if (create == Create::kNo) {
    const int fd = OpenAt2Beneath(dir->fd(), std::string(relative));
    if (fd >= 0) return DirFd(fd, Join(root, relative));
    if (errno != ENOSYS && errno != EPERM) {
      return FromErrno(errno, Join(root, relative), "open directory");
    }
  }
  for (absl::string_view component : components) {
    absl::StatusOr<DirFd> child = dir->OpenChild(component, create);
    if (!child.ok()) return child.status();
    dir = std::move(child);
  }
  return dir;
}

DirFd::DirFd(DirFd&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

DirFd& DirFd::operator=(DirFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

DirFd::~DirFd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<DirFd> DirFd::OpenChild(absl::string_view name, Create create) const {
  const std::string child_path = Join(path_, name);
  if (absl::Status status = CheckComponent(name); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(child_path, ": ", status.message()));
  }
  const std::string child(name);
  if (create == Create::kYes && ::mkdirat(fd_, child.c_str(), 0755) != 0 && errno != EEXIST) {
    return FromErrno(errno, child_path, "create directory");
  }
  const int fd = ::openat(fd_, child.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return FromErrno(errno, child_path, "open directory");
  return DirFd(fd, child_path);
}

absl::StatusOr<int> DirFd::CreateFileAt(absl::string_view name) const {
  const std::string file_path = Join(path_, name);
  if (absl::Status status = CheckComponent(name); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(file_path, ": ", status.message()));
  }
  const int fd = ::openat(fd_, std::string(name).c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return FromErrno(errno, file_path, "create file");
  return fd;
}

absl::Status DirFd::RenameAt(absl::string_view from, const DirFd& to_dir, absl::string_view to,
                             bool exchange) const {
  const std::string from_path = Join(path_, from);
  if (absl::Status status = CheckComponent(from); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(from_path, ": ", status.message()));
  }
  if (absl::Status status = CheckComponent(to); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(Join(to_dir.path_, to), ": ", status.message()));
  }
  if (::renameat2(fd_, std::string(from).c_str(), to_dir.fd_, std::string(to).c_str(),
                  exchange ? RENAME_EXCHANGE : 0) != 0) {
    return FromErrno(errno, from_path, absl::StrCat("rename to ", Join(to_dir.path_, to)));
  }
  return absl::OkStatus();
}

absl::Status DirFd::UnlinkAt(absl::string_view name, bool directory) const {
  const std::string entry_path = Join(path_, name);
  if (absl::Status status = CheckComponent(name); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(entry_path, ": ", status.message()));
  }
  if (::unlinkat(fd_, std::string(name).c_str(), directory ? AT_REMOVEDIR : 0) != 0 &&
      errno != ENOENT) {
    return FromErrno(errno, entry_path, "remove");
  }
  return absl::OkStatus();
}

absl::Status DirFd::RemoveTreeAt(absl::string_view name) const {
  absl::StatusOr<struct stat> info = StatAt(name);
  if (absl::IsNotFound(info.status())) return absl::OkStatus();
  if (!info.ok()) return info.status();
  if (!S_ISDIR(info->st_mode)) return UnlinkAt(name, /*directory=*/false);
  const std::string entry_path = Join(path_, name);
  const int fd =
      ::openat(fd_, std::string(name).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return FromErrno(errno, entry_path, "open directory");
  }
  absl::Status status = RemoveContents(fd, entry_path, 1);
  status.Update(UnlinkAt(name, /*directory=*/true));
  return status;
}

absl::StatusOr<struct stat> DirFd::StatAt(absl::string_view name) const {
  const std::string entry_path = Join(path_, name);
  if (absl::Status status = CheckComponent(name); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(entry_path, ": ", status.message()));
  }
  struct stat info {};
  if (::fstatat(fd_, std::string(name).c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) {
    return FromErrno(errno, entry_path, "stat");
  }
  return info;
}

absl::StatusOr<std::string> DirFd::ReadFileAt(absl::string_view name, int64_t max_bytes) const {
  const std::string file_path = Join(path_, name);
  if (absl::Status status = CheckComponent(name); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(file_path, ": ", status.message()));
  }
  int fd;
  do {
    fd = ::openat(fd_, std::string(name).c_str(), kInputOpenFlags | O_NOFOLLOW);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return FromErrno(errno, file_path, "open file");
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(file_path, ": not a regular file"));
  }
  if (info.st_size > max_bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(file_path, ": ", info.st_size, " bytes; at most ", max_bytes, " are read"));
  }
  std::string text(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::pread(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return FromErrno(error, file_path, "read");
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(done);
  return text;
}

absl::Status DirFd::Fsync() const {
  if (::fsync(fd_) != 0) return FromErrno(errno, path_, "fsync directory");
  return absl::OkStatus();
}

std::string DirFd::IoPath(absl::string_view name) const {
  std::string io_path = absl::StrCat("/proc/self/fd/", fd_);
  if (!name.empty()) absl::StrAppend(&io_path, "/", name);
  return io_path;
}

absl::StatusOr<ReadConfinement> ReadConfinement::Create(const std::vector<Root>& roots) {
  std::vector<Grant> grants;
  for (const Root& root : roots) {
    std::string path = root.path;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    MEGATRAIN_ASSIGN_OR_RETURN(DirFd dir, DirFd::Open(path));
    grants.push_back(Grant{std::move(path), std::move(dir), root.follow_links});
  }
  return ReadConfinement(std::move(grants));
}

std::string ReadConfinement::RootList() const {
  std::vector<std::string> paths;
  for (const Grant& grant : grants_) paths.push_back(grant.path);
  return absl::StrJoin(paths, ", ");
}

absl::StatusOr<int> ReadConfinement::OpenFile(const std::string& path) const {
  // The longest root the path lies in.
  const Grant* grant = nullptr;
  for (const Grant& candidate : grants_) {
    if (IsBelow(path, candidate.path) &&
        (grant == nullptr || candidate.path.size() > grant->path.size())) {
      grant = &candidate;
    }
  }
  if (grant == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": lies outside the directories this job may read (", RootList(), ")"));
  }
  absl::string_view below = absl::string_view(path).substr(grant->path.size());
  while (!below.empty() && below.front() == '/') below.remove_prefix(1);
  const std::string relative = below.empty() ? std::string(".") : std::string(below);
  const std::string escaped = absl::StrCat(
      path, ": resolves outside ", grant->path,
      grant->follow_links ? " (a symbolic link leads out of it; was one swapped in after the job "
                            "was checked?)"
                          : " or through a symbolic link (links are never followed there)");
#ifdef SYS_openat2
  struct open_how how {};
  how.flags = kInputOpenFlags;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  if (!grant->follow_links) how.resolve |= RESOLVE_NO_SYMLINKS;
  int fd;
  do {
    fd = static_cast<int>(
        ::syscall(SYS_openat2, grant->dir.fd(), relative.c_str(), &how, sizeof(how)));
  } while (fd < 0 && errno == EINTR);
  if (fd >= 0) return RegularFileOnly(fd, path);
  if (errno == EXDEV || errno == ELOOP) return absl::PermissionDeniedError(escaped);
  if (errno != ENOSYS && errno != EPERM) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": open"));
  }
#endif
  // No openat2: open through the root's descriptor, then check where the
  // opened file really is (Note [Confined reads]).
  const int flags = kInputOpenFlags | (grant->follow_links ? 0 : O_NOFOLLOW);
  int opened;
  do {
    opened = ::openat(grant->dir.fd(), relative.c_str(), flags);
  } while (opened < 0 && errno == EINTR);
  if (opened < 0) {
    if (errno == ELOOP) return absl::PermissionDeniedError(escaped);
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": open"));
  }
  char real[4096];
  const std::string link = absl::StrCat("/proc/self/fd/", opened);
  const ssize_t length = ::readlink(link.c_str(), real, sizeof(real) - 1);
  if (length <= 0 || !IsBelow(absl::string_view(real, static_cast<size_t>(length)), grant->path)) {
    ::close(opened);
    return absl::PermissionDeniedError(escaped);
  }
  return RegularFileOnly(opened, path);
}

ScopedReadConfinement::ScopedReadConfinement(const ReadConfinement* confinement)
    : previous_(current_confinement) {
  current_confinement = confinement;
}

ScopedReadConfinement::~ScopedReadConfinement() { current_confinement = previous_; }

absl::StatusOr<int> OpenInputFile(const std::string& path) {
  if (current_confinement != nullptr) return current_confinement->OpenFile(path);
  int fd;
  do {
    fd = ::open(path.c_str(), kInputOpenFlags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": open"));
  return RegularFileOnly(fd, path);
}

absl::StatusOr<std::string> ReadInputFile(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<int> fd = OpenInputFile(path);
  if (!fd.ok()) return fd.status();
  struct stat info {};
  if (::fstat(*fd, &info) != 0 || info.st_size > max_bytes) {
    ::close(*fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", info.st_size, " bytes; at most ", max_bytes, " are read"));
  }
  std::string text(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(*fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(*fd);
      return absl::ErrnoToStatus(error, absl::StrCat(path, ": read"));
    }
    if (n == 0) break;  // shrank since fstat
    done += static_cast<size_t>(n);
  }
  ::close(*fd);
  text.resize(done);
  return text;
}

}  // namespace megatrain::engine
