// Tests of server/core/job_manager.h with the fake engine (fake_engine_backend.h):
// queue order, admission, per-user limits, control transitions, events,
// checkpoints, preemption, crash recovery and the SIGTERM drain. Jobs are
// gated where timing matters: the test grants each step, and waits on the
// event log (WaitEvents) or on the fake's condition variables, never on
// sleeps. Every wait is bounded by kTimeout.
#include "server/core/job_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tests/server/core/job_manager_fixture.h"
#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::server {
namespace {

using ::megatrain::server::testing::FakeEngineBackend;
using ::megatrain::server::testing::FakeJobControl;
using ::megatrain::server::testing::JobManagerFixture;
using ::megatrain::server::testing::kAdmin;
using ::megatrain::server::testing::kAlice;
using ::megatrain::server::testing::kBob;
using ::megatrain::server::testing::kTimeout;
using ::megatrain::server::testing::MakeTempDir;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

JobRequest Request(const std::string& name, int64_t max_steps = 5, int32_t priority = 0) {
  JobRequest request;
  request.spec.name = name;
  request.spec.model.preset = "tiny";
  request.spec.data.tokens = "/data/tiny";
  request.spec.train.max_steps = max_steps;
  request.priority = priority;
  return request;
}

// The shared fixture (job_manager_fixture.h).
class JobManagerTest : public JobManagerFixture {};

TEST_F(JobManagerTest, SubmittedJobRunsToSucceededWithFallingLoss) {
  StartManager();
  JobRecord job = Submit(kAlice, Request("tiny", 10));
  EXPECT_EQ(job.id, "job-000001");
  EXPECT_EQ(job.owner, "alice");
  EXPECT_EQ(job.request.spec.output_dir, options_.jobs_dir + "/job-000001");
  std::vector<JobEvent> events = WaitFor(job.id, StateIs(JobState::kSucceeded));
  std::vector<double> losses;
  for (const JobEvent& event : events) {
    if (event.kind == JobEvent::Kind::kStep) losses.push_back(event.loss);
  }
  ASSERT_EQ(losses.size(), 10u);
  for (size_t step_idx = 1; step_idx < losses.size(); ++step_idx) {
    EXPECT_LT(losses[step_idx], losses[step_idx - 1]);
  }
  absl::StatusOr<JobRecord> done = manager_->Get(kAlice, job.id);
  ASSERT_THAT(done, IsOk());
  EXPECT_EQ(done->state, JobState::kSucceeded);
  EXPECT_EQ(done->progress.step, 10);
  EXPECT_EQ(done->progress.tokens, 10 * 1024);
  EXPECT_GT(done->end_time_unix_ms, 0);
  EXPECT_THAT(metrics_.TextExposition(), HasSubstr("megatrain_tokens_total 10240"));
}

TEST_F(JobManagerTest, WatchOfTerminalJobReplaysHistoryThenFinishes) {
  StartManager();
  JobRecord job = Submit(kAlice, Request("tiny", 3));
  WaitFor(job.id, StateIs(JobState::kSucceeded));
  absl::StatusOr<EventBatch> all = manager_->WaitEvents(kAlice, job.id, 0, kTimeout);
  ASSERT_THAT(all, IsOk());
  ASSERT_FALSE(all->events.empty());
  EXPECT_EQ(all->events.front().state, JobState::kQueued);
  absl::StatusOr<EventBatch> rest =
      manager_->WaitEvents(kAlice, job.id, all->events.back().seq, kTimeout);
  ASSERT_THAT(rest, IsOk());
  EXPECT_TRUE(rest->events.empty());
  EXPECT_TRUE(rest->finished);
}

TEST_F(JobManagerTest, QueueRunsByPriorityThenFifo) {
  backend_.gated = true;
  StartManager();
  JobRecord blocker = Submit(kAlice, Request("blocker", 1));
  std::shared_ptr<FakeJobControl> first = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(first, nullptr);
  JobRecord low = Submit(kAlice, Request("low", 1, 0));
  JobRecord high1 = Submit(kBob, Request("high1", 1, 5));
  JobRecord high2 = Submit(kAlice, Request("high2", 1, 5));
  EXPECT_EQ(manager_->Get(kAdmin, high1.id)->queue_position, 1);
  EXPECT_EQ(manager_->Get(kAdmin, high2.id)->queue_position, 2);
  EXPECT_EQ(manager_->Get(kAdmin, low.id)->queue_position, 3);

  first->AllowSteps(1);
  for (int job_idx = 2; job_idx <= 4; ++job_idx) {
    std::shared_ptr<FakeJobControl> next = backend_.WaitForCreated(job_idx, kTimeout);
    ASSERT_NE(next, nullptr);
    next->AllowSteps(1);
  }
  WaitFor(low.id, StateIs(JobState::kSucceeded));
  EXPECT_THAT(backend_.created_names(), ElementsAre("blocker", "high1", "high2", "low"));
}

TEST_F(JobManagerTest, OneJobPerDevice) {
  backend_.gated = true;
  options_.devices = {"cuda:0", "cuda:1"};
  StartManager();
  JobRecord a = Submit(kAlice, Request("a"));
  JobRecord b = Submit(kBob, Request("b"));
  JobRecord c = Submit(kBob, Request("c"));
  ASSERT_NE(backend_.WaitForCreated(2, kTimeout), nullptr);
  EXPECT_EQ(StateOf(a.id), JobState::kRunning);
  EXPECT_EQ(StateOf(b.id), JobState::kRunning);
  EXPECT_EQ(StateOf(c.id), JobState::kQueued);
  EXPECT_EQ(backend_.created_count(), 2);
  absl::StatusOr<ManagerStatus> status = manager_->GetStatus();
  ASSERT_THAT(status, IsOk());
  ASSERT_EQ(status->devices.size(), 2u);
  EXPECT_EQ(status->devices[0].job_id, a.id);
  EXPECT_EQ(status->devices[1].job_id, b.id);
  // Job threads create their engines concurrently: compare as a set.
  EXPECT_THAT((std::vector<std::string>{backend_.WaitForCreated(1, kTimeout)->device,
                                        backend_.WaitForCreated(2, kTimeout)->device}),
              ::testing::UnorderedElementsAre("cuda:0", "cuda:1"));
}

TEST_F(JobManagerTest, PerUserRunningLimitLetsOthersPass) {
  backend_.gated = true;
  options_.devices = {"cuda:0", "cuda:1"};
  options_.max_running_jobs_per_user = 1;
  StartManager();
  JobRecord alice1 = Submit(kAlice, Request("alice1"));
  JobRecord alice2 = Submit(kAlice, Request("alice2"));
  JobRecord bob1 = Submit(kBob, Request("bob1"));
  ASSERT_NE(backend_.WaitForCreated(2, kTimeout), nullptr);
  EXPECT_EQ(StateOf(alice1.id), JobState::kRunning);
  EXPECT_EQ(StateOf(alice2.id), JobState::kQueued);
  EXPECT_EQ(StateOf(bob1.id), JobState::kRunning);
}

TEST_F(JobManagerTest, PerUserQueueLimitIsResourceExhausted) {
  backend_.gated = true;
  options_.max_queued_jobs_per_user = 3;  // counts the running job too (Note [Job limits])
  StartManager();
  Submit(kAlice, Request("running"));
  ASSERT_NE(backend_.WaitForCreated(1, kTimeout), nullptr);
  Submit(kAlice, Request("q1"));
  Submit(kAlice, Request("q2"));
  EXPECT_THAT(manager_->Submit(kAlice, Request("q3"), ""),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("user 'alice' already has 3 jobs queued, running or suspended")));
  Submit(kBob, Request("bob"));  // other users are not affected
}

TEST_F(JobManagerTest, JobThatCanNeverFitIsRefusedWithTheNumbers) {
  backend_.footprint_bytes_by_preset["huge"] = int64_t{1} << 40;
  StartManager();
  JobRequest request = Request("huge");
  request.spec.model.preset = "huge";
  EXPECT_THAT(
      manager_->Submit(kAlice, request, ""),
      StatusIs(absl::StatusCode::kResourceExhausted,
               ::testing::AllOf(HasSubstr("1099511627776 bytes"),
                                HasSubstr("--host_memory_budget is 64.00 MiB (67108864 bytes)"))));
}

// Note [No expert-group sub-blocks] (engine/job/plan.cc): a model one of
// whose streamed blocks (a MoE layer with all its experts) needs more
// memory for its weight and gradient slots than the smallest device has
// can never run: refused at submission, naming the layer, its bytes and
// the device's. A block that fits is admitted, and so is any job when the
// device memory is unknown (0: a CPU device, no NVML).
TEST_F(JobManagerTest, ModelWhoseLayerSlotsExceedTheDeviceIsRefused) {
  backend_.footprint_bytes_by_preset["moe-wide"] = 1 << 20;
  backend_.block_slot_bytes_by_preset["moe-wide"] = int64_t{3} << 30;
  backend_.footprint_bytes_by_preset["moe-narrow"] = 1 << 20;
  backend_.block_slot_bytes_by_preset["moe-narrow"] = int64_t{1} << 30;
  options_.device_memory_bytes = int64_t{2} << 30;
  StartManager();
  JobRequest wide = Request("wide");
  wide.spec.model.preset = "moe-wide";
  EXPECT_THAT(manager_->Submit(kAlice, wide, ""),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("decoder layer 3 is one streamed block of "
                                                  "230087533 parameters"),
                                        HasSubstr("slots need 3221225472 bytes (3 GiB)"),
                                        HasSubstr("2147483648 bytes (2 GiB)"))));
  JobRequest narrow = Request("narrow");
  narrow.spec.model.preset = "moe-narrow";
  JobRecord admitted = Submit(kAlice, narrow);
  EXPECT_FALSE(admitted.id.empty());
}

TEST_F(JobManagerTest, UnknownDeviceMemoryAdmitsAnyBlock) {
  backend_.footprint_bytes_by_preset["moe-wide"] = 1 << 20;
  backend_.block_slot_bytes_by_preset["moe-wide"] = int64_t{3} << 30;
  options_.device_memory_bytes = 0;
  StartManager();
  JobRequest wide = Request("wide");
  wide.spec.model.preset = "moe-wide";
  JobRecord admitted = Submit(kAlice, wide);
  EXPECT_FALSE(admitted.id.empty());
}

