// See job_manager.h.
#include "server/core/job_manager.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <filesystem>
#include <new>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/fs/dir_fd.h"
#include "engine/runtime/status_macros.h"
#include "server/core/checkpoint_records.h"
#include "server/core/job_request_json.h"
#include "server/core/job_scalars.h"
#include "server/core/job_transitions.h"
#include "server/core/logging.h"
#include "server/core/scheduling_policy.h"
#include "server/core/serial_worker.h"
#include "server/core/submit_checks.h"

namespace megatrain::server {
namespace {

namespace fs = std::filesystem;

// Largest batch of events one WaitEvents returns.
constexpr int kMaxEventsPerBatch = 1000;
// Watchers re-check cancellation and deadlines at least this often.
constexpr absl::Duration kMaxWaitSlice = absl::Seconds(1);
// Queued jobs a scheduling pass reads at a time.
constexpr int kSchedulePageSize = 32;
// Weight of the newest step in the step-time average used for the ETA.
constexpr double kEtaSmoothing = 0.2;

std::string FormatBytes(int64_t bytes) {
  const double gib = static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
  if (gib >= 1.0) return absl::StrFormat("%.2f GiB (%d bytes)", gib, bytes);
  return absl::StrFormat("%.2f MiB (%d bytes)", bytes / (1024.0 * 1024.0), bytes);
}

engine::TrainingJob::StopKind StopKindFor(bool cancel) {
  return cancel ? engine::TrainingJob::StopKind::kCancel : engine::TrainingJob::StopKind::kSuspend;
}

// True when normal paths `a` and `b` are equal or one lies inside the
// other (whole components: "/a/b" and "/a/bc" do not overlap).
bool PathsOverlap(const std::string& a, const std::string& b) {
  return a == b || absl::StartsWith(a, b == "/" ? b : b + "/") ||
         absl::StartsWith(b, a == "/" ? a : a + "/");
}

}  // namespace

// A job holding a device. Owned by JobManager::active_; fields guarded by
// JobManager::mu_ except where noted (in words only: clang's analysis
// cannot name the owner's mutex from a nested struct; job_manager.h).
struct JobManager::Active {
  std::string job_id;
  std::string owner;
  // The devices the job holds: its train.devices of them, gang-scheduled
  // (Note [Gang scheduling]); the first names its metrics.
  std::vector<std::string> devices;
  int32_t priority = 0;
  int64_t reserved_bytes = 0;
  int64_t nvme_reserved_bytes = 0;  // Note [NVMe admission]
  // Set by the job thread once Create returns; Run() is called on it without
  // the lock (only that thread resets it).
  std::unique_ptr<engine::TrainingJob> job;
  StopReason stop = StopReason::kNone;
  bool checkpoint_requested = false;
  std::string preempted_for;  // job id that caused kPreempt
  std::string last_checkpoint_dir;
  // Device and inode of the held output directory once the job thread
  // opened it (Note [Held output directory] in engine/fs/held_output_dir.h);
  // 0 before.
  dev_t output_device = 0;
  ino_t output_inode = 0;
  std::thread thread;
};

// Forwards one job's progress to the store, the watchers and the metrics.
// Called on the job's thread only.
class JobManager::Observer : public engine::JobObserver {
 public:
  Observer(JobManager* manager, Active* active, const JobRecord& job)
      : manager_(manager),
        active_(active),
        job_id_(job.id),
        owner_(job.owner),
        devices_(active->devices),
        progress_(job.progress) {
    if (progress_.max_steps == 0) progress_.max_steps = engine::MaxSteps(job.request.spec);
    // The job's curves in its output_dir (job_scalars.h); without them
    // (a read-only or full disk) the job trains on.
    absl::StatusOr<std::unique_ptr<JobScalarWriter>> scalars =
        JobScalarWriter::Open(job.request.spec.output_dir, NowUnixMs());
    if (scalars.ok()) {
      scalars_ = *std::move(scalars);
    } else {
      LogError(absl::StrCat(job_id_, ": no curve files: ", scalars.status().ToString()));
    }
  }

  void OnStep(const engine::StepReport& report) override {
    if (report.stats.step_seconds > 0) {
      avg_step_seconds_ = avg_step_seconds_ == 0 ? report.stats.step_seconds
                                                 : (1 - kEtaSmoothing) * avg_step_seconds_ +
                                                       kEtaSmoothing * report.stats.step_seconds;
    }
    if (report.max_steps > 0) progress_.max_steps = report.max_steps;
    progress_.step = report.step;
    if (!report.skipped) progress_.loss = report.loss;
    progress_.tokens_per_s = report.tokens_per_s;
    progress_.mfu = report.mfu;
    progress_.tokens += report.stats.tokens;
    progress_.eta_seconds =
        progress_.max_steps > report.step
            ? static_cast<double>(progress_.max_steps - report.step) * avg_step_seconds_
            : 0;
    JobEvent event;
    event.job_id = job_id_;
    event.time_unix_ms = NowUnixMs();
    event.kind = JobEvent::Kind::kStep;
    event.step = report.step;
    event.max_steps = progress_.max_steps;
    event.loss = report.loss;
    event.grad_norm = report.grad_norm;
    event.lr = report.lr;
    event.tokens_per_s = report.tokens_per_s;
    event.mfu = report.mfu;
    event.skipped = report.skipped;
    event.step_seconds = report.stats.step_seconds;
    event.eta_seconds = progress_.eta_seconds;
    event.aux_loss = report.aux_loss;
    event.nvme_read_bytes = report.stats.nvme_read_bytes;
    event.nvme_written_bytes = report.stats.nvme_written_bytes;
    event.devices = report.devices;
    event.device_tokens_per_s = report.device_tokens_per_s;
    Persist(event);
    // Note [Progress off the step]: the metrics' locks are /metrics's too,
    // and the curve files are disk writes.
    writer_.Post([this, manager = manager_, devices = devices_, report, event] {
      manager->metrics_->RecordStep(devices, report);
      manager->metrics_->RecordJobStep(job_id_, report);
      if (scalars_ != nullptr) scalars_->AddStep(event);
    });
  }

  void OnEval(int64_t step, double eval_loss) override {
    progress_.eval_loss = eval_loss;
    JobEvent event;
    event.job_id = job_id_;
    event.time_unix_ms = NowUnixMs();
    event.kind = JobEvent::Kind::kEval;
    event.step = step;
    event.eval_loss = eval_loss;
    Persist(event);
    manager_->metrics_->RecordEval(devices_.front(), eval_loss);
    manager_->metrics_->RecordJobEval(job_id_, eval_loss);
    // After the steps before it, on the writer (the curve files' one user).
    writer_.Post([this, event] {
      if (scalars_ != nullptr) scalars_->AddEval(event);
    });
  }

  // Note [Checkpoint ownership]: the record makes the checkpoint the job's.
  void OnCheckpointWritten(const engine::CheckpointInfo& info, double seconds) override {
    // The steps before it first, so that events keep their order (a
    // checkpoint is rare: waiting here costs nothing per step).
    writer_.Drain();
    const JobEvent event = manager_->checkpoints_.RecordWritten(job_id_, owner_, info, seconds);
    {
      absl::MutexLock lock(&manager_->mu_);
      active_->last_checkpoint_dir = info.dir;
    }
    manager_->metrics_->RecordCheckpoint(seconds);
    manager_->AppendEvents({event});
  }

 private:
  // Note [Progress off the step] (serial_worker.h): stored and announced on
  // writer_'s thread, in order; the job thread only copies.
  void Persist(const JobEvent& event) {
    writer_.Post([manager = manager_, job_id = job_id_, progress = progress_, event] {
      absl::StatusOr<int64_t> seq = manager->store_->UpdateProgress(job_id, progress, event);
      if (!seq.ok()) {
        LogError(absl::StrCat(job_id, ": recording progress: ", seq.status().ToString()));
      }
      manager->NotifyEvents();
    });
  }

