// Which optimizer state a job keeps on the NVMe tier: the job field
// `memory.nvme_tier` (docs/job-spec.md; Note [NVMe tier] in
// engine/store/nvme_tier.h). Shared by the job spec, which carries it, the
// plan and the tier; torch-free, header-only.
#ifndef MEGATRAIN_ENGINE_SPEC_NVME_TIER_MODE_H_
#define MEGATRAIN_ENGINE_SPEC_NVME_TIER_MODE_H_

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/spec/keyword.h"

namespace megatrain::engine {

enum class NvmeTierMode {
  kOff,      // everything in host memory (the default)
  kMoments,  // exp_avg and exp_avg_sq in files under the daemon's NVMe directory
  kAuto,     // kMoments only when the job does not fit the host budget otherwise
};

// memory.nvme_tier's keywords (engine/spec/keyword.h): "off", "moments",
// "auto", the spelling of job files, JSON and docs.
inline constexpr Keyword<NvmeTierMode> kNvmeTierModeKeywords[] = {
    {"off", NvmeTierMode::kOff},
    {"moments", NvmeTierMode::kMoments},
    {"auto", NvmeTierMode::kAuto},
};

inline absl::string_view NvmeTierModeName(NvmeTierMode mode) {
  const char* name = KeywordName(kNvmeTierModeKeywords, mode);
  return name != nullptr ? name : "off";
}

// Inverse of NvmeTierModeName; INVALID_ARGUMENT "memory.nvme_tier: must be
// off, moments or auto, got '<name>'" otherwise.
inline absl::StatusOr<NvmeTierMode> ParseNvmeTierMode(absl::string_view name) {
  return ParseKeyword(kNvmeTierModeKeywords, name, "memory.nvme_tier");
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_NVME_TIER_MODE_H_
