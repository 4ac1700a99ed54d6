// Tests of server/core/job_transitions.h: the transition table allows
// exactly the transitions of Note [Job state transitions] (every other pair
// of states is refused), and each control call does what job.proto says in
// every state.
#include "server/core/job_transitions.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

using S = JobState;

// The transitions of Note [Job state transitions], written out again here
// so that a change to the table shows up as a test change.
const std::set<std::pair<S, S>>& ExpectedTransitions() {
  static const auto* const kExpected = new std::set<std::pair<S, S>>{
      {S::kQueued, S::kRunning},        {S::kQueued, S::kSuspended},
      {S::kQueued, S::kCancelled},      {S::kRunning, S::kRunning},
      {S::kRunning, S::kSuspending},    {S::kRunning, S::kQueued},
      {S::kRunning, S::kSuspended},     {S::kRunning, S::kSucceeded},
      {S::kRunning, S::kFailed},        {S::kRunning, S::kCancelled},
      {S::kSuspending, S::kSuspending}, {S::kSuspending, S::kSuspended},
      {S::kSuspending, S::kSucceeded},  {S::kSuspending, S::kFailed},
      {S::kSuspending, S::kCancelled},  {S::kSuspended, S::kQueued},
      {S::kSuspended, S::kCancelled},
  };
  return *kExpected;
}

TEST(JobTransitionsTest, AllowsEveryTransitionOfTheNote) {
  for (const auto& [from, to] : ExpectedTransitions()) {
    SCOPED_TRACE(absl::StrCat(JobStateName(from), " -> ", JobStateName(to)));
    EXPECT_TRUE(IsAllowedTransition(from, to));
    EXPECT_THAT(CheckTransition(from, to), IsOk());
  }
}

TEST(JobTransitionsTest, RefusesEveryOtherPairOfStates) {
  int refused = 0;
  for (S from : kAllJobStates) {
    for (S to : kAllJobStates) {
      if (ExpectedTransitions().count({from, to}) > 0) continue;
      SCOPED_TRACE(absl::StrCat(JobStateName(from), " -> ", JobStateName(to)));
      EXPECT_FALSE(IsAllowedTransition(from, to));
      EXPECT_THAT(CheckTransition(from, to),
                  StatusIs(absl::StatusCode::kFailedPrecondition,
                           HasSubstr(absl::StrCat("job state: ", JobStateName(from), " -> ",
                                                  JobStateName(to), " is not a transition"))));
      ++refused;
    }
  }
  // 7 x 7 pairs less the 17 allowed ones.
  EXPECT_EQ(refused, 49 - 17);
}

TEST(JobTransitionsTest, TerminalStatesHaveNoWayOut) {
  for (S from : kAllJobStates) {
    if (!IsTerminal(from)) continue;
    for (S to : kAllJobStates) {
      EXPECT_FALSE(IsAllowedTransition(from, to))
          << JobStateName(from) << " -> " << JobStateName(to);
    }
  }
}

TEST(JobTransitionsTest, TableRowsAreDistinctAndExplained) {
  std::set<std::pair<S, S>> rows;
  for (const JobTransition& transition : kJobTransitions) {
    EXPECT_TRUE(rows.insert({transition.from, transition.to}).second)
        << "duplicate row " << JobStateName(transition.from) << " -> "
        << JobStateName(transition.to);
    EXPECT_NE(std::string(transition.when), "");
  }
  EXPECT_EQ(rows, ExpectedTransitions());
}

TEST(JobControlTest, CancelEndsAQueuedOrSuspendedJobNow) {
  for (S from : {S::kQueued, S::kSuspended}) {
    absl::StatusOr<ControlStep> step = PlanControl(JobControl::kCancel, "job-000001", from);
    ASSERT_THAT(step, IsOk());
    EXPECT_EQ(step->effect, ControlEffect::kTransition);
    EXPECT_EQ(step->to, S::kCancelled);
  }
}

TEST(JobControlTest, CancelStopsARunningOrSuspendingJobAndKeepsItsState) {
  for (S from : {S::kRunning, S::kSuspending}) {
    absl::StatusOr<ControlStep> step = PlanControl(JobControl::kCancel, "job-000001", from);
    ASSERT_THAT(step, IsOk());
    EXPECT_EQ(step->effect, ControlEffect::kStopRun);
    EXPECT_EQ(step->to, from);
  }
}

TEST(JobControlTest, CancelOfACancelledJobDoesNothing) {
  absl::StatusOr<ControlStep> step = PlanControl(JobControl::kCancel, "job-000001", S::kCancelled);
  ASSERT_THAT(step, IsOk());
  EXPECT_EQ(step->effect, ControlEffect::kNothing);
}

TEST(JobControlTest, SuspendHoldsAQueuedJobAndStopsARunningOne) {
  absl::StatusOr<ControlStep> queued = PlanControl(JobControl::kSuspend, "job-000001", S::kQueued);
  ASSERT_THAT(queued, IsOk());
  EXPECT_EQ(queued->effect, ControlEffect::kTransition);
  EXPECT_EQ(queued->to, S::kSuspended);
  absl::StatusOr<ControlStep> running =
      PlanControl(JobControl::kSuspend, "job-000001", S::kRunning);
  ASSERT_THAT(running, IsOk());
  EXPECT_EQ(running->effect, ControlEffect::kStopRun);
  EXPECT_EQ(running->to, S::kSuspending);
}

