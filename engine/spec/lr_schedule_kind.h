// The shape of the learning-rate schedule after warmup: the job field
// `optimizer.schedule` (docs/job-spec.md). Carried by the job spec (this
// library) and applied by LrSchedule (engine/optim/lr_schedule.h);
// torch-free, header-only.
#ifndef MEGATRAIN_ENGINE_SPEC_LR_SCHEDULE_KIND_H_
#define MEGATRAIN_ENGINE_SPEC_LR_SCHEDULE_KIND_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace megatrain::engine {

// Shape of the schedule after warmup (formulas in engine/optim/lr_schedule.h).
enum class LrScheduleKind {
  kCosine,    // half-cosine from peak to min over (warmup, total]
  kLinear,    // straight line from peak to min over (warmup, total]
  kConstant,  // peak after warmup
};

// "cosine", "linear" or "constant": the spelling of job files, JSON and docs.
inline std::string_view LrScheduleKindName(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kCosine:
      return "cosine";
    case LrScheduleKind::kLinear:
      return "linear";
    case LrScheduleKind::kConstant:
      return "constant";
  }
  return "unknown";
}

// Parses a LrScheduleKindName() spelling (exact, lower case). Errors:
// INVALID_ARGUMENT "optimizer.schedule: unknown 'x' (expected
// cosine|linear|constant)".
inline absl::StatusOr<LrScheduleKind> ParseLrScheduleKind(std::string_view name) {
  for (LrScheduleKind kind :
       {LrScheduleKind::kCosine, LrScheduleKind::kLinear, LrScheduleKind::kConstant}) {
    if (name == LrScheduleKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("optimizer.schedule: unknown '", std::string(name),
                                                 "' (expected cosine|linear|constant)"));
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_LR_SCHEDULE_KIND_H_
