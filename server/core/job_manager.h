// JobManager: the daemon's core. Owns the queue and the running jobs:
// admission (validation, host-memory footprint against the budget, per-user
// limits), scheduling (priority, then FIFO; one job per device; optional
// preemption), the job threads that drive engine::TrainingJob through an
// EngineBackend, the event log and its watchers, checkpoints, crash recovery
// and the SIGTERM drain. It never mentions gRPC or protobuf: the RPC
// handlers (job_service.cc, ...) convert requests and call it.
//
// The scheduling policy (Note [Scheduling policy], Note [Gang scheduling],
// Note [Why a queued job waits]) is a pure function in scheduling_policy.h;
// the job state machine (Note [Job state transitions]) is a table in
// job_transitions.h. The manager carries out what they decide.
//
// Note [Device limit]
// --max_devices_per_user bounds the devices one user's jobs hold at once:
// the devices of their RUNNING and SUSPENDING jobs (every job in active_,
// also one stopping for a cancel, a preemption or the drain: it holds its
// devices until its thread ends). A scheduling pass skips a queued job
// whose start would take its owner over the limit, as it skips one of an
// owner at --max_running_jobs_per_user: other users' jobs behind it may
// start, and it neither stops the pass nor preempts anyone. A job whose own
// train.devices (`all` resolved to the daemon's device count) exceeds the
// limit could never start: Submit and Resume refuse it with
// RESOURCE_EXHAUSTED ("train.devices 4 exceeds --max_devices_per_user 2"),
// and Create holds such queued jobs (re-queued by a restart that lowered
// the limit, or that left fewer devices than they ask for, or a smaller
// --host_memory_budget than they need) as SUSPENDED with that message
// instead of leaving them queued for ever (one asking for more devices or
// memory than the daemon has would also stop every pass: Note [Scheduling
// policy]). Admins are bound like users, as by the job limits.
// Without --auth_tokens every caller is the user "local", so the limit
// then bounds all jobs together.
//
// Note [Job limits]
// --max_queued_jobs_per_user and --max_queued_jobs count every job that is
// not terminal (QUEUED, RUNNING, SUSPENDING, SUSPENDED): suspending a job or
// letting it start does not free room for more. Submit is refused with
// RESOURCE_EXHAUSTED when the new job would exceed either; ResumeJob checks
// them too (the job already counts, so this only refuses when a limit was
// lowered since, e.g. by a restart with other flags). Counts are indexed
// store queries (JobStore::CountLiveJobs).
//
// Note [Lock-free admission]
// mu_ guards the scheduler's state and is taken by every control call, the
// job threads and the drain, so nothing that may wait on a file system runs
// under it. Submit validates the spec, checks its paths
// (PathPolicy::CheckJobSpec), examines its inputs and reads config.json
// (PreflightJobInputs: non-blocking opens, fstat checks, size caps) and
// sizes the job before taking mu_; under mu_ it only re-checks request_id
// and the limits and inserts the job (indexed store queries). A FIFO,
// device node or hung file given as an input so fails or stalls that one
// request, never other users' calls nor the drain (--shutdown_timeout).
// Get and List never take mu_, and queue positions are indexed counts
// (JobStore::QueuePosition); a scheduling pass reads the queue a page at a
// time and stops at the first job that cannot start. Checkpoints likewise:
// under mu_ a checkpoint is chosen from its records only (no stat of its
// directory; SelectResumeCheckpoint verifies it on the job's thread), and
// ListCheckpoints, ExportCheckpoint and DeleteCheckpoint look at the
// directories, and DeleteCheckpoint removes one, without mu_.
//
// Note [Crash recovery]
// Every transition is committed to the JobStore before it takes effect. On
// start-up, jobs found RUNNING (the daemon died under them) are re-queued to
// resume from their newest recorded checkpoint (or from scratch when there
// is none); SUSPENDING ones become SUSPENDED. Queued jobs that the flags
// now in force would never start are then held as SUSPENDED (Note [Device
// limit]). A store with no job beside a jobs_dir holding job directories
// refuses to start (the database was lost; ids would be reused).
//
// Checkpoint records (Note [Checkpoint ownership], Note [Resume
// verification]) are kept by CheckpointRecords (checkpoint_records.h).
//
// Thread-safety: every public method is thread-safe. Lock order: mu_, then
// events_mu_, then the store's own mutex. Ownership: the store, backend and
// metrics are borrowed and must outlive the manager; the manager owns one
// thread per running job and joins them in Drain() / its destructor.
#ifndef MEGATRAIN_SERVER_JOB_MANAGER_H_
#define MEGATRAIN_SERVER_JOB_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/fs/held_output_dir.h"
#include "engine/runtime/cancellation.h"
#include "server/core/auth.h"
#include "server/core/checkpoint_records.h"
#include "server/core/engine_backend.h"
#include "server/core/job.h"
#include "server/core/job_store.h"
#include "server/core/metrics.h"
#include "server/core/nvme_admission.h"
#include "server/core/path_policy.h"
#include "server/core/scheduling_policy.h"
#include "server/core/serial_worker.h"