// train.devices (docs/distributed.md): more devices than the daemon has is
// refused naming both counts (it can never run here: RESOURCE_EXHAUSTED);
// "all" is this daemon's one device and runs.
TEST_F(JobManagerTest, JobAskingForMoreDevicesThanTheDaemonHasIsRefused) {
  StartManager();
  JobRequest request = Request("wide");
  request.spec.train.devices = 2;
  request.spec.train.gradient_accumulation_steps = 2;
  EXPECT_THAT(manager_->Submit(kAlice, request, ""),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("train.devices: 2 requested"),
                                        HasSubstr("this daemon has 1 device(s)"))));
  request = Request("all");
  request.spec.train.devices = engine::kAllDevices;
  JobRecord job = Submit(kAlice, request);
  EXPECT_EQ(job.request.spec.train.devices, 1);
}

TEST_F(JobManagerTest, DataParallelJobIsUnimplementedWithoutACollectiveBackend) {
  // A backend that does not run data-parallel jobs (the engine's in a
  // build without c10d's backend for the daemon's devices).
  options_.devices = {"cpu", "cpu:1"};
  StartManager();
  JobRequest request = Request("wide");
  request.spec.train.devices = 2;
  request.spec.train.gradient_accumulation_steps = 2;
  EXPECT_THAT(manager_->Submit(kAlice, request, ""),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("train.devices: 2 devices: this daemon's engine has no c10d "
                                 "backend for data parallelism")));
}

// Note [Tier shards] in engine/store/nvme_tier.h: a data-parallel job
// takes the NVMe tier as one device does: refused naming the field by a
// daemon without one, admitted with its moments on it by a daemon with one
// (auto too when host memory is too small), handed the daemon's directory.
TEST_F(JobManagerTest, DataParallelJobTakesTheNvmeTierAsOneDeviceDoes) {
  backend_.data_parallel = true;
  backend_.footprint_bytes_by_preset["big"] = 100 << 20;  // 100 MiB > the 64 MiB budget
  options_.devices = {"cpu", "cpu:1"};
  StartManager();
  JobRequest request = Request("wide");
  request.spec.train.devices = 2;
  request.spec.train.gradient_accumulation_steps = 2;
  request.spec.memory.nvme_tier = engine::NvmeTierMode::kMoments;
  EXPECT_THAT(manager_->Submit(kAlice, request, ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("memory.nvme_tier"), HasSubstr("--nvme_dir"))));

  manager_.reset();
  options_.nvme = {"/mnt/nvme", 60 << 20};
  StartManager();
  JobRecord moments = Submit(kAlice, request);
  EXPECT_EQ(moments.request.spec.memory.nvme_tier, engine::NvmeTierMode::kMoments);
  JobRequest big = request;
  big.spec.model.preset = "big";
  big.spec.memory.nvme_tier = engine::NvmeTierMode::kAuto;
  JobRecord tiered = Submit(kAlice, big);
  EXPECT_EQ(tiered.request.spec.memory.nvme_tier, engine::NvmeTierMode::kMoments);
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  EXPECT_EQ(control->nvme_dir, "/mnt/nvme");
  WaitFor(moments.id, StateIs(JobState::kSucceeded));
  WaitFor(tiered.id, StateIs(JobState::kSucceeded));
}

JobRequest WideRequest(const std::string& name, int64_t devices, int64_t max_steps = 1) {
  JobRequest request = Request(name, max_steps);
  request.spec.train.devices = devices;
  request.spec.train.gradient_accumulation_steps = 2;
  return request;
}

// Note [Gang scheduling]: a 2-device job waits until both devices are
// free, holds both, reserves its host memory once, and frees both at its
// end; a 1-device job submitted after it does not overtake it.
TEST_F(JobManagerTest, GangJobWaitsForAllItsDevicesAndHoldsThem) {
  backend_.gated = true;
  backend_.data_parallel = true;
  options_.devices = {"cpu", "cpu:1"};
  StartManager();
  JobRecord narrow = Submit(kAlice, Request("narrow", 1));
  std::shared_ptr<FakeJobControl> first = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->device, "cpu");
  JobRecord wide = Submit(kBob, WideRequest("wide", 2));
  JobRecord after = Submit(kAlice, Request("after", 1));
  EXPECT_EQ(StateOf(wide.id), JobState::kQueued) << "one of its two devices is busy";
  EXPECT_EQ(StateOf(after.id), JobState::kQueued) << "no overtaking the wide job";
  EXPECT_EQ(backend_.created_count(), 1);
  // Note [Why a queued job waits]: the head of the queue says what it
  // waits for; the job behind it says nothing of the kind.
  EXPECT_THAT(manager_->Get(kAdmin, wide.id)->message,
              HasSubstr("waiting for 2 device(s) at once (train.devices): 1 of 2 free; busy: cpu "
                        "(" +
                        narrow.id + ")"));
  EXPECT_THAT(manager_->Get(kAdmin, after.id)->message, Not(HasSubstr("waiting for")));

  first->AllowSteps(1);
  WaitFor(narrow.id, StateIs(JobState::kSucceeded));
  std::shared_ptr<FakeJobControl> gang = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(gang, nullptr);
  EXPECT_EQ(gang->spec_name, "wide");
  EXPECT_EQ(gang->device, "cpu,cpu:1");
  EXPECT_EQ(StateOf(wide.id), JobState::kRunning);
  EXPECT_EQ(StateOf(after.id), JobState::kQueued);
  absl::StatusOr<ManagerStatus> status = manager_->GetStatus();
  ASSERT_THAT(status, IsOk());
  ASSERT_EQ(status->devices.size(), 2u);
  EXPECT_EQ(status->devices[0].job_id, wide.id);
  EXPECT_EQ(status->devices[1].job_id, wide.id);
  // Host memory once: the fake's footprint (1 MiB), not one per device.
  EXPECT_EQ(status->host_memory_reserved_bytes, int64_t{1} << 20);
  EXPECT_EQ(manager_->Get(kAdmin, wide.id)->device, "cpu,cpu:1");

  gang->AllowSteps(1);
  WaitFor(wide.id, StateIs(JobState::kSucceeded));
  std::shared_ptr<FakeJobControl> last = backend_.WaitForCreated(3, kTimeout);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->device, "cpu");
  status = manager_->GetStatus();
  ASSERT_THAT(status, IsOk());
  EXPECT_EQ(status->devices[0].job_id, after.id);
  EXPECT_EQ(status->devices[1].job_id, "");
  last->AllowSteps(1);
  WaitFor(after.id, StateIs(JobState::kSucceeded));
}

// A suspended 2-device job frees both devices; resumed, it is
// gang-scheduled again (it waits while a 1-device job holds one of them)
// and restarts on both from its suspend checkpoint (the engine's exact
// resume of a data-parallel job: data_parallel_job_test).
TEST_F(JobManagerTest, SuspendedGangJobResumesOnAllItsDevicesFromItsCheckpoint) {
  backend_.gated = true;
  backend_.data_parallel = true;
  options_.devices = {"cpu", "cpu:1"};
  StartManager();
  JobRecord wide = Submit(kAlice, WideRequest("wide", 2, 6));
  std::shared_ptr<FakeJobControl> gang = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(gang, nullptr);
  EXPECT_EQ(gang->device, "cpu,cpu:1");
  gang->AllowSteps(3);
  ASSERT_TRUE(gang->WaitForStep(3, kTimeout));
  ASSERT_THAT(manager_->Suspend(kAlice, wide.id), IsOk());
  WaitFor(wide.id, StateIs(JobState::kSuspended));
  const std::string checkpoint = options_.jobs_dir + "/job-000001/step-3";
  EXPECT_EQ(manager_->Get(kAlice, wide.id)->resume_from, checkpoint);
  absl::StatusOr<ManagerStatus> status = manager_->GetStatus();
  ASSERT_THAT(status, IsOk());
  EXPECT_EQ(status->devices[0].job_id, "");
  EXPECT_EQ(status->devices[1].job_id, "");

  JobRecord narrow = Submit(kBob, Request("narrow", 1));
  std::shared_ptr<FakeJobControl> one = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(one, nullptr);
  ASSERT_THAT(manager_->Resume(kAlice, wide.id), IsOk());
  EXPECT_EQ(StateOf(wide.id), JobState::kQueued) << "one of its two devices is busy";
  one->AllowSteps(1);
  WaitFor(narrow.id, StateIs(JobState::kSucceeded));
  std::shared_ptr<FakeJobControl> again = backend_.WaitForCreated(3, kTimeout);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->device, "cpu,cpu:1");
  EXPECT_EQ(again->resume_from, checkpoint);
  EXPECT_EQ(again->start_step, 3);
  again->AllowSteps(3);
  WaitFor(wide.id, StateIs(JobState::kSucceeded));
  EXPECT_EQ(manager_->Get(kAlice, wide.id)->progress.step, 6);
}

// "all" takes every device; more than the daemon has is refused even by a
// backend that runs data-parallel jobs.
TEST_F(JobManagerTest, GangJobForAllDevicesAndRefusalBeyondThem) {
  backend_.data_parallel = true;
  options_.devices = {"cpu", "cpu:1"};
  StartManager();
  EXPECT_THAT(manager_->Submit(kAlice, WideRequest("three", 3), ""),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("train.devices: 3 requested"),
                                        HasSubstr("this daemon has 2 device(s)"))));
  JobRecord all = Submit(kAlice, WideRequest("all", engine::kAllDevices, 2));
  EXPECT_EQ(all.request.spec.train.devices, 2);
  // Step events and metrics per device and in total (Note [Per-device
  // metrics]), through the store.
  int steps = 0;
  for (const JobEvent& event : WaitFor(all.id, StateIs(JobState::kSucceeded))) {
    if (event.kind != JobEvent::Kind::kStep) continue;
    ++steps;
    EXPECT_EQ(event.devices, 2);
    EXPECT_EQ(event.tokens_per_s, 102400);
    EXPECT_EQ(event.device_tokens_per_s, 51200);
  }
  EXPECT_EQ(steps, 2);
  std::shared_ptr<FakeJobControl> job = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job->device, "cpu,cpu:1");
}

TEST_F(JobManagerTest, ActivationOffloadCountsAgainstTheBudget) {
  // 1 MiB of model state (the fake's default) fits 64 MiB; with 1 GiB of
  // pinned offload buffers (train.offload_activations) it never can.
  backend_.activation_offload_bytes = int64_t{1} << 30;
  StartManager();
  Submit(kAlice, Request("no-offload"));
  JobRequest request = Request("offload");
  request.spec.train.offload_activations = true;
  EXPECT_THAT(manager_->Submit(kAlice, request, ""),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("job needs 1.00 GiB"),
                                        HasSubstr("staging 1073741824, of which "
                                                  "train.offload_activations 1073741824 bytes"),
                                        HasSubstr("it can never run on this daemon"))));
}

