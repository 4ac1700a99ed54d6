// See scheduling_policy.h.
#include "server/core/scheduling_policy.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace megatrain::server {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The snapshot as the pass changes it: every start takes devices, memory
// and a place in its owner's counts.
struct PassState {
  explicit PassState(const SchedulerSnapshot& snapshot)
      : limits(snapshot.limits), devices(snapshot.devices), running(snapshot.running) {
    for (const RunningJobView& job : running) {
      ++running_by_owner[job.owner];
      devices_by_owner[job.owner] += job.devices;
      host_reserved_bytes += job.host_memory_bytes;
      nvme_reserved_bytes += job.nvme_bytes;
    }
  }

  // The first `wanted` free devices in --device order (fewer when fewer
  // are free).
  std::vector<std::string> FreeDevices(size_t wanted) const {
    std::vector<std::string> free;
    for (const DeviceState& device : devices) {
      if (device.job_id.empty() && free.size() < wanted) free.push_back(device.name);
    }
    return free;
  }

  size_t FreeDeviceCount() const {
    return static_cast<size_t>(std::count_if(
        devices.begin(), devices.end(), [](const DeviceState& d) { return d.job_id.empty(); }));
  }

  // Note [Device limit] and --max_running_jobs_per_user: the job's owner
  // may not start it now (others may pass it).
  bool OwnerAtLimit(const QueuedJobView& job) const {
    const auto running_it = running_by_owner.find(job.owner);
    const int owner_running = running_it == running_by_owner.end() ? 0 : running_it->second;
    if (limits.max_running_jobs_per_user > 0 && owner_running >= limits.max_running_jobs_per_user) {
      return true;
    }
    const auto devices_it = devices_by_owner.find(job.owner);
    const int64_t owner_devices = devices_it == devices_by_owner.end() ? 0 : devices_it->second;
    return limits.max_devices_per_user > 0 &&
           owner_devices + job.devices > limits.max_devices_per_user;
  }

  bool HostFits(const QueuedJobView& job) const {
    return host_reserved_bytes + job.host_memory_bytes <= limits.host_memory_budget_bytes;
  }

  bool NvmeFits(const QueuedJobView& job) const {
    return nvme_reserved_bytes + job.nvme_bytes <= limits.nvme_budget_bytes;
  }

  void Start(const QueuedJobView& job, const std::vector<std::string>& on) {
    for (DeviceState& device : devices) {
      if (std::find(on.begin(), on.end(), device.name) != on.end()) device.job_id = job.id;
    }
    running.push_back(RunningJobView{job.id, job.owner, job.priority, job.devices,
                                     job.host_memory_bytes, job.nvme_bytes, RunStop::kNone});
    ++running_by_owner[job.owner];
    devices_by_owner[job.owner] += job.devices;
    host_reserved_bytes += job.host_memory_bytes;
    nvme_reserved_bytes += job.nvme_bytes;
  }

  const SchedulingLimits limits;
  std::vector<DeviceState> devices;
  std::vector<RunningJobView> running;
  std::map<std::string, int> running_by_owner;
  std::map<std::string, int64_t> devices_by_owner;
  int64_t host_reserved_bytes = 0;
  int64_t nvme_reserved_bytes = 0;
};

// Note [Why a queued job waits]: what keeps `job` from starting, given
// `free_devices` of the devices free and whether its host memory fits.
std::string WaitReason(const PassState& state, const QueuedJobView& job, size_t free_devices,
                       bool host_fits) {
  const size_t wanted = static_cast<size_t>(job.devices);
  if (free_devices < wanted) {
    std::vector<std::string> busy;
    for (const DeviceState& device : state.devices) {
      if (!device.job_id.empty())
        busy.push_back(absl::StrCat(device.name, " (", device.job_id, ")"));
    }
    return absl::StrCat("waiting for ", wanted,
                        " device(s) at once (train.devices): ", free_devices, " of ",
                        state.devices.size(), " free; busy: ", absl::StrJoin(busy, ", "));
  }
  if (!host_fits) {
    return absl::StrFormat(
        "waiting for host memory: needs %.1f GiB; running jobs hold %.1f of "
        "--host_memory_budget's %.1f GiB",
        job.host_memory_bytes / kGiB, state.host_reserved_bytes / kGiB,
        state.limits.host_memory_budget_bytes / kGiB);
  }
  return absl::StrFormat(
      "waiting for NVMe tier space: needs %.1f GiB; running jobs hold %.1f of %.1f GiB",
      job.nvme_bytes / kGiB, state.nvme_reserved_bytes / kGiB,
      state.limits.nvme_budget_bytes / kGiB);
}