  JobManager* const manager_;
  Active* const active_;
  const std::string job_id_;
  const std::string owner_;
  const std::vector<std::string> devices_;  // the first names the job's metrics
  JobProgress progress_;
  double avg_step_seconds_ = 0;
  std::unique_ptr<JobScalarWriter> scalars_;  // null when its files could not be opened
  // Last: destroyed (drained, joined) first, while the members its tasks
  // copied from or use (scalars_) still exist; before the job's final
  // state is written.
  SerialWorker writer_;
};

JobManager::JobManager(JobManagerOptions options, JobStore* store, EngineBackend* backend,
                       ServerMetrics* metrics)
    : options_(std::move(options)),
      store_(store),
      backend_(backend),
      metrics_(metrics),
      checkpoints_(store, backend) {}

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(JobManagerOptions options,
                                                               JobStore* store,
                                                               EngineBackend* backend,
                                                               ServerMetrics* metrics) {
  if (options.devices.empty()) return absl::InvalidArgumentError("job manager: no devices");
  if (options.host_memory_budget_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host_memory_budget: must be > 0, got ", options.host_memory_budget_bytes));
  }
  if (options.max_devices_per_user < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_devices_per_user: must be >= 0 (0: no limit), got ", options.max_devices_per_user));
  }
  std::unique_ptr<JobManager> manager(new JobManager(std::move(options), store, backend, metrics));
  MEGATRAIN_RETURN_IF_ERROR(manager->CheckStoreMatchesJobsDir());
  MEGATRAIN_RETURN_IF_ERROR(ValidateNvmeTierOptions(manager->options_.nvme));
  MEGATRAIN_RETURN_IF_ERROR(manager->Recover());
  MEGATRAIN_RETURN_IF_ERROR(manager->HoldQueuedJobsThatCanNeverStart());
  manager->SizeRecoveredNvmeJobs();
  manager->SweepStaleNvmeTierDirs();
  absl::MutexLock lock(&manager->mu_);
  manager->RefreshGaugesLocked();
  manager->ScheduleLocked();
  return manager;
}

JobManager::~JobManager() {
  // A bounded drain would leave threads that use `this`; wait for them.
  Drain(absl::InfiniteDuration());
}

absl::Status JobManager::Recover() {
  absl::MutexLock lock(&mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<JobRecord> running,
                             store_->JobsInState(JobState::kRunning));
  for (JobRecord& job : running) {
    job.resume_from = checkpoints_.LatestDir(job);
    job.device.clear();
    const std::string message =
        job.resume_from.empty()
            ? "re-queued after a daemon restart; no checkpoint, starting over"
            : absl::StrCat("re-queued after a daemon restart; resumes from ", job.resume_from);
    LogInfo(absl::StrCat(job.id, ": ", message));
    MEGATRAIN_RETURN_IF_ERROR(TransitionLocked(job, JobState::kQueued, message).status());
  }
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<JobRecord> suspending,
                             store_->JobsInState(JobState::kSuspending));
  for (JobRecord& job : suspending) {
    job.resume_from = checkpoints_.LatestDir(job);
    job.device.clear();
    MEGATRAIN_RETURN_IF_ERROR(TransitionLocked(job, JobState::kSuspended,
                                               "suspended (the daemon restarted while suspending)")
                                  .status());
  }
  return absl::OkStatus();
}

absl::Status JobManager::HoldQueuedJobsThatCanNeverStart() {
  // Note [Device limit]: the limit or --device may have changed since these
  // jobs were admitted (Recover has just re-queued the running ones).
  absl::MutexLock lock(&mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<JobRecord> queued, store_->JobsInState(JobState::kQueued));
  for (JobRecord& job : queued) {
    const absl::Status can_run = CheckAdmittedJobCanStart(job);
    if (can_run.ok()) continue;
    const std::string message = absl::StrCat(
        "held at start-up: ", can_run.message(),
        " (the daemon's flags changed since it was queued); ResumeJob once a restart allows "
        "it, or cancel it");
    LogWarning(absl::StrCat(job.id, ": ", message));
    MEGATRAIN_RETURN_IF_ERROR(TransitionLocked(job, JobState::kSuspended, message).status());
  }
  return absl::OkStatus();
}

int64_t JobManager::NvmeBytesLocked(const JobRecord& job) const {
  if (job.request.spec.memory.nvme_tier == engine::NvmeTierMode::kOff) return 0;
  const auto it = nvme_bytes_by_job_.find(job.id);
  return it != nvme_bytes_by_job_.end() ? it->second : options_.nvme.budget_bytes;
}

void JobManager::SizeRecoveredNvmeJobs() {
  for (const JobState state : {JobState::kQueued, JobState::kSuspended}) {
    absl::StatusOr<std::vector<JobRecord>> jobs = store_->JobsInState(state);
    if (!jobs.ok()) continue;
    for (const JobRecord& job : *jobs) {
      if (job.request.spec.memory.nvme_tier == engine::NvmeTierMode::kOff) continue;
      absl::StatusOr<engine::MemoryFootprint> f = backend_->EstimateFootprint(job.request.spec);
      // A job that cannot be sized counts the whole budget (NvmeBytesLocked).
      if (!f.ok()) {
        LogError(absl::StrCat(job.id, ": sizing its NVMe tier: ", f.status().ToString()));
        continue;
      }
      absl::MutexLock lock(&mu_);
      nvme_bytes_by_job_[job.id] = f->nvme_bytes;
    }
  }
}

void JobManager::SweepStaleNvmeTierDirs() {
  if (options_.nvme.dir.empty()) return;
  absl::StatusOr<NvmeSweep> sweep =
      SweepStaleNvmeTier(options_.nvme.dir, [this](const std::string& name) {
        absl::StatusOr<JobRecord> job = store_->GetJob(name);
        return job.ok() && job->request.spec.memory.nvme_tier != engine::NvmeTierMode::kOff;
      });
  if (!sweep.ok()) {
    LogError(absl::StrCat("--nvme_dir: ", sweep.status().ToString()));
    return;
  }
  for (const std::string& name : sweep->removed) {
    LogInfo(absl::StrCat(name, ": removed its stale NVMe tier directory ", options_.nvme.dir, "/",
                         name, " (left by a daemon that did not stop cleanly)"));
  }
  for (const std::string& left : sweep->left) {
    LogWarning(absl::StrCat("--nvme_dir ", options_.nvme.dir, ": left ", left));
  }
}

// ---------------------------------------------------------------------------
// Submission and queries.

absl::StatusOr<JobRecord> JobManager::FindRepeat(const Principal& caller, const JobRequest& request,
                                                 absl::string_view request_id, bool* found) {
  *found = false;
  if (request_id.empty()) return JobRecord();
  MEGATRAIN_ASSIGN_OR_RETURN(std::optional<JobRecord> existing,
                             store_->FindByRequestId(caller.name, request_id));
  if (!existing.has_value()) return JobRecord();
  JobRequest normalized = request;
  if (normalized.spec.output_dir.empty()) {
    normalized.spec.output_dir = (fs::path(options_.jobs_dir) / existing->id).string();
  }
  if (normalized.spec.memory.nvme_tier == engine::NvmeTierMode::kAuto) {
    normalized.spec.memory.nvme_tier = existing->request.spec.memory.nvme_tier;  // resolved
  }
  if (normalized.spec.train.devices == engine::kAllDevices) {
    normalized.spec.train.devices = existing->request.spec.train.devices;  // resolved
  }
  // Resolved at submit from the records (ResolveInitFrom), never the caller's.
  normalized.spec.model.init_from.checkpoint_dir =
      existing->request.spec.model.init_from.checkpoint_dir;
  normalized.spec.model.init_from.manifest_xxh64 =
      existing->request.spec.model.init_from.manifest_xxh64;
  if (JobRequestToJson(normalized) != JobRequestToJson(existing->request)) {
    return absl::AlreadyExistsError(absl::StrCat("request_id '", request_id,
                                                 "' was already used for job ", existing->id,
                                                 " with a different spec"));
  }
  *found = true;
  FillQueuePositions({&*existing});
  return *std::move(existing);
}

namespace {

// Note [CPU working memory]: the footprint's device estimate (weight
// slots, saved layer inputs, one layer's recompute and backward, a
// micro-batch's logits and loss chunk) is host memory when the daemon's
// devices are CPUs, so admission adds it to the job's host bytes. What a
// GPU would keep resident (device_resident_bytes) is not counted: on the
// CPU nothing is resident (auto resolves to 0).
int64_t CpuWorkingBytes(const engine::MemoryFootprint& f, const std::vector<std::string>& devices) {
  if (devices.empty()) return 0;
  for (const std::string& d : devices) {
    if (!absl::StartsWith(d, "cpu")) return 0;
  }
  return std::max<int64_t>(0, f.device_estimate_bytes - f.device_resident_bytes);
}

}  // namespace

