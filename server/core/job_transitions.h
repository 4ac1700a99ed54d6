// The job state machine written once: which state changes a job may take
// (the transition table) and what each control call (CancelJob, SuspendJob,
// ResumeJob) does to a job in each state. JobManager consults these tables
// instead of a switch per method; everything not in them is refused.
//
// Note [Job state transitions]
// Every transition JobManager commits to the store (Note [Crash recovery]
// in job_manager.h) is one of these; any other is refused with
// FAILED_PRECONDITION (kJobTransitions below, with the reason of each):
//
//   QUEUED     -> RUNNING, SUSPENDED, CANCELLED
//   RUNNING    -> RUNNING (a note: cancel asked), SUSPENDING, QUEUED,
//                 SUSPENDED, SUCCEEDED, FAILED, CANCELLED
//   SUSPENDING -> SUSPENDING (a note: cancel asked), SUSPENDED, SUCCEEDED,
//                 FAILED, CANCELLED
//   SUSPENDED  -> QUEUED, CANCELLED
//   SUCCEEDED, FAILED, CANCELLED: none (terminal)
//
// A SUSPENDING job never goes back to the queue: a user's suspend stands
// over a preemption and over the drain, which re-queue only RUNNING jobs.
//
// Thread-safety: constant tables and pure functions.
#ifndef MEGATRAIN_SERVER_JOB_TRANSITIONS_H_
#define MEGATRAIN_SERVER_JOB_TRANSITIONS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/job/training_job.h"
#include "server/core/job.h"

namespace megatrain::server {

// One allowed state change and why it happens.
struct JobTransition {
  JobState from;
  JobState to;
  const char* when;  // what makes the job take it
};

// The transition table (Note [Job state transitions]).
inline constexpr JobTransition kJobTransitions[] = {
    {JobState::kQueued, JobState::kRunning, "the scheduler starts it"},
    {JobState::kQueued, JobState::kSuspended, "SuspendJob; held at start-up (Note [Device limit])"},
    {JobState::kQueued, JobState::kCancelled, "CancelJob"},
    {JobState::kRunning, JobState::kRunning, "CancelJob noted; the run stops at a step boundary"},
    {JobState::kRunning, JobState::kSuspending, "SuspendJob"},
    {JobState::kRunning, JobState::kQueued, "preempted, the drain, or a restart under it"},
    {JobState::kRunning, JobState::kSuspended, "its run ended suspended"},
    {JobState::kRunning, JobState::kSucceeded, "its run finished"},
    {JobState::kRunning, JobState::kFailed, "its run failed"},
    {JobState::kRunning, JobState::kCancelled, "its run stopped for a CancelJob"},
    {JobState::kSuspending, JobState::kSuspending, "CancelJob noted while suspending"},
    {JobState::kSuspending, JobState::kSuspended, "its checkpoint is written; a restart"},
    {JobState::kSuspending, JobState::kSucceeded, "its run finished first"},
    {JobState::kSuspending, JobState::kFailed, "its run failed"},
    {JobState::kSuspending, JobState::kCancelled, "its run stopped for a CancelJob"},
    {JobState::kSuspended, JobState::kQueued, "ResumeJob"},
    {JobState::kSuspended, JobState::kCancelled, "CancelJob"},
};

// True when kJobTransitions holds `from` -> `to`.
bool IsAllowedTransition(JobState from, JobState to);

// OK for an allowed transition; FAILED_PRECONDITION naming both states
// otherwise ("job state: SUCCEEDED -> QUEUED is not a transition ...").
absl::Status CheckTransition(JobState from, JobState to);

// A control call on a job.
enum class JobControl { kCancel, kSuspend, kResume };

// "CancelJob", "SuspendJob", "ResumeJob".
absl::string_view JobControlName(JobControl control);

// What a control call does to a job in a given state.
enum class ControlEffect {
  // Nothing: the call is idempotent in this state (cancel of a CANCELLED
  // job, suspend of a SUSPENDING or SUSPENDED one).
  kNothing,
  // The job is not running: it takes `to` now.
  kTransition,
  // The job runs: it takes `to` now (a note or SUSPENDING) and its run is
  // asked to stop; its final state follows when the run ends.
  kStopRun,
};

// The effect of a control call and the state it records now.
struct ControlStep {
  ControlEffect effect = ControlEffect::kNothing;
  JobState to = JobState::kQueued;  // for kTransition and kStopRun
};

// What `control` does to job `job_id` in state `from`. FAILED_PRECONDITION
// naming the job when the state refuses it: "job job-000042 already ended
// SUCCEEDED", "... is QUEUED; only SUSPENDED jobs resume", "... is still
// SUSPENDING; resume it once it is SUSPENDED". Every kTransition and
// kStopRun step it returns is an allowed transition.
absl::StatusOr<ControlStep> PlanControl(JobControl control, absl::string_view job_id,
                                        JobState from);

// Why a running job was asked to stop (kNone: it was not).
enum class StopReason { kNone, kCancel, kSuspend, kPreempt, kShutdown };

// The state a job's run ends in, given the engine's outcome and what asked
// it to stop: kSucceeded is SUCCEEDED and kCancelled CANCELLED; a run that
// stopped at a checkpoint (kSuspended) is CANCELLED for a cancel, QUEUED
// (to resume) for a preemption or the drain, SUSPENDED for a suspend or
// nothing. A run that failed (an error status) is FAILED, not asked here.
// From RUNNING every result is an allowed transition; from SUSPENDING
// (stop kSuspend or kCancel) too.
JobState EndStateOf(engine::JobOutcome outcome, StopReason stop);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_JOB_TRANSITIONS_H_
