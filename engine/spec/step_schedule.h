// The step schedule's words: the order of work of a step (the job field
// `train.schedule`, megatrain-bench --schedule) and where the saved layer
// inputs live (`train.activations`, --activations). One place for their
// spellings: the job spec checks them (job_spec.cc), the trainer's choice
// and the executor use the enums (engine/step/schedule_choice.h,
// step_plan.h). Torch-free, header-only.
#ifndef MEGATRAIN_ENGINE_SPEC_STEP_SCHEDULE_H_
#define MEGATRAIN_ENGINE_SPEC_STEP_SCHEDULE_H_

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace megatrain::engine {

// The order of the micro-batches' work in a pass.
enum class StepSchedule {
  kMicroBatchMajor,  // each micro-batch through every layer, then the next
  kLayerMajor,       // every micro-batch of a wave through a layer, then the next
                     // layer (Note [Layer-major schedule] in engine/step/step_plan.h)
};

// "micro-batch-major" / "layer-major" (the job spec's and the bench's words).
inline const char* StepScheduleName(StepSchedule schedule) {
  return schedule == StepSchedule::kLayerMajor ? "layer-major" : "micro-batch-major";
}

// "auto" (empty), "micro-batch-major", "layer-major"; an empty optional for
// auto. INVALID_ARGUMENT "<field>: expected auto, micro-batch-major or
// layer-major, got '<text>'" otherwise.
inline absl::StatusOr<std::optional<StepSchedule>> ParseStepSchedule(absl::string_view text,
                                                                     absl::string_view field) {
  if (text.empty() || text == "auto") return std::optional<StepSchedule>();
  if (text == "micro-batch-major") return std::optional(StepSchedule::kMicroBatchMajor);
  if (text == "layer-major") return std::optional(StepSchedule::kLayerMajor);
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected auto, micro-batch-major or layer-major, got '", text, "'"));
}

// Where the saved layer inputs live (Note [Activation offload] in
// engine/step/executor.h).
enum class ActivationPlacement {
  kAuto,    // Note [Schedule choice] in engine/step/schedule_choice.h
  kDevice,  // on the device
  kHost,    // pinned host memory (train.offload_activations)
};

// "auto", "device", "host".
inline const char* ActivationPlacementName(ActivationPlacement placement) {
  switch (placement) {
    case ActivationPlacement::kAuto:
      return "auto";
    case ActivationPlacement::kDevice:
      return "device";
    case ActivationPlacement::kHost:
      return "host";
  }
  return "?";
}

// "auto" (empty), "device", "host". INVALID_ARGUMENT "<field>: expected
// auto, device or host, got '<text>'" otherwise.
inline absl::StatusOr<ActivationPlacement> ParseActivationPlacement(absl::string_view text,
                                                                    absl::string_view field) {
  if (text.empty() || text == "auto") return ActivationPlacement::kAuto;
  if (text == "device") return ActivationPlacement::kDevice;
  if (text == "host") return ActivationPlacement::kHost;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected auto, device or host, got '", text, "'"));
}

// Whether dense decoder layers run from CUDA graphs (`train.cuda_graphs`,
// megatrain-bench --cuda_graphs; Note [Layer graphs] in
// engine/step/layer_graphs.h): "auto" (empty) -1, "off" 0, "on" 1.
// INVALID_ARGUMENT "<field>: expected auto, on or off, got '<text>'"
// otherwise, quoting at most 32 bytes of `text`.
inline absl::StatusOr<int> ParseCudaGraphs(absl::string_view text, absl::string_view field) {
  if (text.empty() || text == "auto") return -1;
  if (text == "off") return 0;
  if (text == "on") return 1;
  constexpr size_t kQuoted = 32;
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected auto, on or off, got '",
                                                 text.substr(0, kQuoted),
                                                 text.size() > kQuoted ? "...'" : "'"));
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_STEP_SCHEDULE_H_