TEST(JobControlTest, SuspendOfASuspendingOrSuspendedJobDoesNothing) {
  for (S from : {S::kSuspending, S::kSuspended}) {
    absl::StatusOr<ControlStep> step = PlanControl(JobControl::kSuspend, "job-000001", from);
    ASSERT_THAT(step, IsOk());
    EXPECT_EQ(step->effect, ControlEffect::kNothing);
  }
}

TEST(JobControlTest, ResumeQueuesASuspendedJob) {
  absl::StatusOr<ControlStep> step = PlanControl(JobControl::kResume, "job-000001", S::kSuspended);
  ASSERT_THAT(step, IsOk());
  EXPECT_EQ(step->effect, ControlEffect::kTransition);
  EXPECT_EQ(step->to, S::kQueued);
}

TEST(JobControlTest, EveryControlOfAnEndedJobIsRefusedExceptARepeatedCancel) {
  for (JobControl control : {JobControl::kCancel, JobControl::kSuspend, JobControl::kResume}) {
    for (S from : {S::kSucceeded, S::kFailed, S::kCancelled}) {
      if (control == JobControl::kCancel && from == S::kCancelled) continue;
      SCOPED_TRACE(absl::StrCat(JobControlName(control), " of ", JobStateName(from)));
      EXPECT_THAT(
          PlanControl(control, "job-000007", from),
          StatusIs(absl::StatusCode::kFailedPrecondition,
                   HasSubstr(absl::StrCat("job job-000007 already ended ", JobStateName(from)))));
    }
  }
}

TEST(JobControlTest, ResumeOfAQueuedOrRunningJobIsRefused) {
  for (S from : {S::kQueued, S::kRunning}) {
    EXPECT_THAT(PlanControl(JobControl::kResume, "job-000003", from),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr(absl::StrCat("job job-000003 is ", JobStateName(from),
                                                "; only SUSPENDED jobs resume"))));
  }
}

TEST(JobControlTest, ResumeOfASuspendingJobSaysToWaitForSuspended) {
  EXPECT_THAT(PlanControl(JobControl::kResume, "job-000003", S::kSuspending),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is still SUSPENDING; resume it once it is SUSPENDED")));
}

TEST(JobControlTest, EveryStepThatChangesStateIsAnAllowedTransition) {
  for (JobControl control : {JobControl::kCancel, JobControl::kSuspend, JobControl::kResume}) {
    for (S from : kAllJobStates) {
      absl::StatusOr<ControlStep> step = PlanControl(control, "job-000001", from);
      if (!step.ok() || step->effect == ControlEffect::kNothing) continue;
      EXPECT_TRUE(IsAllowedTransition(from, step->to))
          << JobControlName(control) << " of " << JobStateName(from) << " -> "
          << JobStateName(step->to);
    }
  }
}

TEST(JobEndTest, FinishedAndCancelledRunsEndSoWhateverAskedThemToStop) {
  for (StopReason stop : {StopReason::kNone, StopReason::kCancel, StopReason::kSuspend,
                          StopReason::kPreempt, StopReason::kShutdown}) {
    EXPECT_EQ(EndStateOf(engine::JobOutcome::kSucceeded, stop), S::kSucceeded);
    EXPECT_EQ(EndStateOf(engine::JobOutcome::kCancelled, stop), S::kCancelled);
  }
}

TEST(JobEndTest, RunStoppedAtACheckpointEndsAsItsStopAsked) {
  EXPECT_EQ(EndStateOf(engine::JobOutcome::kSuspended, StopReason::kCancel), S::kCancelled);
  EXPECT_EQ(EndStateOf(engine::JobOutcome::kSuspended, StopReason::kPreempt), S::kQueued);
  EXPECT_EQ(EndStateOf(engine::JobOutcome::kSuspended, StopReason::kShutdown), S::kQueued);
  EXPECT_EQ(EndStateOf(engine::JobOutcome::kSuspended, StopReason::kSuspend), S::kSuspended);
  EXPECT_EQ(EndStateOf(engine::JobOutcome::kSuspended, StopReason::kNone), S::kSuspended);
}

TEST(JobEndTest, EveryEndIsAnAllowedTransition) {
  // A RUNNING job may have any stop; a SUSPENDING one only a suspend or a
  // cancel (SuspendJob replaces a preemption or the drain's stop).
  for (engine::JobOutcome outcome : {engine::JobOutcome::kSucceeded, engine::JobOutcome::kCancelled,
                                     engine::JobOutcome::kSuspended}) {
    for (StopReason stop : {StopReason::kNone, StopReason::kCancel, StopReason::kSuspend,
                            StopReason::kPreempt, StopReason::kShutdown}) {
      EXPECT_TRUE(IsAllowedTransition(S::kRunning, EndStateOf(outcome, stop)));
    }
    for (StopReason stop : {StopReason::kCancel, StopReason::kSuspend}) {
      EXPECT_TRUE(IsAllowedTransition(S::kSuspending, EndStateOf(outcome, stop)));
    }
  }
  EXPECT_TRUE(IsAllowedTransition(S::kRunning, S::kFailed));
  EXPECT_TRUE(IsAllowedTransition(S::kSuspending, S::kFailed));
}

}  // namespace
}  // namespace megatrain::server