absl::StatusOr<engine::MemoryFootprint> JobManager::AdmitSpec(const Principal& caller,
                                                              const JobRequest& request,
                                                              const engine::Cancellation& cancel) {
  MEGATRAIN_RETURN_IF_ERROR(ValidateJobRequest(request));
  MEGATRAIN_RETURN_IF_ERROR(backend_->ValidateJobSpec(request.spec));
  // The policy first: a refusal must not depend on (and so reveal) what
  // lies at a path the caller may not read (Note [Per-user data roots]).
  MEGATRAIN_RETURN_IF_ERROR(options_.path_policy.CheckJobSpec(request.spec, caller.name));
  MEGATRAIN_ASSIGN_OR_RETURN(JobInputs inputs, PreflightJobInputs(request.spec));
  MEGATRAIN_RETURN_IF_ERROR(CheckSubmission(request.spec, inputs, backend_));
  MEGATRAIN_ASSIGN_OR_RETURN(NvmeAdmission admitted,
                             AdmitNvmeTier(
                                 request.spec,
                                 [&](const engine::JobSpec& spec) {
                                   return backend_->EstimateFootprintFromHfConfig(
                                       spec, inputs.hf_config_json.value_or(""), cancel);
                                 },
                                 options_.host_memory_budget_bytes, options_.nvme));
  engine::MemoryFootprint footprint = admitted.footprint;
  MEGATRAIN_RETURN_IF_ERROR(engine::CheckBlockSlotsFitDevice(
      footprint, options_.device_memory_bytes, "memory (the smallest of --devices)"));
  const int64_t cpu_working = CpuWorkingBytes(footprint, options_.devices);
  footprint.host_total_bytes += cpu_working;
  if (footprint.host_total_bytes > options_.host_memory_budget_bytes) {
    const engine::HostStoreBytes& host = footprint.host;
    const std::string offload = footprint.activation_offload_bytes > 0
                                    ? absl::StrCat(", of which train.offload_activations ",
                                                   footprint.activation_offload_bytes)
                                    : "";
    return absl::ResourceExhaustedError(absl::StrCat(
        "job needs ", FormatBytes(footprint.host_total_bytes), " of host memory for ",
        footprint.params, " parameters (master ", host.master, ", grad ", host.grad, ", exp_avg ",
        host.exp_avg, ", exp_avg_sq ", host.exp_avg_sq, ", streaming ", host.streaming,
        ", staging ", host.staging, offload,
        cpu_working > 0 ? absl::StrCat(", working memory of a step on the CPU ", cpu_working) : "",
        " bytes) but --host_memory_budget is ", FormatBytes(options_.host_memory_budget_bytes),
        "; it can never run on this daemon",
        footprint.nvme_bytes > 0 ? absl::StrCat(" (with ", FormatBytes(footprint.nvme_bytes),
                                                " of AdamW moments on the NVMe tier)")
                                 : ""));
  }
  return footprint;
}

absl::Status JobManager::CheckJobLimitsLocked(const std::string& owner, int64_t joining) {
  // Note [Job limits].
  if (options_.max_queued_jobs_per_user > 0) {
    MEGATRAIN_ASSIGN_OR_RETURN(int64_t live, store_->CountLiveJobs(owner));
    if (live + joining > options_.max_queued_jobs_per_user) {
      return absl::ResourceExhaustedError(
          absl::StrCat("user '", owner, "' already has ", live,
                       " jobs queued, running or suspended (--max_queued_jobs_per_user=",
                       options_.max_queued_jobs_per_user, ")"));
    }
  }
  if (options_.max_queued_jobs > 0) {
    MEGATRAIN_ASSIGN_OR_RETURN(int64_t live, store_->CountLiveJobs(""));
    if (live + joining > options_.max_queued_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the queue is full: ", live,
          " jobs queued, running or suspended (--max_queued_jobs=", options_.max_queued_jobs, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status JobManager::CheckDevicesCanRun(int64_t devices, bool requested_all) const {
  const int64_t daemon_devices = static_cast<int64_t>(options_.devices.size());
  if (devices > daemon_devices) {
    return absl::ResourceExhaustedError(
        absl::StrCat("train.devices: ", devices, " requested, this daemon has ", daemon_devices,
                     " device(s) (--device); the job can never run on this daemon"));
  }
  // Note [Device limit].
  if (options_.max_devices_per_user > 0 && devices > options_.max_devices_per_user) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "train.devices ", devices, " exceeds --max_devices_per_user ",
        options_.max_devices_per_user,
        requested_all
            ? absl::StrCat(" (train.devices: all is this daemon's ", daemon_devices, " devices)")
            : "",
        "; the job can never run on this daemon"));
  }
  return absl::OkStatus();
}

absl::Status JobManager::CheckAdmittedJobCanStart(const JobRecord& job) const {
  MEGATRAIN_RETURN_IF_ERROR(
      CheckDevicesCanRun(std::max<int64_t>(1, job.request.spec.train.devices), false));
  if (job.host_memory_bytes > options_.host_memory_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job needs ", FormatBytes(job.host_memory_bytes),
        " of host memory but --host_memory_budget is ",
        FormatBytes(options_.host_memory_budget_bytes), "; it can never run on this daemon"));
  }
  return absl::OkStatus();
}

namespace {

// train.devices at submission (docs/distributed.md), once "all" is resolved
// and the count checked (JobManager::CheckDevicesCanRun): a data-parallel
// job (N > 1) is gang-scheduled (Note [Gang scheduling]) when the engine
// backend runs such jobs (EngineBackend::RunsDataParallelJobs: a build with
// c10d's backend for the daemon's devices), else UNIMPLEMENTED. Its AdamW
// moments may go to the NVMe tier as one device's do, each rank's shard in
// files of its own (Note [Tier shards] in engine/store/nvme_tier.h).
absl::Status CheckDataParallelSpec(bool data_parallel, const engine::TrainSpec& train) {
  if (train.devices > 1 && !data_parallel) {
    return absl::UnimplementedError(absl::StrCat(
        "train.devices: ", train.devices,
        " devices: this daemon's engine has no c10d backend for data parallelism on its devices "
        "(gloo for CPU slots, NCCL for CUDA devices; devices of one kind)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobRecord> JobManager::Submit(const Principal& caller, JobRequest request,
                                             absl::string_view request_id,
                                             const engine::Cancellation& cancel) {
  if (request_id.size() > kMaxRequestIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("request_id: at most ", kMaxRequestIdLength,
                                                   " characters, got ", request_id.size()));
  }
  if (draining()) return absl::UnavailableError("the daemon is shutting down; submit later");
  // Note [Lock-free admission]: everything that reads files runs here,
  // before mu_.
  bool repeat = false;
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord existing, FindRepeat(caller, request, request_id, &repeat));
  if (repeat) return existing;
  // train.devices: "all" is this daemon's device count.
  const bool requested_all = request.spec.train.devices == engine::kAllDevices;
  if (requested_all) request.spec.train.devices = static_cast<int64_t>(options_.devices.size());
  MEGATRAIN_RETURN_IF_ERROR(CheckDevicesCanRun(request.spec.train.devices, requested_all));
  MEGATRAIN_RETURN_IF_ERROR(
      CheckDataParallelSpec(backend_->RunsDataParallelJobs(options_.devices), request.spec.train));
  MEGATRAIN_ASSIGN_OR_RETURN(engine::MemoryFootprint footprint, AdmitSpec(caller, request, cancel));
  MEGATRAIN_RETURN_IF_ERROR(ResolveInitFrom(caller, &request.spec));

  JobRecord job;
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return absl::UnavailableError("the daemon is shutting down; submit later");
    // Again under the lock: a concurrent call with the same request_id may
    // have inserted it meanwhile (the store reads are quick and indexed).
    MEGATRAIN_ASSIGN_OR_RETURN(existing, FindRepeat(caller, request, request_id, &repeat));
    if (repeat) return existing;
    MEGATRAIN_RETURN_IF_ERROR(CheckJobLimitsLocked(caller.name, 1));

    MEGATRAIN_ASSIGN_OR_RETURN(int64_t seq, store_->NextJobSeq());
    job.seq = seq;
    job.id = JobIdForSeq(seq);
    job.owner = caller.name;
    job.request_id = std::string(request_id);
    job.request = std::move(request);
    const bool default_output_dir = job.request.spec.output_dir.empty();
    if (default_output_dir) {
      job.request.spec.output_dir = (fs::path(options_.jobs_dir) / job.id).string();
    }
    // Issue 14: output directories are exclusive (one indexed query).
    MEGATRAIN_RETURN_IF_ERROR(CheckOutputDirExclusive(caller, job.request.spec.output_dir,
                                                      /*explicit_dir=*/!default_output_dir));
    job.state = JobState::kQueued;
    job.create_time_unix_ms = NowUnixMs();
    job.progress.max_steps = engine::MaxSteps(job.request.spec);
    job.host_memory_bytes = footprint.host_total_bytes;
    // Note [NVMe admission]: the tier chosen now is the job's for good.
    job.request.spec.memory.nvme_tier =
        footprint.nvme_bytes > 0 ? engine::NvmeTierMode::kMoments : engine::NvmeTierMode::kOff;
    if (footprint.nvme_bytes > 0) nvme_bytes_by_job_[job.id] = footprint.nvme_bytes;
    job.message = absl::StrCat("submitted by ", caller.name);
    MEGATRAIN_RETURN_IF_ERROR(
        store_->InsertJob(job, JobEvent::StateChange(job.id, JobState::kQueued, job.message))
            .status());
    LogInfo(absl::StrCat(job.id, ": submitted by ", caller.name, " (", job.request.spec.name,
                         ", priority ", job.request.priority, ", host memory ",
                         FormatBytes(job.host_memory_bytes), ")"));
    ScheduleLocked();  // refreshes the gauges
  }
  NotifyEvents();
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord stored, store_->GetJob(job.id));
  FillQueuePositions({&stored});
  return stored;
}

