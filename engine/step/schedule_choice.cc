// The trainer's choice of a step schedule (Note [Schedule choice] in
// schedule_choice.h).
#include "engine/step/schedule_choice.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/spec/job_spec.h"

namespace megatrain::engine {
namespace {

std::string Gigabytes(int64_t bytes) { return absl::StrFormat("%.1f GB", bytes / 1e9); }

}  // namespace

std::string ScheduleChoice::Describe() const {
  std::string out = StepScheduleName(schedule);
  if (schedule == StepSchedule::kLayerMajor) absl::StrAppend(&out, ", wave ", wave);
  absl::StrAppend(&out, ", activations ",
                  offload_activations ? "in pinned host memory" : "on the device");
  if (activation_budget_bytes > 0) {
    absl::StrAppend(&out, " (", Gigabytes(activation_device_bytes), " on the device of a ",
                    Gigabytes(activation_budget_bytes), " budget)");
  }
  return out;
}

absl::StatusOr<ScheduleChoice> ChooseSchedule(const ModelConfig& config,
                                              const ScheduleRequest& request, int64_t micro_batch,
                                              int64_t seq_len, int64_t device_total_bytes,
                                              int64_t executor_device_bytes) {
  if (request.gradient_accumulation_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient_accumulation_steps: must be >= 1, got ", request.gradient_accumulation_steps));
  }
  if (request.wave < kWaveRange.min || request.wave > kWaveRange.max) {
    return absl::InvalidArgumentError(absl::StrCat("wave: must be in [", kWaveRange.min,
                                                   " (auto), ", kWaveRange.max, "], got ",
                                                   request.wave));
  }
  if (request.wave > 1 && request.schedule == StepSchedule::kMicroBatchMajor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wave: ", request.wave, " micro-batches per wave needs the layer-major schedule"));
  }
  const int64_t accumulation = request.gradient_accumulation_steps;
  const bool gpu = device_total_bytes > 0;
  ScheduleChoice choice;
  // A wave asked for implies layer-major.
  const bool layer_major = (gpu && accumulation > 1) || request.wave > 0;
  choice.schedule = request.schedule.value_or(layer_major ? StepSchedule::kLayerMajor
                                                          : StepSchedule::kMicroBatchMajor);
  const int64_t layers = config.num_hidden_layers;
  const int64_t layer_input_bytes = micro_batch * seq_len * config.hidden_size * 4;
  // Live activations of a wave of w (Note [Schedule choice]).
  auto kept = [&](int64_t w) { return w * (layers + 2) * layer_input_bytes; };
  auto offloaded = [&](int64_t w) { return (w * 3 + 2) * layer_input_bytes; };
  if (gpu) {
    choice.activation_budget_bytes = static_cast<int64_t>(
        kActivationBudgetFraction *
        static_cast<double>(std::max<int64_t>(0, device_total_bytes - executor_device_bytes)));
  }
  const int64_t budget = choice.activation_budget_bytes;
  int64_t wave = 1;
  if (choice.schedule == StepSchedule::kLayerMajor) {
    wave = request.wave > 0 ? std::min<int64_t>(request.wave, accumulation) : accumulation;
  }
  bool host = request.activations == ActivationPlacement::kHost;
  if (request.activations == ActivationPlacement::kAuto && gpu) {
    if (kept(wave) > budget && layers > 1) host = true;
    // Auto wave: shrink it until its offloaded form fits.
    if (host && request.wave == 0) {
      while (wave > 1 && offloaded(wave) > budget) --wave;
    }
  }
  choice.wave = static_cast<int>(wave);
  choice.offload_activations = host && layers > 1;
  choice.activation_device_bytes = choice.offload_activations ? offloaded(wave) : kept(wave);
  return choice;
}

}  // namespace megatrain::engine