// Note [CPU working memory] in job_manager.cc: on CPU devices a step's
// working memory (here 1 GiB besides 1 MiB a GPU would keep resident) is
// host memory and counts against the 64 MiB budget; on GPUs it does not.
TEST_F(JobManagerTest, CpuDaemonCountsAStepsWorkingMemoryAgainstTheBudget) {
  options_.devices = {"cpu", "cpu:1"};
  backend_.device_estimate_bytes = (int64_t{1} << 30) + (int64_t{1} << 20);
  backend_.device_resident_bytes = int64_t{1} << 20;
  StartManager();
  EXPECT_THAT(manager_->Submit(kAlice, Request("big-logits"), ""),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("job needs 1.00 GiB"),
                                        HasSubstr("working memory of a step on the CPU 1073741824 "
                                                  "bytes"),
                                        HasSubstr("it can never run on this daemon"))));
}

TEST_F(JobManagerTest, GpuDaemonLeavesAStepsWorkingMemoryToTheDevice) {
  options_.devices = {"cuda:0", "cuda:1"};
  backend_.device_estimate_bytes = (int64_t{1} << 30) + (int64_t{1} << 20);
  backend_.device_resident_bytes = int64_t{1} << 20;
  StartManager();
  EXPECT_THAT(manager_->Submit(kAlice, Request("big-logits"), ""), IsOk());
}

TEST_F(JobManagerTest, JobThatFitsLaterWaitsForMemory) {
  backend_.gated = true;
  options_.devices = {"cuda:0", "cuda:1"};
  options_.host_memory_budget_bytes = 3 << 20;
  backend_.footprint_bytes_by_preset["mid"] = 2 << 20;
  StartManager();
  JobRequest request = Request("first", 1);
  request.spec.model.preset = "mid";
  JobRecord first = Submit(kAlice, request);
  request.spec.name = "second";
  JobRecord second = Submit(kBob, request);
  std::shared_ptr<FakeJobControl> first_control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(first_control, nullptr);
  // A device is free, but 2 MiB + 2 MiB > 3 MiB.
  EXPECT_EQ(StateOf(second.id), JobState::kQueued);
  EXPECT_EQ(backend_.created_count(), 1);
  first_control->AllowSteps(1);
  std::shared_ptr<FakeJobControl> second_control = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(second_control, nullptr);
  second_control->AllowSteps(1);
  WaitFor(second.id, StateIs(JobState::kSucceeded));
}

TEST_F(JobManagerTest, ResubmitWithSameRequestIdReturnsTheSameJob) {
  StartManager();
  JobRecord first = Submit(kAlice, Request("tiny"), "req-42");
  JobRecord again = Submit(kAlice, Request("tiny"), "req-42");
  EXPECT_EQ(again.id, first.id);
  JobRecord other = Submit(kBob, Request("tiny"), "req-42");  // keys are per user
  EXPECT_NE(other.id, first.id);
  EXPECT_THAT(manager_->Submit(kAlice, Request("different"), "req-42"),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("request_id 'req-42' was already used for job job-000001")));
  EXPECT_THAT(manager_->Submit(kAlice, Request("tiny"), std::string(200, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("request_id")));
}

TEST_F(JobManagerTest, InvalidSpecIsRefusedWithTheEnginesMessage) {
  StartManager();
  JobRequest request = Request("bad");
  request.spec.train.micro_batch = 0;
  EXPECT_THAT(manager_->Submit(kAlice, request, ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.micro_batch: must be in [1, 4096], got 0")));
  request = Request("bad");
  request.priority = 2000;
  EXPECT_THAT(manager_->Submit(kAlice, request, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("priority")));
}

TEST_F(JobManagerTest, CancelQueuedAndRunningJobs) {
  backend_.gated = true;
  StartManager();
  JobRecord running = Submit(kAlice, Request("running", 100));
  JobRecord queued = Submit(kAlice, Request("queued"));
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  control->AllowSteps(2);
  ASSERT_TRUE(control->WaitForStep(2, kTimeout));

  absl::StatusOr<JobRecord> cancelled = manager_->Cancel(kAlice, queued.id);
  ASSERT_THAT(cancelled, IsOk());
  EXPECT_EQ(cancelled->state, JobState::kCancelled);

  absl::StatusOr<JobRecord> stopping = manager_->Cancel(kAlice, running.id);
  ASSERT_THAT(stopping, IsOk());
  EXPECT_EQ(stopping->state, JobState::kRunning);  // until the step boundary
  WaitFor(running.id, StateIs(JobState::kCancelled));
  EXPECT_EQ(StateOf(running.id), JobState::kCancelled);
  // Idempotent on CANCELLED.
  EXPECT_THAT(manager_->Cancel(kAlice, running.id), IsOk());
}

TEST_F(JobManagerTest, ForcedCancelAsksTheJobToAbandonItsStep) {
  backend_.gated = true;
  StartManager();
  JobRecord running = Submit(kAlice, Request("running", 100));
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  control->AllowSteps(1);
  ASSERT_TRUE(control->WaitForStep(1, kTimeout));
  // (The gated fake ends at any stop request, so a plain cancel before the
  // forced one would race with it; the manager passes `force` on either way.)
  absl::StatusOr<JobRecord> forced = manager_->Cancel(kAlice, running.id, /*force=*/true);
  ASSERT_THAT(forced, IsOk());
  EXPECT_THAT(forced->message, HasSubstr("forced cancel requested by alice"));
  EXPECT_EQ(control->last_stop(), engine::TrainingJob::StopKind::kForceCancel);
  WaitFor(running.id, StateIs(JobState::kCancelled));
}

TEST_F(JobManagerTest, ResumeOfAJobThatIsNotSuspendedIsFailedPrecondition) {
  backend_.gated = true;
  StartManager();
  JobRecord running = Submit(kAlice, Request("running", 100));
  JobRecord queued = Submit(kAlice, Request("queued"));
  ASSERT_NE(backend_.WaitForCreated(1, kTimeout), nullptr);
  EXPECT_THAT(manager_->Resume(kAlice, running.id),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is RUNNING; only SUSPENDED jobs resume")));
  EXPECT_THAT(manager_->Resume(kAlice, queued.id),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is QUEUED; only SUSPENDED jobs resume")));
  EXPECT_THAT(
      manager_->CreateCheckpoint(kAlice, queued.id, absl::Now() + kTimeout, nullptr),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("only RUNNING jobs checkpoint")));
}

TEST_F(JobManagerTest, ResumedJobKeepsItsFirstStartTime) {
  backend_.gated = true;
  StartManager();
  JobRecord job = Submit(kAlice, Request("long", 6));
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  control->AllowSteps(1);
  ASSERT_TRUE(control->WaitForStep(1, kTimeout));
  const int64_t first_start = manager_->Get(kAlice, job.id)->start_time_unix_ms;
  ASSERT_GT(first_start, 0);
  ASSERT_THAT(manager_->Suspend(kAlice, job.id), IsOk());
  WaitFor(job.id, StateIs(JobState::kSuspended));
  absl::SleepFor(absl::Milliseconds(5));
  ASSERT_THAT(manager_->Resume(kAlice, job.id), IsOk());
  // Created again: StartLocked has run (it starts the job's thread).
  ASSERT_NE(backend_.WaitForCreated(2, kTimeout), nullptr);
  EXPECT_EQ(manager_->Get(kAlice, job.id)->start_time_unix_ms, first_start);
}

TEST_F(JobManagerTest, CancelOfFinishedJobIsFailedPrecondition) {
  StartManager();
  JobRecord job = Submit(kAlice, Request("done", 2));
  WaitFor(job.id, StateIs(JobState::kSucceeded));
  EXPECT_THAT(manager_->Cancel(kAlice, job.id), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                         HasSubstr("already ended SUCCEEDED")));
  EXPECT_THAT(manager_->Suspend(kAlice, job.id),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already ended")));
  EXPECT_THAT(manager_->Resume(kAlice, job.id),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already ended")));
}

TEST_F(JobManagerTest, SuspendCheckpointsAndResumeContinuesFromIt) {
  backend_.gated = true;
  StartManager();
  JobRecord job = Submit(kAlice, Request("long", 6));
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  control->AllowSteps(3);
  ASSERT_TRUE(control->WaitForStep(3, kTimeout));

  absl::StatusOr<JobRecord> suspending = manager_->Suspend(kAlice, job.id);
  ASSERT_THAT(suspending, IsOk());
  EXPECT_EQ(suspending->state, JobState::kSuspending);
  std::vector<JobEvent> events = WaitFor(job.id, StateIs(JobState::kSuspended));
  absl::StatusOr<JobRecord> suspended = manager_->Get(kAlice, job.id);
  ASSERT_THAT(suspended, IsOk());
  EXPECT_EQ(suspended->state, JobState::kSuspended);
  const std::string checkpoint = options_.jobs_dir + "/job-000001/step-3";
  EXPECT_EQ(suspended->resume_from, checkpoint);
  EXPECT_TRUE(suspended->device.empty());
  EXPECT_EQ(manager_->GetStatus()->host_memory_reserved_bytes, 0);

  absl::StatusOr<JobRecord> resumed = manager_->Resume(kAlice, job.id);
  ASSERT_THAT(resumed, IsOk());
  std::shared_ptr<FakeJobControl> again = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->resume_from, checkpoint);
  EXPECT_EQ(again->start_step, 3);
  again->AllowSteps(3);
  WaitFor(job.id, StateIs(JobState::kSucceeded));
  EXPECT_EQ(manager_->Get(kAlice, job.id)->progress.step, 6);
}

// Note [Checkpoint adoption]: at each start the checkpoints the store
// records for the job (never a scan) are handed to the engine's ledger.
TEST_F(JobManagerTest, StartAdoptsTheJobsRecordedCheckpoints) {
  backend_.gated = true;
  StartManager();
  JobRecord job = Submit(kAlice, Request("long", 6));
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  EXPECT_THAT(backend_.adopt_calls(), ::testing::IsEmpty());  // nothing recorded yet
  control->AllowSteps(3);
  ASSERT_TRUE(control->WaitForStep(3, kTimeout));
  ASSERT_THAT(manager_->Suspend(kAlice, job.id), IsOk());
  WaitFor(job.id, StateIs(JobState::kSuspended));

  ASSERT_THAT(manager_->Resume(kAlice, job.id), IsOk());
  std::shared_ptr<FakeJobControl> again = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(again, nullptr);
  const auto calls = backend_.adopt_calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].first, manager_->Get(kAlice, job.id)->request.spec.output_dir);
  EXPECT_THAT(calls[0].second, ::testing::ElementsAre(options_.jobs_dir + "/job-000001/step-3"));
  again->AllowSteps(3);
  WaitFor(job.id, StateIs(JobState::kSucceeded));
}

// Issue 20 (Note [Long conversations]): the job's data description is one
// of its events.
TEST_F(JobManagerTest, DataDescriptionIsAnEvent) {
  backend_.data_description =
      "data: 10 training documents with loss masks, 3 longer than train.seq_len 64 (trained "
      "across windows)";
  StartManager();
  JobRecord job = Submit(kAlice, Request("chat", 2));
  std::vector<JobEvent> events = WaitFor(job.id, StateIs(JobState::kSucceeded));
  int found = 0;
  for (const JobEvent& event : events) {
    found +=
        event.kind == JobEvent::Kind::kStateChange && event.message == backend_.data_description;
  }
  EXPECT_EQ(found, 1);
}

TEST_F(JobManagerTest, SuspendQueuedJobHoldsItAndResumeRequeues) {
  backend_.gated = true;
  StartManager();
  Submit(kAlice, Request("running"));
  JobRecord waiting = Submit(kAlice, Request("waiting"));
  ASSERT_NE(backend_.WaitForCreated(1, kTimeout), nullptr);
  EXPECT_EQ(manager_->Suspend(kAlice, waiting.id)->state, JobState::kSuspended);
  EXPECT_EQ(manager_->Resume(kAlice, waiting.id)->state, JobState::kQueued);
}

TEST_F(JobManagerTest, CreateCheckpointWaitsForTheCheckpoint) {
  backend_.gated = true;
  StartManager();
  JobRecord job = Submit(kAlice, Request("ckpt", 10));
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  control->AllowSteps(4);
  ASSERT_TRUE(control->WaitForStep(4, kTimeout));
  absl::StatusOr<CheckpointRecord> checkpoint =
      manager_->CreateCheckpoint(kAlice, job.id, absl::Now() + kTimeout, [] { return false; });
  ASSERT_THAT(checkpoint, IsOk());
  EXPECT_EQ(checkpoint->step, 4);
  auto listed = manager_->ListCheckpoints(kAlice, job.id);
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].dir, options_.jobs_dir + "/job-000001/step-4");
  EXPECT_GT((*listed)[0].create_time_unix_ms, 0);
}