absl::StatusOr<JobRecord> JobManager::LoadForCaller(const Principal& caller,
                                                    absl::string_view job_id) {
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord job, store_->GetJob(job_id));
  MEGATRAIN_RETURN_IF_ERROR(CheckOwnerAccess(caller, job.owner, absl::StrCat("job ", job.id)));
  return job;
}

void JobManager::FillQueuePositions(std::vector<JobRecord*> jobs) {
  // One indexed count per queued job (JobStore::QueuePosition): the cost
  // follows the position, and no queued row is parsed.
  for (JobRecord* job : jobs) {
    job->queue_position = 0;
    if (job->state != JobState::kQueued) continue;
    absl::StatusOr<int64_t> position = store_->QueuePosition(job->id);
    if (position.ok()) job->queue_position = *position;
    absl::MutexLock lock(&wait_mu_);  // Note [Why a queued job waits]
    if (job->id == waiting_job_) job->message = waiting_reason_;
  }
}

absl::StatusOr<JobRecord> JobManager::Get(const Principal& caller, absl::string_view job_id) {
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord job, LoadForCaller(caller, job_id));
  FillQueuePositions({&job});
  return job;
}

absl::StatusOr<JobPage> JobManager::List(const Principal& caller, JobQuery query) {
  if (!caller.is_admin()) {
    if (!query.owner.empty() && query.owner != caller.name) {
      return absl::PermissionDeniedError(absl::StrCat(
          "owner: user '", caller.name, "' may only list their own jobs, not '", query.owner, "'"));
    }
    query.owner = caller.name;
  }
  MEGATRAIN_ASSIGN_OR_RETURN(JobPage page, store_->ListJobs(query));
  std::vector<JobRecord*> jobs;
  for (JobRecord& job : page.jobs) jobs.push_back(&job);
  FillQueuePositions(std::move(jobs));
  return page;
}

// ---------------------------------------------------------------------------
// Control.

absl::StatusOr<int64_t> JobManager::TransitionLocked(JobRecord& job, JobState state,
                                                     std::string message) {
  MEGATRAIN_RETURN_IF_ERROR(CheckTransition(job.state, state));
  job.state = state;
  job.message = message;
  if (IsTerminal(state)) job.end_time_unix_ms = NowUnixMs();
  if (state != JobState::kFailed) job.error_code = absl::StatusCode::kOk;
  absl::StatusOr<int64_t> seq =
      store_->UpdateState(job, JobEvent::StateChange(job.id, state, std::move(message)));
  NotifyEvents();
  return seq;
}

absl::StatusOr<JobRecord> JobManager::Cancel(const Principal& caller, absl::string_view job_id,
                                             bool force) {
  absl::MutexLock lock(&mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord job, LoadForCaller(caller, job_id));
  MEGATRAIN_ASSIGN_OR_RETURN(const ControlStep step,
                             PlanControl(JobControl::kCancel, job.id, job.state));
  if (step.effect == ControlEffect::kTransition) {
    MEGATRAIN_RETURN_IF_ERROR(
        TransitionLocked(job, step.to, absl::StrCat("cancelled by ", caller.name)).status());
    LogInfo(absl::StrCat(job.id, ": cancelled by ", caller.name));
    RefreshGaugesLocked();
    ScheduleLocked();
  } else if (step.effect == ControlEffect::kStopRun) {
    auto it = active_.find(job.id);
    // A forced cancel may follow a plain one; a plain one once.
    if (it != active_.end() && (it->second->stop != StopReason::kCancel || force)) {
      Active& active = *it->second;
      active.stop = StopReason::kCancel;
      if (active.job != nullptr) {
        active.job->RequestStop(force ? engine::TrainingJob::StopKind::kForceCancel
                                      : StopKindFor(true));
      }
      MEGATRAIN_RETURN_IF_ERROR(
          TransitionLocked(
              job, step.to,
              absl::StrCat(
                  force ? "forced cancel requested by " : "cancel requested by ", caller.name,
                  force ? "; abandons the running step" : "; stops at the next step boundary"))
              .status());
      LogInfo(absl::StrCat(job.id, ": cancel requested by ", caller.name));
    }
  }
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord updated, store_->GetJob(job.id));
  return updated;
}

absl::StatusOr<JobRecord> JobManager::Suspend(const Principal& caller, absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord job, LoadForCaller(caller, job_id));
  MEGATRAIN_ASSIGN_OR_RETURN(const ControlStep step,
                             PlanControl(JobControl::kSuspend, job.id, job.state));
  if (step.effect == ControlEffect::kTransition) {
    MEGATRAIN_RETURN_IF_ERROR(
        TransitionLocked(job, step.to, absl::StrCat("held by ", caller.name)).status());
    RefreshGaugesLocked();
    ScheduleLocked();
  } else if (step.effect == ControlEffect::kStopRun) {
    auto it = active_.find(job.id);
    if (it == active_.end()) return absl::InternalError(absl::StrCat(job.id, ": not active"));
    Active& active = *it->second;
    if (active.stop == StopReason::kCancel) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job.id, " is being cancelled"));
    }
    active.stop = StopReason::kSuspend;
    if (active.job != nullptr) active.job->RequestStop(StopKindFor(false));
    MEGATRAIN_RETURN_IF_ERROR(TransitionLocked(job, step.to,
                                               absl::StrCat("suspend requested by ", caller.name,
                                                            "; checkpoints at the next step"))
                                  .status());
    LogInfo(absl::StrCat(job.id, ": suspend requested by ", caller.name));
    RefreshGaugesLocked();
  }
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord updated, store_->GetJob(job.id));
  FillQueuePositions({&updated});
  return updated;
}

absl::StatusOr<JobRecord> JobManager::Resume(const Principal& caller, absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord job, LoadForCaller(caller, job_id));
  MEGATRAIN_ASSIGN_OR_RETURN(const ControlStep step,
                             PlanControl(JobControl::kResume, job.id, job.state));
  if (draining_) return absl::UnavailableError("the daemon is shutting down; resume later");
  // The job already counts (Note [Job limits]); a limit lowered since it
  // was suspended (a restart with other flags) still holds.
  MEGATRAIN_RETURN_IF_ERROR(CheckJobLimitsLocked(job.owner, 0));
  // Note [Device limit]: one that could never start would wait for ever
  // (and, beyond the daemon's devices or budget, stop every scheduling
  // pass).
  MEGATRAIN_RETURN_IF_ERROR(CheckAdmittedJobCanStart(job));
  job.resume_from = checkpoints_.LatestDir(job);
  MEGATRAIN_RETURN_IF_ERROR(
      TransitionLocked(job, step.to,
                       absl::StrCat("resumed by ", caller.name,
                                    job.resume_from.empty()
                                        ? std::string()
                                        : absl::StrCat("; continues from ", job.resume_from)))
          .status());
  LogInfo(absl::StrCat(job.id, ": resumed by ", caller.name));
  RefreshGaugesLocked();
  ScheduleLocked();
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord updated, store_->GetJob(job.id));
  FillQueuePositions({&updated});
  return updated;
}

// ---------------------------------------------------------------------------
// Scheduling (Note [Scheduling policy]).

void JobManager::ScheduleLocked() {
  ReapThreadsLocked();
  if (draining_) return;
  SchedulerSnapshot snapshot = SnapshotLocked();
  // The queue is read a page at a time, as far as the policy walks it: a
  // pass usually stops at its first job, so its cost does not follow the
  // queue's length. Every device busy and no preemption: only the head.
  const int page_size = NeedsOnlyQueueHead(snapshot) ? 1 : kSchedulePageSize;
  std::map<std::string, JobRecord> read;  // the queued jobs read, by id
  std::optional<JobStore::QueueCursor> cursor;
  SchedulingDecision decision;
  while (true) {
    absl::StatusOr<std::vector<JobRecord>> page = store_->QueuedJobsPage(cursor, page_size);
    if (!page.ok()) {
      LogError(absl::StrCat("scheduler: reading the queue: ", page.status().ToString()));
      break;
    }
    snapshot.queue_complete = page->size() < static_cast<size_t>(page_size);
    if (!page->empty()) {
      cursor = JobStore::QueueCursor{page->back().request.priority, page->back().seq};
    }
    for (JobRecord& job : *page) {
      snapshot.queue.push_back(QueuedViewLocked(job));
      read.emplace(job.id, std::move(job));
    }
    decision = Next(snapshot);
    if (!decision.needs_more_queue) break;
  }
  for (JobStart& start : decision.starts) {
    StartLocked(std::move(read.at(start.job_id)), std::move(start.devices));
  }
  if (decision.preemption.has_value()) PreemptLocked(*decision.preemption);
  {
    absl::MutexLock lock(&wait_mu_);
    waiting_job_ = std::move(decision.waiting_job);
    waiting_reason_ = std::move(decision.waiting_reason);
  }
  RefreshGaugesLocked();
}

