// Admission of jobs that use the NVMe tier (nvme_admission.h).
#include "server/core/nvme_admission.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/fs/dir_fd.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::server {
namespace {

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.2f GiB (%d bytes)", static_cast<double>(bytes) / (1 << 30), bytes);
}

// The names in the directory of `dir` (not "." and ".."), read through a
// descriptor of it.
absl::StatusOr<std::vector<std::string>> ListNames(const engine::DirFd& dir) {
  const int fd = ::openat(dir.fd(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* stream = fd >= 0 ? ::fdopendir(fd) : nullptr;
  if (stream == nullptr) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return absl::InternalError(absl::StrCat(dir.path(), ": list: ", std::strerror(err)));
  }
  std::vector<std::string> names;
  while (const struct dirent* entry = ::readdir(stream)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(stream);  // closes fd
  return names;
}

}  // namespace

absl::StatusOr<NvmeSweep> SweepStaleNvmeTier(
    const std::string& dir, const std::function<bool(const std::string& name)>& recorded) {
  MEGATRAIN_ASSIGN_OR_RETURN(const engine::DirFd root, engine::DirFd::Open(dir));
  MEGATRAIN_ASSIGN_OR_RETURN(const std::vector<std::string> names, ListNames(root));
  NvmeSweep sweep;
  for (const std::string& name : names) {
    if (!recorded(name)) {
      sweep.left.push_back(absl::StrCat(name, ": no tiered job of that id"));
      continue;
    }
    absl::StatusOr<struct stat> info = root.StatAt(name);  // lstat: a link is not followed
    if (!info.ok()) {
      sweep.left.push_back(absl::StrCat(name, ": ", info.status().message()));
      continue;
    }
    if (!S_ISDIR(info->st_mode)) {
      sweep.left.push_back(absl::StrCat(name, ": not a directory (a link or a file)"));
      continue;
    }
    const absl::Status removed = root.RemoveTreeAt(name);
    if (removed.ok()) {
      sweep.removed.push_back(name);
    } else {
      sweep.left.push_back(absl::StrCat(name, ": ", removed.message()));
    }
  }
  return sweep;
}

absl::Status ValidateNvmeTierOptions(const NvmeTierOptions& nvme) {
  if (nvme.dir.empty()) return absl::OkStatus();
  if (nvme.dir.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--nvme_dir: must be an absolute path, got '", nvme.dir, "'"));
  }
  if (nvme.budget_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nvme_budget: must be > 0 with --nvme_dir (the disk bytes the jobs' "
                     "moment files may take), got ",
                     nvme.budget_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<NvmeAdmission> AdmitNvmeTier(
    const engine::JobSpec& spec,
    const std::function<absl::StatusOr<engine::MemoryFootprint>(const engine::JobSpec&)>& estimate,
    int64_t host_budget_bytes, const NvmeTierOptions& nvme) {
  NvmeAdmission out;
  engine::JobSpec sized = spec;
  if (spec.memory.nvme_tier == engine::NvmeTierMode::kAuto) {
    sized.memory.nvme_tier = engine::NvmeTierMode::kOff;
    MEGATRAIN_ASSIGN_OR_RETURN(out.footprint, estimate(sized));
    // Note [NVMe admission]: the tier only when host memory is not enough.
    if (out.footprint.host_total_bytes <= host_budget_bytes || nvme.dir.empty()) return out;
    sized.memory.nvme_tier = engine::NvmeTierMode::kMoments;
  }
  if (sized.memory.nvme_tier == engine::NvmeTierMode::kOff) {
    MEGATRAIN_ASSIGN_OR_RETURN(out.footprint, estimate(sized));
    return out;
  }
  if (nvme.dir.empty()) {
    return absl::InvalidArgumentError(
        "memory.nvme_tier: moments needs the daemon's NVMe tier, and this daemon was started "
        "without --nvme_dir (use off, or auto to go to the tier only where there is one)");
  }
  MEGATRAIN_ASSIGN_OR_RETURN(out.footprint, estimate(sized));
  out.tier = engine::NvmeTierMode::kMoments;
  if (out.footprint.nvme_bytes > nvme.budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job needs ", Gib(out.footprint.nvme_bytes),
        " on the NVMe tier (exp_avg and exp_avg_sq of ", out.footprint.params,
        " parameters, memory.nvme_tier ", engine::NvmeTierModeName(spec.memory.nvme_tier), ") and ",
        Gib(out.footprint.host_total_bytes), " of host memory, but --nvme_budget is ",
        Gib(nvme.budget_bytes), " (--host_memory_budget ", Gib(host_budget_bytes),
        "); it can never run on this daemon"));
  }
  return out;
}

}  // namespace megatrain::server