TEST_F(JobManagerTest, CreateCheckpointOfQueuedJobIsFailedPrecondition) {
  backend_.gated = true;
  StartManager();
  Submit(kAlice, Request("running"));
  JobRecord queued = Submit(kAlice, Request("queued"));
  EXPECT_THAT(manager_->CreateCheckpoint(kAlice, queued.id, absl::Now() + kTimeout, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("only RUNNING jobs")));
}

TEST_F(JobManagerTest, ExportAndDeleteCheckpoints) {
  StartManager();
  JobRequest request = Request("tiny", 4);
  request.spec.checkpoint.every_steps = 2;
  JobRecord job = Submit(kAlice, request);
  WaitFor(job.id, StateIs(JobState::kSucceeded));
  auto listed = manager_->ListCheckpoints(kAlice, job.id);
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 2u);  // step-2, step-4 (the final one)

  const std::string out = MakeTempDir() + "/export";
  MEGATRAIN_EXPECT_OK(manager_->ExportCheckpoint(kAlice, "job-000001/step-4", out, ""));
  EXPECT_TRUE(std::filesystem::exists(out + "/config.json"));
  EXPECT_THAT(manager_->ExportCheckpoint(kAlice, "job-000001/step-4", out, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not an empty directory")));
  EXPECT_THAT(manager_->ExportCheckpoint(kAlice, "job-000001/step-4", "rel/dir", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("absolute")));
  EXPECT_THAT(manager_->ExportCheckpoint(kAlice, "job-000001/step-4", out + "2", "fp16"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
  EXPECT_THAT(manager_->ExportCheckpoint(kAlice, "job-000001/step-3", out + "2", ""),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-000001/step-3")));
  EXPECT_THAT(manager_->ExportCheckpoint(kBob, "job-000001/step-4", out + "2", ""),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("another user")));

  MEGATRAIN_EXPECT_OK(manager_->DeleteCheckpoint(kAlice, "job-000001/step-2"));
  listed = manager_->ListCheckpoints(kAlice, job.id);
  ASSERT_THAT(listed, IsOk());
  EXPECT_EQ(listed->size(), 1u);
}

TEST_F(JobManagerTest, EngineCreateErrorFailsTheJobWithItsCode) {
  backend_.fail_create_name = "oom";
  StartManager();
  JobRecord job = Submit(kAlice, Request("oom"));
  WaitFor(job.id, StateIs(JobState::kFailed));
  absl::StatusOr<JobRecord> failed = manager_->Get(kAlice, job.id);
  ASSERT_THAT(failed, IsOk());
  EXPECT_EQ(failed->state, JobState::kFailed);
  EXPECT_EQ(failed->error_code, absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(failed->message, HasSubstr("fake: out of memory"));
}

TEST_F(JobManagerTest, UsersSeeOnlyTheirJobsAdminsAll) {
  StartManager();
  JobRecord alice_job = Submit(kAlice, Request("a"));
  JobRecord bob_job = Submit(kBob, Request("b"));
  EXPECT_THAT(manager_->Get(kBob, alice_job.id),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("belongs to another user")));
  EXPECT_THAT(manager_->Cancel(kBob, alice_job.id),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("another user")));
  EXPECT_THAT(manager_->Get(kAdmin, alice_job.id), IsOk());
  EXPECT_THAT(manager_->Get(kAlice, "job-000999"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-000999")));

  auto mine = manager_->List(kBob, JobQuery());
  ASSERT_THAT(mine, IsOk());
  ASSERT_EQ(mine->jobs.size(), 1u);
  EXPECT_EQ(mine->jobs[0].id, bob_job.id);
  JobQuery others;
  others.owner = "alice";
  EXPECT_THAT(manager_->List(kBob, others),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("own jobs")));
  auto all = manager_->List(kAdmin, JobQuery());
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ(all->jobs.size(), 2u);
  auto alices = manager_->List(kAdmin, others);
  ASSERT_THAT(alices, IsOk());
  ASSERT_EQ(alices->jobs.size(), 1u);
  EXPECT_EQ(alices->jobs[0].owner, "alice");
}

TEST_F(JobManagerTest, PaginationCoversEveryJobOnce) {
  backend_.gated = true;  // keep them queued: only the first runs
  StartManager();
  for (int job_idx = 0; job_idx < 7; ++job_idx) Submit(kAlice, Request(absl::StrCat("j", job_idx)));
  JobQuery query;
  query.page_size = 3;
  std::vector<std::string> ids;
  for (int page_idx = 0; page_idx < 10; ++page_idx) {  // bounded
    auto page = manager_->List(kAlice, query);
    ASSERT_THAT(page, IsOk());
    for (const JobRecord& job : page->jobs) ids.push_back(job.id);
    if (page->next_page_token.empty()) break;
    query.page_token = page->next_page_token;
  }
  EXPECT_THAT(ids, ElementsAre("job-000007", "job-000006", "job-000005", "job-000004", "job-000003",
                               "job-000002", "job-000001"));
}

TEST_F(JobManagerTest, HigherPriorityJobPreemptsLowerOne) {
  backend_.gated = true;
  options_.preemption = true;
  StartManager();
  JobRecord low = Submit(kAlice, Request("low", 5, 0));
  std::shared_ptr<FakeJobControl> low_control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(low_control, nullptr);
  low_control->AllowSteps(2);
  ASSERT_TRUE(low_control->WaitForStep(2, kTimeout));

  JobRecord high = Submit(kBob, Request("high", 1, 10));
  // The low job checkpoints at its step boundary and goes back to the queue.
  std::vector<JobEvent> events = WaitFor(low.id, [](const JobEvent& event) {
    return event.kind == JobEvent::Kind::kStateChange && event.state == JobState::kQueued &&
           absl::StrContains(event.message, "preempted");
  });
  ASSERT_FALSE(events.empty());
  EXPECT_THAT(events.back().message, HasSubstr("preempted by job-000002; re-queued, resumes from"));
  std::shared_ptr<FakeJobControl> high_control = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(high_control, nullptr);
  EXPECT_EQ(high_control->spec_name, "high");
  high_control->AllowSteps(1);
  WaitFor(high.id, StateIs(JobState::kSucceeded));

  std::shared_ptr<FakeJobControl> low_again = backend_.WaitForCreated(3, kTimeout);
  ASSERT_NE(low_again, nullptr);
  EXPECT_EQ(low_again->start_step, 2);
  low_again->AllowSteps(3);
  WaitFor(low.id, StateIs(JobState::kSucceeded));
}

TEST_F(JobManagerTest, WithoutPreemptionHighPriorityWaits) {
  backend_.gated = true;
  StartManager();
  Submit(kAlice, Request("low", 5, 0));
  ASSERT_NE(backend_.WaitForCreated(1, kTimeout), nullptr);
  JobRecord high = Submit(kBob, Request("high", 1, 10));
  EXPECT_EQ(StateOf(high.id), JobState::kQueued);
  EXPECT_EQ(high.queue_position, 1);
}

TEST_F(JobManagerTest, RestartRequeuesRunningJobsFromTheirLastCheckpoint) {
  // A daemon "crashed" with job-000001 RUNNING and a checkpoint at step 4 on
  // disk: the store is left exactly as the dead process wrote it.
  JobRecord job;
  job.seq = 1;
  job.id = "job-000001";
  job.owner = "alice";
  job.request = Request("crashed", 6);
  job.request.spec.output_dir = options_.jobs_dir + "/job-000001";
  job.state = JobState::kRunning;
  job.device = "cpu";
  job.create_time_unix_ms = NowUnixMs();
  job.host_memory_bytes = 1 << 20;
  MEGATRAIN_ASSERT_OK(store_->InsertJob(job, JobEvent::StateChange(job.id, job.state, "started")));
  RecordFakeCheckpoint(job, 4);

  StartManager();
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  EXPECT_EQ(control->resume_from, job.request.spec.output_dir + "/step-4");
  EXPECT_EQ(control->start_step, 4);
  std::vector<JobEvent> events = WaitFor(job.id, StateIs(JobState::kSucceeded));
  bool requeued = false;
  for (const JobEvent& event : events) {
    requeued = requeued ||
               (event.kind == JobEvent::Kind::kStateChange && event.state == JobState::kQueued &&
                absl::StrContains(event.message, "after a daemon restart"));
  }
  EXPECT_TRUE(requeued);
}

TEST_F(JobManagerTest, DrainCheckpointsAndRequeuesRunningJobs) {
  backend_.gated = true;
  StartManager();
  JobRecord job = Submit(kAlice, Request("long", 10));
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  control->AllowSteps(2);
  ASSERT_TRUE(control->WaitForStep(2, kTimeout));

  EXPECT_TRUE(manager_->Drain(kTimeout));
  EXPECT_TRUE(manager_->draining());
  absl::StatusOr<JobRecord> after = store_->GetJob(job.id);
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(after->state, JobState::kQueued);
  EXPECT_EQ(after->resume_from, options_.jobs_dir + "/job-000001/step-2");
  EXPECT_THAT(manager_->Submit(kAlice, Request("late"), ""),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  EXPECT_THAT(manager_->WaitEvents(kAlice, job.id, 0, kTimeout),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));

  // The next daemon picks it up from the checkpoint.
  manager_.reset();
  backend_.gated = false;
  StartManager();
  std::shared_ptr<FakeJobControl> resumed = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->start_step, 2);
  WaitFor(job.id, StateIs(JobState::kSucceeded));
}

TEST_F(JobManagerTest, CreateRejectsBadOptions) {
  options_.devices.clear();
  EXPECT_THAT(JobManager::Create(options_, store_.get(), &backend_, &metrics_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no devices")));
  options_.devices = {"cpu"};
  options_.host_memory_budget_bytes = 0;
  EXPECT_THAT(JobManager::Create(options_, store_.get(), &backend_, &metrics_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--host_memory_budget")));
}

TEST(ResolveDevicesTest, ExpandsTheDeviceFlag) {
  EXPECT_THAT(*ResolveDevices("cpu", 2), ElementsAre("cpu"));
  EXPECT_THAT(*ResolveDevices("auto", 0), ElementsAre("cpu"));
  EXPECT_THAT(*ResolveDevices("auto", 2), ElementsAre("cuda:0", "cuda:1"));
  EXPECT_THAT(*ResolveDevices("cuda", 1), ElementsAre("cuda:0"));
  EXPECT_THAT(*ResolveDevices("cuda:1,cuda:0,cuda:1", 2), ElementsAre("cuda:1", "cuda:0"));
  EXPECT_THAT(ResolveDevices("cuda:2", 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cuda:2 is not available")));
  EXPECT_THAT(ResolveDevices("tpu", 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--device")));
  // Note [CPU device slots].
  EXPECT_THAT(*ResolveDevices("cpu,cpu:1,cpu:0,cpu:2", 0), ElementsAre("cpu", "cpu:1", "cpu:2"));
  for (const char* bad : {"cpu:64", "cpu:-1", "cpu:x", "cpu:"}) {
    EXPECT_THAT(ResolveDevices(bad, 0),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad CPU device")))
        << bad;
  }
}

// ---------------------------------------------------------------------------
// Issue 14: admission without file I/O under the lock, limits that hold.

// Runs `fn` on its own thread and waits at most kTimeout for it: a call that
// blocks fails the test instead of hanging it. The thread is detached on
// timeout (the test has failed by then).
template <typename T>
std::optional<T> CallWithin(std::function<T()> fn) {
  auto task = std::make_shared<std::packaged_task<T()>>(std::move(fn));
  std::future<T> result = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (result.wait_for(absl::ToChronoNanoseconds(kTimeout)) != std::future_status::ready) {
    ADD_FAILURE() << "call did not return within " << kTimeout;
    return std::nullopt;
  }
  return result.get();
}

std::string MakeFifo(const std::string& dir, const std::string& name) {
  const std::string path = (std::filesystem::path(dir) / name).string();
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  return path;
}

TEST_F(JobManagerTest, FifoAsDataPathFailsThatSubmitNamingThePath) {
  StartManager();
  const std::string fifo = MakeFifo(MakeTempDir(), "tokens.fifo");
  JobRequest request = Request("fifo");
  request.spec.data.tokens = fifo;
  std::optional<absl::StatusOr<JobRecord>> submitted =
      CallWithin<absl::StatusOr<JobRecord>>([&] { return manager_->Submit(kAlice, request, ""); });
  ASSERT_TRUE(submitted.has_value());
  EXPECT_THAT(*submitted, StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("data.tokens: '" + fifo + "' is a FIFO")));
  // Nothing was queued; others proceed.
  JobRecord bob = Submit(kBob, Request("bob"));
  EXPECT_THAT(manager_->Get(kBob, bob.id), IsOk());
}

TEST_F(JobManagerTest, FifoAsModelConfigFailsThatSubmitWithinBoundedTime) {
  StartManager();
  const std::string hf_dir = MakeTempDir();
  const std::string config = MakeFifo(hf_dir, "config.json");
  JobRequest request = Request("fifo-config");
  request.spec.model.preset.clear();
  request.spec.model.hf_dir = hf_dir;
  // A blocking open of a FIFO without a writer never returns: the test
  // fails on the deadline rather than hanging if that regresses.
  std::optional<absl::StatusOr<JobRecord>> submitted =
      CallWithin<absl::StatusOr<JobRecord>>([&] { return manager_->Submit(kAlice, request, ""); });
  ASSERT_TRUE(submitted.has_value());
  EXPECT_THAT(*submitted, StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("model.hf_dir: '" + config + "' is a FIFO")));
}

TEST_F(JobManagerTest, ModelConfigMissingOrTooLargeIsRefused) {
  StartManager();
  const std::string hf_dir = MakeTempDir();
  JobRequest request = Request("config");
  request.spec.model.preset.clear();
  request.spec.model.hf_dir = hf_dir;
  EXPECT_THAT(
      manager_->Submit(kAlice, request, ""),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("config.json' does not exist")));
  const std::string config = hf_dir + "/config.json";
  { std::ofstream create(config); }
  std::filesystem::resize_file(config, kMaxHfConfigBytes + 1);
  EXPECT_THAT(manager_->Submit(kAlice, request, ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat(kMaxHfConfigBytes + 1, " bytes; at most"))));
}

// Forwards to a FakeEngineBackend, but ValidateJobSpec of a spec named
// "hung" blocks until Release(): a stand-in for a hung file system under a
// submission.
class HangingBackend final : public EngineBackend {
 public:
  explicit HangingBackend(FakeEngineBackend* fake) : fake_(fake) {}

  absl::Status ValidateJobSpec(const engine::JobSpec& spec) override {
    if (spec.name == "hung") {
      std::unique_lock<std::mutex> lock(mu_);
      entered_ = true;
      cv_.notify_all();
      cv_.wait(lock, [this] { return released_; });
    }
    return fake_->ValidateJobSpec(spec);
  }
  absl::StatusOr<engine::MemoryFootprint> EstimateFootprint(const engine::JobSpec& spec) override {
    return fake_->EstimateFootprint(spec);
  }
  absl::StatusOr<std::unique_ptr<engine::TrainingJob>> CreateJob(
      const engine::JobSpec& spec, const std::string& device,
      const std::optional<std::string>& resume_from) override {
    return fake_->CreateJob(spec, device, resume_from);
  }
  absl::StatusOr<std::vector<engine::CheckpointInfo>> ListCheckpoints(
      const std::string& output_dir) override {
    return fake_->ListCheckpoints(output_dir);
  }
  absl::StatusOr<engine::CheckpointInfo> VerifyCheckpoint(const std::string& checkpoint_dir,
                                                          bool check_data) override {
    return fake_->VerifyCheckpoint(checkpoint_dir, check_data);
  }
  absl::StatusOr<int64_t> AdoptRecordedCheckpoints(
      const std::string& output_dir, const std::vector<std::string>& checkpoint_dirs) override {
    return fake_->AdoptRecordedCheckpoints(output_dir, checkpoint_dirs);
  }
  absl::Status ExportHfModel(const std::string& checkpoint_dir, const std::string& out_dir,
                             const std::string& dtype) override {
    return fake_->ExportHfModel(checkpoint_dir, out_dir, dtype);
  }
  int CudaDeviceCount() override { return 0; }
  absl::StatusOr<LinkBandwidth> MeasureLinkBandwidth(
      const std::string& device, const std::function<void()>& between_directions) override {
    return fake_->MeasureLinkBandwidth(device, between_directions);
  }

  bool WaitEntered(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] { return entered_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  FakeEngineBackend* const fake_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false;   // guarded by mu_
  bool released_ = false;  // guarded by mu_
};

TEST_F(JobManagerTest, HungSubmissionStallsNeitherOtherUsersNorTheDrain) {
  HangingBackend hanging(&backend_);
  auto created = JobManager::Create(options_, store_.get(), &hanging, &metrics_);
  ASSERT_THAT(created, IsOk());
  std::unique_ptr<JobManager> manager = *std::move(created);
  std::promise<absl::StatusOr<JobRecord>> hung_result;
  std::thread hung_submit(
      [&] { hung_result.set_value(manager->Submit(kAlice, Request("hung"), "")); });
  ASSERT_TRUE(hanging.WaitEntered(kTimeout));

  // While alice's submission is stuck, bob's calls complete.
  std::optional<absl::StatusOr<JobRecord>> bob = CallWithin<absl::StatusOr<JobRecord>>(
      [&] { return manager->Submit(kBob, Request("bob", 1), ""); });
  ASSERT_TRUE(bob.has_value());
  ASSERT_THAT(*bob, IsOk());
  std::optional<absl::StatusOr<JobRecord>> got =
      CallWithin<absl::StatusOr<JobRecord>>([&] { return manager->Get(kBob, (*bob)->id); });
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, IsOk());
  // So does the drain, within its timeout.
  std::optional<bool> drained = CallWithin<bool>([&] { return manager->Drain(kTimeout); });
  ASSERT_TRUE(drained.has_value());
  EXPECT_TRUE(*drained);

  hanging.Release();
  hung_submit.join();
  EXPECT_THAT(hung_result.get_future().get(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
}

TEST_F(JobManagerTest, JobLimitsCountQueuedSuspendedAndRunningJobs) {
  backend_.gated = true;
  options_.max_queued_jobs_per_user = 3;
  options_.max_queued_jobs = 4;
  StartManager();
  Submit(kAlice, Request("running"));
  ASSERT_NE(backend_.WaitForCreated(1, kTimeout), nullptr);
  JobRecord held = Submit(kAlice, Request("held"));
  ASSERT_THAT(manager_->Suspend(kAlice, held.id), IsOk());
  Submit(kAlice, Request("queued"));
  EXPECT_THAT(manager_->Submit(kAlice, Request("one-more"), ""),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("user 'alice' already has 3 jobs queued, running or suspended "
                                 "(--max_queued_jobs_per_user=3)")));
  Submit(kBob, Request("bob"));
  EXPECT_THAT(manager_->Submit(kBob, Request("bob2"), ""),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("the queue is full: 4 jobs queued, running or suspended "
                                 "(--max_queued_jobs=4)")));
}

TEST_F(JobManagerTest, ResumeIsRefusedWhenALoweredLimitIsExceeded) {
  backend_.gated = true;
  options_.max_queued_jobs_per_user = 3;
  StartManager();
  Submit(kAlice, Request("running"));
  ASSERT_NE(backend_.WaitForCreated(1, kTimeout), nullptr);
  JobRecord first = Submit(kAlice, Request("held1"));
  JobRecord second = Submit(kAlice, Request("held2"));
  ASSERT_THAT(manager_->Suspend(kAlice, first.id), IsOk());
  ASSERT_THAT(manager_->Suspend(kAlice, second.id), IsOk());
  // Restart with a lower limit: the three jobs stay, no new one may join.
  ASSERT_TRUE(manager_->Drain(kTimeout));
  manager_.reset();
  options_.max_queued_jobs_per_user = 2;
  StartManager();
  EXPECT_THAT(manager_->Resume(kAlice, first.id),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("user 'alice' already has 3 jobs queued, running or suspended")));
  EXPECT_EQ(StateOf(first.id), JobState::kSuspended);
  // Once one ends, the other may resume.
  ASSERT_THAT(manager_->Cancel(kAlice, second.id), IsOk());
  EXPECT_THAT(manager_->Resume(kAlice, first.id), IsOk());
}

TEST_F(JobManagerTest, QueuePositionsFollowPriorityThenSubmission) {
  backend_.gated = true;
  StartManager();
  Submit(kAlice, Request("running"));
  ASSERT_NE(backend_.WaitForCreated(1, kTimeout), nullptr);
  JobRecord low = Submit(kAlice, Request("low", 5, 0));
  JobRecord high = Submit(kBob, Request("high", 5, 10));
  JobRecord low2 = Submit(kAlice, Request("low2", 5, 0));
  EXPECT_EQ(manager_->Get(kAlice, low.id)->queue_position, 2);
  EXPECT_EQ(manager_->Get(kBob, high.id)->queue_position, 1);
  EXPECT_EQ(manager_->Get(kAlice, low2.id)->queue_position, 3);
  ASSERT_THAT(manager_->Cancel(kBob, high.id), IsOk());
  EXPECT_EQ(manager_->Get(kAlice, low2.id)->queue_position, 2);
  EXPECT_EQ(manager_->Get(kBob, high.id)->queue_position, 0);
}

TEST_F(JobManagerTest, PerUserDataRootRefusesAnotherUsersDataWithoutItsSize) {
  const std::string data = MakeTempDir();
  std::filesystem::create_directories(data + "/alice");
  std::filesystem::create_directories(data + "/bob");
  { std::ofstream(data + "/bob/secret.bin") << std::string(12345, 'x'); }
  auto policy = PathPolicy::Create({data + "/{user}"}, {});
  ASSERT_THAT(policy, IsOk());
  options_.path_policy = *policy;
  StartManager();
  JobRequest mine = Request("mine");
  mine.spec.data.tokens = data + "/alice/tokens";
  EXPECT_THAT(manager_->Submit(kAlice, mine, ""), IsOk());
  JobRequest theirs = Request("theirs");
  theirs.spec.data.tokens = data + "/bob/secret.bin";
  absl::StatusOr<JobRecord> refused = manager_->Submit(kAlice, theirs, "");
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kPermissionDenied,
                                HasSubstr("data.tokens: '" + data +
                                          "/bob/secret.bin' is "
                                          "outside the daemon's data roots (" +
                                          data + "/{user}; --data_roots)")));
  EXPECT_FALSE(absl::StrContains(refused.status().message(), "12345"));
  // The same refusal for a path that does not exist: nothing is revealed.
  theirs.spec.data.tokens = data + "/bob/nothing.bin";
  EXPECT_THAT(manager_->Submit(kAlice, theirs, ""),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("outside the daemon's")));
  EXPECT_THAT(manager_->Submit(kBob, theirs, ""), IsOk());
}

TEST_F(JobManagerTest, DeleteCheckpointRemovesALinkSwappedInWithoutFollowingIt) {
  StartManager();
  // Two recorded checkpoints (step-2 and step-4): deletes act on records
  // only (checkpoint_ownership_test), so both halves below need one.
  JobRequest request = Request("tiny", 4);
  request.spec.checkpoint.every_steps = 2;
  JobRecord job = Submit(kAlice, request);
  WaitFor(job.id, StateIs(JobState::kSucceeded));
  // Someone with write access to the job's directory swaps step-2 for a
  // link to another user's data.
  const std::string victim = MakeTempDir();
  std::ofstream(victim + "/precious") << "keep";
  const std::string step_dir = job.request.spec.output_dir + "/step-2";
  ::megatrain::testing::RemoveTestTree(step_dir);
  std::filesystem::create_directory_symlink(victim, step_dir);
  MEGATRAIN_EXPECT_OK(manager_->DeleteCheckpoint(kAlice, "job-000001/step-2"));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(step_dir)));
  EXPECT_TRUE(std::filesystem::exists(victim + "/precious"));
  // A link in place of the output directory itself fails the delete.
  const std::string output_dir = job.request.spec.output_dir;
  std::filesystem::rename(output_dir, output_dir + ".moved");
  std::filesystem::create_directory_symlink(output_dir + ".moved", output_dir);
  EXPECT_THAT(manager_->DeleteCheckpoint(kAlice, "job-000001/step-4"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("symbolic link")));
  EXPECT_TRUE(std::filesystem::exists(output_dir + ".moved/step-4"));
}

// Note [NVMe admission] (issue 19): a job asking for the tier on a daemon
// without one is refused naming the field; auto goes to the tier only when
// host memory is too small, is stored resolved, and the job is handed the
// daemon's directory; a tier larger than --nvme_budget is refused with the
// bytes per tier.
TEST_F(JobManagerTest, NvmeTierIsAdmittedAgainstItsBudget) {
  backend_.footprint_bytes_by_preset["big"] = 100 << 20;  // 100 MiB > the 64 MiB budget
  StartManager();
  JobRequest moments = Request("moments");
  moments.spec.memory.nvme_tier = engine::NvmeTierMode::kMoments;
  EXPECT_THAT(manager_->Submit(kAlice, moments, ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("memory.nvme_tier"), HasSubstr("--nvme_dir"))));

  manager_.reset();
  options_.nvme = {"/mnt/nvme", 40 << 20};
  StartManager();
  JobRequest big = Request("big");
  big.spec.model.preset = "big";
  big.spec.memory.nvme_tier = engine::NvmeTierMode::kAuto;
  // 50 MiB of moments on a 40 MiB tier: never.
  EXPECT_THAT(manager_->Submit(kAlice, big, ""),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("(52428800 bytes) on the NVMe tier"),
                                        HasSubstr("--nvme_budget is"))));

  manager_.reset();
  options_.nvme = {"/mnt/nvme", 60 << 20};
  StartManager();
  JobRecord tiered = Submit(kAlice, big);
  EXPECT_EQ(tiered.request.spec.memory.nvme_tier, engine::NvmeTierMode::kMoments);
  EXPECT_EQ(tiered.host_memory_bytes, 50 << 20);
  JobRequest small = Request("small");
  small.spec.memory.nvme_tier = engine::NvmeTierMode::kAuto;
  JobRecord in_ram = Submit(kAlice, small);
  EXPECT_EQ(in_ram.request.spec.memory.nvme_tier, engine::NvmeTierMode::kOff);
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  EXPECT_EQ(control->nvme_dir, "/mnt/nvme");
  WaitFor(tiered.id, StateIs(JobState::kSucceeded));
}

