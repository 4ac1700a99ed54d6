// The trainer's choice of a step schedule (issue 16): the order of work
// (micro-batch-major or layer-major), the layer-major wave and where the
// wave's saved layer inputs live, from the sizes of the plan. Every part
// of the choice can be forced by an option (TrainerOptions, megatrain-bench
// --schedule / --wave / --activations, the job spec's train.schedule,
// train.wave, train.activations). No LibTorch types: the server and the
// benchmark use this header.
//
// Note [Schedule choice]
// With A micro-batches per step the micro-batch-major schedule streams
// every layer 2A times per step; layer-major streams it twice per wave
// (Note [Layer-major schedule] in step_plan.h), at the price of keeping the
// wave's saved layer inputs at once. Auto therefore picks:
//   * schedule: layer-major when A > 1 on a GPU (with A = 1 both orders
//     are the same plan) or when a wave is asked for; micro-batch-major on
//     the CPU, which has no link to save (the CPU runtime still runs
//     layer-major when asked);
//   * wave: all A micro-batches (the weights cross the link once per
//     step), unless even their offloaded form does not fit (below); a wave
//     asked for is capped at A;
//   * activations: on the device when the wave's live activations, W x
//     (L + 2) x [B, T, C] fp32 (L saved inputs, the hidden state and its
//     gradient per micro-batch), fit the activation budget; otherwise in
//     pinned host memory (the activation-offload path: W x 3 x [B, T, C]
//     fp32 stay on the device, plus the ring of two); otherwise the largest
//     wave whose offloaded form fits. The budget is kActivationBudgetFraction
//     of the device memory left after the executor's own buffers (weight and
//     gradient slots, resident blocks, accumulation buffers: Note
//     [Executor memory plan] in executor.h); the rest is the working memory
//     of one layer's recompute and backward and of the loss chunks.
// Resident layers, the resident embedding and device gradient accumulation
// keep their own auto rules (TrainerOptions); layer-major with one wave
// sums the streamed gradients in the gradient slots and needs no
// accumulation buffers.
//
// Thread-safety: pure functions.
#ifndef MEGATRAIN_ENGINE_STEP_SCHEDULE_CHOICE_H_
#define MEGATRAIN_ENGINE_STEP_SCHEDULE_CHOICE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/model_config.h"
#include "engine/spec/step_schedule.h"  // ActivationPlacement, ParseStepSchedule, ...
#include "engine/step/step_plan.h"

namespace megatrain::engine {

// Auto's share of the device memory left after the executor's buffers that
// the wave's activations may take (Note [Schedule choice]). 1/2: llama-3b
// at 4 x [8, 2048] keeps 4 x 30 x [8, 2048, 3072] fp32 = 24.2 GB, which
// fits beside its ~20 GB of executor buffers on an 80 GB H100 (budget
// ~30 GB); the other half covers one layer's recompute and backward.
inline constexpr double kActivationBudgetFraction = 0.5;

// What the options ask for.
struct ScheduleRequest {
  std::optional<StepSchedule> schedule;  // empty: auto
  int wave = 0;                          // layer-major micro-batches per wave; 0: auto
  ActivationPlacement activations = ActivationPlacement::kAuto;
  int64_t gradient_accumulation_steps = 1;  // A: micro-batches per optimizer step
};

// What the trainer runs.
struct ScheduleChoice {
  StepSchedule schedule = StepSchedule::kMicroBatchMajor;
  int wave = 1;  // micro-batches per wave (1 for micro-batch-major)
  bool offload_activations = false;
  // The wave's live activations on the device, in bytes (Note [Schedule
  // choice]), and the budget they were held against (0 on the CPU).
  int64_t activation_device_bytes = 0;
  int64_t activation_budget_bytes = 0;
  // One line for the job's events and the bench's stderr, e.g.
  // "layer-major, wave 4 of 4, activations on the device (8.6 GB of a 31.0
  // GB budget)".
  std::string Describe() const;
};

// Checks `request` (INVALID_ARGUMENT naming the option: `wave` must be in
// kWaveRange, [0, 4096] (engine/spec/job_spec.h), and 0 or 1 with
// micro-batch-major; `gradient_accumulation_steps` >= 1) and resolves it
// for `config` with micro-batches of [micro_batch, seq_len] on a device of
// `device_total_bytes` (0: the CPU) whose executor buffers take
// `executor_device_bytes` (Note [Schedule choice]).
absl::StatusOr<ScheduleChoice> ChooseSchedule(const ModelConfig& config,
                                              const ScheduleRequest& request, int64_t micro_batch,
                                              int64_t seq_len, int64_t device_total_bytes,
                                              int64_t executor_device_bytes);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_SCHEDULE_CHOICE_H_
