// See path_policy.h.
#include "server/core/path_policy.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "engine/runtime/status_macros.h"

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
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '..' components are not allowed, got '", path, "'"));
    }
  }
  return absl::OkStatus();
}

constexpr absl::string_view kUserPlaceholder = "{user}";

// True for a name that may replace "{user}" (Note [Per-user data roots]).
bool IsPlainUserName(absl::string_view user) {
  if (user.empty() || user == "." || user == "..") return false;
  for (const char c : user) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

// `user_roots` with "{user}" replaced by `user` and resolved; roots that do
// not exist (yet) or cannot be used for this user are left out.
std::vector<std::string> ResolveUserRoots(const std::vector<std::string>& user_roots,
                                          absl::string_view user) {
  std::vector<std::string> resolved_roots;
  if (!IsPlainUserName(user)) return resolved_roots;
  for (const std::string& root : user_roots) {
    std::string resolved;
    if (RealPath(absl::StrReplaceAll(root, {{kUserPlaceholder, user}}), &resolved)) {
      resolved_roots.push_back(std::move(resolved));
    }
  }
  return resolved_roots;
}

// `roots` are resolved; `shown_roots` are the roots as the refusal names
// them (per-user roots with their placeholder, Note [Per-user data roots]).
absl::Status CheckBeneath(absl::string_view field, const std::string& path,
                          const std::vector<std::string>& roots,
                          const std::vector<std::string>& shown_roots, absl::string_view kind,
                          absl::string_view flag) {
  MEGATRAIN_RETURN_IF_ERROR(CheckSyntax(field, path));
  if (shown_roots.empty()) return absl::OkStatus();
  MEGATRAIN_ASSIGN_OR_RETURN(std::string resolved, ResolvePathBeneath(field, path));
  for (const std::string& root : roots) {
    if (IsBeneath(resolved, root)) return absl::OkStatus();
  }
  const std::string normal = fs::path(path).lexically_normal().string();
  const std::string resolves =
      resolved == normal ? std::string() : absl::StrCat(" resolves to '", resolved, "', which");
  return absl::PermissionDeniedError(
      absl::StrCat(field, ": '", path, "'", resolves, " is outside the daemon's ", kind, " roots (",
                   absl::StrJoin(shown_roots, ", "), "; ", flag, ")"));
}

// Resolves `roots`; with `user_roots` set, roots containing "{user}" go
// there as written (after checking the directory before the placeholder),
// otherwise they are refused.
absl::StatusOr<std::vector<std::string>> ResolveRoots(const std::vector<std::string>& roots,
                                                      absl::string_view flag,
                                                      std::vector<std::string>* user_roots) {
  std::vector<std::string> resolved_roots;
  for (const std::string& root : roots) {
    if (root.empty() || root.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": roots must be absolute paths, got '", root, "'"));
    }
    const size_t placeholder = root.find("{user}");
    if (placeholder != std::string::npos) {
      if (user_roots == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": '{user}' is only allowed in data roots, got '", root, "'"));
      }
      for (absl::string_view component : absl::StrSplit(root, '/')) {
        if (component == "..") {
          return absl::InvalidArgumentError(
              absl::StrCat(flag, ": '..' components are not allowed, got '", root, "'"));
        }
      }
      const std::string base = fs::path(root.substr(0, placeholder)).parent_path().string();
      MEGATRAIN_RETURN_IF_ERROR(ResolveRoots({base}, flag, nullptr).status());
      user_roots->push_back(root);
      continue;
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
      return absl::FailedPreconditionError(absl::StrCat(flag, ": '", root, "' is not a directory"));
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
  std::vector<std::string> user_data;
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<std::string> data,
                             ResolveRoots(data_roots, data_flag, &user_data));
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<std::string> output,
                             ResolveRoots(output_roots, output_flag, nullptr));
  return PathPolicy(std::move(data), std::move(user_data), std::move(output));
}

