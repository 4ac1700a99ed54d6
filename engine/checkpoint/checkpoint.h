// Training checkpoints: everything needed to resume a job exactly (fp32
// master weights, AdamW moments, step, RNG state, data cursor, schedule and
// job spec), written crash-safely, checksummed, and pruned by a retention
// rule. The on-disk format is specified in docs/checkpoint-format.md.
//
// Layout: `<output_dir>/checkpoints/step-00000123/` holds
//   config.json      the model's HF config (ModelConfig::ToHfConfigJson), so a
//                    checkpoint exports to HF with nothing else
//   state.json       step, rng_state, schedule, data cursor, job spec
//   master.bin       fp32 master weights, every block back to back
//   exp_avg.bin      AdamW first moment, same layout
//   exp_avg_sq.bin   AdamW second moment, same layout
//   manifest.json    size and XXH64 of every file above, written last
// The .bin files have a 64-byte header (magic "MTCKPTBK", version, kind,
// block count and per-block element counts) followed by raw little-endian
// fp32: the bytes of the host store, alignment padding included, so a resume
// is a memcpy and bit-exact. Little-endian hosts only (x86-64, aarch64).
//
// Crash safety (Note [Checkpoint publication]): a checkpoint is written into
// `checkpoints/.tmp-step-00000123.XXXXXX/`, every file fsync'd, the
// directory fsync'd, then renamed to `step-00000123` and `checkpoints/`
// fsync'd. A crash at any moment leaves the earlier checkpoints intact and
// at most a `.tmp-*` directory, which ListCheckpoints ignores and the next
// WriteCheckpoint removes. Old checkpoints are deleted by renaming them to
// `.tmp-delete-*` first, so a crash mid-delete never leaves a half-deleted
// `step-*` directory.
//
// Thread-safety: the functions hold no global state. One writer per
// output_dir at a time (the job's thread); the store must not be modified
// (no trainer step) while WriteCheckpoint reads it or ReadCheckpoint writes
// it. Reading checkpoints concurrently with a writer is safe: a reader sees
// complete `step-*` directories only (a reader racing with retention may see
// a directory disappear and get DATA_LOSS / NOT_FOUND).
#ifndef MEGATRAIN_ENGINE_CHECKPOINT_H_
#define MEGATRAIN_ENGINE_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/checkpoint/checkpoint_info.h"
#include "engine/model/model_config.h"
#include "engine/spec/job_spec.h"
#include "engine/store/host_store.h"
#include "engine/store/nvme_tier.h"

