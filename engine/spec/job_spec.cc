// See job_spec.h.
#include "engine/spec/job_spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "engine/runtime/status_macros.h"
#include "engine/spec/checkpoint_retention.h"
#include "engine/spec/lr_schedule_kind.h"
#include "engine/spec/step_schedule.h"

namespace megatrain::engine {
namespace {

// Exactly one of each pair of fields, and the tokenizer that text needs.
absl::Status CheckSources(const JobSpec& s) {
  if (s.model.preset.empty() == s.model.hf_dir.empty()) {
    return absl::InvalidArgumentError("model: set exactly one of model.preset and model.hf_dir");
  }
  if (!s.model.preset.empty()) MEGATRAIN_RETURN_IF_ERROR(PresetConfig(s.model.preset).status());
  if (s.data.tokens.empty() == s.data.text.empty()) {
    return absl::InvalidArgumentError("data: set exactly one of data.tokens and data.text");
  }
  if (!s.data.text.empty() && s.data.tokenizer.empty() && s.model.hf_dir.empty()) {
    return absl::InvalidArgumentError(
        "data.tokenizer: required with data.text and model.preset (a model directory's "
        "tokenizer.json, the file, or a SentencePiece model); with model.hf_dir the "
        "directory's tokenizer.json is the default");
  }
  MEGATRAIN_RETURN_IF_ERROR(
      CheckRealInRange("data.eval_fraction", s.data.eval_fraction, kEvalFractionRange));
  if (!s.data.eval_tokens.empty() && s.data.eval_fraction > 0) {
    return absl::InvalidArgumentError(
        "data.eval_fraction: must be 0 when data.eval_tokens gives the held-out set");
  }
  const DocumentAttention attention = s.data.packing.document_attention;
  if (attention != DocumentAttention::kAuto && attention != DocumentAttention::kIsolated &&
      attention != DocumentAttention::kShared) {
    return absl::InvalidArgumentError(
        absl::StrCat(kDocumentAttentionField, ": unknown value ", static_cast<int>(attention)));
  }
  return absl::OkStatus();
}

// train.schedule, train.wave, train.activations and train.cuda_graphs (Note [Schedule choice]
// in engine/step/schedule_choice.h); the spellings are step_schedule.h's.
absl::Status CheckTrainSchedule(const TrainSpec& t) {
  MEGATRAIN_ASSIGN_OR_RETURN(const std::optional<StepSchedule> schedule,
                             ParseStepSchedule(t.schedule, "train.schedule"));
  MEGATRAIN_ASSIGN_OR_RETURN(const ActivationPlacement activations,
                             ParseActivationPlacement(t.activations, "train.activations"));
  MEGATRAIN_RETURN_IF_ERROR(CheckIntInRange("train.wave", t.wave, kWaveRange));
  MEGATRAIN_RETURN_IF_ERROR(ParseCudaGraphs(t.cuda_graphs, "train.cuda_graphs").status());
  if (t.wave > 1 && schedule == StepSchedule::kMicroBatchMajor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.wave: ", t.wave, " micro-batches per wave needs train.schedule: layer-major"));
  }
  if (t.offload_activations && activations == ActivationPlacement::kDevice) {
    return absl::InvalidArgumentError(
        "train.activations: 'device' contradicts train.offload_activations: true");
  }
  return absl::OkStatus();
}

// train.devices (docs/distributed.md): each device runs the same number of
// micro-batches per step.
absl::Status CheckTrainDevices(const TrainSpec& t) {
  MEGATRAIN_RETURN_IF_ERROR(CheckIntInRange("train.devices", t.devices, kDevicesRange));
  if (t.devices > 1 && t.gradient_accumulation_steps % t.devices != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.devices: ", t.devices,
                     " devices need train.gradient_accumulation_steps to be a "
                     "multiple of ",
                     t.devices, " (each device runs the same number of micro-batches), got ",
                     t.gradient_accumulation_steps));
  }
  return absl::OkStatus();
}

