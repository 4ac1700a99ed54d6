// CheckpointRecords: the daemon's records of the checkpoints its jobs wrote
// (Note [Checkpoint ownership]): recording a written checkpoint, listing
// the recorded ones whose directories exist, putting them into the output
// directory's ledger, verifying a checkpoint against its record, and, before
// a resume, choosing the newest intact one and quarantining the damaged
// ones (Note [Resume verification]). It appends no event itself: the events
// its work produces are returned, for JobManager to append and announce.
//
// Note [Checkpoint ownership]
// A checkpoint belongs to the job that wrote it, not to the directory it
// lies in: when a job writes one (JobObserver::OnCheckpointWritten), its
// record (job id, owner, step, path, XXH64 of manifest.json) goes into the
// store, and listing, export, deletion and resume use only those records
// (a stat of the recorded path, never a directory scan). The engine writes
// the job id into the checkpoint's state.json and refuses to resume from a
// checkpoint naming another job. Output directories are exclusive: Submit
// refuses an output_dir that equals, contains or lies inside another job's
// (any user, any state) or the jobs directory. Records from before schema
// version 3 (no manifest hash; their state.json names no job) are legacy:
// trusted as recorded, by path and step only.
//
// Note [Resume verification]
// Before a job resumes, its thread verifies the recorded checkpoints newest
// first, from the one it was to resume from down (engine::VerifyCheckpoint
// with check_data: every file against its XXH64, then against the record).
// One that fails is quarantined (renamed quarantined-step-N, its record
// dropped, an event returned) and the next older one is tried; when none is
// intact the job fails with DATA_LOSS naming each file and why. This reads
// the checkpoint once more than the restore does: the price of never
// handing the engine a damaged or foreign checkpoint (and of knowing which
// older one to fall back to before the model is built).
//
// Thread-safety: thread-safe (no state of its own; the store and the
// backend are). Methods that stat or read checkpoint directories say so:
// never call them under JobManager's lock (Note [Lock-free admission] in
// job_manager.h). Ownership: the store and backend are borrowed and must
// outlive it.
#ifndef MEGATRAIN_SERVER_CHECKPOINT_RECORDS_H_
#define MEGATRAIN_SERVER_CHECKPOINT_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/engine_backend.h"
#include "server/core/job.h"
#include "server/core/job_store.h"

namespace megatrain::server {

// The checkpoint a job resumes from, and the events choosing it produced.
struct ResumeSelection {
  // "" for a fresh start; DATA_LOSS naming every file when no recorded
  // checkpoint is intact.
  absl::StatusOr<std::string> dir = std::string();
  // One per quarantined checkpoint, then one naming the older checkpoint
  // chosen instead (state-change events in the job's current state).
  std::vector<JobEvent> events;
};

class CheckpointRecords {
 public:
  CheckpointRecords(JobStore* store, EngineBackend* backend) : store_(store), backend_(backend) {}

  // Records `info`, written by job `job_id` of `owner` in `write_seconds`,
  // and forgets the job's records whose directories the engine's retention
  // removed (a stat per record). Returns the kCheckpoint event to append;
  // a store failure is logged (the job trains on).
  JobEvent RecordWritten(const std::string& job_id, const std::string& owner,
                         const engine::CheckpointInfo& info, double write_seconds);

  // The recorded checkpoints of `job_id` whose directories exist, oldest
  // first (a stat per record). Errors of the store.
  absl::StatusOr<std::vector<CheckpointRecord>> Present(const std::string& job_id);

  // The present record of `job` at `step`. NOT_FOUND naming
  // `checkpoint_id` and how many the job has.
  absl::StatusOr<CheckpointRecord> Find(const JobRecord& job, int64_t step,
                                        absl::string_view checkpoint_id);

  // Newest recorded checkpoint directory of `job`, from the store only (no
  // file I/O: safe under JobManager's lock; a directory that has vanished
  // is found out by SelectResume); "" when none, job.resume_from when the
  // store fails.
  std::string LatestDir(const JobRecord& job);

  // Note [Checkpoint adoption] in engine/checkpoint/checkpoint_info.h: puts the
  // records of `job` into its output directory's ledger, so retention
  // applies to checkpoints written before the ledger. Failures are logged.
  void Adopt(const JobRecord& job);

  // Note [Resume verification]: reads whole checkpoints.
  ResumeSelection SelectResume(const JobRecord& job);

  // DATA_LOSS naming the file unless `found` (read from record.dir) is the
  // checkpoint the record describes: same step, its state names the job
  // (none for a legacy record), same manifest hash (unless legacy).
  static absl::Status VerifyAgainstRecord(const CheckpointRecord& record,
                                          const engine::CheckpointInfo& found);

 private:
  // Renames record.dir to quarantined-<name>, forgets the record and adds
  // an event to `events`; returns "<dir>: <why> (<what was done>)".
  std::string Quarantine(const JobRecord& job, const CheckpointRecord& record,
                         const absl::Status& why, std::vector<JobEvent>* events);
  // Drops the records of `job_id` (but `written_step`'s) whose directories
  // are gone.
  void ForgetVanished(const std::string& job_id, int64_t written_step);

  JobStore* const store_;
  EngineBackend* const backend_;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_CHECKPOINT_RECORDS_H_
