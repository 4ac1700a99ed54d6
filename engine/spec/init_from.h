// Where a job's weights come from when it starts from another job's
// checkpoint: the job field `model.init_from` (docs/job-spec.md, "Starting
// from a checkpoint"). Shared by the job spec (job_spec.h), the trainer job
// (engine/job/training_job.cc), which loads it, and the daemon, which
// resolves it at submit; torch-free, header-only.
#ifndef MEGATRAIN_ENGINE_SPEC_INIT_FROM_H_
#define MEGATRAIN_ENGINE_SPEC_INIT_FROM_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace megatrain::engine {

// What of the checkpoint's AdamW state a job started from it takes.
enum class InitOptimizer {
  // Fresh AdamW: zero moments, step 0, the job's own schedule from its start.
  kFresh,
  // The checkpoint's AdamW moments and step count: the job's first step is
  // step checkpoint + 1 of the schedule (bias correction and learning rate
  // as the original job's next step), and it ends at train.max_steps as
  // a resumed job would (steps checkpoint + 1 .. max_steps).
  kRestore,
};

// "fresh" | "restore", the spelling of job files, JSON and docs.
inline const char* InitOptimizerName(InitOptimizer optimizer) {
  return optimizer == InitOptimizer::kRestore ? "restore" : "fresh";
}

// Parses InitOptimizerName's spellings. INVALID_ARGUMENT naming the field
// `model.init_from.optimizer` and the value otherwise.
inline absl::StatusOr<InitOptimizer> ParseInitOptimizer(absl::string_view name) {
  if (name == "fresh") return InitOptimizer::kFresh;
  if (name == "restore") return InitOptimizer::kRestore;
  return absl::InvalidArgumentError(
      absl::StrCat("model.init_from.optimizer: must be fresh or restore, got '", name, "'"));
}

// model.init_from: a job's starting weights (and, with kRestore, AdamW
// state) from a checkpoint its user owns.
struct InitFrom {
  // "<job id>/step-<step>", e.g. "job-000012/step-400" (the id `megatrain
  // checkpoints` prints); empty: the job does not start from a checkpoint.
  std::string checkpoint;
  InitOptimizer optimizer = InitOptimizer::kFresh;
  // The checkpoint's directory: set by the daemon at submit from its
  // records (Note [Checkpoint ownership] in server/core/checkpoint_records.h),
  // never from the user (not in the job file or the proto); a standalone
  // run sets it itself. The engine reads only this.
  std::string checkpoint_dir;
  // XXH64 of its manifest.json as the daemon's record has it (Note
  // [Checkpoint ownership]); 0: not checked. The job checks it again when
  // it starts, so that a directory replaced while the job was queued (a
  // link swapped in above it) is refused, not read.
  uint64_t manifest_xxh64 = 0;
};

// The largest step a checkpoint id may name (a 64-bit step count).
inline constexpr int64_t kMaxInitFromStep = int64_t{1} << 62;

// Checks the shape of `checkpoint` ("job-<digits>/step-<digits>"): no other
// character, so no path (`..`, `/abs`, `~`) can reach the file system.
// INVALID_ARGUMENT naming `model.init_from.checkpoint` and the value.
inline absl::Status CheckInitFromCheckpointId(absl::string_view checkpoint) {
  const auto refuse = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.init_from.checkpoint: expected '<job id>/step-<step>' as `megatrain checkpoints` "
        "prints it (e.g. job-000012/step-400), got '",
        checkpoint.substr(0, 256), checkpoint.size() > 256 ? "...'" : "'"));
  };
  const auto all_digits = [](absl::string_view s) {
    if (s.empty() || s.size() > 19) return false;
    for (char c : s) {
      if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
    }
    return true;
  };
  const size_t slash = checkpoint.find('/');
  if (slash == absl::string_view::npos) return refuse();
  absl::string_view job = checkpoint.substr(0, slash);
  if (!absl::ConsumePrefix(&job, "job-") || !all_digits(job)) {
    return refuse();
  }
  absl::string_view digits = checkpoint.substr(slash + 1);
  int64_t value = 0;
  if (!absl::ConsumePrefix(&digits, "step-") || !all_digits(digits) ||
      !absl::SimpleAtoi(digits, &value) || value > kMaxInitFromStep) {
    return refuse();
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_INIT_FROM_H_
