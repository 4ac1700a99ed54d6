// The step schedule's words: the order of work of a step (the job field
// `train.schedule`, megatrain-bench --schedule), where the saved layer
// inputs live (`train.activations`, --activations), whether layers run
// from CUDA graphs (`train.cuda_graphs`, --cuda_graphs) and through the
// fused kernels (`train.fused_kernels`, --fused_kernels). One place for
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
#include "engine/spec/keyword.h"

namespace megatrain::engine {

// The order of the micro-batches' work in a pass.
enum class StepSchedule {
  kMicroBatchMajor,  // each micro-batch through every layer, then the next
  kLayerMajor,       // every micro-batch of a wave through a layer, then the next
                     // layer (Note [Layer-major schedule] in engine/step/step_plan.h)
};

// train.schedule's keywords (engine/spec/keyword.h): auto is the empty
// optional, the trainer's choice.
inline constexpr Keyword<std::optional<StepSchedule>> kStepScheduleKeywords[] = {
    {"auto", std::nullopt},
    {"micro-batch-major", StepSchedule::kMicroBatchMajor},
    {"layer-major", StepSchedule::kLayerMajor},
};

// "micro-batch-major" / "layer-major" (the job spec's and the bench's words).
inline const char* StepScheduleName(StepSchedule schedule) {
  const char* name = KeywordName(kStepScheduleKeywords, std::optional(schedule));
  return name != nullptr ? name : "?";
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
// auto. INVALID_ARGUMENT "<field>: must be auto, micro-batch-major or
// layer-major, got '<text>'" otherwise.
inline absl::StatusOr<std::optional<StepSchedule>> ParseStepSchedule(absl::string_view text,
                                                                     absl::string_view field) {
  if (text.empty()) return std::optional<StepSchedule>();
  return ParseKeyword(kStepScheduleKeywords, text, field);
}

// Where the saved layer inputs live (Note [Activation offload] in
// engine/step/executor.h).
enum class ActivationPlacement {
  kAuto,    // Note [Schedule choice] in engine/step/schedule_choice.h
  kDevice,  // on the device
  kHost,    // pinned host memory (train.offload_activations)
};

// train.activations' keywords (engine/spec/keyword.h).
inline constexpr Keyword<ActivationPlacement> kActivationPlacementKeywords[] = {
    {"auto", ActivationPlacement::kAuto},
    {"device", ActivationPlacement::kDevice},
    {"host", ActivationPlacement::kHost},
};

// "auto", "device", "host".
inline const char* ActivationPlacementName(ActivationPlacement placement) {
  const char* name = KeywordName(kActivationPlacementKeywords, placement);
  return name != nullptr ? name : "?";
}

// "auto" (empty), "device", "host". INVALID_ARGUMENT "<field>: must be
// auto, device or host, got '<text>'" otherwise.
inline absl::StatusOr<ActivationPlacement> ParseActivationPlacement(absl::string_view text,
                                                                    absl::string_view field) {
  if (text.empty()) return ActivationPlacement::kAuto;
  return ParseKeyword(kActivationPlacementKeywords, text, field);
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

// train.cuda_graphs' keywords (engine/spec/keyword.h).
inline constexpr Keyword<CudaGraphs> kCudaGraphsKeywords[] = {
    {"auto", CudaGraphs::kAuto},
    {"off", CudaGraphs::kOff},
    {"on", CudaGraphs::kOn},
};

// "auto", "off", "on".
inline const char* CudaGraphsName(CudaGraphs graphs) {
  const char* name = KeywordName(kCudaGraphsKeywords, graphs);
  return name != nullptr ? name : "?";
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

// "auto" (empty), "off", "on". INVALID_ARGUMENT "<field>: must be auto,
// off or on, got '<text>'" otherwise, quoting at most 32 bytes of `text`.
inline absl::StatusOr<CudaGraphs> ParseCudaGraphs(absl::string_view text, absl::string_view field) {
  if (text.empty()) return CudaGraphs::kAuto;
  return ParseKeyword(kCudaGraphsKeywords, text, field);
}

// Whether dense decoder layers run the fused elementwise kernels
// (`train.fused_kernels`, megatrain-bench --fused_kernels; Note [Fused
// kernels] in engine/model/fused_math.h). They act only on CUDA bf16
// tensors; elsewhere the layers keep the ATen ops whatever the choice.
enum class FusedKernels {
  kAuto,  // on where the build has them (CUDA builds), as kOn
  kOff,
  kOn,  // refused at submission by a build without them
};

// train.fused_kernels' keywords (engine/spec/keyword.h).
inline constexpr Keyword<FusedKernels> kFusedKernelsKeywords[] = {
    {"auto", FusedKernels::kAuto},
    {"off", FusedKernels::kOff},
    {"on", FusedKernels::kOn},
};

// "auto", "off", "on".
inline const char* FusedKernelsName(FusedKernels fused) {
  const char* name = KeywordName(kFusedKernelsKeywords, fused);
  return name != nullptr ? name : "?";
}

// Whether a decoder layer's forward is recomputed in backward
// (`train.activation_checkpointing`, megatrain-bench
// --activation_checkpointing; Note [Kept layer graphs] in
// engine/step/executor.h).
enum class ActivationCheckpointing {
  kAuto,  // resident dense layers whose forward graph fits keep it (no recompute)
  kAll,   // every layer saves only its input and is recomputed
};

// train.activation_checkpointing's keywords (engine/spec/keyword.h).
inline constexpr Keyword<ActivationCheckpointing> kActivationCheckpointingKeywords[] = {
    {"auto", ActivationCheckpointing::kAuto},
    {"all", ActivationCheckpointing::kAll},
};

// TrainerOptions::kept_graph_layers for `choice`: -1 (auto) or 0 (all).
inline int KeptGraphLayersOption(ActivationCheckpointing choice) {
  return choice == ActivationCheckpointing::kAll ? 0 : -1;
}

// TrainerOptions::fused_kernels for `choice` in a build that has the
// kernels (`compiled`, engine::FusedKernelsCompiled()) or not: kOn is on
// (the trainer refuses it without the kernels), kAuto is on exactly when
// they are compiled.
inline bool FusedKernelsEnabled(FusedKernels choice, bool compiled) {
  return choice == FusedKernels::kOn || (choice == FusedKernels::kAuto && compiled);
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_STEP_SCHEDULE_H_
