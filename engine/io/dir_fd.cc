// See dir_fd.h.
#include "engine/io/dir_fd.h"

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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace megatrain::engine {
namespace {

// Trees deeper than this are not removed (a guard against a hostile tree
// exhausting the stack or the descriptors).
constexpr int kMaxTreeDepth = 64;

absl::Status FromErrno(int error, const std::string& path, absl::string_view what) {
  const std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(message);
    case ELOOP:
    case ENOTDIR:
    case EXDEV:
      // O_NOFOLLOW / RESOLVE_* met a symbolic link, or a component is not a
      // directory: the tree is not what the daemon made.
      return absl::FailedPreconditionError(
          absl::StrCat(message,
                       " (a symbolic link or non-directory is in the way; links are "
                       "never followed in a job's directory)"));
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
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

}  // namespace

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

absl::Status DirFd::Fsync() const {
  if (::fsync(fd_) != 0) return FromErrno(errno, path_, "fsync directory");
  return absl::OkStatus();
}

std::string DirFd::IoPath(absl::string_view name) const {
  std::string io_path = absl::StrCat("/proc/self/fd/", fd_);
  if (!name.empty()) absl::StrAppend(&io_path, "/", name);
  return io_path;
}

}  // namespace megatrain::engine