SchedulerSnapshot JobManager::SnapshotLocked() {
  SchedulerSnapshot snapshot;
  snapshot.limits.host_memory_budget_bytes = options_.host_memory_budget_bytes;
  snapshot.limits.nvme_budget_bytes = options_.nvme.budget_bytes;
  snapshot.limits.max_running_jobs_per_user = options_.max_running_jobs_per_user;
  snapshot.limits.max_devices_per_user = options_.max_devices_per_user;
  snapshot.limits.preemption = options_.preemption;
  for (const std::string& device : options_.devices) {
    snapshot.devices.push_back(DeviceState{device, job_on_device_[device]});
  }
  for (const auto& [id, active] : active_) {
    const RunStop stop = active->stop == StopReason::kNone      ? RunStop::kNone
                         : active->stop == StopReason::kPreempt ? RunStop::kPreempt
                                                                : RunStop::kOther;
    snapshot.running.push_back(RunningJobView{
        id, active->owner, active->priority, static_cast<int64_t>(active->devices.size()),
        active->reserved_bytes, active->nvme_reserved_bytes, stop});
  }
  return snapshot;
}

QueuedJobView JobManager::QueuedViewLocked(const JobRecord& job) const {
  return QueuedJobView{job.id,
                       job.owner,
                       job.request.priority,
                       std::max<int64_t>(1, job.request.spec.train.devices),
                       job.host_memory_bytes,
                       NvmeBytesLocked(job)};
}

void JobManager::PreemptLocked(const Preemption& preemption) {
  auto it = active_.find(preemption.victim_id);
  if (it == active_.end()) return;
  Active* victim = it->second.get();
  victim->stop = StopReason::kPreempt;
  victim->preempted_for = preemption.for_job_id;
  if (victim->job != nullptr) victim->job->RequestStop(StopKindFor(false));
  LogInfo(absl::StrCat(victim->job_id, ": preempted by ", preemption.for_job_id, " (priority ",
                       preemption.for_priority, " > ", victim->priority, ")"));
  JobEvent note =
      JobEvent::StateChange(victim->job_id, JobState::kRunning,
                            absl::StrCat("preempted by ", preemption.for_job_id,
                                         "; checkpoints at the next step and re-queues"));
  absl::StatusOr<int64_t> seq = store_->AppendEvent(note);
  if (!seq.ok()) LogError(seq.status().ToString());
  NotifyEvents();
}

void JobManager::StartLocked(JobRecord job, std::vector<std::string> devices) {
  const std::string device = absl::StrJoin(devices, ",");
  job.device = device;
  // The first start: a resumed or re-queued job keeps it (queue time and
  // run time stay readable from create, start and end times).
  if (job.start_time_unix_ms == 0) job.start_time_unix_ms = NowUnixMs();
  const std::string message = job.resume_from.empty()
                                  ? absl::StrCat("started on ", device)
                                  : absl::StrCat("resuming on ", device, " from ", job.resume_from);
  absl::StatusOr<int64_t> seq = TransitionLocked(job, JobState::kRunning, message);
  if (!seq.ok()) {
    LogError(absl::StrCat(job.id, ": cannot start: ", seq.status().ToString()));
    return;
  }
  LogInfo(absl::StrCat(job.id, ": ", message));
  auto active = std::make_unique<Active>();
  active->job_id = job.id;
  active->owner = job.owner;
  active->devices = devices;
  active->priority = job.request.priority;
  active->reserved_bytes = job.host_memory_bytes;
  active->last_checkpoint_dir = job.resume_from;
  reserved_bytes_ += job.host_memory_bytes;
  active->nvme_reserved_bytes = NvmeBytesLocked(job);
  nvme_reserved_bytes_ += active->nvme_reserved_bytes;
  for (const std::string& d : devices) job_on_device_[d] = job.id;
  Active* raw = active.get();
  active_[job.id] = std::move(active);
  // Started by launcher_, a thread at the daemon's own priority: a thread
  // inherits its creator's nice value, and this may be an RPC handler's
  // (Note [RPC threads below training] in server/rpc/rpc_priority.h). The
  // job thread takes mu_ before it can finish, so it cannot end before
  // `thread` is set.
  launcher_.Post([this, raw, job = std::move(job)] {
    absl::MutexLock lock(&mu_);
    raw->thread = std::thread(&JobManager::RunJob, this, raw, job);
  });
}

void JobManager::RunJob(Active* active, JobRecord job) {
  // No exception may leave this thread (STYLE: errors).
  absl::StatusOr<engine::JobOutcome> outcome = absl::InternalError("job did not run");
  try {
    outcome = HoldAndRun(active, job);
  } catch (const std::bad_alloc&) {
    outcome = absl::ResourceExhaustedError("out of host memory (std::bad_alloc) in the engine");
  } catch (const std::exception& e) {
    outcome = absl::InternalError(absl::StrCat("engine threw: ", e.what()));
  } catch (...) {
    outcome = absl::InternalError("engine threw an unknown exception");
  }
  // Free the job's memory before releasing its reservation.
  std::unique_ptr<engine::TrainingJob> finished;
  {
    absl::MutexLock lock(&mu_);
    finished = std::move(active->job);
  }
  finished.reset();
  FinishJob(active, outcome);
}

absl::StatusOr<engine::JobOutcome> JobManager::HoldAndRun(Active* active, const JobRecord& job) {
  // Again at start: the roots may have changed since submission (a restart
  // with other flags), or a directory on the way may have become a
  // symbolic link (Note [Path checks] in path_policy.h).
  MEGATRAIN_RETURN_IF_ERROR(options_.path_policy.CheckJobSpec(job.request.spec, job.owner));
  // Note [Held output directory]: opened once from its root without
  // following links, claimed, and this thread's for the whole run.
  MEGATRAIN_ASSIGN_OR_RETURN(engine::HeldOutputDir held, HoldOutputDir(active, job));
  engine::ScopedHeldOutputDir held_scope(&held);
  // Note [Resume verification] in checkpoint_records.h.
  ResumeSelection selection = checkpoints_.SelectResume(job);
  AppendEvents(selection.events);
  MEGATRAIN_RETURN_IF_ERROR(selection.dir.status());
  std::optional<std::string> resume_from;
  if (!selection.dir->empty()) resume_from = *selection.dir;
  checkpoints_.Adopt(job);
  engine::JobSpec spec = job.request.spec;
  spec.job_id = job.id;  // written into its checkpoints, required of resume_from
  // Note [NVMe admission]: the tier's files go under <nvme_dir>/<job id>.
  if (spec.memory.nvme_tier != engine::NvmeTierMode::kOff) spec.memory.nvme_dir = options_.nvme.dir;
  // Note [Confined reads] in engine/fs/dir_fd.h: every input the engine
  // opens on this thread, now and while it runs, stays below the roots.
  MEGATRAIN_ASSIGN_OR_RETURN(engine::ReadConfinement confinement,
                             options_.path_policy.ConfineJobReads(&spec, job.owner));
  engine::ScopedReadConfinement confined(&confinement);
  MEGATRAIN_ASSIGN_OR_RETURN(std::unique_ptr<engine::TrainingJob> created,
                             backend_->CreateJobOnDevices(spec, active->devices, resume_from));
  engine::TrainingJob* training_job = created.get();
  {
    absl::MutexLock lock(&mu_);
    active->job = std::move(created);
    if (active->stop != StopReason::kNone) {
      training_job->RequestStop(StopKindFor(active->stop == StopReason::kCancel));
    }
    if (active->checkpoint_requested) training_job->RequestCheckpoint();
  }
  metrics_->SetHostStore(active->devices.front(), training_job->footprint().host);
  RecordStartEvents(job.id, *training_job);
  Observer observer(this, active, job);
  return training_job->Run(&observer);
}

void JobManager::RecordStartEvents(const std::string& job_id,
                                   const engine::TrainingJob& training_job) {
  std::vector<std::string> texts;
  // Issue 16: the step schedule the trainer chose.
  if (const std::string schedule = training_job.schedule_description(); !schedule.empty()) {
    texts.push_back(absl::StrCat("schedule: ", schedule));
  }
  // Issue 20: what the long-document rule did to SFT / chat data (Note
  // [Long conversations] in engine/job/training_job.cc).
  if (std::string data = training_job.data_description(); !data.empty()) {
    texts.push_back(std::move(data));
  }
  for (const std::string& text : texts) {
    absl::StatusOr<int64_t> seq =
        store_->AppendEvent(JobEvent::StateChange(job_id, JobState::kRunning, text));
    if (!seq.ok()) LogError(absl::StrCat(job_id, ": recording event: ", seq.status().ToString()));
    NotifyEvents();
  }
}

