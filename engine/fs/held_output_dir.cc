// See held_output_dir.h.
#include "engine/fs/held_output_dir.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;

// The calling thread's held output directory (ScopedHeldOutputDir).
thread_local const HeldOutputDir* current_held = nullptr;

// `path` lexically normal, without a trailing '/' (except "/").
std::string Normal(const std::string& path) {
  std::string out = fs::path(path).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

// The part of `path` below `root` ("" when equal), or nullopt when `path`
// does not lie below `root` (both normal).
std::optional<std::string> Below(const std::string& path, const std::string& root) {
  if (path == root) return std::string();
  if (root == "/") return path.substr(1);
  if (absl::StartsWith(path, root) && path.size() > root.size() && path[root.size()] == '/') {
    return path.substr(root.size() + 1);
  }
  return std::nullopt;
}

// Walks `relative` below `root` one component at a time (DirFd::OpenChild:
// O_NOFOLLOW), creating as asked.
absl::StatusOr<DirFd> Walk(const DirFd& root, const std::string& relative, DirFd::Create create) {
  std::optional<DirFd> current;
  const DirFd* at = &root;
  for (absl::string_view component : absl::StrSplit(relative, '/', absl::SkipEmpty())) {
    absl::StatusOr<DirFd> child = at->OpenChild(component, create);
    if (!child.ok()) return child.status();
    current = std::move(*child);
    at = &*current;
  }
  if (current.has_value()) return std::move(*current);
  // `relative` is empty: the root itself, as a second descriptor.
  return DirFd::Open(root.path());
}

absl::StatusOr<struct stat> StatOf(const DirFd& dir) {
  struct stat info {};
  if (::fstat(dir.fd(), &info) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(dir.path(), ": fstat"));
  }
  return info;
}

}  // namespace

absl::StatusOr<HeldOutputDir> HeldOutputDir::Open(const std::string& output_dir,
                                                  const std::vector<std::string>& roots,
                                                  DirFd::Create create) {
  if (output_dir.empty() || output_dir.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("output_dir: '", output_dir, "': must be an absolute path"));
  }
  for (absl::string_view component : absl::StrSplit(output_dir, '/')) {
    if (component == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("output_dir: '", output_dir, "': may not contain '..'"));
    }
  }
  const std::string path = Normal(output_dir);
  std::string best_root;
  std::optional<std::string> relative;
  for (const std::string& root : roots) {
    const std::string normal_root = Normal(root);
    std::optional<std::string> below = Below(path, normal_root);
    if (below.has_value() && (!relative.has_value() || normal_root.size() > best_root.size())) {
      best_root = normal_root;
      relative = below;
    }
  }
  std::optional<DirFd> root_fd;
  absl::StatusOr<DirFd> dir = absl::UnknownError("unset");
  if (relative.has_value()) {
    // The root is the operator's (a --output_roots entry, or the jobs
    // directory, made on first use).
    std::error_code ec;
    if (create == DirFd::Create::kYes) fs::create_directories(best_root, ec);
    absl::StatusOr<DirFd> opened_root = DirFd::Open(best_root);
    if (!opened_root.ok()) return Annotate(opened_root.status(), "output root");
    root_fd = std::move(*opened_root);
    dir = Walk(*root_fd, *relative, create);
  } else {
    std::error_code ec;
    if (create == DirFd::Create::kYes) fs::create_directories(path, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("output_dir: cannot create '", path, "': ", ec.message()));
    }
    dir = DirFd::Open(path);
  }
  if (!dir.ok()) return Annotate(dir.status(), absl::StrCat("output_dir '", output_dir, "'"));
  absl::StatusOr<struct stat> info = StatOf(*dir);
  if (!info.ok()) return info.status();
  return HeldOutputDir(std::move(root_fd), relative.value_or(""), std::move(*dir), info->st_dev,
                       info->st_ino);
}

absl::Status HeldOutputDir::Verify() const {
  if (!root_.has_value()) return absl::OkStatus();
  absl::StatusOr<DirFd> again = Walk(*root_, relative_, DirFd::Create::kNo);
  absl::StatusOr<struct stat> info =
      again.ok() ? StatOf(*again) : absl::StatusOr<struct stat>(again.status());
  if (info.ok() && info->st_dev == device_ && info->st_ino == inode_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "output_dir '", path(),
      "' no longer leads to the job's directory (a directory on the way was moved, removed or "
      "replaced by a symbolic link",
      info.ok() ? "" : absl::StrCat(": ", info.status().message()),
      "); nothing more is written there (Note [Held output directory])"));
}

ScopedHeldOutputDir::ScopedHeldOutputDir(const HeldOutputDir* held) : previous_(current_held) {
  current_held = held;
}

ScopedHeldOutputDir::~ScopedHeldOutputDir() { current_held = previous_; }

absl::StatusOr<DirFd> OpenOutputSubdir(const std::string& output_dir, absl::string_view relative,
                                       DirFd::Create create) {
  if (current_held != nullptr && Normal(current_held->path()) == Normal(output_dir)) {
    if (absl::Status verified = current_held->Verify(); !verified.ok()) return verified;
    return Walk(current_held->dir(), std::string(relative), create);
  }
  if (create == DirFd::Create::kYes) {
    std::error_code ec;
    fs::create_directories(output_dir, ec);
    if (ec) {
      return absl::ErrnoToStatus(ec.value(), absl::StrCat(output_dir, ": create directory"));
    }
  }
  return DirFd::OpenBeneath(output_dir, relative, create);
}

}  // namespace megatrain::engine
