// JobStore: the daemon's persistent state in one SQLite database (WAL mode)
// under --state_dir: jobs, their event logs and the checkpoints the daemon
// saw being written. Every state change is committed before the RPC that
// caused it returns, so a crash or kill -9 loses nothing that was submitted
// (WAL with synchronous=NORMAL is durable against process crashes; a power
// loss may lose the last transactions).
//
// Schema (version 3, PRAGMA user_version; opening migrates older ones in
// place: version 1 lacked `audit`; version 2 lacked jobs.output_dir,
// checkpoints.owner and checkpoints.manifest_xxh64, which opening adds and
// fills from spec_json and jobs.owner, leaving manifest_xxh64 '' for the
// checkpoints recorded before: legacy records, see docs/operations.md):
//   jobs(seq PK, id UNIQUE, owner, request_id, spec_json, priority, state,
//        times, progress columns, device, host_memory_bytes, error_code,
//        message, resume_from, output_dir (normalised, indexed);
//        UNIQUE(owner, request_id))
//   events(seq PK AUTOINCREMENT, job_id, time_unix_ms, kind, payload JSON)
//   checkpoints(job_id, step, dir, bytes, create_time_unix_ms,
//               write_seconds, owner, manifest_xxh64 (16 hex digits or '');
//               PK(job_id, step))
//   audit(seq PK AUTOINCREMENT, time_unix_ms, user, role, peer, method,
//         target, job_id, code, message, detail): server/core/audit_log.h
//
// Job ids are never reused: a job's seq is the largest seq + 1 and jobs are
// never deleted from the table.
//
// Note [Database file identity]
// Open remembers the device and inode of the database file. Every write
// first checks that `path` still names that file: when the file was deleted
// or replaced while the daemon runs, SQLite would go on writing to the
// unlinked inode and every change would vanish at the next start. Writes
// then fail with FAILED_PRECONDITION saying what happened and what to do;
// reads go on (they see the daemon's own, still consistent, state).
//
// Errors: INTERNAL for SQLite failures (message names the statement),
// DATA_LOSS for a corrupt database or row, NOT_FOUND for an unknown job,
// ALREADY_EXISTS for a duplicate job id or (owner, request_id),
// FAILED_PRECONDITION for a write after the file was deleted or replaced.
//
// Thread-safety: all methods are thread-safe (one connection behind a
// mutex). Ownership: owns the connection; closed by the destructor.
#ifndef MEGATRAIN_SERVER_JOB_STORE_H_
#define MEGATRAIN_SERVER_JOB_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/audit_record.h"
#include "server/core/job.h"

struct sqlite3;

namespace megatrain::server {

// Default and largest page of ListJobs.
inline constexpr int kDefaultPageSize = 50;
inline constexpr int kMaxPageSize = 1000;

// A page request of ListJobs. Newest jobs first.
struct JobQuery {
  std::string owner;             // empty: every owner
  std::vector<JobState> states;  // empty: every state
  int page_size = 0;             // [0, kMaxPageSize]; 0: kDefaultPageSize
  std::string page_token;        // from the previous JobPage; empty: first
};

// `output_dir` made comparable: lexically normal, without a trailing '/'
// ("/a/b/" and "/a/./b" -> "/a/b"). Used for the jobs.output_dir column and
// the overlap check; symbolic links are not resolved (the path policy
// refuses links on the way, Note [Path checks] in path_policy.h).
std::string NormalizeOutputDir(absl::string_view output_dir);

struct JobPage {
  std::vector<JobRecord> jobs;
  std::string next_page_token;  // empty on the last page
};

class JobStore {
 public:
  // Opens (creating if needed) the database at `path`, in WAL mode, and
  // migrates an older schema forward. INTERNAL when SQLite cannot open it;
  // FAILED_PRECONDITION when it was written by a newer schema version.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);

  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // The seq of the next job (largest seq + 1). Callers that create jobs must
  // serialise NextJobSeq + InsertJob themselves.
  absl::StatusOr<int64_t> NextJobSeq();

  // Inserts `job` (every column) and `event` in one transaction. Returns the
  // event's seq. ALREADY_EXISTS when job.id or (job.owner, job.request_id)
  // exists.
  absl::StatusOr<int64_t> InsertJob(const JobRecord& job, const JobEvent& event);

  // NOT_FOUND naming `id` when there is no such job.
  absl::StatusOr<JobRecord> GetJob(absl::string_view id);

  // The job `owner` created with `request_id`, if any.
  absl::StatusOr<std::optional<JobRecord>> FindByRequestId(absl::string_view owner,
                                                           absl::string_view request_id);

