// Learning-rate schedules for the optimizer: linear warmup, then cosine or
// linear decay to a floor, or a constant rate. The trainer asks for the rate
// of each optimizer step (counted from 1) and hands it to CpuAdamW::Step.
#ifndef MEGATRAIN_ENGINE_LR_SCHEDULE_H_
#define MEGATRAIN_ENGINE_LR_SCHEDULE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/spec/lr_schedule_kind.h"

namespace megatrain::engine {

// Options of a schedule. Step numbers count optimizer updates from 1.
struct LrScheduleOptions {
  LrScheduleKind kind = LrScheduleKind::kCosine;
  double peak_lr = 1e-3;      // rate at the end of warmup; finite, >= 0
  int64_t warmup_steps = 0;   // in [0, total_steps]; 0 = no warmup
  int64_t total_steps = 1;    // >= 1; the decay reaches the floor here
  double min_lr_ratio = 0.0;  // floor = peak_lr * min_lr_ratio, in [0, 1]
};

// A learning-rate schedule (immutable value).
//
//   warmup (step <= warmup_steps):  lr = peak * step / warmup_steps
//   after warmup, with progress = (step - warmup) / (total - warmup) in
//   (0, 1] and min = peak * min_lr_ratio:
//     cosine:    min + (peak - min) * 0.5 * (1 + cos(pi * progress))
//                (Loshchilov & Hutter, "SGDR", ICLR 2017, eq. 5, one cycle
//                without restarts; as HF transformers
//                get_cosine_schedule_with_warmup with a floor)
//     linear:    peak - (peak - min) * progress
//     constant:  peak
//   after total_steps: the value at total_steps (min for cosine and linear).
//
// Thread-safety: immutable after Create(); LrAt() is safe from any thread.
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(
//       LrSchedule schedule,
//       LrSchedule::Create({.kind = LrScheduleKind::kCosine, .peak_lr = 3e-4,
//                           .warmup_steps = 100, .total_steps = 10000,
//                           .min_lr_ratio = 0.1}));
//   const float lr = schedule.LrAt(step);
class LrSchedule {
 public:
  // Errors: INVALID_ARGUMENT naming the field and value, e.g.
  // "optimizer.warmup_steps: must be in [0, total_steps=100], got 200".
  static absl::StatusOr<LrSchedule> Create(const LrScheduleOptions& options);

  // The learning rate of update `step` (from 1); steps < 1 are treated as 1.
  float LrAt(int64_t step) const;

  const LrScheduleOptions& options() const { return options_; }

 private:
  explicit LrSchedule(const LrScheduleOptions& options) : options_(options) {}

  LrScheduleOptions options_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_LR_SCHEDULE_H_
