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
// RESOURCE_EXHAUSTED with the bytes per tier. Thread-safety: pure functions.
#ifndef MEGATRAIN_SERVER_CORE_NVME_ADMISSION_H_
#define MEGATRAIN_SERVER_CORE_NVME_ADMISSION_H_

#include <cstdint>
#include <functional>
#include <string>

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

// INVALID_ARGUMENT naming the flag for a relative --nvme_dir or one
// without a --nvme_budget > 0. A budget without a directory is allowed
// (`megatrain plan` uses it alone; jobs cannot use the tier).
absl::Status ValidateNvmeTierOptions(const NvmeTierOptions& nvme);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_CORE_NVME_ADMISSION_H_
