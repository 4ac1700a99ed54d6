// What a training step does when its loss or gradient is not finite (NaN or
// inf): the job field `train.nan_policy` (docs/job-spec.md, "Non-finite
// steps"). Shared by the trainer (trainer.h), which applies it per step, and
// the job spec (engine/spec/job_spec.h), which carries it; torch-free,
// header-only.
#ifndef MEGATRAIN_ENGINE_SPEC_NAN_POLICY_H_
#define MEGATRAIN_ENGINE_SPEC_NAN_POLICY_H_

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace megatrain::engine {

enum class NanPolicy {
  // The optimizer update is not applied (weights and AdamW moments keep
  // their bits, the step number does not advance), the gradients are
  // dropped (the next step overwrites them) and training goes on with the
  // next batch. The step is reported with `skipped` set.
  kSkip,
  // The job fails with FAILED_PRECONDITION naming the step.
  kFail,
};

// "skip" | "fail", the spelling of job files, JSON and docs.
inline const char* NanPolicyName(NanPolicy policy) {
  return policy == NanPolicy::kFail ? "fail" : "skip";
}

// Parses NanPolicyName's spellings. INVALID_ARGUMENT naming the field
// `train.nan_policy` and the value otherwise.
inline absl::StatusOr<NanPolicy> ParseNanPolicy(absl::string_view name) {
  if (name == "skip") return NanPolicy::kSkip;
  if (name == "fail") return NanPolicy::kFail;
  return absl::InvalidArgumentError(
      absl::StrCat("train.nan_policy: must be skip or fail, got '", name, "'"));
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_NAN_POLICY_H_
