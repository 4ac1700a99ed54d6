// The one check of a checkpoint retention rule's bounds (keep_last,
// keep_every), shared by job-spec validation and the checkpoint writer so
// that the ranges (kCheckpointKeepLastRange, kCheckpointKeepEveryRange in
// job_spec.h) are checked in one place. A header of its own so that the
// writer need not see the rest of the spec's validation.
#ifndef MEGATRAIN_ENGINE_SPEC_CHECKPOINT_RETENTION_H_
#define MEGATRAIN_ENGINE_SPEC_CHECKPOINT_RETENTION_H_

#include "absl/status/status.h"
#include "engine/spec/job_spec.h"

namespace megatrain::engine {

// The checkpoint section's rows (Note [Spec field table] in
// spec_fields.h: checkpoint.every_steps, keep_last, keep_every) against
// their ranges; used by ValidateJobSpec and WriteCheckpoint.
// INVALID_ARGUMENT as CheckIntInRange ("checkpoint.keep_last: must be in
// [1, 1048576], got 0"), every bad field's message joined by "; ".
// Thread-safe.
absl::Status CheckCheckpointRetention(const CheckpointSpec& checkpoint);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_CHECKPOINT_RETENTION_H_
