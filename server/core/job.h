// Core types of the job queue: a submitted job (JobRequest), what the daemon
// knows about it (JobRecord), its event log entries (JobEvent) and its
// checkpoints (CheckpointRecord). These are the server's own types: no gRPC
// or protobuf here (server/rpc/proto_convert.h maps them to megatrain.v1).
//
// Thread-safety: plain value types.
#ifndef MEGATRAIN_SERVER_JOB_H_
#define MEGATRAIN_SERVER_JOB_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/job/training_job.h"

namespace megatrain::server {

// Life cycle of a job; values match megatrain.v1.JobState. See job.proto for
// the transitions.
enum class JobState {
  kQueued = 1,
  kRunning = 2,
  kSuspending = 3,
  kSuspended = 4,
  kSucceeded = 5,
  kFailed = 6,
  kCancelled = 7,
};

// All states, in enum order.
inline constexpr JobState kAllJobStates[] = {
    JobState::kQueued,    JobState::kRunning, JobState::kSuspending, JobState::kSuspended,
    JobState::kSucceeded, JobState::kFailed,  JobState::kCancelled};

// "QUEUED", "RUNNING", ... (the proto enum name without JOB_STATE_).
absl::string_view JobStateName(JobState state);
// Inverse of JobStateName, case-insensitive; nullopt for an unknown name.
std::optional<JobState> ParseJobState(absl::string_view name);
// SUCCEEDED, FAILED and CANCELLED: the job will never run again.
bool IsTerminal(JobState state);

// Limits on the scheduling fields (see job.proto).
inline constexpr int32_t kMinPriority = -1000;
inline constexpr int32_t kMaxPriority = 1000;
inline constexpr int kMaxLabels = 32;
inline constexpr size_t kMaxLabelKeyLength = 63;
inline constexpr size_t kMaxLabelValueLength = 256;
inline constexpr size_t kMaxRequestIdLength = 128;

// A job as submitted: the engine's spec plus the scheduling fields the engine
// does not know about.
struct JobRequest {
  engine::JobSpec spec;
  int32_t priority = 0;                       // higher runs first
  std::map<std::string, std::string> labels;  // free-form, bounded
};

// Checks the server-side fields of `request` (priority, labels). The engine
// checks `spec` (EngineBackend::ValidateJobSpec). INVALID_ARGUMENT naming the
// field path: "priority: must be in [-1000, 1000], got 5000".
absl::Status ValidateJobRequest(const JobRequest& request);

// Latest training progress of a job.
struct JobProgress {
  int64_t step = 0;       // optimizer steps done
  int64_t max_steps = 0;  // steps in all (0 when unknown)
  double loss = 0;
  std::optional<double> eval_loss;
  double tokens_per_s = 0;
  double mfu = 0;          // [0, 1]
  int64_t tokens = 0;      // tokens trained so far
  double eta_seconds = 0;  // 0 when unknown
};

// Everything the daemon keeps about one job.
struct JobRecord {
  std::string id;          // "job-000042"
  int64_t seq = 0;         // 42: submission order (FIFO key)
  std::string owner;       // user name
  std::string request_id;  // idempotency key, may be empty
  JobRequest request;
  JobState state = JobState::kQueued;
  int64_t create_time_unix_ms = 0;
  int64_t start_time_unix_ms = 0;  // last start; 0 if never
  int64_t end_time_unix_ms = 0;    // terminal; 0 if not yet
  JobProgress progress;
  std::string device;                                   // while running
  int64_t host_memory_bytes = 0;                        // EstimateFootprint().host_total_bytes
  absl::StatusCode error_code = absl::StatusCode::kOk;  // for FAILED
  std::string message;                                  // error for FAILED, else the latest note
  std::string resume_from;                              // checkpoint dir for the next start
  int64_t queue_position = 0;                           // 1-based for QUEUED (filled on read)
};

// One entry of a job's event log. Fields are meaningful per `kind`.
struct JobEvent {
  enum class Kind { kStateChange = 1, kStep = 2, kEval = 3, kCheckpoint = 4 };

  int64_t seq = 0;  // assigned by the store
  std::string job_id;
  int64_t time_unix_ms = 0;
  Kind kind = Kind::kStateChange;
  // kStateChange
  JobState state = JobState::kQueued;
  std::string message;
  // kStep, kEval, kCheckpoint
  int64_t step = 0;
  // kStep
  int64_t max_steps = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  bool skipped = false;
  double step_seconds = 0;
  double eta_seconds = 0;
  double aux_loss = 0;  // MoE load-balancing loss (mean over micro-batches); 0 otherwise
  // NVMe tier bytes of the step (StepStats::nvme_*_bytes; 0 off the tier).
  int64_t nvme_read_bytes = 0;
  int64_t nvme_written_bytes = 0;
  // Devices the job trains on (train.devices) and the tokens/s of each
  // (StepReport; tokens_per_s is the job's total).
  int64_t devices = 1;
  double device_tokens_per_s = 0;
  // kEval
  double eval_loss = 0;
  // kCheckpoint
  std::string checkpoint_dir;
  double checkpoint_seconds = 0;

  static JobEvent StateChange(std::string job_id, JobState state, std::string message);
};

// A checkpoint of a job, recorded in the job store when the daemon saw the
// job write it: the record, not the directory it lies in, makes it the
// job's (Note [Checkpoint ownership] in server/core/checkpoint_records.h).
struct CheckpointRecord {
  std::string job_id;
  int64_t step = 0;
  std::string dir;
  int64_t bytes = 0;                // 0 when unknown
  int64_t create_time_unix_ms = 0;  // 0 when unknown
  double write_seconds = 0;         // 0 when unknown
  std::string owner;                // the job's owner when it was written
  // XXH64 of the checkpoint's manifest.json when it was written; 0 for a
  // record from before schema version 3 (a legacy checkpoint, whose
  // state.json names no job either).
  uint64_t manifest_xxh64 = 0;
};

// "<job id>/step-<step>".
std::string CheckpointId(absl::string_view job_id, int64_t step);
// Inverse of CheckpointId. INVALID_ARGUMENT naming `checkpoint_id` when it is
// not of that form.
absl::StatusOr<std::pair<std::string, int64_t>> ParseCheckpointId(absl::string_view checkpoint_id);

// "job-000042" for 42.
std::string JobIdForSeq(int64_t seq);

// Current time, Unix epoch milliseconds.
int64_t NowUnixMs();

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_JOB_H_
