// Admission of jobs that use the NVMe tier (memory.nvme_tier; Note [NVMe
// tier] in engine/store/nvme_tier.h): which tier a job's AdamW moments go
// to on this daemon, and whether its disk bytes can ever fit --nvme_budget.
// The job manager calls it at submission, before it takes its lock (Note
// [Lock-free admission] in job_manager.h), and counts the admitted NVMe
// bytes of running jobs against the budget when it schedules.
//
// Note [NVMe admission]
//   * off: everything in host memory (the footprint as estimated).
//   * moments: the moments on the tier; refused at submission
//     (INVALID_ARGUMENT naming memory.nvme_tier) by a daemon without
//     --nvme_dir.
//   * auto: in host memory when the all-in-RAM footprint fits
//     --host_memory_budget, else on the tier (when the daemon has one; if
//     not, the host-memory check refuses the job as for off). The choice is
//     made once, at submission, and stored in the job's spec ("auto"
//     becomes "off" or "moments"), as the default output_dir is: the job
//     runs the same way after a restart.
// A tiered job whose moment bytes exceed --nvme_budget can never run:
// RESOURCE_EXHAUSTED with the bytes per tier. The bytes a tiered job holds
// on the disk count against the budget only while it runs (from its start
// to the end of its run): a suspended or preempted job releases them, for
// its moment files are removed when its run ends, before its reservation
// is released (the moments live in its checkpoint; a resume writes fresh
// files), and a preemption happens only when stopping the victim frees
// enough host memory and NVMe bytes for the waiting job (Note [Scheduling
// policy] in job_manager.h). Thread-safety: pure functions.
//
// Note [Stale NVMe tier directories]
// A job's moment files live in <--nvme_dir>/<job id> while it runs and go
// when its run ends. A daemon killed with SIGKILL (or a crash, a power
// cut) leaves them behind: 8 bytes per parameter of disk per job that
// admission no longer counts. At start, before any job runs, the daemon
// removes every entry of --nvme_dir that is a directory and names a job
// of its store whose spec uses the tier (the entries it created), through
// a descriptor of --nvme_dir (DirFd::RemoveTreeAt: unlinkat below
// descriptors opened O_NOFOLLOW, so a symbolic link is never followed).
// Anything else (a name no tiered job has, a file or a symbolic link of a
// job's name) is not the daemon's and stays, logged. A directory that
// cannot be opened is logged; tiered jobs then fail at their start naming
// it.
#ifndef MEGATRAIN_SERVER_CORE_NVME_ADMISSION_H_
#define MEGATRAIN_SERVER_CORE_NVME_ADMISSION_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/job/training_job.h"

namespace megatrain::server {

// The daemon's NVMe tier (--nvme_dir, --nvme_budget).
struct NvmeTierOptions {
  std::string dir;           // absolute; empty: no tier
  int64_t budget_bytes = 0;  // disk bytes all running jobs' moments may take (> 0 with a dir)
};

// A job's admitted footprint and the tier it resolved to.
struct NvmeAdmission {
  engine::MemoryFootprint footprint;  // footprint.nvme_bytes > 0 iff on the tier
  engine::NvmeTierMode tier = engine::NvmeTierMode::kOff;  // kOff or kMoments, never kAuto
};

// Sizes `spec` for this daemon (Note [NVMe admission]); `estimate` sizes a
// spec (EngineBackend::EstimateFootprint*, which counts the moments on the
// tier for memory.nvme_tier moments). Errors: INVALID_ARGUMENT naming
// memory.nvme_tier when the tier is asked for and `nvme.dir` is empty;
// RESOURCE_EXHAUSTED with the bytes per tier when the moments exceed
// nvme.budget_bytes; `estimate`'s errors.
absl::StatusOr<NvmeAdmission> AdmitNvmeTier(
    const engine::JobSpec& spec,
    const std::function<absl::StatusOr<engine::MemoryFootprint>(const engine::JobSpec&)>& estimate,
    int64_t host_budget_bytes, const NvmeTierOptions& nvme);

// What SweepStaleNvmeTier did: entry names removed, and entries left
// (each "name: why").
struct NvmeSweep {
  std::vector<std::string> removed;
  std::vector<std::string> left;
};

// Removes the stale job directories of `dir` (Note [Stale NVMe tier
// directories]): the entries that are directories (not followed when they
// are symbolic links) and for which `recorded(name)` holds. Call only
// while no job uses the tier. Errors: the directory's (NOT_FOUND,
// PERMISSION_DENIED, FAILED_PRECONDITION for a symbolic link, naming it);
// a failed removal is reported in `left`, the others still run.
absl::StatusOr<NvmeSweep> SweepStaleNvmeTier(
    const std::string& dir, const std::function<bool(const std::string& name)>& recorded);

// INVALID_ARGUMENT naming the flag for a relative --nvme_dir or one
// without a --nvme_budget > 0. A budget without a directory is allowed
// (`megatrain plan` uses it alone; jobs cannot use the tier).
absl::Status ValidateNvmeTierOptions(const NvmeTierOptions& nvme);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_CORE_NVME_ADMISSION_H_
