// What a job and the server see of checkpoints without loading them: a
// checkpoint's identity (CheckpointInfo), listing, verification and export
// to an HF directory. Torch-free declarations (the server's core includes
// them through engine/job/training_job.h without linking the engine);
// implemented in checkpoint.cc beside the reader and writer
// (engine/checkpoint/checkpoint.h; the format is docs/checkpoint-format.md).
//
// Thread-safety: as checkpoint.h: no global state; reading concurrently with
// a writer sees complete `step-*` directories only.
#ifndef MEGATRAIN_ENGINE_CHECKPOINT_CHECKPOINT_INFO_H_
#define MEGATRAIN_ENGINE_CHECKPOINT_CHECKPOINT_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace megatrain::engine {

// A checkpoint written by a job (see docs/checkpoint-format.md).
struct CheckpointInfo {
  std::string dir;
  int64_t step = 0;
  int64_t bytes = 0;
  // The job id its state.json names; empty for a checkpoint written without
  // one (a standalone run or a format-1 checkpoint from before job ids).
  // Filled by WriteCheckpoint and VerifyCheckpoint, not by ListCheckpoints.
  std::string job_id;
  // XXH64 (seed 0) of its manifest.json: identifies the checkpoint's whole
  // content (the manifest holds every other file's XXH64). Filled by
  // WriteCheckpoint and VerifyCheckpoint, 0 from ListCheckpoints.
  uint64_t manifest_xxh64 = 0;
};

// Checks checkpoint `checkpoint_dir` (a `step-*` directory) without loading
// it: manifest.json parses, state.json matches its size and XXH64 and
// parses, and its step equals the manifest's. With `check_data`, every
// other file listed in the manifest is read whole and must match its size
// and XXH64 (reads the whole checkpoint once). Returns its step, job id and
// manifest hash (dir and bytes filled too).
// Errors: NOT_FOUND when the directory is missing; DATA_LOSS naming the file
// for anything that does not verify; UNIMPLEMENTED for a newer format.
absl::StatusOr<CheckpointInfo> VerifyCheckpoint(const std::string& checkpoint_dir, bool check_data);

// The `step-*` directories under `<output_dir>/checkpoints`, oldest (lowest
// step) first, with the bytes of their files; `.tmp-*` directories are
// skipped. An output_dir without a `checkpoints` directory has none.
// NOT_FOUND when output_dir is missing.
absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& output_dir);

// Note [Checkpoint adoption]: records in `<output_dir>/checkpoints/
// .ledger.json` (Note [Checkpoint ledger] in checkpoint.cc) the checkpoints
// `checkpoint_dirs` that the daemon's job store records as this job's, so
// that retention (keep_last / keep_every) applies to checkpoints written
// before the ledger existed. The list comes from the job store, never from
// a directory scan: a `step-*` directory a user put there stays unrecorded
// and is never deleted. A directory is adopted only when it is
// `<output_dir>/checkpoints/step-N` exactly (lexically), named as
// CheckpointDirName names step N, and a real directory (not a symbolic
// link) there now; others are skipped. Everything is reached through the
// directory's descriptor without following links (dir_fd.h). Call it on the
// job's thread before its first checkpoint write (one writer per
// output_dir). Returns how many were newly recorded; 0 (and no file
// written) when all are already recorded or none qualifies.
// Errors: FAILED_PRECONDITION when a symbolic link is in the way of
// `checkpoints/`; others from the file system writing the ledger, naming it.
// A missing `checkpoints/` is OK (0).
absl::StatusOr<int64_t> AdoptRecordedCheckpoints(const std::string& output_dir,
                                                 const std::vector<std::string>& checkpoint_dirs);

// Writes checkpoint `checkpoint_dir` as an HF model directory `out_dir`:
// reads the checkpoint's config.json and master weights (verified) into a
// store without optimizer state and writes config.json, safetensors shards
// of at most 5 GB and their index. `dtype` "bf16" | "fp32"
// (ParseExportDtype). `out_dir` is reached from "/" without following any
// symbolic link (ExportHfDirectory in hf_model.h): pass it resolved.
absl::Status ExportHfModel(const std::string& checkpoint_dir, const std::string& out_dir,
                           const std::string& dtype);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_CHECKPOINT_CHECKPOINT_INFO_H_