namespace megatrain::server {

struct JobManagerOptions {
  // Default output directories are <jobs_dir>/<job id>.
  std::string jobs_dir;
  // Devices jobs run on, one job each at a time ("cpu", "cuda:0", ...).
  std::vector<std::string> devices;
  // Host memory all running jobs may need together, in bytes (> 0).
  int64_t host_memory_budget_bytes = 0;
  // Memory of the smallest device in `devices`, in bytes (NVML's total);
  // 0: unknown (a CPU device, no NVML), and not checked. A job whose
  // largest streamed block's slots exceed it can never run (Note [No
  // expert-group sub-blocks] in engine/job/plan.cc) and is refused at
  // submission.
  int64_t device_memory_bytes = 0;
  // Running jobs per user; 0: no limit.
  int max_running_jobs_per_user = 0;
  // Devices held by one user's running (and suspending) jobs together; 0:
  // no limit, < 0: INVALID_ARGUMENT from Create (Note [Device limit]).
  int max_devices_per_user = 0;
  // Non-terminal jobs (queued, running, suspended) per user; 0: no limit.
  // Submissions beyond it are refused with RESOURCE_EXHAUSTED (Note [Job
  // limits]).
  int max_queued_jobs_per_user = 100;
  // Non-terminal jobs in all; 0: no limit.
  int max_queued_jobs = 10000;
  // Higher-priority jobs may suspend running lower-priority ones.
  bool preemption = false;
  // Where jobs may read and write (--data_roots, --output_roots): checked
  // at submission, again when a job starts, and for export directories;
  // "{user}" data roots are filled with the job's owner (Note [Per-user
  // data roots] in path_policy.h).
  // When it restricts writes, its output roots must include jobs_dir (the
  // default output directories).
  PathPolicy path_policy = PathPolicy::Unrestricted();
  // The NVMe tier (--nvme_dir, --nvme_budget; Note [NVMe admission] in
  // nvme_admission.h): jobs whose moments go there start only while their
  // moment bytes fit the budget left by the running ones.
  NvmeTierOptions nvme;
};

// A batch of a job's events for a watcher.
struct EventBatch {
  std::vector<JobEvent> events;
  // True when the job is terminal and every event was delivered: the watch
  // is over.
  bool finished = false;
};

// Snapshot for GetServerStatus.
struct ManagerStatus {
  std::vector<DeviceState> devices;
  int64_t host_memory_budget_bytes = 0;
  int64_t host_memory_reserved_bytes = 0;
  std::map<JobState, int64_t> jobs_by_state;
  bool draining = false;
};

class JobManager {
 public:
  // Recovers jobs interrupted by a crash (Note [Crash recovery]) and runs a
  // first scheduling pass. INVALID_ARGUMENT for bad options (no devices, a
  // budget <= 0); errors of the store.
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(JobManagerOptions options,
                                                            JobStore* store, EngineBackend* backend,
                                                            ServerMetrics* metrics);
  // Drains (see Drain) and joins every job thread.
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Queues a job owned by `caller`. With a non-empty `request_id`, a repeat
  // returns the job the first call created. Errors: INVALID_ARGUMENT naming
  // the field path (spec, priority, labels, request_id; a ".." in a path;
  // an output_dir overlapping another job's or the jobs directory, Note
  // [Checkpoint ownership]);
  // PERMISSION_DENIED naming the field for a path outside the roots of
  // options.path_policy; UNIMPLEMENTED
  // (architecture); INVALID_ARGUMENT naming the field and path for an input
  // that is a FIFO, socket or device node, or a config.json that is too
  // large (Note [Input preflight] in path_policy.h); NOT_FOUND for a
  // missing config.json; RESOURCE_EXHAUSTED when the footprint exceeds the
  // budget (message gives both numbers), when the slots of the model's
  // largest streamed block exceed options.device_memory_bytes (message
  // names the decoder layer, its bytes and the device's:
  // engine::CheckBlockSlotsFitDevice), when train.devices exceeds the
  // daemon's devices or --max_devices_per_user (Note [Device limit]) or a
  // job limit is reached (Note [Job limits]);
  // ALREADY_EXISTS when request_id was used with a different spec;
  // UNAVAILABLE while draining; `cancel`'s status (CANCELLED,
  // DEADLINE_EXCEEDED) when it stops the footprint estimate (Note
  // [Cancelled engine calls] in server/rpc/rpc_call.h; nothing is queued).
  absl::StatusOr<JobRecord> Submit(const Principal& caller, JobRequest request,
                                   absl::string_view request_id,
                                   const engine::Cancellation& cancel = engine::Cancellation())
      ABSL_LOCKS_EXCLUDED(mu_);