// Note [Gang scheduling]: the devices `waiting` could ever get by
// preemption (free ones, and those of every job of lower priority or
// stopping already) are enough for it.
bool PreemptionCouldSuffice(const PassState& state, const QueuedJobView& waiting) {
  int64_t reachable = static_cast<int64_t>(state.FreeDeviceCount());
  for (const RunningJobView& job : state.running) {
    if (job.stop != RunStop::kNone || job.priority < waiting.priority) reachable += job.devices;
  }
  return reachable >= waiting.devices;
}

// Note [Scheduling policy]: the running job `waiting` may preempt, if any.
std::optional<Preemption> ChoosePreemption(const PassState& state, const QueuedJobView& waiting) {
  if (!PreemptionCouldSuffice(state, waiting)) return std::nullopt;
  const RunningJobView* victim = nullptr;
  for (const RunningJobView& job : state.running) {
    if (job.stop == RunStop::kPreempt) return std::nullopt;  // one preemption at a time
    if (job.stop != RunStop::kNone || job.priority >= waiting.priority) continue;
    // Lowest priority first; among equals the later submission.
    if (victim == nullptr || job.priority < victim->priority ||
        (job.priority == victim->priority && job.id > victim->id)) {
      victim = &job;
    }
  }
  if (victim == nullptr) return std::nullopt;
  // Only when stopping the victim lets `waiting` start: it frees devices in
  // any case; host memory and NVMe bytes must fit too (a suspended job
  // holds neither).
  const bool fits_after =
      state.host_reserved_bytes - victim->host_memory_bytes + waiting.host_memory_bytes <=
          state.limits.host_memory_budget_bytes &&
      state.nvme_reserved_bytes - victim->nvme_bytes + waiting.nvme_bytes <=
          state.limits.nvme_budget_bytes;
  if (!fits_after) return std::nullopt;
  return Preemption{victim->id, victim->priority, waiting.id, waiting.priority};
}

}  // namespace

bool NeedsOnlyQueueHead(const SchedulerSnapshot& snapshot) {
  return !snapshot.limits.preemption && PassState(snapshot).FreeDeviceCount() == 0;
}

SchedulingDecision Next(const SchedulerSnapshot& snapshot) {
  SchedulingDecision decision;
  PassState state(snapshot);
  if (NeedsOnlyQueueHead(snapshot)) {
    if (!snapshot.queue.empty()) {
      decision.waiting_job = snapshot.queue.front().id;
      decision.waiting_reason = WaitReason(state, snapshot.queue.front(), 0, true);
    } else {
      decision.needs_more_queue = !snapshot.queue_complete;
    }
    return decision;
  }
  for (const QueuedJobView& job : snapshot.queue) {
    if (state.OwnerAtLimit(job)) continue;
    // Note [Gang scheduling]: all of the job's devices or none.
    std::vector<std::string> free = state.FreeDevices(static_cast<size_t>(job.devices));
    const bool host_fits = state.HostFits(job);
    if (free.size() < static_cast<size_t>(job.devices) || !host_fits || !state.NvmeFits(job)) {
      if (snapshot.limits.preemption) decision.preemption = ChoosePreemption(state, job);
      decision.waiting_job = job.id;
      decision.waiting_reason = WaitReason(state, job, free.size(), host_fits);
      return decision;
    }
    state.Start(job, free);
    decision.starts.push_back(JobStart{job.id, std::move(free)});
  }
  decision.needs_more_queue = !snapshot.queue_complete;
  return decision;
}

}  // namespace megatrain::server
