// The scheduler's policy as a pure function: given a snapshot of the
// devices, the running jobs and (a prefix of) the queue, Next() says which
// queued jobs start on which devices, which running job to preempt, and why
// the pass stopped where it did. JobManager takes the snapshot under its
// lock, calls Next and carries the decision out; the policy itself holds no
// state, takes no lock and starts no thread, so it is tested on snapshots
// alone (tests/server/core/scheduling_policy_test.cc).
//
// Note [Scheduling policy]
// Queued jobs are ordered by priority (highest first), then by submission
// order (JobRecord.seq), also for jobs re-queued after a preemption or
// restart. A scheduling pass walks that order and starts each job on free
// devices while its host-memory footprint fits the remaining budget
// (--host_memory_budget minus the footprints of the running jobs) and, for a
// job on the NVMe tier, its moment bytes fit the tier's budget (Note [NVMe
// admission] in nvme_admission.h). A job whose owner is at
// --max_running_jobs_per_user, or whose start would take its owner over
// --max_devices_per_user (Note [Device limit] in job_manager.h), is skipped
// (others may pass it). The first job that finds too few free devices or
// not enough memory stops the pass: smaller jobs behind it do not overtake
// it, so big jobs are not starved. With preemption on, that job may instead
// suspend the running job of lowest priority below its own (among equals
// the later submission; one preemption at a time; only when that frees
// enough for it: host memory and NVMe bytes); the preempted job writes a
// checkpoint at its next step boundary and goes back to the queue,
// resuming from that checkpoint. Passes run after every submit, resume,
// cancel and job end.
//
// Note [Gang scheduling]
// A job with train.devices N > 1 (data parallel; docs/distributed.md) needs
// N free devices at once: it starts only when N are free (the first N free
// in --device order), holds all N until it ends, and frees them together.
// Until then it waits as the head of the queue does (later jobs do not
// overtake it, even 1-device ones that would fit a free device). Its host
// memory is reserved once (the footprint of the whole job). No job is
// preempted for it unless the free devices and those of every job it may
// preempt (lower priority, or stopping already) add up to N: otherwise each
// victim would be checkpointed and stopped for nothing while a job of
// higher priority keeps the devices it lacks. A preemption frees one
// victim's devices at a time; a job needing more waits for the next pass.
//
// Note [Why a queued job waits]
// The job a pass stopped at (SchedulingDecision::waiting_job) gets a
// reason, shown as its message by GetJob and ListJobs: "waiting for 2
// device(s) at once (train.devices): 1 of 2 free; busy: cuda:1
// (job-000003)", "waiting for host memory: needs ...", or "waiting for NVMe
// tier space: needs ...". Only that job, the one the free devices go to
// next, gets one: the jobs behind it wait for it. When every device is busy
// and preemption is off, nothing can start, and the pass reads only the
// head of the queue (NeedsOnlyQueueHead): the head waits for devices, even
// when its owner is at a limit. The reason is a view of the scheduler's
// state, rewritten by every pass and never stored.
//
// Thread-safety: value types and pure functions.
#ifndef MEGATRAIN_SERVER_SCHEDULING_POLICY_H_
#define MEGATRAIN_SERVER_SCHEDULING_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace megatrain::server {

// One device and the job on it.
struct DeviceState {
  std::string name;
  std::string job_id;  // empty when idle
};

// Whether a running job was asked to stop.
enum class RunStop {
  kNone,     // runs on
  kPreempt,  // preempted: it checkpoints and re-queues
  kOther,    // a cancel, a suspend or the drain
};

// A job holding devices (RUNNING or SUSPENDING), as the policy sees it.
struct RunningJobView {
  std::string id;
  std::string owner;
  int32_t priority = 0;
  int64_t devices = 1;            // devices it holds
  int64_t host_memory_bytes = 0;  // its reservation of --host_memory_budget
  int64_t nvme_bytes = 0;         // its reservation of the NVMe tier budget
  RunStop stop = RunStop::kNone;
};

// A QUEUED job, as the policy sees it.
struct QueuedJobView {
  std::string id;
  std::string owner;
  int32_t priority = 0;
  int64_t devices = 1;  // train.devices, resolved (>= 1)
  int64_t host_memory_bytes = 0;
  int64_t nvme_bytes = 0;  // 0 off the NVMe tier
};

// The daemon's flags the policy applies.
struct SchedulingLimits {
  int64_t host_memory_budget_bytes = 0;  // --host_memory_budget
  int64_t nvme_budget_bytes = 0;         // --nvme_budget (0 without the tier)
  int max_running_jobs_per_user = 0;     // 0: no limit
  int max_devices_per_user = 0;          // 0: no limit
  bool preemption = false;               // --preemption
};

// What a scheduling pass sees.
struct SchedulerSnapshot {
  SchedulingLimits limits;
  // Every device, in --device order.
  std::vector<DeviceState> devices;
  // Every job holding devices.
  std::vector<RunningJobView> running;
  // The queue in its order (priority, then seq), or a prefix of it.
  std::vector<QueuedJobView> queue;
  // True when `queue` is the whole queue; false when more may follow it.
  bool queue_complete = true;
};

// A queued job to start, on these devices (its train.devices of them, free).
struct JobStart {
  std::string job_id;
  std::vector<std::string> devices;
};

// A running job to stop so that a waiting one can start.
struct Preemption {
  std::string victim_id;
  int32_t victim_priority = 0;
  std::string for_job_id;
  int32_t for_priority = 0;
};

// The outcome of one pass, to be carried out in this order: the starts,
// then the preemption.
struct SchedulingDecision {
  std::vector<JobStart> starts;  // in queue order
  std::optional<Preemption> preemption;
  // The queued job the pass stopped at (empty: none did) and why (Note
  // [Why a queued job waits]).
  std::string waiting_job;
  std::string waiting_reason;
  // The pass walked all of the snapshot's queue without stopping and more
  // may follow (queue_complete false): call Next again with a longer queue.
  bool needs_more_queue = false;
};

// True when nothing can start (every device busy) and nothing can be
// preempted (preemption off): a pass then needs only the queue's first job,
// to say why it waits.
bool NeedsOnlyQueueHead(const SchedulerSnapshot& snapshot);

// One scheduling pass over `snapshot` (Note [Scheduling policy], Note [Gang
// scheduling], Note [Why a queued job waits]).
//
// Example:
//   snapshot.devices = {{"cuda:0", "job-000001"}, {"cuda:1", ""}};
//   snapshot.queue = {{.id = "job-000002", .devices = 1, ...}};
//   Next(snapshot).starts  // {{"job-000002", {"cuda:1"}}}
SchedulingDecision Next(const SchedulerSnapshot& snapshot);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_SCHEDULING_POLICY_H_