  // NOT_FOUND for an unknown id; PERMISSION_DENIED for another user's job.
  absl::StatusOr<JobRecord> Get(const Principal& caller, absl::string_view job_id);

  // One page of jobs, newest first. A user's query is limited to their own
  // jobs (query.owner empty or their name; another name: PERMISSION_DENIED);
  // an admin's empty owner means everyone. INVALID_ARGUMENT for a bad
  // page_size or page_token.
  absl::StatusOr<JobPage> List(const Principal& caller, JobQuery query);

  // See CancelJob / SuspendJob / ResumeJob in job.proto for the transitions;
  // FAILED_PRECONDITION for a state that does not allow it; ResumeJob is
  // UNAVAILABLE while draining and RESOURCE_EXHAUSTED when its owner is
  // over a job limit (Note [Job limits]) or when the job could never start
  // under the flags now in force: its train.devices above
  // --max_devices_per_user or the daemon's devices, its host memory above
  // --host_memory_budget (Note [Device limit]; lowered by a restart since
  // it was suspended). A resumed job whose owner's running jobs hold the
  // limit's devices is queued and waits. Return the job after the
  // change.
  // With `force`, a running job also abandons its current step (losing
  // only that step) instead of finishing it: TrainingJob::StopKind::
  // kForceCancel; a forced cancel may follow a plain one.
  absl::StatusOr<JobRecord> Cancel(const Principal& caller, absl::string_view job_id,
                                   bool force = false) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<JobRecord> Suspend(const Principal& caller, absl::string_view job_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<JobRecord> Resume(const Principal& caller, absl::string_view job_id)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until job `job_id` has events with seq > after_seq, its watch is
  // over (EventBatch.finished), or `max_wait` passes (empty batch). Returns
  // at most 1000 events. UNAVAILABLE once the manager has drained.
  absl::StatusOr<EventBatch> WaitEvents(const Principal& caller, absl::string_view job_id,
                                        int64_t after_seq, absl::Duration max_wait);

  // Asks running job `job_id` for a checkpoint and waits until one is
  // written. FAILED_PRECONDITION when the job is not RUNNING; ABORTED when it
  // stops first; DEADLINE_EXCEEDED at `deadline`; CANCELLED when
  // `cancelled()` turns true (polled about once a second).
  absl::StatusOr<CheckpointRecord> CreateCheckpoint(const Principal& caller,
                                                    absl::string_view job_id, absl::Time deadline,
                                                    const std::function<bool()>& cancelled)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Recorded checkpoints of `job_id` whose directories exist, oldest first
  // (Note [Checkpoint ownership]; a directory nobody recorded is never
  // listed).
  absl::StatusOr<std::vector<CheckpointRecord>> ListCheckpoints(const Principal& caller,
                                                                absl::string_view job_id);

  // Writes checkpoint `checkpoint_id` as an HF model directory `out_dir`.
  // INVALID_ARGUMENT for a malformed id, a relative or non-empty out_dir, a
  // ".." in it or a dtype other than "", "bf16", "fp32"; PERMISSION_DENIED
  // for another user's checkpoint or an out_dir outside the output roots;
  // NOT_FOUND for an unknown checkpoint (not recorded); DATA_LOSS when its
  // directory no longer holds what the job wrote; errors of the engine's
  // export. A job loaded from model.hf_dir exports with that directory's
  // config keys and tokenizer files (Note [Export copies] in
  // engine/formats/hf_export.h), read only while the owner's data roots still
  // allow it; the report says what was copied and skipped.
  absl::StatusOr<engine::HfExportReport> ExportCheckpoint(const Principal& caller,
                                                          absl::string_view checkpoint_id,
                                                          const std::string& out_dir,
                                                          const std::string& dtype);

  // Deletes a recorded checkpoint's directory and record. NOT_FOUND for one
  // that is not recorded; FAILED_PRECONDITION when a QUEUED or SUSPENDED
  // job will resume from it, or a QUEUED job of its owner without a
  // checkpoint of its own will start from it (model.init_from; one of
  // another user, an admin's, or one submitted while the delete runs fails
  // when it starts, NOT_FOUND naming the field).
  absl::Status DeleteCheckpoint(const Principal& caller, absl::string_view checkpoint_id)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<ManagerStatus> GetStatus() ABSL_LOCKS_EXCLUDED(mu_);

  // SIGTERM: refuses new work from now on (UNAVAILABLE), asks every running
  // job to write a checkpoint and stop, re-queues them to resume on the next
  // start, then wakes all watchers (UNAVAILABLE). Returns true when all job
  // threads ended within `timeout`, false otherwise (they keep running; the
  // caller should then exit the process without destroying the manager).
  // Idempotent.
  bool Drain(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // True once Drain has started.
  bool draining() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Active;
  class Observer;

  JobManager(JobManagerOptions options, JobStore* store, EngineBackend* backend,
             ServerMetrics* metrics);

  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);
  // The job `caller` created earlier with `request_id` (*found true), or
  // an empty record (*found false; also for an empty request_id).
  // ALREADY_EXISTS when that job has a different spec. Takes no lock.
  absl::StatusOr<JobRecord> FindRepeat(const Principal& caller, const JobRequest& request,
                                       absl::string_view request_id, bool* found);
  // Validation, path policy, input preflight and footprint of a new job
  // (Note [Lock-free admission]): must be called without mu_. Errors as
  // Submit's.
  absl::StatusOr<engine::MemoryFootprint> AdmitSpec(const Principal& caller,
                                                    const JobRequest& request,
                                                    const engine::Cancellation& cancel)
      ABSL_LOCKS_EXCLUDED(mu_);
  // RESOURCE_EXHAUSTED when `joining` more jobs of `owner` would exceed a
  // job limit (Note [Job limits]).
  absl::Status CheckJobLimitsLocked(const std::string& owner, int64_t joining)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED naming train.devices when a job asking for
  // `devices` (resolved: >= 1) could never start on this daemon: more
  // than --max_devices_per_user (Note [Device limit]) or than the daemon's
  // devices. `requested_all`: the spec said `all` (named in the message).
  // Reads only options_: no lock needed.
  absl::Status CheckDevicesCanRun(int64_t devices, bool requested_all) const;
  // RESOURCE_EXHAUSTED when `job`, admitted earlier, could never start
  // under the options now in force (a restart may have changed them):
  // CheckDevicesCanRun's refusals, or its host memory above
  // --host_memory_budget. Reads only options_ and `job`: no lock needed.
  absl::Status CheckAdmittedJobCanStart(const JobRecord& job) const;
  // Create, after Recover: holds the queued jobs that
  // CheckAdmittedJobCanStart refuses as SUSPENDED, with its message (Note
  // [Device limit]): such a job would wait for ever, and stop every
  // scheduling pass when its devices or memory can never be free.
  absl::Status HoldQueuedJobsThatCanNeverStart() ABSL_LOCKS_EXCLUDED(mu_);
  // Loads a job and checks that `caller` may access it.
  absl::StatusOr<JobRecord> LoadForCaller(const Principal& caller, absl::string_view job_id);
  // Fills queue_position of QUEUED jobs, and the message of the job at the
  // head of the queue with why it cannot start (Note [Why a queued job
  // waits]).
  void FillQueuePositions(std::vector<JobRecord*> jobs) ABSL_LOCKS_EXCLUDED(wait_mu_);
  // INVALID_ARGUMENT naming output_dir when `output_dir` overlaps another
  // job's (equal, inside, containing; any owner and state; the other job is
  // named only to its owner and admins) or, when `explicit_dir`, jobs_dir.
  // An export's `out_dir` (and `resolved_out`, what it resolves to) must
  // lie outside the jobs directory and outside every job's output
  // directory that is still claimed (JobStore::FindOutputDirOverlap):
  // INVALID_ARGUMENT naming out_dir otherwise (the other job named only to
  // those who may see it).
  absl::Status CheckExportTarget(const Principal& caller, const std::string& out_dir,
                                 const std::string& resolved_out);
  // Note [Held output directory] (engine/fs/held_output_dir.h), on the job
  // thread at start: opens `job`'s output_dir from its root (an output root
  // or the jobs directory) without following links and claims its identity
  // for `active`. FAILED_PRECONDITION when a link is on the way or another
  // running job holds the same directory; errors of HeldOutputDir::Open.
  // Takes mu_ briefly.
  absl::StatusOr<engine::HeldOutputDir> HoldOutputDir(Active* active, const JobRecord& job)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckOutputDirExclusive(const Principal& caller, const std::string& output_dir,
                                       bool explicit_dir);
  // FAILED_PRECONDITION when the store has no job but jobs_dir holds job
  // directories (the database was lost: ids would be reused).
  absl::Status CheckStoreMatchesJobsDir();
  absl::StatusOr<CheckpointRecord> FindCheckpoint(const Principal& caller,
                                                  absl::string_view checkpoint_id, JobRecord* job);
  // model.init_from at submit (Note [Checkpoint ownership]): resolves
  // spec->model.init_from.checkpoint through the records as every other
  // checkpoint access does and sets init_from.checkpoint_dir (whatever the
  // caller sent is dropped). Errors naming model.init_from.checkpoint:
  // PERMISSION_DENIED for another user's job, NOT_FOUND for an unknown job
  // or checkpoint, DATA_LOSS for one no longer what its job wrote,
  // INVALID_ARGUMENT for a model other than the job's; INVALID_ARGUMENT
  // naming train.max_steps (or train.max_tokens) when `optimizer: restore`
  // leaves no step after the checkpoint's. Reads the checkpoint's
  // manifest, state and config.json: call without mu_.
  absl::Status ResolveInitFrom(const Principal& caller, engine::JobSpec* spec)
      ABSL_LOCKS_EXCLUDED(mu_);
  // DeleteCheckpoint's model.init_from check: FAILED_PRECONDITION naming
  // the first QUEUED job of `owner` that has no checkpoint of its own and
  // starts from `dir`. Reads that user's queued jobs a page at a time
  // (bounded by their queue): call without mu_.
  absl::Status CheckNoQueuedJobStartsFrom(const std::string& owner, const std::string& dir,
                                          absl::string_view checkpoint_id) ABSL_LOCKS_EXCLUDED(mu_);

  // One scheduling pass: a snapshot of the devices, the running jobs and
  // the queue (read a page at a time, as far as the policy needs), then
  // Next()'s decision carried out (Note [Scheduling policy]).
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The devices, running jobs and limits, with an empty queue.
  SchedulerSnapshot SnapshotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job` as the policy sees it.
  QueuedJobView QueuedViewLocked(const JobRecord& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the victim of `preemption` to checkpoint and re-queue.
  void PreemptLocked(const Preemption& preemption) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The admitted NVMe moment bytes of `job` (0 off the tier; the whole
  // budget when it could not be sized).
  int64_t NvmeBytesLocked(const JobRecord& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Create: sizes the tiered queued and suspended jobs of the store
  // (reads their configs; Note [NVMe admission]).
  void SizeRecoveredNvmeJobs() ABSL_LOCKS_EXCLUDED(mu_);
  // Create, before any job runs: removes the tier directories a killed
  // daemon left (Note [Stale NVMe tier directories] in nvme_admission.h),
  // logging what it removed and left.
  void SweepStaleNvmeTierDirs();
  // Starts `job` on `devices` (its train.devices of them, all free).
  void StartLocked(JobRecord job, std::vector<std::string> devices)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job thread: HoldAndRun, then FinishJob. Catches every exception.
  void RunJob(Active* active, JobRecord job) ABSL_LOCKS_EXCLUDED(mu_);
  // On the job thread: checks the paths again, holds the output directory,
  // chooses the checkpoint to resume from (appending the events that
  // produced), creates the job and runs it. Takes mu_ briefly.
  absl::StatusOr<engine::JobOutcome> HoldAndRun(Active* active, const JobRecord& job)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records a starting job's schedule and data descriptions as RUNNING
  // events (logged, not returned, when the store refuses them). Takes no
  // lock; call without mu_.
  void RecordStartEvents(const std::string& job_id, const engine::TrainingJob& training_job)
      ABSL_LOCKS_EXCLUDED(mu_);
  // On the job thread, once its run ended: records the end, frees the
  // job's devices and reservations, and schedules.
  void FinishJob(Active* active, const absl::StatusOr<engine::JobOutcome>& outcome)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Commits the state `job` ends in after `outcome` of `active`'s run
  // (EndStateOf) with its message.
  void RecordEndLocked(const Active& active, const absl::StatusOr<engine::JobOutcome>& outcome,
                       JobRecord job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReapThreadsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits `job`'s change to `state`, with `message` as its event, to the
  // store and wakes the watchers; returns the event's seq.
  // FAILED_PRECONDITION, nothing written, when Note [Job state transitions]
  // (job_transitions.h) does not allow it.
  absl::StatusOr<int64_t> TransitionLocked(JobRecord& job, JobState state, std::string message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `events` to the store (failures are logged), then wakes the
  // watchers. Takes no lock of the manager but events_mu_.
  void AppendEvents(const std::vector<JobEvent>& events) ABSL_LOCKS_EXCLUDED(events_mu_);
  void NotifyEvents() ABSL_LOCKS_EXCLUDED(events_mu_);
  // Blocks until an event newer than `generation` is announced, the
  // manager stops, or `deadline` passes.
  void WaitForEventsAfter(int64_t generation, absl::Time deadline) ABSL_LOCKS_EXCLUDED(events_mu_);

  const JobManagerOptions options_;
  JobStore* const store_;
  EngineBackend* const backend_;
  ServerMetrics* const metrics_;
  CheckpointRecords checkpoints_;

  // Guards the scheduler's state: the members below, and the fields of
  // every Active (Note [Lock-free admission]). Lock order: mu_, then
  // wait_mu_ or events_mu_, then the store's own mutex.
  mutable absl::Mutex mu_;
  absl::CondVar idle_cv_;  // active_ became empty; waited on with mu_
  // The jobs holding devices, by job id. The fields of an Active are
  // guarded by mu_ too: clang's analysis cannot name this mutex from the
  // nested struct, so every function that touches them holds mu_ (or is
  // ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)), except where Active says.
  std::map<std::string, std::unique_ptr<Active>> active_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> job_on_device_ ABSL_GUARDED_BY(mu_);  // device -> job id
  // Note [Why a queued job waits]
  // The scheduler's last pass stopped at this queued job (empty: none)
  // for this reason. Reads take only wait_mu_ (after mu_ when both), so
  // that Get and List need not wait for a scheduling pass. Not stored: a
  // view of the scheduler's state, rewritten by every pass.
  mutable absl::Mutex wait_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::string waiting_job_ ABSL_GUARDED_BY(wait_mu_);
  std::string waiting_reason_ ABSL_GUARDED_BY(wait_mu_);
  std::vector<std::thread> finished_threads_ ABSL_GUARDED_BY(mu_);  // to join
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // host memory of the running jobs
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  // Note [NVMe admission]: admitted moment bytes by job id (tiered jobs
  // only; sized at submission or, for jobs from before a restart, by
  // Create), and those of the running jobs.
  std::map<std::string, int64_t> nvme_bytes_by_job_ ABSL_GUARDED_BY(mu_);
  int64_t nvme_reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex events_mu_ ABSL_ACQUIRED_AFTER(mu_);
  absl::CondVar events_cv_;  // an event was announced or the manager stopped
  int64_t event_generation_ ABSL_GUARDED_BY(events_mu_) = 0;  // bumped on every new event
  bool stopped_ ABSL_GUARDED_BY(events_mu_) = false;          // drained

  // Creates the job threads (StartJobLocked), so that they start at the
  // priority of the thread that built the manager, never an RPC thread's.
  // Last: destroyed first, after Drain.
  SerialWorker launcher_;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_JOB_MANAGER_H_
