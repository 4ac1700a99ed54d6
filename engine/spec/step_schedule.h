// The step schedule's words: the order of work of a step (the job field
// `train.schedule`, megatrain-bench --schedule), where the saved layer
// inputs live (`train.activations`, --activations) and whether layers run
// from CUDA graphs (`train.cuda_graphs`, --cuda_graphs). One place for
// their spellings and for the rules between them: the edges parse them
// (the proto conversion, the spec's JSON reader, megatrain-bench's flags)
// into the enums the job spec carries (job_spec.h); the trainer's choice
// and the executor use the enums (engine/step/schedule_choice.h,
// step_plan.h). Torch-free, header-only.
#ifndef MEGATRAIN_ENGINE_SPEC_STEP_SCHEDULE_H_
#define MEGATRAIN_ENGINE_SPEC_STEP_SCHEDULE_H_

#include <cstdint>
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

// "auto" for an empty optional (the trainer's choice), else StepScheduleName.
inline const char* StepScheduleRequestName(std::optional<StepSchedule> schedule) {
  return schedule.has_value() ? StepScheduleName(*schedule) : "auto";
}

// Note [Schedule choice] in engine/step/schedule_choice.h: a wave of more
// than one micro-batch is a layer-major wave, so it contradicts a forced
// micro-batch-major schedule. The one statement of the rule: the job spec
// (ValidateJobSpec) and the trainer's choice (ChooseSchedule) word the
// refusal each for its own field.
inline bool WaveContradictsSchedule(std::optional<StepSchedule> schedule, int64_t wave) {
  return wave > 1 && schedule == StepSchedule::kMicroBatchMajor;
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

// Where the saved layer inputs live as asked: train.offload_activations
// (TrainerOptions::offload_activations, --offload_activations) true means
// kHost whatever `placement` says (the job spec refuses kDevice with it);
// otherwise `placement`. The one statement of the rule.
inline ActivationPlacement RequestedActivations(bool offload_activations,
                                                ActivationPlacement placement) {
  return offload_activations ? ActivationPlacement::kHost : placement;
}

// Whether dense decoder layers run from CUDA graphs (`train.cuda_graphs`,
// megatrain-bench --cuda_graphs; Note [Layer graphs] in
// engine/step/layer_graphs.h).
enum class CudaGraphs {
  kAuto,  // on a GPU when a micro-batch is small (kCudaGraphMaxTokens)
  kOff,
  kOn,
};

// "auto", "off", "on".
inline const char* CudaGraphsName(CudaGraphs graphs) {
  switch (graphs) {
    case CudaGraphs::kAuto:
      return "auto";
    case CudaGraphs::kOff:
      return "off";
    case CudaGraphs::kOn:
      return "on";
  }
  return "?";
}

// The trainer's spelling (TrainerOptions::cuda_graphs,
// ScheduleRequest::cuda_graphs, megatrain-bench --cuda_graphs): -1 auto,
// 0 off, 1 on.
inline int CudaGraphsOption(CudaGraphs graphs) {
  return graphs == CudaGraphs::kOn ? 1 : graphs == CudaGraphs::kOff ? 0 : -1;
}

// Inverse of CudaGraphsOption; anything but 0 and 1 is auto.
inline CudaGraphs CudaGraphsFromOption(int option) {
  return option == 1 ? CudaGraphs::kOn : option == 0 ? CudaGraphs::kOff : CudaGraphs::kAuto;
}

// "auto" (empty), "off", "on". INVALID_ARGUMENT "<field>: expected auto,
// on or off, got '<text>'" otherwise, quoting at most 32 bytes of `text`.
inline absl::StatusOr<CudaGraphs> ParseCudaGraphs(absl::string_view text, absl::string_view field) {
  if (text.empty() || text == "auto") return CudaGraphs::kAuto;
  if (text == "off") return CudaGraphs::kOff;
  if (text == "on") return CudaGraphs::kOn;
  constexpr size_t kQuoted = 32;
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected auto, on or off, got '",
                                                 text.substr(0, kQuoted),
                                                 text.size() > kQuoted ? "...'" : "'"));
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_STEP_SCHEDULE_H_