// Whether `job_id` has an event saying it was preempted (read through the
// store: MaybePreemptLocked appends it before Submit returns).
bool WasPreempted(JobStore& store, const std::string& job_id) {
  absl::StatusOr<std::vector<JobEvent>> events = store.ListEvents(job_id, 0, 1000);
  EXPECT_THAT(events, IsOk());
  if (!events.ok()) return false;
  return std::any_of(events->begin(), events->end(), [](const JobEvent& event) {
    return absl::StrContains(event.message, "preempted by");
  });
}

// Note [NVMe admission]: preemption counts NVMe bytes. Two devices, a 60
// MiB tier, tiered jobs of 50 MiB of moments each: a tiered job of
// priority 2 waits for the disk (a device is free). Of the running jobs
// only the tiered one of priority 0 is below it (the in-RAM one has 5);
// stopping it frees its NVMe bytes (a suspended job holds none), so it is
// preempted and the waiting job starts, handed the tier.
TEST_F(JobManagerTest, PreemptionFreesTheVictimsNvmeBytes) {
  backend_.gated = true;
  backend_.footprint_bytes_by_preset["big"] = 100 << 20;  // 50 MiB on the tier
  options_.preemption = true;
  options_.devices = {"d0", "d1"};
  options_.host_memory_budget_bytes = 256 << 20;
  options_.nvme = {"/mnt/nvme", 60 << 20};
  StartManager();
  JobRequest tiered_low = Request("tiered-low", 5, 0);
  tiered_low.spec.model.preset = "big";
  tiered_low.spec.memory.nvme_tier = engine::NvmeTierMode::kMoments;
  const JobRecord t1 = Submit(kAlice, tiered_low);
  std::shared_ptr<FakeJobControl> t1_control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(t1_control, nullptr);
  const JobRecord in_ram = Submit(kAlice, Request("in-ram", 5, 5));
  ASSERT_NE(backend_.WaitForCreated(2, kTimeout), nullptr);
  t1_control->AllowSteps(1);
  ASSERT_TRUE(t1_control->WaitForStep(1, kTimeout));

  JobRequest mid = Request("tiered-mid", 1, 2);
  mid.spec.model.preset = "big";
  mid.spec.memory.nvme_tier = engine::NvmeTierMode::kMoments;
  Submit(kBob, mid);
  EXPECT_TRUE(WasPreempted(*store_, t1.id));
  EXPECT_FALSE(WasPreempted(*store_, in_ram.id));
  std::shared_ptr<FakeJobControl> t2_control = backend_.WaitForCreated(3, kTimeout);
  ASSERT_NE(t2_control, nullptr);
  EXPECT_EQ(t2_control->spec_name, "tiered-mid");
  EXPECT_EQ(t2_control->nvme_dir, "/mnt/nvme");
  EXPECT_EQ(StateOf(in_ram.id), JobState::kRunning);
}

