// See job_transitions.h.
#include "server/core/job_transitions.h"

#include "absl/strings/str_cat.h"

namespace megatrain::server {
namespace {

// One row of the control table: `control` on a job in `from`.
struct ControlRule {
  JobControl control;
  JobState from;
  ControlStep step;
};

// What each control call does per state; a state not listed for a call
// refuses it (PlanControl says why).
constexpr ControlRule kControlRules[] = {
    {JobControl::kCancel, JobState::kQueued, {ControlEffect::kTransition, JobState::kCancelled}},
    {JobControl::kCancel, JobState::kSuspended, {ControlEffect::kTransition, JobState::kCancelled}},
    {JobControl::kCancel, JobState::kRunning, {ControlEffect::kStopRun, JobState::kRunning}},
    {JobControl::kCancel, JobState::kSuspending, {ControlEffect::kStopRun, JobState::kSuspending}},
    {JobControl::kCancel, JobState::kCancelled, {ControlEffect::kNothing, JobState::kCancelled}},
    {JobControl::kSuspend, JobState::kQueued, {ControlEffect::kTransition, JobState::kSuspended}},
    {JobControl::kSuspend, JobState::kRunning, {ControlEffect::kStopRun, JobState::kSuspending}},
    {JobControl::kSuspend, JobState::kSuspending, {ControlEffect::kNothing, JobState::kSuspending}},
    {JobControl::kSuspend, JobState::kSuspended, {ControlEffect::kNothing, JobState::kSuspended}},
    {JobControl::kResume, JobState::kSuspended, {ControlEffect::kTransition, JobState::kQueued}},
};

}  // namespace

bool IsAllowedTransition(JobState from, JobState to) {
  for (const JobTransition& transition : kJobTransitions) {
    if (transition.from == from && transition.to == to) return true;
  }
  return false;
}

absl::Status CheckTransition(JobState from, JobState to) {
  if (IsAllowedTransition(from, to)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("job state: ", JobStateName(from), " -> ", JobStateName(to),
                   " is not a transition (Note [Job state transitions] in "
                   "server/core/job_transitions.h)"));
}

absl::string_view JobControlName(JobControl control) {
  switch (control) {
    case JobControl::kCancel:
      return "CancelJob";
    case JobControl::kSuspend:
      return "SuspendJob";
    case JobControl::kResume:
      return "ResumeJob";
  }
  return "UNKNOWN";
}

absl::StatusOr<ControlStep> PlanControl(JobControl control, absl::string_view job_id,
                                        JobState from) {
  for (const ControlRule& rule : kControlRules) {
    if (rule.control == control && rule.from == from) return rule.step;
  }
  if (IsTerminal(from)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended ", JobStateName(from)));
  }
  if (control == JobControl::kResume && from == JobState::kSuspending) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is still SUSPENDING; resume it once it is SUSPENDED"));
  }
  if (control == JobControl::kResume) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", JobStateName(from), "; only SUSPENDED jobs resume"));
  }
  // Not reached: cancel and suspend are listed for every live state.
  return absl::FailedPreconditionError(
      absl::StrCat(JobControlName(control), ": job ", job_id, " is ", JobStateName(from)));
}

JobState EndStateOf(engine::JobOutcome outcome, StopReason stop) {
  switch (outcome) {
    case engine::JobOutcome::kSucceeded:
      return JobState::kSucceeded;
    case engine::JobOutcome::kCancelled:
      return JobState::kCancelled;
    case engine::JobOutcome::kSuspended:
      break;
  }
  switch (stop) {
    case StopReason::kCancel:
      return JobState::kCancelled;
    case StopReason::kPreempt:
    case StopReason::kShutdown:
      return JobState::kQueued;
    case StopReason::kSuspend:
    case StopReason::kNone:
      break;
  }
  return JobState::kSuspended;
}

}  // namespace megatrain::server
