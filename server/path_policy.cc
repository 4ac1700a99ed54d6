// See path_policy.h.
#include "server/path_policy.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/status_macros.h"

namespace megatrain::server {
namespace {

namespace fs = std::filesystem;

// realpath(3) into a std::string; errno set on failure.
bool RealPath(const std::string& path, std::string* resolved) {
  char buffer[PATH_MAX];
  if (::realpath(path.c_str(), buffer) == nullptr) return false;
  *resolved = buffer;
  return true;
}

// True when `path` (resolved) is `root` or lies below it.
bool IsBeneath(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  if (path.size() < root.size() || path.compare(0, root.size(), root) != 0) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

// INVALID_ARGUMENT for a relative path or a ".." component.
absl::Status CheckSyntax(absl::string_view field, absl::string_view path) {
  if (path.empty() || path.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be an absolute path, got '", path, "'"));
  }
  for (absl::string_view component : absl::StrSplit(path, '/')) {
    if (component == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": '..' components are not allowed, got '", path, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBeneath(absl::string_view field, const std::string& path,
                          const std::vector<std::string>& roots, absl::string_view kind,
                          absl::string_view flag) {
  MEGATRAIN_RETURN_IF_ERROR(CheckSyntax(field, path));
  if (roots.empty()) return absl::OkStatus();
  MEGATRAIN_ASSIGN_OR_RETURN(std::string resolved, ResolvePathBeneath(field, path));
  for (const std::string& root : roots) {
    if (IsBeneath(resolved, root)) return absl::OkStatus();
  }
  const std::string normal = fs::path(path).lexically_normal().string();
  const std::string resolves =
      resolved == normal ? std::string() : absl::StrCat(" resolves to '", resolved, "', which");
  return absl::PermissionDeniedError(absl::StrCat(field, ": '", path, "'", resolves,
                                                  " is outside the daemon's ", kind, " roots (",
                                                  absl::StrJoin(roots, ", "), "; ", flag, ")"));
}

absl::StatusOr<std::vector<std::string>> ResolveRoots(const std::vector<std::string>& roots,
                                                      absl::string_view flag) {
  std::vector<std::string> resolved_roots;
  for (const std::string& root : roots) {
    if (root.empty() || root.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": roots must be absolute paths, got '", root, "'"));
    }
    std::string resolved;
    if (!RealPath(root, &resolved)) {
      const int error = errno;
      if (error == ENOENT) {
        return absl::NotFoundError(absl::StrCat(flag, ": '", root, "' does not exist"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat(flag, ": cannot resolve '", root, "': ", std::strerror(error)));
    }
    struct stat info {};
    if (::stat(resolved.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, ": '", root, "' is not a directory"));
    }
    resolved_roots.push_back(std::move(resolved));
  }
  return resolved_roots;
}

}  // namespace

std::vector<std::string> SplitPathList(absl::string_view list) {
  std::vector<std::string> paths;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (!part.empty()) paths.emplace_back(part);
  }
  return paths;
}

absl::StatusOr<std::string> ResolvePathBeneath(absl::string_view field, const std::string& path) {
  // Walk up from `path` until realpath succeeds; the components walked over
  // do not exist yet (or are dangling links, refused below).
  fs::path existing = fs::path(path).lexically_normal();
  std::vector<std::string> missing;  // innermost first
  while (true) {
    std::string resolved;
    if (RealPath(existing.string(), &resolved)) {
      fs::path result(resolved);
      for (auto it = missing.rbegin(); it != missing.rend(); ++it) result /= *it;
      return result.string();
    }
    const int error = errno;
    if (error != ENOENT && error != ENOTDIR) {
      return absl::PermissionDeniedError(absl::StrCat(
          field, ": cannot resolve '", existing.string(), "': ", std::strerror(error)));
    }
    struct stat info {};
    if (::lstat(existing.c_str(), &info) == 0 && S_ISLNK(info.st_mode)) {
      return absl::PermissionDeniedError(absl::StrCat(
          field, ": '", existing.string(), "' is a dangling symbolic link (in '", path, "')"));
    }
    if (!existing.has_relative_path()) {
      // "/" itself failed to resolve: nothing sensible is left.
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": cannot resolve '", path, "': ", std::strerror(error)));
    }
    // "/a/b/" has an empty filename; lexically_normal keeps a trailing
    // slash, so skip it.
    if (!existing.filename().empty()) missing.push_back(existing.filename().string());
    existing = existing.parent_path();
  }
}

absl::StatusOr<PathPolicy> PathPolicy::Create(const std::vector<std::string>& data_roots,
                                              const std::vector<std::string>& output_roots,
                                              absl::string_view data_flag,
                                              absl::string_view output_flag) {
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<std::string> data, ResolveRoots(data_roots, data_flag));
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<std::string> output,
                             ResolveRoots(output_roots, output_flag));
  return PathPolicy(std::move(data), std::move(output));
}

absl::Status PathPolicy::CheckRead(absl::string_view field, absl::string_view path) const {
  if (path.empty()) return absl::OkStatus();
  return CheckBeneath(field, std::string(path), data_roots_, "data", "--data_roots");
}

absl::Status PathPolicy::CheckWrite(absl::string_view field, absl::string_view path) const {
  if (path.empty()) return absl::OkStatus();
  return CheckBeneath(field, std::string(path), output_roots_, "output", "--output_roots");
}

absl::Status PathPolicy::CheckJobSpec(const engine::JobSpec& spec) const {
  MEGATRAIN_RETURN_IF_ERROR(CheckRead("model.hf_dir", spec.model.hf_dir));
  MEGATRAIN_RETURN_IF_ERROR(CheckRead("data.tokens", spec.data.tokens));
  MEGATRAIN_RETURN_IF_ERROR(CheckRead("data.eval_tokens", spec.data.eval_tokens));
  MEGATRAIN_RETURN_IF_ERROR(CheckRead("data.text", spec.data.text));
  MEGATRAIN_RETURN_IF_ERROR(CheckRead("data.tokenizer", spec.data.tokenizer));
  return CheckWrite("output_dir", spec.output_dir);
}

}  // namespace megatrain::server