// The same without a tiered victim: the only job below the waiting tiered
// one holds host memory and a device but no NVMe bytes; stopping it would
// not let the waiting job start, so it keeps running.
// Note [Gang scheduling]: a 2-device job of middle priority does not
// preempt the low-priority job on one device while a higher-priority job
// keeps the other (it could never get both); with both devices held by
// lower-priority jobs it preempts them, one a pass, and starts on both.
TEST_F(JobManagerTest, GangJobPreemptsOnlyWhenItCanGetAllItsDevices) {
  backend_.gated = true;
  backend_.data_parallel = true;
  options_.preemption = true;
  options_.devices = {"cpu", "cpu:1"};
  StartManager();
  const JobRecord top = Submit(kAlice, Request("top", 5, 10));
  std::shared_ptr<FakeJobControl> top_control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(top_control, nullptr);
  const JobRecord low = Submit(kAlice, Request("low", 5, 0));
  std::shared_ptr<FakeJobControl> low_control = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(low_control, nullptr);
  JobRequest wide_request = WideRequest("wide", 2);
  wide_request.priority = 5;
  const JobRecord wide = Submit(kBob, wide_request);
  low_control->AllowSteps(1);
  ASSERT_TRUE(low_control->WaitForStep(1, kTimeout));
  EXPECT_FALSE(WasPreempted(*store_, low.id)) << "the wide job could not get top's device";
  EXPECT_EQ(StateOf(low.id), JobState::kRunning);
  EXPECT_EQ(StateOf(wide.id), JobState::kQueued);

  // Once top ends, both devices can be had: low is preempted and wide runs.
  top_control->AllowSteps(5);
  WaitFor(top.id, StateIs(JobState::kSucceeded));
  low_control->AllowSteps(1);
  std::shared_ptr<FakeJobControl> gang = backend_.WaitForCreated(3, kTimeout);
  ASSERT_NE(gang, nullptr);
  EXPECT_EQ(gang->spec_name, "wide");
  EXPECT_EQ(gang->device, "cpu,cpu:1");
  EXPECT_TRUE(WasPreempted(*store_, low.id));
  gang->AllowSteps(1);
  WaitFor(wide.id, StateIs(JobState::kSucceeded));
}