void JobManager::FinishJob(Active* active, const absl::StatusOr<engine::JobOutcome>& outcome) {
  absl::MutexLock lock(&mu_);
  const std::string job_id = active->job_id;
  const std::vector<std::string> devices = active->devices;
  // Note [Per-job series] in metrics.h: gone before watchers see the end.
  metrics_->RemoveJob(job_id);
  absl::StatusOr<JobRecord> loaded = store_->GetJob(job_id);
  if (loaded.ok()) {
    RecordEndLocked(*active, outcome, *loaded);
  } else {
    LogError(absl::StrCat(job_id, ": reading the job at its end: ", loaded.status().ToString()));
  }
  for (const std::string& device : devices) metrics_->ClearDevice(device);
  reserved_bytes_ -= active->reserved_bytes;
  nvme_reserved_bytes_ -= active->nvme_reserved_bytes;
  for (const std::string& device : devices) job_on_device_[device].clear();
  finished_threads_.push_back(std::move(active->thread));
  active_.erase(job_id);  // destroys *active
  if (active_.empty()) idle_cv_.SignalAll();
  ScheduleLocked();
}

void JobManager::RecordEndLocked(const Active& active,
                                 const absl::StatusOr<engine::JobOutcome>& outcome, JobRecord job) {
  job.device.clear();
  JobState state = JobState::kFailed;
  std::string message;
  if (!outcome.ok()) {
    job.error_code = outcome.status().code();
    message = std::string(outcome.status().message());
  } else {
    state = EndStateOf(*outcome, active.stop);
    std::string checkpoint;
    if (*outcome == engine::JobOutcome::kSuspended) {
      checkpoint = !active.last_checkpoint_dir.empty() ? active.last_checkpoint_dir
                                                       : checkpoints_.LatestDir(job);
      job.resume_from = checkpoint;
    }
    const int64_t step = job.progress.step;
    if (state == JobState::kSucceeded) {
      message = absl::StrCat("finished at step ", step);
    } else if (state == JobState::kCancelled) {
      message = absl::StrCat("cancelled at step ", step);
    } else if (state == JobState::kSuspended) {
      message = absl::StrCat("suspended at step ", step, "; checkpoint ", checkpoint);
    } else if (active.stop == StopReason::kPreempt) {
      message = absl::StrCat("preempted by ", active.preempted_for, "; re-queued, resumes from ",
                             checkpoint);
    } else {
      message = absl::StrCat("daemon shut down; re-queued, resumes from ", checkpoint);
    }
  }
  absl::StatusOr<int64_t> seq = TransitionLocked(job, state, message);
  if (!seq.ok()) LogError(absl::StrCat(job.id, ": recording the end: ", seq.status().ToString()));
  LogInfo(absl::StrCat(job.id, ": ", JobStateName(state), ": ", message));
}

void JobManager::ReapThreadsLocked() {
  // Joining a finished thread is quick; a thread never joins itself.
  std::vector<std::thread> keep;
  for (std::thread& thread : finished_threads_) {
    if (thread.get_id() == std::this_thread::get_id()) {
      keep.push_back(std::move(thread));
    } else if (thread.joinable()) {
      thread.join();
    }
  }
  finished_threads_ = std::move(keep);
}

void JobManager::RefreshGaugesLocked() {
  absl::StatusOr<std::map<JobState, int64_t>> counts = store_->CountByState();
  if (counts.ok()) metrics_->SetJobCounts(*counts);
  metrics_->SetHostMemory(options_.host_memory_budget_bytes, reserved_bytes_);
}

// ---------------------------------------------------------------------------
// Events.

void JobManager::AppendEvents(const std::vector<JobEvent>& events) {
  for (const JobEvent& event : events) {
    absl::StatusOr<int64_t> seq = store_->AppendEvent(event);
    if (!seq.ok()) {
      LogError(absl::StrCat(event.job_id, ": recording event: ", seq.status().ToString()));
    }
  }
  if (!events.empty()) NotifyEvents();
}

void JobManager::NotifyEvents() {
  {
    absl::MutexLock lock(&events_mu_);
    ++event_generation_;
  }
  events_cv_.SignalAll();
}

void JobManager::WaitForEventsAfter(int64_t generation, absl::Time deadline) {
  absl::MutexLock lock(&events_mu_);
  while (!stopped_ && event_generation_ == generation) {
    if (events_cv_.WaitWithDeadline(&events_mu_, deadline)) return;  // timed out
  }
}

absl::StatusOr<EventBatch> JobManager::WaitEvents(const Principal& caller, absl::string_view job_id,
                                                  int64_t after_seq, absl::Duration max_wait) {
  MEGATRAIN_RETURN_IF_ERROR(LoadForCaller(caller, job_id).status());
  const absl::Time deadline = absl::Now() + max_wait;
  while (true) {
    int64_t generation = 0;
    {
      absl::MutexLock lock(&events_mu_);
      if (stopped_) return absl::UnavailableError("the daemon is shutting down");
      generation = event_generation_;
    }
    // Read the state before the events: the terminal state and its event are
    // committed together, so a terminal state read first guarantees that the
    // listing below contains the final event.
    MEGATRAIN_ASSIGN_OR_RETURN(JobRecord job, store_->GetJob(job_id));
    EventBatch batch;
    MEGATRAIN_ASSIGN_OR_RETURN(batch.events,
                               store_->ListEvents(job_id, after_seq, kMaxEventsPerBatch));
    if (!batch.events.empty()) return batch;
    if (IsTerminal(job.state)) {
      batch.finished = true;
      return batch;
    }
    if (absl::Now() >= deadline) return batch;
    WaitForEventsAfter(generation, deadline);
  }
}

// ---------------------------------------------------------------------------
// Checkpoints.

absl::StatusOr<engine::HeldOutputDir> JobManager::HoldOutputDir(Active* active,
                                                                const JobRecord& job) {
  std::vector<std::string> roots = options_.path_policy.output_roots();
  if (!options_.jobs_dir.empty()) roots.push_back(options_.jobs_dir);
  // Exclusivity again, before anything is created (HeldOutputDir::Open
  // then makes sure the path is the directory's real place): an older job
  // that claims an overlapping directory (the oldest claimant comes first)
  // fails this start.
  MEGATRAIN_ASSIGN_OR_RETURN(std::optional<JobRecord> claimant,
                             store_->FindOutputDirOverlap(job.request.spec.output_dir));
  if (claimant.has_value() && claimant->id != job.id) {
    return absl::FailedPreconditionError(
        absl::StrCat("output_dir: '", job.request.spec.output_dir,
                     "' overlaps the output directory of an older job that still claims it; output "
                     "directories are exclusive to one job"));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(engine::HeldOutputDir held,
                             engine::HeldOutputDir::Open(job.request.spec.output_dir, roots));
  absl::MutexLock lock(&mu_);
  for (const auto& entry : active_) {
    const Active* other = entry.second.get();
    if (other == active || other->output_inode == 0) continue;
    if (other->output_device == held.device() && other->output_inode == held.inode()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "output_dir: '", job.request.spec.output_dir,
          "' is the directory another running job writes (the same directory, reached by "
          "another path); output directories are exclusive to one job"));
    }
  }
  active->output_device = held.device();
  active->output_inode = held.inode();
  return held;
}

absl::Status JobManager::CheckExportTarget(const Principal& caller, const std::string& out_dir,
                                           const std::string& resolved_out) {
  const std::string jobs_dir = NormalizeOutputDir(options_.jobs_dir);
  for (const std::string& dir : {NormalizeOutputDir(out_dir), NormalizeOutputDir(resolved_out)}) {
    if (!jobs_dir.empty() && PathsOverlap(dir, jobs_dir)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "out_dir: '", out_dir, "' overlaps the daemon's jobs directory '", jobs_dir,
          "' (its jobs' directories, and those of jobs not yet submitted); export elsewhere"));
    }
    MEGATRAIN_ASSIGN_OR_RETURN(std::optional<JobRecord> other, store_->FindOutputDirOverlap(dir));
    if (other.has_value()) {
      const bool visible = caller.is_admin() || other->owner == caller.name;
      return absl::InvalidArgumentError(
          absl::StrCat("out_dir: '", out_dir, "' equals, contains or lies inside ",
                       visible ? absl::StrCat("the output directory of job ", other->id)
                               : std::string("another job's output directory"),
                       "; exports go outside every job's directory"));
    }
  }
  return absl::OkStatus();
}

absl::Status JobManager::CheckOutputDirExclusive(const Principal& caller,
                                                 const std::string& output_dir, bool explicit_dir) {
  const std::string dir = NormalizeOutputDir(output_dir);
  const std::string jobs_dir = NormalizeOutputDir(options_.jobs_dir);
  if (explicit_dir) {
    MEGATRAIN_RETURN_IF_ERROR(options_.path_policy.CheckNotOutputRoot("output_dir", output_dir));
  }
  if (explicit_dir && !jobs_dir.empty() && PathsOverlap(dir, jobs_dir)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output_dir: '", output_dir, "' overlaps the daemon's jobs directory '", jobs_dir,
        "', which holds the default output directories; leave output_dir empty to get one "
        "there"));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(std::optional<JobRecord> other, store_->FindOutputDirOverlap(dir));
  if (!other.has_value()) return absl::OkStatus();
  // Whose directory it is only for those who may see that job.
  const bool visible = caller.is_admin() || other->owner == caller.name;
  const std::string whose =
      visible ? absl::StrCat("the output directory '", other->request.spec.output_dir, "' of job ",
                             other->id)
              : std::string("another job's output directory");
  return absl::InvalidArgumentError(absl::StrCat("output_dir: '", output_dir,
                                                 "' equals, contains or lies inside ", whose,
                                                 "; output directories are exclusive to one job"));
}

