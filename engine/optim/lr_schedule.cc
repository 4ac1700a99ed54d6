// Implementation of LrSchedule (see lr_schedule.h).
#include "engine/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/spec/job_spec.h"

namespace megatrain::engine {

absl::StatusOr<LrSchedule> LrSchedule::Create(const LrScheduleOptions& options) {
  if (!std::isfinite(options.peak_lr) || options.peak_lr < 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.lr: must be finite and >= 0, got ", options.peak_lr));
  }
  if (options.total_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.total_steps: must be >= 1, got ", options.total_steps));
  }
  if (options.warmup_steps < 0 || options.warmup_steps > options.total_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.warmup_steps: must be in [0, total_steps=", options.total_steps,
                     "], got ", options.warmup_steps));
  }
  if (absl::Status status =
          CheckRealInRange("optimizer.min_lr_ratio", options.min_lr_ratio, kMinLrRatioRange);
      !status.ok()) {
    return status;
  }
  return LrSchedule(options);
}

float LrSchedule::LrAt(int64_t step) const {
  const double peak = options_.peak_lr;
  const int64_t warmup = options_.warmup_steps;
  const int64_t total = options_.total_steps;
  step = std::max<int64_t>(step, 1);
  if (step <= warmup) {
    return static_cast<float>(peak * static_cast<double>(step) / static_cast<double>(warmup));
  }
  if (options_.kind == LrScheduleKind::kConstant) {
    return static_cast<float>(peak);
  }
  // Here warmup < step. When warmup == total there is no decay phase: every
  // later step is past the end, i.e. at the floor.
  const double min_lr = peak * options_.min_lr_ratio;
  const double progress =
      warmup >= total
          ? 1.0
          : std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(total - warmup));
  double lr = peak;
  switch (options_.kind) {
    case LrScheduleKind::kCosine:
      lr = min_lr + (peak - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
      break;
    case LrScheduleKind::kLinear:
      lr = peak - (peak - min_lr) * progress;
      break;
    case LrScheduleKind::kConstant:
      break;
  }
  return static_cast<float>(lr);
}

}  // namespace megatrain::engine