TEST_F(JobManagerTest, NoPreemptionThatWouldNotFreeTheNvmeBytes) {
  backend_.gated = true;
  backend_.footprint_bytes_by_preset["big"] = 100 << 20;
  options_.preemption = true;
  options_.devices = {"d0", "d1"};
  options_.host_memory_budget_bytes = 256 << 20;
  options_.nvme = {"/mnt/nvme", 60 << 20};
  StartManager();
  JobRequest tiered_high = Request("tiered-high", 5, 10);
  tiered_high.spec.model.preset = "big";
  tiered_high.spec.memory.nvme_tier = engine::NvmeTierMode::kMoments;
  Submit(kAlice, tiered_high);
  ASSERT_NE(backend_.WaitForCreated(1, kTimeout), nullptr);
  const JobRecord in_ram = Submit(kAlice, Request("in-ram", 5, 0));
  ASSERT_NE(backend_.WaitForCreated(2, kTimeout), nullptr);
  JobRequest waiting_request = tiered_high;
  waiting_request.spec.name = "tiered-waiting";
  waiting_request.priority = 5;
  const JobRecord waiting = Submit(kBob, waiting_request);
  EXPECT_FALSE(WasPreempted(*store_, in_ram.id));
  EXPECT_EQ(StateOf(in_ram.id), JobState::kRunning);
  EXPECT_EQ(StateOf(waiting.id), JobState::kQueued);
}

// Note [Stale NVMe tier directories]: a daemon killed while tiered jobs ran
// left their directories; the next start removes those of its tiered jobs
// (a finished one and one it re-queues) before any job runs, and leaves an
// entry that is no tiered job's.
TEST_F(JobManagerTest, StartRemovesStaleNvmeTierDirectories) {
  namespace fs = std::filesystem;
  const std::string tier = MakeTempDir();
  for (int seq = 1; seq <= 3; ++seq) {
    JobRecord job;
    job.seq = seq;
    job.id = absl::StrFormat("job-%06d", seq);
    job.owner = "alice";
    job.request = Request(absl::StrCat("crashed-", seq), 6);
    job.request.spec.output_dir = absl::StrCat(options_.jobs_dir, "/", job.id);
    // Jobs 1 and 2 used the tier; job 3 did not.
    job.request.spec.memory.nvme_tier =
        seq < 3 ? engine::NvmeTierMode::kMoments : engine::NvmeTierMode::kOff;
    job.state = seq == 2 ? JobState::kRunning : JobState::kFailed;
    job.create_time_unix_ms = NowUnixMs();
    job.host_memory_bytes = 1 << 20;
    MEGATRAIN_ASSERT_OK(store_->InsertJob(job, JobEvent::StateChange(job.id, job.state, "x")));
    fs::create_directories(absl::StrCat(tier, "/", job.id));
    std::ofstream(absl::StrCat(tier, "/", job.id, "/exp_avg.bin")) << "stale";
  }
  fs::create_directories(tier + "/not-ours");
  backend_.gated = true;
  options_.nvme = {tier, 60 << 20};
  StartManager();
  EXPECT_FALSE(fs::exists(tier + "/job-000001"));
  EXPECT_FALSE(fs::exists(tier + "/job-000002"));
  EXPECT_TRUE(fs::exists(tier + "/job-000003/exp_avg.bin"));  // not a tiered job
  EXPECT_TRUE(fs::exists(tier + "/not-ours"));
  // The re-queued tiered job starts after the sweep, handed the directory.
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  EXPECT_EQ(control->nvme_dir, tier);
}

// ---------------------------------------------------------------------------
// Note [Device limit]: --max_devices_per_user.

// The job on each device, in --device order, read under the manager's lock:
// a pass that a job's end or a control call ran has finished by then.
std::vector<std::string> JobsOnDevices(JobManager& manager) {
  absl::StatusOr<ManagerStatus> status = manager.GetStatus();
  EXPECT_THAT(status, IsOk());
  std::vector<std::string> jobs;
  if (status.ok()) {
    for (const DeviceState& device : status->devices) jobs.push_back(device.job_id);
  }
  return jobs;
}

// A user whose running jobs hold the limit's devices has their next job
// skipped, even with a device free; another user's job behind it starts on
// that device; the skipped job starts once its owner's devices free.
TEST_F(JobManagerTest, DeviceLimitSkipsTheOwnersNextJobWhileOthersPass) {
  backend_.gated = true;
  backend_.data_parallel = true;
  options_.devices = {"cpu", "cpu:1", "cpu:2"};
  options_.max_devices_per_user = 2;
  StartManager();
  JobRecord wide = Submit(kAlice, WideRequest("wide", 2));
  std::shared_ptr<FakeJobControl> gang = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(gang, nullptr);
  EXPECT_EQ(gang->device, "cpu,cpu:1");
  JobRecord second = Submit(kAlice, Request("second", 1));
  EXPECT_EQ(StateOf(second.id), JobState::kQueued) << "2 + 1 devices > 2";
  JobRecord bob = Submit(kBob, Request("bob", 1));
  EXPECT_EQ(StateOf(bob.id), JobState::kRunning) << "others pass a skipped job";
  EXPECT_THAT(JobsOnDevices(*manager_), ElementsAre(wide.id, wide.id, bob.id));
  std::shared_ptr<FakeJobControl> bob_control = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(bob_control, nullptr);
  EXPECT_EQ(bob_control->device, "cpu:2");

  // A free device is not enough while alice holds two.
  bob_control->AllowSteps(1);
  WaitFor(bob.id, StateIs(JobState::kSucceeded));
  EXPECT_THAT(JobsOnDevices(*manager_), ElementsAre(wide.id, wide.id, ""));
  EXPECT_EQ(StateOf(second.id), JobState::kQueued);

  gang->AllowSteps(1);
  WaitFor(wide.id, StateIs(JobState::kSucceeded));
  std::shared_ptr<FakeJobControl> next = backend_.WaitForCreated(3, kTimeout);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->spec_name, "second");
  next->AllowSteps(1);
  WaitFor(second.id, StateIs(JobState::kSucceeded));
}