absl::Status JobManager::CheckStoreMatchesJobsDir() {
  MEGATRAIN_ASSIGN_OR_RETURN(auto counts, store_->CountByState());
  int64_t jobs = 0;
  for (const auto& [state, count] : counts) jobs += count;
  if (jobs > 0 || options_.jobs_dir.empty()) return absl::OkStatus();
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::directory_iterator it(options_.jobs_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t seq = 0;
    if (absl::StartsWith(name, "job-") && absl::SimpleAtoi(name.substr(4), &seq)) {
      found.push_back(name);
    }
  }
  if (found.empty()) return absl::OkStatus();
  std::sort(found.begin(), found.end());
  const size_t shown = std::min<size_t>(found.size(), 3);
  return absl::FailedPreconditionError(absl::StrCat(
      "the job database is empty, but ", options_.jobs_dir, " holds ", found.size(),
      " job directories (", absl::StrJoin(found.begin(), found.begin() + shown, ", "),
      found.size() > shown ? ", ..." : "",
      "): the database under --state_dir was deleted or replaced. Starting would reuse "
      "those job ids and give their checkpoints to new jobs. Restore the database from a "
      "backup, or move the job directories out of ",
      options_.jobs_dir, " (e.g. to ", options_.jobs_dir,
      ".orphaned), then start megatraind again"));
}

absl::StatusOr<CheckpointRecord> JobManager::CreateCheckpoint(
    const Principal& caller, absl::string_view job_id, absl::Time deadline,
    const std::function<bool()>& cancelled) {
  int64_t after_seq = 0;
  {
    absl::MutexLock lock(&mu_);
    MEGATRAIN_ASSIGN_OR_RETURN(JobRecord job, LoadForCaller(caller, job_id));
    auto it = active_.find(job.id);
    if (job.state != JobState::kRunning || it == active_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job.id, " is ", JobStateName(job.state), "; only RUNNING jobs checkpoint"));
    }
    MEGATRAIN_ASSIGN_OR_RETURN(after_seq, store_->LastEventSeq(job.id));
    Active& active = *it->second;
    active.checkpoint_requested = true;
    if (active.job != nullptr) active.job->RequestCheckpoint();
    LogInfo(absl::StrCat(job.id, ": checkpoint requested by ", caller.name));
  }
  while (true) {
    int64_t generation = 0;
    {
      absl::MutexLock lock(&events_mu_);
      if (stopped_) return absl::UnavailableError("the daemon is shutting down");
      generation = event_generation_;
    }
    MEGATRAIN_ASSIGN_OR_RETURN(std::vector<JobEvent> events,
                               store_->ListEvents(job_id, after_seq, kMaxEventsPerBatch));
    for (const JobEvent& event : events) {
      after_seq = event.seq;
      if (event.kind == JobEvent::Kind::kCheckpoint) {
        CheckpointRecord checkpoint;
        checkpoint.job_id = std::string(job_id);
        checkpoint.step = event.step;
        checkpoint.dir = event.checkpoint_dir;
        checkpoint.create_time_unix_ms = event.time_unix_ms;
        checkpoint.write_seconds = event.checkpoint_seconds;
        return checkpoint;
      }
      if (event.kind == JobEvent::Kind::kStateChange && event.state != JobState::kRunning &&
          event.state != JobState::kSuspending) {
        return absl::AbortedError(absl::StrCat("job ", job_id, " became ",
                                               JobStateName(event.state),
                                               " before writing the checkpoint"));
      }
    }
    if (!events.empty()) continue;
    if (cancelled && cancelled()) return absl::CancelledError("the caller went away");
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("job ", job_id,
                       ": no checkpoint written before the deadline; the "
                       "request stays pending until the next step boundary"));
    }
    WaitForEventsAfter(generation, std::min(deadline, now + kMaxWaitSlice));
  }
}

absl::StatusOr<std::vector<CheckpointRecord>> JobManager::ListCheckpoints(
    const Principal& caller, absl::string_view job_id) {
  MEGATRAIN_ASSIGN_OR_RETURN(JobRecord job, LoadForCaller(caller, job_id));
  return checkpoints_.Present(job.id);
}

absl::StatusOr<CheckpointRecord> JobManager::FindCheckpoint(const Principal& caller,
                                                            absl::string_view checkpoint_id,
                                                            JobRecord* job) {
  MEGATRAIN_ASSIGN_OR_RETURN(auto parsed, ParseCheckpointId(checkpoint_id));
  MEGATRAIN_ASSIGN_OR_RETURN(*job, LoadForCaller(caller, parsed.first));
  return checkpoints_.Find(*job, parsed.second, checkpoint_id);
}

namespace {

// model.init_from.optimizer restore goes on from the checkpoint's step to
// the job's last step, counted from 0 (docs/job-spec.md, "Starting from a
// checkpoint"): a job whose last step is not past the checkpoint's would
// train nothing and end SUCCEEDED. INVALID_ARGUMENT naming train.max_steps
// (or train.max_tokens, what set the step count).
absl::Status CheckRestoreLeavesSteps(const engine::JobSpec& spec, int64_t checkpoint_step) {
  const int64_t max_steps = engine::MaxSteps(spec);
  if (spec.model.init_from.optimizer != engine::InitOptimizer::kRestore ||
      max_steps > checkpoint_step) {
    return absl::OkStatus();
  }
  const std::string steps =
      spec.train.max_steps > 0
          ? absl::StrCat("train.max_steps: ", max_steps)
          : absl::StrCat("train.max_tokens: ", spec.train.max_tokens, " (", max_steps, " steps)");
  return absl::InvalidArgumentError(absl::StrCat(
      steps, " leaves nothing to train after model.init_from.checkpoint ",
      spec.model.init_from.checkpoint, " with optimizer: restore, which goes on from step ",
      checkpoint_step + 1, " to the job's last step; give more steps than ", checkpoint_step,
      ", or optimizer: fresh to count from step 1"));
}

}  // namespace

absl::Status JobManager::ResolveInitFrom(const Principal& caller, engine::JobSpec* spec) {
  engine::InitFrom& init = spec->model.init_from;
  init.checkpoint_dir.clear();  // never the caller's
  init.manifest_xxh64 = 0;
  if (init.checkpoint.empty()) return absl::OkStatus();
  constexpr absl::string_view kField = "model.init_from.checkpoint";
  // Also checked with the spec's other fields (ValidateJobSpec); again
  // here, before the id reaches the store: no path, only
  // job-<digits>/step-<digits>.
  MEGATRAIN_RETURN_IF_ERROR(engine::CheckInitFromCheckpointId(init.checkpoint));
  JobRecord source;
  absl::StatusOr<CheckpointRecord> record = FindCheckpoint(caller, init.checkpoint, &source);
  if (!record.ok()) return Annotate(record.status(), kField);
  MEGATRAIN_RETURN_IF_ERROR(CheckRestoreLeavesSteps(*spec, record->step));
  absl::StatusOr<engine::CheckpointInfo> found =
      backend_->VerifyCheckpoint(record->dir, /*check_data=*/false);
  if (!found.ok()) return Annotate(found.status(), kField);
  MEGATRAIN_RETURN_IF_ERROR(
      Annotate(CheckpointRecords::VerifyAgainstRecord(*record, *found), kField));
  MEGATRAIN_RETURN_IF_ERROR(backend_->CheckInitFromModel(*spec, record->dir));
  init.checkpoint_dir = record->dir;
  init.manifest_xxh64 = record->manifest_xxh64;
  return absl::OkStatus();
}