// train.resident_layers (Note [Auto resident layers] in
// engine/step/schedule_choice.h): auto or a count; resident layers keep
// their AdamW state on the device, which the NVMe tier (the moments in
// files) and data parallelism (gradients reduced through the store) do
// not allow. The model's num_hidden_layers bounds it at submission.
absl::Status CheckResidentLayers(const JobSpec& s) {
  const int64_t n = s.train.resident_layers;
  if (n < kResidentLayersRange.min || n > kResidentLayersRange.max) {
    return absl::InvalidArgumentError(absl::StrCat("train.resident_layers: must be auto or in [0, ",
                                                   kResidentLayersRange.max, "], got ", n));
  }
  if (n <= 0) return absl::OkStatus();
  if (s.memory.nvme_tier != NvmeTierMode::kOff) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.resident_layers: ", n,
                     " resident layers need memory.nvme_tier: off (the tier keeps "
                     "the AdamW moments in files), got ",
                     NvmeTierModeName(s.memory.nvme_tier)));
  }
  if (s.train.devices > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.resident_layers: must be 0 or auto with train.devices > 1 (a resident layer's "
        "gradient stays on its device), got ",
        n));
  }
  return absl::OkStatus();
}

absl::Status CheckTrain(const TrainSpec& t) {
  MEGATRAIN_RETURN_IF_ERROR(CheckIntInRange("train.micro_batch", t.micro_batch, kMicroBatchRange));
  MEGATRAIN_RETURN_IF_ERROR(CheckIntInRange("train.seq_len", t.seq_len, kSeqLenRange));
  MEGATRAIN_RETURN_IF_ERROR(CheckIntInRange("train.gradient_accumulation_steps",
                                            t.gradient_accumulation_steps,
                                            kGradientAccumulationStepsRange));
  MEGATRAIN_RETURN_IF_ERROR(CheckIntInRange("train.max_steps", t.max_steps, kMaxStepsRange));
  MEGATRAIN_RETURN_IF_ERROR(CheckIntInRange("train.max_tokens", t.max_tokens, kMaxTokensRange));
  if (t.max_steps == 0 && t.max_tokens == 0) {
    return absl::InvalidArgumentError(
        "train.max_steps: set train.max_steps or train.max_tokens (> 0)");
  }
  MEGATRAIN_RETURN_IF_ERROR(
      CheckRealInRange("train.max_grad_norm", t.max_grad_norm, kMaxGradNormRange));
  if (t.nan_policy != NanPolicy::kSkip && t.nan_policy != NanPolicy::kFail) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.nan_policy: unknown value ", static_cast<int>(t.nan_policy)));
  }
  MEGATRAIN_RETURN_IF_ERROR(CheckTrainDevices(t));
  return CheckTrainSchedule(t);
}

// After CheckTrain: warmup_steps is bounded by the run's length.
absl::Status CheckOptimizer(const JobSpec& s) {
  const OptimizerSpec& o = s.optimizer;
  MEGATRAIN_RETURN_IF_ERROR(CheckRealInRange("optimizer.lr", o.lr, kLrRange));
  MEGATRAIN_RETURN_IF_ERROR(CheckRealInRange("optimizer.beta1", o.beta1, kBeta1Range));
  MEGATRAIN_RETURN_IF_ERROR(CheckRealInRange("optimizer.beta2", o.beta2, kBeta2Range));
  MEGATRAIN_RETURN_IF_ERROR(CheckRealInRange("optimizer.eps", o.eps, kEpsRange));
  MEGATRAIN_RETURN_IF_ERROR(
      CheckRealInRange("optimizer.weight_decay", o.weight_decay, kWeightDecayRange));
  MEGATRAIN_RETURN_IF_ERROR(
      CheckRealInRange("optimizer.min_lr_ratio", o.min_lr_ratio, kMinLrRatioRange));
  MEGATRAIN_RETURN_IF_ERROR(ParseLrScheduleKind(o.schedule).status());
  return CheckIntInRange("optimizer.warmup_steps", o.warmup_steps, IntRange{0, MaxSteps(s)});
}

