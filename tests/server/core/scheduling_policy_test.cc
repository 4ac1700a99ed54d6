// Tests of server/core/scheduling_policy.h on snapshots alone (no manager,
// no store, no thread): admission by host memory and NVMe bytes, gang
// scheduling, per-user limits, preemption by priority, and the reason a
// queued job waits (Note [Why a queued job waits]).
#include "server/core/scheduling_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace megatrain::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kGiB = int64_t{1} << 30;

QueuedJobView Queued(const std::string& id, int64_t host_gib, int64_t devices = 1,
                     int32_t priority = 0, const std::string& owner = "alice") {
  return QueuedJobView{id, owner, priority, devices, host_gib * kGiB, 0};
}

RunningJobView Running(const std::string& id, int64_t host_gib, int32_t priority = 0,
                       int64_t devices = 1, const std::string& owner = "bob") {
  return RunningJobView{id, owner, priority, devices, host_gib * kGiB, 0, RunStop::kNone};
}

// `device_jobs`: one entry per device cuda:0, cuda:1, ...; the job on it
// or "" when free. 8 GiB of host memory, preemption off, no limits.
SchedulerSnapshot Snapshot(const std::vector<std::string>& device_jobs) {
  SchedulerSnapshot snapshot;
  snapshot.limits.host_memory_budget_bytes = 8 * kGiB;
  for (size_t i = 0; i < device_jobs.size(); ++i) {
    snapshot.devices.push_back(DeviceState{"cuda:" + std::to_string(i), device_jobs[i]});
  }
  return snapshot;
}

std::vector<std::string> StartedIds(const SchedulingDecision& decision) {
  std::vector<std::string> ids;
  for (const JobStart& start : decision.starts) ids.push_back(start.job_id);
  return ids;
}

TEST(SchedulingPolicyTest, StartsQueuedJobsInQueueOrderOnFreeDevices) {
  SchedulerSnapshot snapshot = Snapshot({"", "job-000001", ""});
  snapshot.running = {Running("job-000001", 1)};
  snapshot.queue = {Queued("job-000002", 1), Queued("job-000003", 1), Queued("job-000004", 1)};

  const SchedulingDecision decision = Next(snapshot);

  ASSERT_EQ(decision.starts.size(), 2u);
  EXPECT_EQ(decision.starts[0].job_id, "job-000002");
  EXPECT_THAT(decision.starts[0].devices, ElementsAre("cuda:0"));
  EXPECT_EQ(decision.starts[1].job_id, "job-000003");
  EXPECT_THAT(decision.starts[1].devices, ElementsAre("cuda:2"));
  EXPECT_EQ(decision.waiting_job, "job-000004");
  EXPECT_THAT(decision.waiting_reason, HasSubstr("0 of 3 free"));
}

TEST(SchedulingPolicyTest, JobWhoseMemoryDoesNotFitWaitsAndSmallerOnesDoNotOvertakeIt) {
  SchedulerSnapshot snapshot = Snapshot({"job-000001", "", ""});
  snapshot.running = {Running("job-000001", 5)};
  snapshot.queue = {Queued("job-000002", 4), Queued("job-000003", 1)};

  const SchedulingDecision decision = Next(snapshot);

  EXPECT_THAT(decision.starts, IsEmpty());
  EXPECT_EQ(decision.waiting_job, "job-000002");
  EXPECT_EQ(decision.waiting_reason,
            "waiting for host memory: needs 4.0 GiB; running jobs hold 5.0 of "
            "--host_memory_budget's 8.0 GiB");
  EXPECT_FALSE(decision.preemption.has_value());
}

TEST(SchedulingPolicyTest, StartsCountAgainstTheBudgetOfLaterJobsInThePass) {
  SchedulerSnapshot snapshot = Snapshot({"", ""});
  snapshot.queue = {Queued("job-000001", 5), Queued("job-000002", 5)};

  const SchedulingDecision decision = Next(snapshot);

  EXPECT_THAT(StartedIds(decision), ElementsAre("job-000001"));
  EXPECT_EQ(decision.waiting_job, "job-000002");
  EXPECT_THAT(decision.waiting_reason, HasSubstr("running jobs hold 5.0 of"));
}

TEST(SchedulingPolicyTest, TieredJobWaitsForNvmeTierSpace) {
  SchedulerSnapshot snapshot = Snapshot({"job-000001", ""});
  snapshot.limits.nvme_budget_bytes = 10 * kGiB;
  snapshot.running = {Running("job-000001", 1)};
  snapshot.running[0].nvme_bytes = 7 * kGiB;
  QueuedJobView tiered = Queued("job-000002", 1);
  tiered.nvme_bytes = 4 * kGiB;
  snapshot.queue = {tiered};

  const SchedulingDecision decision = Next(snapshot);

  EXPECT_THAT(decision.starts, IsEmpty());
  EXPECT_EQ(decision.waiting_reason,
            "waiting for NVMe tier space: needs 4.0 GiB; running jobs hold 7.0 of 10.0 GiB");
}