absl::StatusOr<engine::HfExportReport> JobManager::ExportCheckpoint(const Principal& caller,
                                                                    absl::string_view checkpoint_id,
                                                                    const std::string& out_dir,
                                                                    const std::string& dtype) {
  if (draining()) return absl::UnavailableError("the daemon is shutting down");
  // Access first: a caller learns nothing about other users' checkpoints.
  MEGATRAIN_ASSIGN_OR_RETURN(auto parsed, ParseCheckpointId(checkpoint_id));
  MEGATRAIN_RETURN_IF_ERROR(LoadForCaller(caller, parsed.first).status());
  const std::string export_dtype = dtype.empty() ? "bf16" : dtype;
  if (export_dtype != "bf16" && export_dtype != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype: must be 'bf16' or 'fp32', got '", dtype, "'"));
  }
  const fs::path out(out_dir);
  if (out_dir.empty() || !out.is_absolute()) {
    return absl::InvalidArgumentError(
        absl::StrCat("out_dir: must be an absolute path, got '", out_dir, "'"));
  }
  MEGATRAIN_RETURN_IF_ERROR(options_.path_policy.CheckWrite("out_dir", out_dir));
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec))) {
    return absl::InvalidArgumentError(
        absl::StrCat("out_dir: '", out_dir, "' exists and is not an empty directory"));
  }
  JobRecord job;
  MEGATRAIN_ASSIGN_OR_RETURN(CheckpointRecord checkpoint,
                             FindCheckpoint(caller, checkpoint_id, &job));
  // The directory must still hold what the job wrote (manifest and state
  // only; the export verifies the weights it reads).
  MEGATRAIN_ASSIGN_OR_RETURN(engine::CheckpointInfo found,
                             backend_->VerifyCheckpoint(checkpoint.dir, /*check_data=*/false));
  MEGATRAIN_RETURN_IF_ERROR(CheckpointRecords::VerifyAgainstRecord(checkpoint, found));
  // The export walks every component of the resolved path from "/" without
  // following a link (engine::ExportHfDirectory): a link swapped in after
  // CheckWrite fails the export instead of leading out of the root.
  MEGATRAIN_ASSIGN_OR_RETURN(const std::string resolved_out,
                             ResolvePathBeneath("out_dir", out_dir));
  MEGATRAIN_RETURN_IF_ERROR(CheckExportTarget(caller, out_dir, resolved_out));
  LogInfo(absl::StrCat(checkpoint_id, ": exporting to ", resolved_out, " (", export_dtype, ") for ",
                       caller.name));
  // The source model directory, as the job's own reads are checked: the
  // owner's data roots now, resolved; the engine reads it confined below.
  const std::string& hf_dir = job.request.spec.model.hf_dir;
  std::string source_dir;
  if (!hf_dir.empty() && options_.path_policy.CheckRead("model.hf_dir", hf_dir, job.owner).ok()) {
    source_dir = ResolvePathBeneath("model.hf_dir", hf_dir).value_or("");
  }
  absl::StatusOr<engine::HfExportReport> report =
      backend_->ExportHfModelFrom(checkpoint.dir, resolved_out, export_dtype, source_dir);
  if (report.ok() && !hf_dir.empty() && source_dir.empty()) {
    report->skipped_files.push_back(absl::StrCat(
        "model.hf_dir: '", hf_dir, "' is no longer readable under the data roots; nothing copied"));
  }
  if (report.ok() && !report->skipped_files.empty()) {
    LogInfo(absl::StrCat(checkpoint_id, ": export skipped ",
                         absl::StrJoin(report->skipped_files, "; ")));
  }
  return report;
}

absl::Status EngineBackend::RemoveCheckpointDir(const std::string& output_dir,
                                                const std::string& checkpoint_dir) {
  // Note [Directory descriptors] in engine/fs/dir_fd.h: reached from the job's
  // output directory one component at a time, never through a link.
  const fs::path root = fs::path(output_dir).lexically_normal();
  const fs::path relative = fs::path(checkpoint_dir).lexically_normal().lexically_relative(root);
  if (relative.empty() || *relative.begin() == ".." || relative.is_absolute() ||
      !relative.has_filename()) {
    return absl::InternalError(absl::StrCat("checkpoint directory '", checkpoint_dir,
                                            "' is not inside the job's output_dir '", root.string(),
                                            "'"));
  }
  absl::StatusOr<engine::DirFd> parent =
      relative.has_parent_path()
          ? engine::DirFd::OpenBeneath(root.string(), relative.parent_path().string(),
                                       engine::DirFd::Create::kNo)
          : engine::DirFd::Open(root.string());
  if (absl::IsNotFound(parent.status())) return absl::OkStatus();
  if (!parent.ok()) return parent.status();
  return parent->RemoveTreeAt(relative.filename().string());
}

absl::Status JobManager::CheckNoQueuedJobStartsFrom(const std::string& owner,
                                                    const std::string& dir,
                                                    absl::string_view checkpoint_id) {
  JobQuery query;
  query.owner = owner;
  query.states = {JobState::kQueued};
  query.page_size = kMaxPageSize;
  do {
    MEGATRAIN_ASSIGN_OR_RETURN(JobPage page, store_->ListJobs(query));
    for (const JobRecord& queued : page.jobs) {
      if (queued.resume_from.empty() && queued.request.spec.model.init_from.checkpoint_dir == dir) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint '", checkpoint_id, "' is where QUEUED job ", queued.id,
                         " starts from (model.init_from); cancel it first"));
      }
    }
    query.page_token = page.next_page_token;
  } while (!query.page_token.empty());
  return absl::OkStatus();
}

absl::Status JobManager::DeleteCheckpoint(const Principal& caller,
                                          absl::string_view checkpoint_id) {
  // Access and existence without mu_ (a stat of the recorded directory).
  JobRecord job;
  MEGATRAIN_ASSIGN_OR_RETURN(CheckpointRecord checkpoint,
                             FindCheckpoint(caller, checkpoint_id, &job));
  MEGATRAIN_RETURN_IF_ERROR(CheckNoQueuedJobStartsFrom(job.owner, checkpoint.dir, checkpoint_id));
  // Note [Held output directory]: the job's output_dir must still lead,
  // without a link, to the directory it names (a parent swapped for a link
  // would aim the delete at another directory); a missing one is left to
  // RemoveCheckpointDir.
  std::vector<std::string> roots = options_.path_policy.output_roots();
  if (!options_.jobs_dir.empty()) roots.push_back(options_.jobs_dir);
  absl::Status unmoved =
      engine::HeldOutputDir::Open(job.request.spec.output_dir, roots, engine::DirFd::Create::kNo)
          .status();
  if (!unmoved.ok() && !absl::IsNotFound(unmoved)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", checkpoint_id, "' not deleted: ", unmoved.message()));
  }
  {
    // Under mu_ only the store: the job's state now, then the record goes,
    // so that no resume chosen from here on can pick this checkpoint.
    absl::MutexLock lock(&mu_);
    MEGATRAIN_ASSIGN_OR_RETURN(job, store_->GetJob(job.id));
    if ((job.state == JobState::kQueued || job.state == JobState::kSuspended) &&
        job.resume_from == checkpoint.dir) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint '", checkpoint_id,
                                                        "' is where ", JobStateName(job.state),
                                                        " job ", job.id, " resumes from"));
    }
    MEGATRAIN_RETURN_IF_ERROR(store_->DeleteCheckpoint(job.id, checkpoint.step));
  }
  // The files without mu_: a slow or hung file system stalls this call only.
  absl::Status removed = backend_->RemoveCheckpointDir(job.request.spec.output_dir, checkpoint.dir);
  if (!removed.ok()) {
    // Recorded again, so that the owner can retry the delete; a partly
    // removed checkpoint fails verification at resume and is quarantined.
    absl::Status recorded = store_->RecordCheckpoint(checkpoint);
    if (!recorded.ok()) LogError(absl::StrCat(checkpoint_id, ": ", recorded.ToString()));
    return removed;
  }
  LogInfo(absl::StrCat(checkpoint_id, ": deleted by ", caller.name));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Status and shutdown.

absl::StatusOr<ManagerStatus> JobManager::GetStatus() {
  absl::MutexLock lock(&mu_);
  ManagerStatus status;
  for (const std::string& device : options_.devices) {
    status.devices.push_back(DeviceState{device, job_on_device_[device]});
  }
  status.host_memory_budget_bytes = options_.host_memory_budget_bytes;
  status.host_memory_reserved_bytes = reserved_bytes_;
  MEGATRAIN_ASSIGN_OR_RETURN(status.jobs_by_state, store_->CountByState());
  status.draining = draining_;
  return status;
}

bool JobManager::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

bool JobManager::Drain(absl::Duration timeout) {
  bool idle = true;
  {
    absl::MutexLock lock(&mu_);
    if (!draining_) {
      draining_ = true;
      for (auto& [id, active] : active_) {
        // A user's suspend or cancel stands; everything else checkpoints
        // and re-queues.
        if (active->stop == StopReason::kNone || active->stop == StopReason::kPreempt) {
          active->stop = StopReason::kShutdown;
          if (active->job != nullptr) active->job->RequestStop(StopKindFor(false));
          LogInfo(absl::StrCat(id, ": checkpointing for shutdown"));
        }
      }
    }
    // absl::Now() + InfiniteDuration() is InfiniteFuture: no deadline.
    const absl::Time deadline = absl::Now() + timeout;
    while (!active_.empty()) {
      if (idle_cv_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
    }
    idle = active_.empty();
    if (idle) ReapThreadsLocked();
  }
  {
    absl::MutexLock events_lock(&events_mu_);
    stopped_ = true;
  }
  events_cv_.SignalAll();
  return idle;
}

}  // namespace megatrain::server