absl::Status CheckEvalAndCheckpoint(const JobSpec& s) {
  MEGATRAIN_RETURN_IF_ERROR(
      CheckIntInRange("eval.every_steps", s.eval.every_steps, kEvalEveryStepsRange));
  MEGATRAIN_RETURN_IF_ERROR(CheckIntInRange("eval.batches", s.eval.batches, kEvalBatchesRange));
  MEGATRAIN_RETURN_IF_ERROR(CheckIntInRange("checkpoint.every_steps", s.checkpoint.every_steps,
                                            kCheckpointEveryStepsRange));
  return CheckCheckpointRetention(s.checkpoint);
}

}  // namespace

absl::Status CheckCheckpointRetention(const CheckpointSpec& checkpoint) {
  MEGATRAIN_RETURN_IF_ERROR(
      CheckIntInRange("checkpoint.keep_last", checkpoint.keep_last, kCheckpointKeepLastRange));
  return CheckIntInRange("checkpoint.keep_every", checkpoint.keep_every, kCheckpointKeepEveryRange);
}

absl::Status CheckIntInRange(absl::string_view field, int64_t value, IntRange range) {
  if (value >= range.min && value <= range.max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be in [", range.min, ", ", range.max, "], got ", value));
}

absl::Status CheckRealInRange(absl::string_view field, double value, RealRange range) {
  const bool above_min = range.min_open ? value > range.min : value >= range.min;
  if (std::isfinite(value) && above_min && value <= range.max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": must be in ", range.min_open ? "(" : "[",
                                                 range.min, ", ", range.max, "], got ", value));
}

int64_t MaxSteps(const JobSpec& spec) {
  const TrainSpec& t = spec.train;
  if (t.max_steps > 0) return t.max_steps;
  int64_t tokens_per_step = 0;
  if (t.max_tokens <= 0 || t.micro_batch < 1 || t.seq_len < 1 ||
      t.gradient_accumulation_steps < 1 ||
      __builtin_mul_overflow(t.micro_batch, t.seq_len, &tokens_per_step) ||
      __builtin_mul_overflow(tokens_per_step, t.gradient_accumulation_steps, &tokens_per_step)) {
    return 0;
  }
  // ceil(max_tokens / tokens_per_step), without forming max_tokens + divisor.
  return t.max_tokens / tokens_per_step + (t.max_tokens % tokens_per_step != 0 ? 1 : 0);
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  MEGATRAIN_RETURN_IF_ERROR(CheckSources(spec));
  MEGATRAIN_RETURN_IF_ERROR(CheckTrain(spec.train));
  const NvmeTierMode tier = spec.memory.nvme_tier;
  if (tier != NvmeTierMode::kOff && tier != NvmeTierMode::kMoments && tier != NvmeTierMode::kAuto) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory.nvme_tier: unknown value ", static_cast<int>(tier)));
  }
  // Note [Gradient ring] in engine/step/grad_lander.h: the norm of the
  // whole gradient is needed before any update when clipping.
  if (spec.memory.gradient_landing == GradientLanding::kRing && spec.train.max_grad_norm > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory.gradient_landing: ring needs train.max_grad_norm 0 (clipping needs the whole "
        "gradient's norm before any update), got max_grad_norm ",
        spec.train.max_grad_norm, "; use arena or auto"));
  }
  // Note [Shared host store] in engine/step/gradient_reducer.h: the ranks'
  // reduced shards land in the shared store's gradient arena.
  if (spec.memory.gradient_landing == GradientLanding::kRing && spec.train.devices > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory.gradient_landing: ring is not built with train.devices > 1 (the reduced "
        "gradients land in the shared store's arena), got devices ",
        spec.train.devices, "; use arena or auto"));
  }
  MEGATRAIN_RETURN_IF_ERROR(CheckResidentLayers(spec));
  MEGATRAIN_RETURN_IF_ERROR(CheckOptimizer(spec));
  return CheckEvalAndCheckpoint(spec);
}

}  // namespace megatrain::engine
