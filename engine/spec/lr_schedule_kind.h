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
#include "engine/spec/keyword.h"

namespace megatrain::engine {

// Shape of the schedule after warmup (formulas in engine/optim/lr_schedule.h).
enum class LrScheduleKind {
  kCosine,    // half-cosine from peak to min over (warmup, total]
  kLinear,    // straight line from peak to min over (warmup, total]
  kConstant,  // peak after warmup
};

// optimizer.schedule's keywords (engine/spec/keyword.h): "cosine",
// "linear" or "constant", the spelling of job files, JSON and docs.
inline constexpr Keyword<LrScheduleKind> kLrScheduleKindKeywords[] = {
    {"cosine", LrScheduleKind::kCosine},
    {"linear", LrScheduleKind::kLinear},
    {"constant", LrScheduleKind::kConstant},
};

inline std::string_view LrScheduleKindName(LrScheduleKind kind) {
  const char* name = KeywordName(kLrScheduleKindKeywords, kind);
  return name != nullptr ? name : "unknown";
}

// Parses a LrScheduleKindName() spelling (exact, lower case). Errors:
// INVALID_ARGUMENT "optimizer.schedule: must be cosine, linear or
// constant, got 'x'".
inline absl::StatusOr<LrScheduleKind> ParseLrScheduleKind(std::string_view name) {
  return ParseKeyword(kLrScheduleKindKeywords, absl::string_view(name.data(), name.size()),
                      "optimizer.schedule");
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_LR_SCHEDULE_KIND_H_
