// See job_spec.h.
#include "engine/spec/job_spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/model_config.h"
#include "engine/spec/checkpoint_retention.h"
#include "engine/spec/keyword.h"
#include "engine/spec/spec_fields.h"

namespace megatrain::engine {
namespace {

// Enums out of their range: only a caller that casts an integer makes
// one (the edges parse words into the enums).
template <typename Enum>
void CheckEnumValue(absl::string_view field, Enum value, Enum last, SpecErrors& errors) {
  const int n = static_cast<int>(value);
  if (n < 0 || n > static_cast<int>(last)) {
    errors.Add(absl::InvalidArgumentError(absl::StrCat(field, ": unknown value ", n)));
  }
}

// The number of an enum, for the message of one out of its range.
template <typename Enum>
int EnumNumber(Enum value) {
  return static_cast<int>(value);
}
template <typename Enum>
int EnumNumber(std::optional<Enum> value) {
  return value.has_value() ? static_cast<int>(*value) : -1;
}

// Note [Spec field table]: a keyword row's value must be one of its
// table's (only a caller that casts an integer makes another).
template <typename T, size_t N>
void CheckKeyword(absl::string_view field, const T& value, const Keyword<T> (&keywords)[N],
                  SpecErrors& errors) {
  if (KeywordName(keywords, value) == nullptr) {
    errors.Add(
        absl::InvalidArgumentError(absl::StrCat(field, ": unknown value ", EnumNumber(value))));
  }
}

// Exactly one of each pair of fields, and the tokenizer that text needs.
void CheckSources(const JobSpec& s, SpecErrors& errors) {
  if (s.model.preset.empty() == s.model.hf_dir.empty()) {
    errors.Add(
        absl::InvalidArgumentError("model: set exactly one of model.preset and model.hf_dir"));
  }
  if (!s.model.preset.empty()) errors.Add(PresetConfig(s.model.preset).status());
  if (!s.model.init_from.checkpoint.empty()) {
    errors.Add(CheckInitFromCheckpointId(s.model.init_from.checkpoint));
  }
  CheckEnumValue("model.init_from.optimizer", s.model.init_from.optimizer, InitOptimizer::kRestore,
                 errors);
  if (s.data.tokens.empty() == s.data.text.empty()) {
    errors.Add(absl::InvalidArgumentError("data: set exactly one of data.tokens and data.text"));
  }
  if (!s.data.text.empty() && s.data.tokenizer.empty() && s.model.hf_dir.empty()) {
    errors.Add(absl::InvalidArgumentError(
        "data.tokenizer: required with data.text and model.preset (a model directory's "
        "tokenizer.json, the file, or a SentencePiece model); with model.hf_dir the "
        "directory's tokenizer.json is the default"));
  }
  errors.Add(CheckRealInRange("data.eval_fraction", s.data.eval_fraction, kEvalFractionRange));
  if (!s.data.eval_tokens.empty() && s.data.eval_fraction > 0) {
    errors.Add(absl::InvalidArgumentError(
        "data.eval_fraction: must be 0 when data.eval_tokens gives the held-out set"));
  }
  const DocumentAttention attention = s.data.packing.document_attention;
  if (attention != DocumentAttention::kAuto && attention != DocumentAttention::kIsolated &&
      attention != DocumentAttention::kShared) {
    errors.Add(absl::InvalidArgumentError(
        absl::StrCat(kDocumentAttentionField, ": unknown value ", static_cast<int>(attention))));
  }
}

// train.schedule, train.wave, train.activations and train.cuda_graphs (Note [Schedule choice]
// in engine/step/schedule_choice.h); the rules are step_schedule.h's.
void CheckTrainSchedule(const TrainSpec& t, SpecErrors& errors) {
  if (WaveContradictsSchedule(t.schedule, t.wave)) {
    errors.Add(absl::InvalidArgumentError(absl::StrCat(
        "train.wave: ", t.wave, " micro-batches per wave needs train.schedule: layer-major")));
  }
  if (t.offload_activations && t.activations == ActivationPlacement::kDevice) {
    errors.Add(absl::InvalidArgumentError(
        "train.activations: 'device' contradicts train.offload_activations: true"));
  }
}

// train.devices (docs/distributed.md): each device runs the same number of
// micro-batches per step.
void CheckTrainDevices(const TrainSpec& t, SpecErrors& errors) {
  const absl::Status range = CheckIntInRange("train.devices", t.devices, kDevicesRange);
  errors.Add(range);
  if (range.ok() && t.devices > 1 && t.gradient_accumulation_steps % t.devices != 0) {
    errors.Add(absl::InvalidArgumentError(
        absl::StrCat("train.devices: ", t.devices,
                     " devices need train.gradient_accumulation_steps to be a "
                     "multiple of ",
                     t.devices, " (each device runs the same number of micro-batches), got ",
                     t.gradient_accumulation_steps)));
  }
}

// train.resident_layers (Note [Auto resident layers] in
// engine/step/schedule_choice.h): auto or a count; resident layers keep
// their AdamW state on the device, which the NVMe tier (the moments in
// files) and data parallelism (gradients reduced through the store) do
// not allow. The model's num_hidden_layers bounds it at submission.
void CheckResidentLayers(const JobSpec& s, SpecErrors& errors) {
  const int64_t n = s.train.resident_layers;
  if (n < kResidentLayersRange.min || n > kResidentLayersRange.max) {
    errors.Add(absl::InvalidArgumentError(absl::StrCat(
        "train.resident_layers: must be auto or in [0, ", kResidentLayersRange.max, "], got ", n)));
    return;
  }
  if (n <= 0) return;
  if (s.memory.nvme_tier != NvmeTierMode::kOff) {
    errors.Add(absl::InvalidArgumentError(
        absl::StrCat("train.resident_layers: ", n,
                     " resident layers need memory.nvme_tier: off (the tier keeps "
                     "the AdamW moments in files), got ",
                     NvmeTierModeName(s.memory.nvme_tier))));
  }
  if (s.train.devices > 1) {
    errors.Add(absl::InvalidArgumentError(absl::StrCat(
        "train.resident_layers: must be 0 or auto with train.devices > 1 (a resident layer's "
        "gradient stays on its device), got ",
        n)));
  }
}

void CheckTrain(const TrainSpec& t, SpecErrors& errors) {
  // Note [Spec field table].
#define MEGATRAIN_CHECK(name, kind, range, json, proto) \
  errors.Add(Check##kind##InRange("train." #name, t.name, range));
  MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_CHECK)
#undef MEGATRAIN_CHECK
#define MEGATRAIN_CHECK(name, keywords, json) \
  CheckKeyword("train." #name, t.name, keywords, errors);
  MEGATRAIN_TRAIN_KEYWORD_FIELDS(MEGATRAIN_CHECK)
#undef MEGATRAIN_CHECK
  if (t.max_steps == 0 && t.max_tokens == 0) {
    errors.Add(absl::InvalidArgumentError(
        "train.max_steps: set train.max_steps or train.max_tokens (> 0)"));
  }
  if (t.nan_policy != NanPolicy::kSkip && t.nan_policy != NanPolicy::kFail) {
    errors.Add(absl::InvalidArgumentError(
        absl::StrCat("train.nan_policy: unknown value ", static_cast<int>(t.nan_policy))));
  }
  CheckTrainDevices(t, errors);
  CheckTrainSchedule(t, errors);
}

// warmup_steps is bounded by the run's length, checked only when `train_ok`
// (CheckTrain found nothing: the length is known).
void CheckOptimizer(const JobSpec& s, bool train_ok, SpecErrors& errors) {
  const OptimizerSpec& o = s.optimizer;
#define MEGATRAIN_CHECK(name, kind, range, json, proto) \
  errors.Add(Check##kind##InRange("optimizer." #name, o.name, range));
  MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_CHECK)
#undef MEGATRAIN_CHECK
#define MEGATRAIN_CHECK(name, keywords, json) \
  CheckKeyword("optimizer." #name, o.name, keywords, errors);
  MEGATRAIN_OPTIMIZER_KEYWORD_FIELDS(MEGATRAIN_CHECK)
#undef MEGATRAIN_CHECK
  if (train_ok) {
    errors.Add(CheckIntInRange("optimizer.warmup_steps", o.warmup_steps, IntRange{0, MaxSteps(s)}));
  }
}

void CheckEvalAndCheckpoint(const JobSpec& s, SpecErrors& errors) {
#define MEGATRAIN_CHECK(name, kind, range, json, proto) \
  errors.Add(Check##kind##InRange("eval." #name, s.eval.name, range));
  MEGATRAIN_EVAL_NUMBER_FIELDS(MEGATRAIN_CHECK)
#undef MEGATRAIN_CHECK
  errors.Add(CheckCheckpointRetention(s.checkpoint));
}

// memory.nvme_tier and memory.gradient_landing against the rest.
void CheckMemory(const JobSpec& spec, SpecErrors& errors) {
  const MemorySpec& m = spec.memory;
#define MEGATRAIN_CHECK(name, keywords, json) \
  CheckKeyword("memory." #name, m.name, keywords, errors);
  MEGATRAIN_MEMORY_KEYWORD_FIELDS(MEGATRAIN_CHECK)
#undef MEGATRAIN_CHECK
  // Note [Gradient ring] in engine/step/grad_lander.h: the norm of the
  // whole gradient is needed before any update when clipping.
  if (spec.memory.gradient_landing == GradientLanding::kRing &&
      ClippingForbidsGradientRing(spec.train.max_grad_norm)) {
    errors.Add(absl::InvalidArgumentError(absl::StrCat(
        "memory.gradient_landing: ring needs train.max_grad_norm 0 (", kGradientRingClippingReason,
        "), got max_grad_norm ", spec.train.max_grad_norm, "; use arena or auto")));
  }
}

}  // namespace

absl::Status CheckCheckpointRetention(const CheckpointSpec& checkpoint) {
  SpecErrors errors;  // Note [Spec field table]
#define MEGATRAIN_CHECK(name, kind, range, json, proto) \
  errors.Add(Check##kind##InRange("checkpoint." #name, checkpoint.name, range));
  MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(MEGATRAIN_CHECK)
#undef MEGATRAIN_CHECK
  return errors.ToStatus();
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

void SpecErrors::Add(const absl::Status& status) {
  if (status.ok()) return;
  if (errors_.empty()) code_ = status.code();
  errors_.push_back(std::string(status.message()));
}

absl::Status SpecErrors::ToStatus() const {
  if (errors_.empty()) return absl::OkStatus();
  return absl::Status(code_, absl::StrJoin(errors_, "; "));
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  SpecErrors errors;
  CheckSources(spec, errors);
  CheckTrain(spec.train, errors);
  const bool train_ok = errors.empty();
  CheckMemory(spec, errors);
  CheckResidentLayers(spec, errors);
  CheckOptimizer(spec, train_ok, errors);
  CheckEvalAndCheckpoint(spec, errors);
  return errors.ToStatus();
}

}  // namespace megatrain::engine