TEST(SchedulingPolicyTest, GangJobWaitsForAllItsDevicesAndBlocksTheQueueBehindIt) {
  SchedulerSnapshot snapshot = Snapshot({"job-000001", ""});
  snapshot.running = {Running("job-000001", 1)};
  snapshot.queue = {Queued("job-000002", 1, /*devices=*/2), Queued("job-000003", 1)};

  const SchedulingDecision decision = Next(snapshot);

  EXPECT_THAT(decision.starts, IsEmpty());  // job-000003 would fit cuda:1 but waits
  EXPECT_EQ(decision.waiting_job, "job-000002");
  EXPECT_EQ(decision.waiting_reason,
            "waiting for 2 device(s) at once (train.devices): 1 of 2 free; busy: cuda:0 "
            "(job-000001)");
}

TEST(SchedulingPolicyTest, GangJobStartsOnTheFirstFreeDevicesInDeviceOrder) {
  SchedulerSnapshot snapshot = Snapshot({"", "job-000001", "", ""});
  snapshot.running = {Running("job-000001", 1)};
  snapshot.queue = {Queued("job-000002", 1, /*devices=*/2)};

  const SchedulingDecision decision = Next(snapshot);

  ASSERT_EQ(decision.starts.size(), 1u);
  EXPECT_THAT(decision.starts[0].devices, ElementsAre("cuda:0", "cuda:2"));
  EXPECT_TRUE(decision.waiting_job.empty());
}

TEST(SchedulingPolicyTest, OwnerAtRunningLimitIsSkippedAndOthersPass) {
  SchedulerSnapshot snapshot = Snapshot({"job-000001", ""});
  snapshot.limits.max_running_jobs_per_user = 1;
  snapshot.running = {Running("job-000001", 1, 0, 1, "alice")};
  snapshot.queue = {Queued("job-000002", 1, 1, 0, "alice"), Queued("job-000003", 1, 1, 0, "bob")};

  const SchedulingDecision decision = Next(snapshot);

  EXPECT_THAT(StartedIds(decision), ElementsAre("job-000003"));
  EXPECT_TRUE(decision.waiting_job.empty());
}

TEST(SchedulingPolicyTest, JobThatWouldTakeItsOwnerOverTheDeviceLimitIsSkipped) {
  SchedulerSnapshot snapshot = Snapshot({"job-000001", "", "", ""});
  snapshot.limits.max_devices_per_user = 2;
  snapshot.running = {Running("job-000001", 1, 0, 1, "alice")};
  snapshot.queue = {Queued("job-000002", 1, /*devices=*/2, 0, "alice"),
                    Queued("job-000003", 1, /*devices=*/1, 0, "alice")};

  const SchedulingDecision decision = Next(snapshot);

  EXPECT_THAT(StartedIds(decision), ElementsAre("job-000003"));  // 1 + 1 <= 2
}

TEST(SchedulingPolicyTest, HigherPriorityJobPreemptsTheLowestPriorityLatestJob) {
  SchedulerSnapshot snapshot = Snapshot({"job-000001", "job-000002", "job-000003"});
  snapshot.limits.preemption = true;
  snapshot.running = {Running("job-000001", 1, /*priority=*/5), Running("job-000002", 1, -1),
                      Running("job-000003", 1, -1)};
  snapshot.queue = {Queued("job-000004", 1, 1, /*priority=*/10)};

  const SchedulingDecision decision = Next(snapshot);

  ASSERT_TRUE(decision.preemption.has_value());
  EXPECT_EQ(decision.preemption->victim_id, "job-000003");  // among equals, the later one
  EXPECT_EQ(decision.preemption->for_job_id, "job-000004");
  EXPECT_EQ(decision.waiting_job, "job-000004");
  EXPECT_THAT(decision.starts, IsEmpty());
}

TEST(SchedulingPolicyTest, NoPreemptionOfEqualOrHigherPriority) {
  SchedulerSnapshot snapshot = Snapshot({"job-000001"});
  snapshot.limits.preemption = true;
  snapshot.running = {Running("job-000001", 1, /*priority=*/3)};
  snapshot.queue = {Queued("job-000002", 1, 1, /*priority=*/3)};

  EXPECT_FALSE(Next(snapshot).preemption.has_value());
}

TEST(SchedulingPolicyTest, OnePreemptionAtATime) {
  SchedulerSnapshot snapshot = Snapshot({"job-000001", "job-000002"});
  snapshot.limits.preemption = true;
  snapshot.running = {Running("job-000001", 1, 0), Running("job-000002", 1, 0)};
  snapshot.running[0].stop = RunStop::kPreempt;
  snapshot.queue = {Queued("job-000003", 1, 1, /*priority=*/10)};

  EXPECT_FALSE(Next(snapshot).preemption.has_value());
}