absl::Status PathPolicy::CheckRead(absl::string_view field, absl::string_view path,
                                   absl::string_view user) const {
  if (path.empty()) return absl::OkStatus();
  if (user_data_roots_.empty()) {
    return CheckBeneath(field, std::string(path), data_roots_, data_roots_, "data", "--data_roots");
  }
  std::vector<std::string> roots = data_roots_;
  for (std::string& root : ResolveUserRoots(user_data_roots_, user)) {
    roots.push_back(std::move(root));
  }
  return CheckBeneath(field, std::string(path), roots, shown_data_roots_, "data", "--data_roots");
}

absl::Status PathPolicy::CheckWrite(absl::string_view field, absl::string_view path) const {
  if (path.empty()) return absl::OkStatus();
  return CheckBeneath(field, std::string(path), output_roots_, output_roots_, "output",
                      "--output_roots");
}

absl::Status PathPolicy::CheckNotOutputRoot(absl::string_view field, absl::string_view path) const {
  if (path.empty() || output_roots_.empty()) return absl::OkStatus();
  std::string normal = fs::path(std::string(path)).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  absl::StatusOr<std::string> resolved = ResolvePathBeneath(field, std::string(path));
  for (const std::string& root : output_roots_) {
    if (normal == root || (resolved.ok() && *resolved == root)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": '", path, "' is the output root '", root,
          "' itself (--output_roots); a job's output directory is exclusive to it, so it must "
          "lie below a root, e.g. '",
          root == "/" ? "" : root, "/<name>'"));
    }
  }
  return absl::OkStatus();
}

absl::Status PathPolicy::CheckJobSpec(const engine::JobSpec& spec, absl::string_view user) const {
  MEGATRAIN_RETURN_IF_ERROR(CheckRead("model.hf_dir", spec.model.hf_dir, user));
  MEGATRAIN_RETURN_IF_ERROR(CheckRead("data.tokens", spec.data.tokens, user));
  MEGATRAIN_RETURN_IF_ERROR(CheckRead("data.eval_tokens", spec.data.eval_tokens, user));
  MEGATRAIN_RETURN_IF_ERROR(CheckRead("data.text", spec.data.text, user));
  MEGATRAIN_RETURN_IF_ERROR(CheckRead("data.tokenizer", spec.data.tokenizer, user));
  return CheckWrite("output_dir", spec.output_dir);
}

absl::StatusOr<engine::ReadConfinement> PathPolicy::ConfineJobReads(engine::JobSpec* spec,
                                                                    absl::string_view user) const {
  for (auto [field, path] :
       {std::pair<const char*, std::string*>{"model.hf_dir", &spec->model.hf_dir},
        {"data.tokens", &spec->data.tokens},
        {"data.eval_tokens", &spec->data.eval_tokens},
        {"data.text", &spec->data.text},
        {"data.tokenizer", &spec->data.tokenizer}}) {
    if (path->empty()) continue;
    MEGATRAIN_ASSIGN_OR_RETURN(*path, ResolvePathBeneath(field, *path));
  }
  std::vector<engine::ReadConfinement::Root> roots;
  if (shown_data_roots_.empty()) {
    roots.push_back({"/", /*follow_links=*/true});
  } else {
    for (const std::string& root : data_roots_) roots.push_back({root, /*follow_links=*/true});
    for (std::string& root : ResolveUserRoots(user_data_roots_, user)) {
      roots.push_back({std::move(root), /*follow_links=*/true});
    }
  }
  if (!spec->output_dir.empty()) {
    roots.push_back({fs::path(spec->output_dir).lexically_normal().string(),
                     /*follow_links=*/false});
  }
  absl::StatusOr<engine::ReadConfinement> confinement = engine::ReadConfinement::Create(roots);
  if (!confinement.ok()) {
    return absl::Status(confinement.status().code(),
                        absl::StrCat("job start: opening the roots it reads below: ",
                                     confinement.status().message()));
  }
  return confinement;
}