  // One page of jobs matching `query`, newest first. INVALID_ARGUMENT for a
  // page_size outside [0, kMaxPageSize] or a page_token that is malformed or
  // was made for other filters.
  absl::StatusOr<JobPage> ListJobs(const JobQuery& query);

  // Every job in `state`, by priority (highest first), then seq (FIFO).
  absl::StatusOr<std::vector<JobRecord>> JobsInState(JobState state);

  // Number of jobs per state (every state present, possibly 0).
  absl::StatusOr<std::map<JobState, int64_t>> CountByState();

  // A job (any owner) that still claims its output_dir, which equals
  // `output_dir`, lies inside it or contains it (compared after
  // NormalizeOutputDir, whole path components only: "/a/b" and "/a/bc" do
  // not overlap); the oldest such job, or nullopt. A job claims its
  // directory while it is not terminal, and after that while checkpoints of
  // it are recorded (a cancelled job without checkpoints frees its path).
  // O(jobs) in SQLite, no file system access.
  absl::StatusOr<std::optional<JobRecord>> FindOutputDirOverlap(absl::string_view output_dir);

  // Number of jobs of `owner` in `state`.
  absl::StatusOr<int64_t> CountJobs(absl::string_view owner, JobState state);

  // Queue queries whose cost follows the jobs they return or count, not the
  // length of the queue or of the history (indexes jobs_by_state_priority_seq
  // and jobs_by_owner_state).

  // Number of non-terminal jobs (QUEUED, RUNNING, SUSPENDING, SUSPENDED) of
  // `owner`, or of everyone when `owner` is empty.
  absl::StatusOr<int64_t> CountLiveJobs(absl::string_view owner);

  // 1-based position of job `id` in the queue order (priority, highest
  // first, then seq); 0 when the job is not QUEUED or does not exist.
  absl::StatusOr<int64_t> QueuePosition(absl::string_view id);

  // Where a page of the queue ends: the (priority, seq) of its last job.
  struct QueueCursor {
    int32_t priority = 0;
    int64_t seq = 0;
  };
  // At most `limit` (> 0) QUEUED jobs in queue order, after `after` when
  // given (else from the head).
  absl::StatusOr<std::vector<JobRecord>> QueuedJobsPage(const std::optional<QueueCursor>& after,
                                                        int limit);

  // Writes the state columns of `job` (state, times, device,
  // host_memory_bytes, error_code, message, resume_from) and appends
  // `event`, in one transaction. Returns the event's seq. NOT_FOUND for an
  // unknown job.
  absl::StatusOr<int64_t> UpdateState(const JobRecord& job, const JobEvent& event);

  // Writes the progress columns of job `id` and appends `event`, in one
  // transaction. Returns the event's seq.
  absl::StatusOr<int64_t> UpdateProgress(absl::string_view id, const JobProgress& progress,
                                         const JobEvent& event);

  // Appends `event` (its seq is ignored). Returns the new seq.
  absl::StatusOr<int64_t> AppendEvent(const JobEvent& event);

  // Events of job `id` with seq > after_seq, oldest first, at most `limit`.
  absl::StatusOr<std::vector<JobEvent>> ListEvents(absl::string_view id, int64_t after_seq,
                                                   int limit);

  // The largest event seq of job `id`; 0 when it has none.
  absl::StatusOr<int64_t> LastEventSeq(absl::string_view id);

  // Records (or replaces) a checkpoint (every field of `checkpoint`).
  absl::Status RecordCheckpoint(const CheckpointRecord& checkpoint);

  // Checkpoints recorded for job `id`, oldest (lowest step) first.
  absl::StatusOr<std::vector<CheckpointRecord>> ListCheckpoints(absl::string_view id);

  // Forgets a recorded checkpoint (no-op when absent).
  absl::Status DeleteCheckpoint(absl::string_view id, int64_t step);

  // Appends an audit record (its seq is ignored; time_unix_ms 0 means now).
  // Returns the new seq.
  absl::StatusOr<int64_t> AppendAudit(const AuditRecord& record);

  // One page of audit records matching `query`, newest first.
  // INVALID_ARGUMENT for a page_size outside [0, kMaxPageSize] or a
  // page_token that is malformed or was made for other filters.
  absl::StatusOr<AuditPage> ListAudit(const AuditQuery& query);

 private:
  JobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

  // Note [Database file identity]: OK while path_ names the file opened.
  absl::Status CheckSameFileLocked();

  std::mutex mu_;
  sqlite3* db_;             // owned; guarded by mu_
  const std::string path_;  // as opened
  // Identity of the file opened (st_dev, st_ino); set once by Open.
  uint64_t file_device_ = 0;
  uint64_t file_inode_ = 0;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_JOB_STORE_H_