namespace megatrain::engine {

// Version of the checkpoint format this build writes and the newest it reads.
inline constexpr uint32_t kCheckpointFormatVersion = 1;

// Everything a resume needs besides the tensors. The strings are opaque to
// this module: they are stored and returned byte for byte (they must be
// valid UTF-8; JSON text is expected but not parsed).
struct CheckpointState {
  int64_t step = 0;              // optimizer steps done; the next step is step + 1
  uint64_t rng_state = 0;        // the caller's RNG seed / counter
  std::string data_cursor_json;  // data loader position, from the loader
  std::string job_spec_json;     // the job as submitted
  std::string schedule_json;     // LR schedule options (the rate is a pure
                                 // function of step and these)
  // The daemon's id of the job that wrote it (JobSpec::job_id); empty for a
  // standalone run. Written as state.json "job_id" only when non-empty, so
  // format-1 readers and checkpoints from before job ids agree; a resume
  // refuses a checkpoint that names another job (TrainingJob::Create).
  std::string job_id;
};

// Name of the directory of `step` under `<output_dir>/checkpoints`:
// "step-00000123" (zero-padded to 8 digits; longer numbers are not padded).
std::string CheckpointDirName(int64_t step);

// Writes a checkpoint of `store` (master weights and AdamW moments) and
// `state` as `<output_dir>/checkpoints/step-<state.step>/`, creating
// directories as needed, then applies `retention`: keeps the `keep_last`
// newest checkpoints by step, plus every step that is a positive multiple of
// `keep_every` (when > 0), plus the one just written; deletes the others.
// `every_steps` is not used here. A checkpoint of the same step that already
// exists is replaced atomically (renameat2 RENAME_EXCHANGE). Leftover
// `.tmp-*` directories from a crashed write are removed first.
//
// Streams block by block from the store (no copy of the model in memory);
// blocks until every byte is on disk (fsync).
//
// Errors: INVALID_ARGUMENT for state.step < 0, a retention outside the spec
// library's bounds (CheckCheckpointRetention: keep_last in [1, 2^20],
// keep_every in [0, 2^40]), or a state string that is not valid UTF-8
// (naming the field); FAILED_PRECONDITION when the store has no optimizer
// state; RESOURCE_EXHAUSTED when the disk is full or a file size limit is
// hit (ENOSPC, EDQUOT, EFBIG); others from the file system, naming the path.
// On an error while writing the files, the temporary directory is removed
// before returning and the message says so and names the newest earlier
// checkpoint, e.g.
//   writing checkpoint step-00000004: <root>/.tmp-step-00000004.Ab12Cd/
//   exp_avg.bin: write: No space left on device (ENOSPC); the partial
//   checkpoint <root>/.tmp-step-00000004.Ab12Cd was removed; earlier
//   checkpoints are intact (newest: <root>/step-00000002)
// On every error the previous checkpoints are untouched.
//
// Example:
//   CheckpointState state{.step = trainer->step(), .rng_state = rng.state()};
//   MEGATRAIN_ASSIGN_OR_RETURN(
//       CheckpointInfo info,
//       WriteCheckpoint(trainer->store(), state, spec.output_dir, spec.checkpoint));
//
// `tier`: the AdamW moments' files when the store keeps none (Note [NVMe
// tier] in store/nvme_tier.h; with data parallelism every rank's shard,
// Note [Tier shards]): read back from them, a chunk at a time, into the
// same bytes an all-in-RAM store writes, whatever the number of shards; their errors (DATA_LOSS for
// a truncated file, naming it) fail the write as above. FAILED_PRECONDITION when the store keeps no
// moments and `tier` is null.
absl::StatusOr<CheckpointInfo> WriteCheckpoint(const HostStore& store, const CheckpointState& state,
                                               const std::string& output_dir,
                                               const CheckpointSpec& retention,
                                               const NvmeMomentTier* tier = nullptr);

// Restores the checkpoint in `checkpoint_dir` (a `step-*` directory) into
// `store`: master weights, and the AdamW moments when the store has
// optimizer state (a store without it, e.g. for export, reads master only and
// skips the moment files); refreshes the bf16 streaming copy. Gradients are
// not saved and not touched (each step overwrites them). Returns the state
// to resume from; the caller sets Trainer::set_step(state.step).
//
// Every file read is checked against manifest.json (size, then XXH64 of the
// whole file, computed while copying).
//
// Errors:
//   DATA_LOSS naming the file for a missing file, a size or XXH64 that
//     disagrees with the manifest (truncation, corruption), a bad magic or
//     header, or a manifest / state.json that does not parse;
//   UNIMPLEMENTED for a format version newer than kCheckpointFormatVersion;
//   FAILED_PRECONDITION when the checkpoint's model does not match the
//     store's (block count, a tensor name or shape; the message names what
//     differs);
//   NOT_FOUND when `checkpoint_dir` does not exist.
// After DATA_LOSS in a tensor file the store's contents are unspecified
// (partly restored): restore another checkpoint or discard the store.
// Errors found before any tensor is copied (all but a checksum mismatch in a
// .bin file) leave the store untouched.
// `tier`: where the moments go when the store keeps none (as
// WriteCheckpoint); FAILED_PRECONDITION when it is needed and null.
// `moments`: kSkip reads the master weights only and leaves the store's
// moments as they are (a new job's store has them zeroed: model.init_from
// with a fresh optimizer); the tier is then not needed.
enum class CheckpointMoments { kRead, kSkip };
absl::StatusOr<CheckpointState> ReadCheckpoint(
    const std::string& checkpoint_dir, HostStore* store, const NvmeMomentTier* tier = nullptr,
    CheckpointMoments moments = CheckpointMoments::kRead);

// The model config stored in the checkpoint (its config.json, checked
// against the manifest). Errors as ReadCheckpoint's for that file, plus
// INVALID_ARGUMENT / UNIMPLEMENTED from ParseHfConfig.
absl::StatusOr<ModelConfig> ReadCheckpointConfig(const std::string& checkpoint_dir);

// Checks that the model of the checkpoint in `checkpoint_dir` has the
// tensors of `config` (same blocks, tensor names and shapes: what
// ReadCheckpoint requires of a store of `config`). Reads config.json only.
// FAILED_PRECONDITION naming what differs; ReadCheckpointConfig's errors.
absl::Status CheckCheckpointModel(const std::string& checkpoint_dir, const ModelConfig& config);

// ListCheckpoints, VerifyCheckpoint and ExportHfModel are declared in
// checkpoint_info.h (torch-free, for the server) and implemented in
// checkpoint.cc.

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_CHECKPOINT_H_