TEST(SchedulingPolicyTest, NoPreemptionWhenTheVictimsMemoryWouldNotBeEnough) {
  SchedulerSnapshot snapshot = Snapshot({"job-000001", "job-000002"});
  snapshot.limits.preemption = true;
  snapshot.running = {Running("job-000001", 6, /*priority=*/10), Running("job-000002", 1, 0)};
  snapshot.queue = {Queued("job-000003", 4, 1, /*priority=*/5)};  // 6 + 4 > 8 without job 2

  const SchedulingDecision decision = Next(snapshot);

  EXPECT_FALSE(decision.preemption.has_value());
  EXPECT_EQ(decision.waiting_job, "job-000003");
}

TEST(SchedulingPolicyTest, NoPreemptionForAGangJobThatCouldNeverGetEnoughDevices) {
  // Note [Gang scheduling]: job 1 (priority 10) keeps its device, so the
  // 2-device job could reach only job 2's device.
  SchedulerSnapshot snapshot = Snapshot({"job-000001", "job-000002"});
  snapshot.limits.preemption = true;
  snapshot.running = {Running("job-000001", 1, /*priority=*/10), Running("job-000002", 1, 0)};
  snapshot.queue = {Queued("job-000003", 1, /*devices=*/2, /*priority=*/5)};

  EXPECT_FALSE(Next(snapshot).preemption.has_value());
}

TEST(SchedulingPolicyTest, GangJobPreemptsWhenStoppingJobsMakeUpItsDevices) {
  // job 1 is being cancelled (its device counts as reachable); job 2 is
  // the one lower-priority victim.
  SchedulerSnapshot snapshot = Snapshot({"job-000001", "job-000002"});
  snapshot.limits.preemption = true;
  snapshot.running = {Running("job-000001", 1, /*priority=*/10), Running("job-000002", 1, 0)};
  snapshot.running[0].stop = RunStop::kOther;
  snapshot.queue = {Queued("job-000003", 1, /*devices=*/2, /*priority=*/5)};

  const SchedulingDecision decision = Next(snapshot);

  ASSERT_TRUE(decision.preemption.has_value());
  EXPECT_EQ(decision.preemption->victim_id, "job-000002");
}

TEST(SchedulingPolicyTest, WithEveryDeviceBusyAndNoPreemptionOnlyTheHeadIsNeeded) {
  SchedulerSnapshot snapshot = Snapshot({"job-000001"});
  snapshot.limits.max_running_jobs_per_user = 1;
  snapshot.running = {Running("job-000001", 1, 0, 1, "alice")};
  snapshot.queue = {Queued("job-000002", 1, 1, 0, "alice")};
  snapshot.queue_complete = false;

  ASSERT_TRUE(NeedsOnlyQueueHead(snapshot));
  const SchedulingDecision decision = Next(snapshot);

  // The head waits for devices even though its owner is at a limit.
  EXPECT_EQ(decision.waiting_job, "job-000002");
  EXPECT_THAT(decision.waiting_reason,
              HasSubstr("waiting for 1 device(s) at once (train.devices): 0 of 1 free; busy: "
                        "cuda:0 (job-000001)"));
  EXPECT_FALSE(decision.needs_more_queue);
}

TEST(SchedulingPolicyTest, AFreeDeviceOrPreemptionNeedsMoreThanTheHead) {
  SchedulerSnapshot free_device = Snapshot({"job-000001", ""});
  EXPECT_FALSE(NeedsOnlyQueueHead(free_device));
  SchedulerSnapshot preemption = Snapshot({"job-000001"});
  preemption.limits.preemption = true;
  EXPECT_FALSE(NeedsOnlyQueueHead(preemption));
}

TEST(SchedulingPolicyTest, AskForMoreQueueOnlyWhenThePassDidNotStop) {
  SchedulerSnapshot snapshot = Snapshot({"", ""});
  snapshot.limits.max_running_jobs_per_user = 1;
  snapshot.running = {};
  snapshot.queue = {Queued("job-000001", 1), Queued("job-000002", 1)};  // both alice's
  snapshot.queue_complete = false;

  SchedulingDecision decision = Next(snapshot);
  EXPECT_THAT(StartedIds(decision), ElementsAre("job-000001"));
  EXPECT_TRUE(decision.needs_more_queue);

  snapshot.queue.push_back(Queued("job-000003", 1, 1, 0, "bob"));
  snapshot.queue.push_back(Queued("job-000004", 1, 1, 0, "carol"));
  snapshot.queue_complete = true;
  decision = Next(snapshot);
  EXPECT_THAT(StartedIds(decision), ElementsAre("job-000001", "job-000003"));
  EXPECT_EQ(decision.waiting_job, "job-000004");
  EXPECT_FALSE(decision.needs_more_queue);
}

TEST(SchedulingPolicyTest, EmptyQueueStartsNothingAndNobodyWaits) {
  const SchedulingDecision decision = Next(Snapshot({"", ""}));
  EXPECT_THAT(decision.starts, IsEmpty());
  EXPECT_TRUE(decision.waiting_job.empty());
  EXPECT_FALSE(decision.preemption.has_value());
  EXPECT_FALSE(decision.needs_more_queue);
}

}  // namespace
}  // namespace megatrain::server