// A job asking for more devices than the limit can never start: refused at
// submission with the field, the value and the limit, for an admin too (as
// the job limits bind admins), and for `all` resolved to the daemon's
// devices; nothing is stored. Up to the limit is admitted.
TEST_F(JobManagerTest, JobOverTheDeviceLimitIsRefusedAtSubmission) {
  backend_.data_parallel = true;
  options_.devices = {"cpu", "cpu:1", "cpu:2"};
  options_.max_devices_per_user = 2;
  StartManager();
  for (const Principal& who : {kAlice, kAdmin}) {
    absl::StatusOr<JobRecord> refused = manager_->Submit(who, WideRequest("three", 3), "");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << who.name;
    EXPECT_EQ(refused.status().message(),
              "train.devices 3 exceeds --max_devices_per_user 2; the job can never run on this "
              "daemon")
        << who.name;
  }
  absl::StatusOr<JobRecord> all =
      manager_->Submit(kAlice, WideRequest("all", engine::kAllDevices), "");
  EXPECT_EQ(all.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(all.status().message(),
            "train.devices 3 exceeds --max_devices_per_user 2 (train.devices: all is this "
            "daemon's 3 devices); the job can never run on this daemon");
  absl::StatusOr<JobPage> stored = manager_->List(kAdmin, JobQuery{});
  ASSERT_THAT(stored, IsOk());
  EXPECT_TRUE(stored->jobs.empty());
  JobRecord two = Submit(kAlice, WideRequest("two", 2));
  WaitFor(two.id, StateIs(JobState::kSucceeded));
}

// A cancelled gang job, plain or forced, running or queued, leaves nothing
// behind: a running one frees all its devices (and its owner's device
// count) for the next job; a queued one, waiting at the head of the queue
// for its devices, stops holding back the jobs behind it.
TEST_F(JobManagerTest, CancelledGangJobFreesAllItsDevicesForTheNextJob) {
  backend_.gated = true;
  backend_.data_parallel = true;
  options_.devices = {"cpu", "cpu:1"};
  options_.max_devices_per_user = 2;
  StartManager();
  // Running, plain then forced: the next gang job of the same user starts
  // on both devices.
  JobRecord first = Submit(kAlice, WideRequest("first", 2, 100));
  std::shared_ptr<FakeJobControl> first_control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(first_control, nullptr);
  first_control->AllowSteps(1);
  ASSERT_TRUE(first_control->WaitForStep(1, kTimeout));
  JobRecord second = Submit(kAlice, WideRequest("second", 2, 100));
  EXPECT_EQ(StateOf(second.id), JobState::kQueued);
  ASSERT_THAT(manager_->Cancel(kAlice, first.id), IsOk());
  WaitFor(first.id, StateIs(JobState::kCancelled));
  std::shared_ptr<FakeJobControl> second_control = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(second_control, nullptr);
  EXPECT_EQ(second_control->device, "cpu,cpu:1");
  // (Running a step first: a forced cancel before the job's engine exists
  // is applied as a plain one.)
  second_control->AllowSteps(1);
  ASSERT_TRUE(second_control->WaitForStep(1, kTimeout));
  JobRecord third = Submit(kAlice, WideRequest("third", 2, 1));
  ASSERT_THAT(manager_->Cancel(kAlice, second.id, /*force=*/true), IsOk());
  WaitFor(second.id, StateIs(JobState::kCancelled));
  EXPECT_EQ(second_control->last_stop(), engine::TrainingJob::StopKind::kForceCancel);
  std::shared_ptr<FakeJobControl> third_control = backend_.WaitForCreated(3, kTimeout);
  ASSERT_NE(third_control, nullptr);
  EXPECT_EQ(third_control->device, "cpu,cpu:1");
  third_control->AllowSteps(1);
  WaitFor(third.id, StateIs(JobState::kSucceeded));

  // Queued: bob runs on one device; a gang job waits for both at the head
  // of the queue and holds back a 1-device job behind it until cancelled.
  JobRecord bob = Submit(kBob, Request("bob", 100));
  ASSERT_NE(backend_.WaitForCreated(4, kTimeout), nullptr);
  for (const bool force : {false, true}) {
    JobRecord waiting = Submit(kAlice, WideRequest(force ? "forced" : "plain", 2));
    JobRecord behind = Submit(kBob, Request(force ? "behind-forced" : "behind-plain", 1));
    EXPECT_EQ(StateOf(waiting.id), JobState::kQueued);
    EXPECT_EQ(StateOf(behind.id), JobState::kQueued) << "no overtaking the gang job";
    absl::StatusOr<JobRecord> cancelled = manager_->Cancel(kAlice, waiting.id, force);
    ASSERT_THAT(cancelled, IsOk());
    EXPECT_EQ(cancelled->state, JobState::kCancelled);
    EXPECT_EQ(StateOf(behind.id), JobState::kRunning) << (force ? "forced" : "plain");
    EXPECT_THAT(JobsOnDevices(*manager_), ElementsAre(bob.id, behind.id));
    std::shared_ptr<FakeJobControl> behind_control =
        backend_.WaitForCreated(force ? 6 : 5, kTimeout);
    ASSERT_NE(behind_control, nullptr);
    EXPECT_EQ(behind_control->device, "cpu:1");
    behind_control->AllowSteps(1);
    WaitFor(behind.id, StateIs(JobState::kSucceeded));
  }
  EXPECT_THAT(backend_.created_names(),
              ElementsAre("first", "second", "third", "bob", "behind-plain", "behind-forced"));
}

// A user at the limit who suspends a job, starts another and resumes the
// first does not get more devices: the resumed job is queued and skipped
// (others pass it) until the owner's running job ends, then resumes from
// its checkpoint.
TEST_F(JobManagerTest, ResumeDoesNotGetAroundTheDeviceLimit) {
  backend_.gated = true;
  backend_.data_parallel = true;
  options_.devices = {"cpu", "cpu:1", "cpu:2", "cpu:3"};
  options_.max_devices_per_user = 2;
  StartManager();
  JobRecord held = Submit(kAlice, WideRequest("held", 2, 6));
  std::shared_ptr<FakeJobControl> held_control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(held_control, nullptr);
  held_control->AllowSteps(2);
  ASSERT_TRUE(held_control->WaitForStep(2, kTimeout));
  ASSERT_THAT(manager_->Suspend(kAlice, held.id), IsOk());
  WaitFor(held.id, StateIs(JobState::kSuspended));
  JobRecord running = Submit(kAlice, WideRequest("running", 2));
  std::shared_ptr<FakeJobControl> running_control = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(running_control, nullptr);

  absl::StatusOr<JobRecord> resumed = manager_->Resume(kAlice, held.id);
  ASSERT_THAT(resumed, IsOk());
  EXPECT_EQ(resumed->state, JobState::kQueued);
  EXPECT_EQ(StateOf(held.id), JobState::kQueued) << "two devices free, but alice holds two";
  JobRecord bob = Submit(kBob, Request("bob", 1));
  EXPECT_EQ(StateOf(bob.id), JobState::kRunning);
  EXPECT_THAT(JobsOnDevices(*manager_), ElementsAre(running.id, running.id, bob.id, ""));

  running_control->AllowSteps(1);
  WaitFor(running.id, StateIs(JobState::kSucceeded));
  // Bob's job and the resumed one are created by their own job threads:
  // either may be the third created.
  ASSERT_NE(backend_.WaitForCreated(4, kTimeout), nullptr);
  const std::vector<std::string> names = backend_.created_names();
  ASSERT_THAT(std::vector<std::string>(names.begin() + 2, names.begin() + 4),
              ::testing::UnorderedElementsAre("held", "bob"));
  std::shared_ptr<FakeJobControl> again =
      backend_.WaitForCreated(names[2] == "held" ? 3 : 4, kTimeout);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->spec_name, "held");
  EXPECT_EQ(again->start_step, 2);
  again->AllowSteps(4);
  WaitFor(held.id, StateIs(JobState::kSucceeded));
}

// A restart that lowers the limit below a job's devices (or leaves fewer
// devices than a job asks for) holds the queued and re-queued ones as
// SUSPENDED with the reason, instead of leaving them queued for ever (one
// asking for more devices than the daemon has would hold back every job
// behind it); ResumeJob refuses them with the submission's message until a
// restart allows them, and they then resume from their checkpoints.
TEST_F(JobManagerTest, RestartWithALowerDeviceLimitHoldsJobsThatCanNoLongerStart) {
  backend_.gated = true;
  backend_.data_parallel = true;
  options_.devices = {"cpu", "cpu:1"};
  StartManager();
  JobRecord running = Submit(kAlice, WideRequest("running", 2, 6));
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  control->AllowSteps(2);
  ASSERT_TRUE(control->WaitForStep(2, kTimeout));
  JobRecord queued = Submit(kAlice, WideRequest("queued", 2));
  JobRecord bob = Submit(kBob, Request("bob", 1));
  ASSERT_TRUE(manager_->Drain(kTimeout));
  manager_.reset();

  options_.max_devices_per_user = 1;
  StartManager();
  const std::string reason =
      "train.devices 2 exceeds --max_devices_per_user 1; the job can never run on this daemon";
  for (const JobRecord& job : {running, queued}) {
    absl::StatusOr<JobRecord> after = manager_->Get(kAlice, job.id);
    ASSERT_THAT(after, IsOk());
    EXPECT_EQ(after->state, JobState::kSuspended) << job.id;
    EXPECT_THAT(after->message, HasSubstr(absl::StrCat("held at start-up: ", reason)));
    EXPECT_THAT(manager_->Resume(kAlice, job.id),
                StatusIs(absl::StatusCode::kResourceExhausted, reason));
  }
  EXPECT_EQ(manager_->Get(kAlice, running.id)->resume_from,
            options_.jobs_dir + "/job-000001/step-2");
  EXPECT_EQ(StateOf(bob.id), JobState::kRunning) << "the held jobs hold back nobody";
  ASSERT_TRUE(manager_->Drain(kTimeout));
  manager_.reset();

  // Fewer devices than a job asks for: the same, with that reason.
  options_.max_devices_per_user = 0;
  options_.devices = {"cpu"};
  backend_.gated = false;
  StartManager();
  EXPECT_THAT(manager_->Resume(kAlice, running.id),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "train.devices: 2 requested, this daemon has 1 device(s) (--device); the "
                       "job can never run on this daemon"));
  WaitFor(bob.id, StateIs(JobState::kSucceeded));
  ASSERT_TRUE(manager_->Drain(kTimeout));
  manager_.reset();

  // Allowed again: resumed from its checkpoint.
  options_.devices = {"cpu", "cpu:1"};
  StartManager();
  ASSERT_THAT(manager_->Resume(kAlice, running.id), IsOk());
  WaitFor(running.id, StateIs(JobState::kSucceeded));
  EXPECT_EQ(manager_->Get(kAlice, running.id)->progress.step, 6);
  std::shared_ptr<FakeJobControl> last =
      backend_.WaitForCreated(backend_.created_count(), kTimeout);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->spec_name, "running");
  EXPECT_EQ(last->start_step, 2);
  EXPECT_EQ(StateOf(queued.id), JobState::kSuspended);
}

// The same for a restart with a smaller --host_memory_budget than a queued
// job needs: held with the numbers, so that it does not stop every
// scheduling pass (it would wait at the head of the queue for ever).
TEST_F(JobManagerTest, RestartWithASmallerBudgetHoldsJobsThatCanNoLongerStart) {
  backend_.gated = true;
  backend_.footprint_bytes_by_preset["mid"] = 2 << 20;
  StartManager();
  JobRecord running = Submit(kBob, Request("running", 100));
  ASSERT_NE(backend_.WaitForCreated(1, kTimeout), nullptr);
  JobRequest request = Request("mid", 1);
  request.spec.model.preset = "mid";
  JobRecord mid = Submit(kAlice, request);
  JobRecord small = Submit(kBob, Request("small", 1));
  ASSERT_TRUE(manager_->Drain(kTimeout));
  manager_.reset();

  options_.host_memory_budget_bytes = 1 << 20;
  backend_.gated = false;
  StartManager();
  const std::string reason =
      "job needs 2.00 MiB (2097152 bytes) of host memory but --host_memory_budget is 1.00 MiB "
      "(1048576 bytes); it can never run on this daemon";
  absl::StatusOr<JobRecord> held = manager_->Get(kAlice, mid.id);
  ASSERT_THAT(held, IsOk());
  EXPECT_EQ(held->state, JobState::kSuspended);
  EXPECT_THAT(held->message, HasSubstr(absl::StrCat("held at start-up: ", reason)));
  EXPECT_THAT(manager_->Resume(kAlice, mid.id),
              StatusIs(absl::StatusCode::kResourceExhausted, reason));
  WaitFor(running.id, StateIs(JobState::kSucceeded));
  WaitFor(small.id, StateIs(JobState::kSucceeded));
}

// A retried submission of a `train.devices: all` job (same request_id)
// returns the job the first created, whose devices were resolved.
TEST_F(JobManagerTest, RepeatedSubmitOfAnAllDevicesJobReturnsTheSameJob) {
  backend_.data_parallel = true;
  options_.devices = {"cpu", "cpu:1"};
  StartManager();
  JobRecord first = Submit(kAlice, WideRequest("all", engine::kAllDevices), "retry-1");
  EXPECT_EQ(first.request.spec.train.devices, 2);
  JobRecord again = Submit(kAlice, WideRequest("all", engine::kAllDevices), "retry-1");
  EXPECT_EQ(again.id, first.id);
}

TEST_F(JobManagerTest, NegativeDeviceLimitIsRefusedNamingTheFlag) {
  options_.max_devices_per_user = -1;
  EXPECT_THAT(JobManager::Create(options_, store_.get(), &backend_, &metrics_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--max_devices_per_user: must be >= 0 (0: no limit), got -1"));
}

}  // namespace
}  // namespace megatrain::server
