// See output_group.h.
#include "server/core/output_group.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace megatrain::server {
namespace {

absl::Status ChownChmod(const std::string& path, gid_t gid, mode_t mode) {
  if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--output_group: cannot give '%s' group %d: %s (the daemon's user must be a member "
        "of the group)",
        path, static_cast<int>(gid), std::strerror(errno)));
  }
  if (::chmod(path.c_str(), mode) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--output_group: cannot chmod %04o '%s': %s", mode, path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<gid_t> ResolveOutputGroup(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("--output_group: empty group name");
  std::vector<char> buffer(16384);
  struct group entry;
  struct group* found = nullptr;
  int number = 0;
  const int rc =
      absl::SimpleAtoi(name, &number) && number >= 0
          ? ::getgrgid_r(static_cast<gid_t>(number), &entry, buffer.data(), buffer.size(), &found)
          : ::getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--output_group: no group '", name, "' on this host",
                     rc != 0 ? absl::StrCat(" (", std::strerror(rc), ")") : ""));
  }
  return found->gr_gid;
}

absl::Status ShareOutputsWithGroup(const std::string& state_dir, const std::string& jobs_dir,
                                   gid_t gid) {
  if (absl::Status status = ChownChmod(state_dir, gid, 0710); !status.ok()) return status;
  if (absl::Status status = ChownChmod(jobs_dir, gid, 02750); !status.ok()) return status;
  ::umask(027);
  return absl::OkStatus();
}

}  // namespace megatrain::server