// ---------------------------------------------------------------------------
// Note [Input preflight].

namespace {

// Names a file kind other than regular file and directory, for messages.
const char* FileKindName(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

// Closes a descriptor when it goes out of scope.
struct ScopedFd {
  int fd = -1;
  ~ScopedFd() {
    if (fd >= 0) ::close(fd);
  }
};

// An input that must be a regular file, or (with `directory_ok`) a
// directory, when it exists. stat(2) never opens the file.
absl::Status CheckInputKind(absl::string_view field, const std::string& path, bool directory_ok) {
  if (path.empty()) return absl::OkStatus();
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return absl::OkStatus();  // the job's start reports it
  if (S_ISREG(info.st_mode) || (directory_ok && S_ISDIR(info.st_mode))) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": '", path, "' is ", FileKindName(info.st_mode),
      directory_ok ? "; must be a regular file or a directory" : "; must be a regular file"));
}

// Reads `hf_dir`/config.json with a non-blocking open, fstat'ed to be a
// regular file of at most kMaxHfConfigBytes.
absl::StatusOr<std::string> ReadHfConfig(const std::string& hf_dir) {
  constexpr absl::string_view field = "model.hf_dir";
  struct stat dir_info {};
  if (::stat(hf_dir.c_str(), &dir_info) != 0) {
    // A path in the spec that is not there: the field is wrong.
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", hf_dir, "': ", std::strerror(errno)));
  }
  if (!S_ISDIR(dir_info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", hf_dir, "' is ", FileKindName(dir_info.st_mode), "; must be a directory"));
  }
  const std::string path = (fs::path(hf_dir) / "config.json").string();
  // O_NONBLOCK: opening a FIFO returns at once instead of waiting for a
  // writer; fstat then refuses it. Nothing is read before that check.
  ScopedFd file{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)};
  if (file.fd < 0) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' does not exist"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat(field, ": cannot open '", path, "': ", std::strerror(error)));
  }
  struct stat info {};
  if (::fstat(file.fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", path, "' is ", FileKindName(info.st_mode), "; must be a regular file"));
  }
  if (info.st_size > kMaxHfConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' is ", info.st_size,
                                                   " bytes; at most ", kMaxHfConfigBytes,
                                                   " are read"));
  }
  std::string text(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  // Reads until EOF even if the file grew, but never past the cap.
  while (true) {
    if (done == text.size()) {
      if (text.size() >= static_cast<size_t>(kMaxHfConfigBytes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": '", path, "' grew past ", kMaxHfConfigBytes, " bytes while being read"));
      }
      text.resize(std::min<size_t>(text.size() + 4096, kMaxHfConfigBytes));
    }
    const ssize_t got = ::read(file.fd, text.data() + done, text.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": reading '", path, "': ", std::strerror(errno)));
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  text.resize(done);
  return text;
}

}  // namespace

absl::StatusOr<JobInputs> PreflightJobInputs(const engine::JobSpec& spec) {
  JobInputs inputs;
  if (!spec.model.hf_dir.empty()) {
    MEGATRAIN_ASSIGN_OR_RETURN(inputs.hf_config_json, ReadHfConfig(spec.model.hf_dir));
  }
  MEGATRAIN_RETURN_IF_ERROR(CheckInputKind("data.tokens", spec.data.tokens, true));
  MEGATRAIN_RETURN_IF_ERROR(CheckInputKind("data.eval_tokens", spec.data.eval_tokens, true));
  MEGATRAIN_RETURN_IF_ERROR(CheckInputKind("data.text", spec.data.text, false));
  // A model directory (its tokenizer.json) or the file (docs/job-spec.md).
  MEGATRAIN_RETURN_IF_ERROR(CheckInputKind("data.tokenizer", spec.data.tokenizer, true));
  return inputs;
}

}  // namespace megatrain::server
