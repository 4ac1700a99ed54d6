// Tests of issue 14's storage isolation in the job manager (Notes
// [Checkpoint ownership] and [Resume verification] in server/core/job_manager.h)
// with the fake engine: output directories are exclusive, checkpoints are
// listed, exported, deleted and resumed from records only, a forged or
// replaced checkpoint is never used, a corrupt newest checkpoint is
// quarantined and the job resumes from the older one, and a lost database is
// noticed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/job_manager.h"
#include "server/core/job_store.h"
#include "tests/server/core/job_manager_fixture.h"
#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

namespace fs = std::filesystem;

using ::megatrain::server::testing::FakeEngineBackend;
using ::megatrain::server::testing::FakeJobControl;
using ::megatrain::server::testing::JobManagerFixture;
using ::megatrain::server::testing::kAdmin;
using ::megatrain::server::testing::kAlice;
using ::megatrain::server::testing::kBob;
using ::megatrain::server::testing::kTimeout;
using ::megatrain::server::testing::MakeTempDir;
using ::megatrain::server::testing::WriteFakeCheckpoint;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

JobRequest Request(const std::string& name, int64_t max_steps = 4,
                   const std::string& output_dir = "") {
  JobRequest request;
  request.spec.name = name;
  request.spec.model.preset = "tiny";
  request.spec.data.tokens = "/data/tiny";
  request.spec.train.max_steps = max_steps;
  request.spec.output_dir = output_dir;
  return request;
}

// The shared fixture (job_manager_fixture.h) plus a directory outside the
// state directory for user-chosen output directories.
class CheckpointOwnershipTest : public JobManagerFixture {
 protected:
  void SetUp() override {
    JobManagerFixture::SetUp();
    out_dir_ = MakeTempDir();
  }

  // Runs a fresh job of alice to the end (checkpoints at steps 2 and 4).
  JobRecord RunToEnd(const std::string& name) {
    JobRequest request = Request(name, 4);
    request.spec.checkpoint.every_steps = 2;
    request.spec.checkpoint.keep_last = 5;
    JobRecord job = Submit(kAlice, std::move(request));
    WaitFor(job.id, StateIs(JobState::kSucceeded));
    return job;
  }

  // Inserts a job of `owner` that a daemon left SUSPENDED with checkpoints
  // at `steps` recorded, resuming from the last one.
  JobRecord SuspendedJobWithCheckpoints(const std::string& owner, std::vector<int64_t> steps) {
    JobRecord job;
    job.seq = 1;
    job.id = JobIdForSeq(1);
    job.owner = owner;
    job.request = Request("suspended", 8);
    job.request.spec.output_dir = (fs::path(options_.jobs_dir) / job.id).string();
    job.state = JobState::kSuspended;
    job.create_time_unix_ms = NowUnixMs();
    job.host_memory_bytes = 1 << 20;
    for (int64_t step : steps) job.resume_from = RecordFakeCheckpoint(job, step).dir;
    EXPECT_THAT(store_->InsertJob(job, JobEvent::StateChange(job.id, job.state, "suspended")),
                IsOk());
    return job;
  }

  static void Corrupt(const std::string& checkpoint_dir) {
    std::ofstream(fs::path(checkpoint_dir) / "state", std::ios::trunc) << "garbage";
  }

  std::string out_dir_;
};

// --- Output directories are exclusive ---------------------------------------

TEST_F(CheckpointOwnershipTest, SubmitRefusesAnotherUsersOutputDirWithoutNamingTheJob) {
  StartManager();
  const JobRecord alice = Submit(kAlice, Request("a", 2, out_dir_ + "/run"));
  for (const std::string& dir :
       {out_dir_ + "/run", out_dir_ + "/run/", out_dir_ + "/run/sub", out_dir_}) {
    EXPECT_THAT(manager_->Submit(kBob, Request("b", 2, dir), ""),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("output_dir:"), HasSubstr("another job's output"),
                               Not(HasSubstr(alice.id)))))
        << dir;
  }
  // A sibling that only shares a prefix of the name is fine.
  EXPECT_THAT(manager_->Submit(kBob, Request("b", 2, out_dir_ + "/run2"), ""), IsOk());
}

TEST_F(CheckpointOwnershipTest, SubmitNamesTheOverlappingJobToItsOwnerAndAdmins) {
  StartManager();
  const JobRecord first = Submit(kAlice, Request("a", 2, out_dir_ + "/run"));
  WaitFor(first.id, StateIs(JobState::kSucceeded));  // any state counts
  for (const Principal& who : {kAlice, kAdmin}) {
    EXPECT_THAT(manager_->Submit(who, Request("again", 2, out_dir_ + "/run"), ""),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("output_dir:"), HasSubstr("of job " + first.id))));
  }
}

TEST_F(CheckpointOwnershipTest, SubmitRefusesOutputDirsInTheJobsDirectory) {
  StartManager();
  // Another job's default directory, and one a future job will get.
  const JobRecord first = Submit(kAlice, Request("a", 2));
  for (const std::string& dir : {first.request.spec.output_dir, options_.jobs_dir + "/job-000099",
                                 options_.jobs_dir, state_dir_}) {
    EXPECT_THAT(manager_->Submit(kBob, Request("b", 2, dir), ""),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("output_dir:"), HasSubstr("jobs directory"))))
        << dir;
  }
}

// --- Checkpoints are the records' ---------------------------------------------

TEST_F(CheckpointOwnershipTest, ListShowsOnlyRecordedCheckpointsNotForgedOnes) {
  StartManager();
  const JobRecord job = RunToEnd("a");
  // Dropped in by someone else: right name, right place, no record.
  WriteFakeCheckpoint(job.request.spec.output_dir + "/step-9", 9, job.id);
  absl::StatusOr<std::vector<CheckpointRecord>> listed = manager_->ListCheckpoints(kAlice, job.id);
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].step, 2);
  EXPECT_EQ((*listed)[1].step, 4);
  EXPECT_EQ((*listed)[1].owner, "alice");
  EXPECT_NE((*listed)[1].manifest_xxh64, 0u);

  EXPECT_THAT(manager_->ExportCheckpoint(kAlice, CheckpointId(job.id, 9), out_dir_ + "/x", ""),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("2 recorded checkpoints")));
  EXPECT_THAT(manager_->DeleteCheckpoint(kAlice, CheckpointId(job.id, 9)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  EXPECT_TRUE(fs::exists(job.request.spec.output_dir + "/step-9"));
}

TEST_F(CheckpointOwnershipTest, ExportAndDeleteUseTheRecords) {
  StartManager();
  const JobRecord job = RunToEnd("a");
  MEGATRAIN_ASSERT_OK(
      manager_->ExportCheckpoint(kAlice, CheckpointId(job.id, 4), out_dir_ + "/hf", "bf16"));
  EXPECT_TRUE(fs::exists(out_dir_ + "/hf/config.json"));
  MEGATRAIN_ASSERT_OK(manager_->DeleteCheckpoint(kAlice, CheckpointId(job.id, 2)));
  EXPECT_FALSE(fs::exists(job.request.spec.output_dir + "/step-2"));
  absl::StatusOr<std::vector<CheckpointRecord>> recorded = store_->ListCheckpoints(job.id);
  ASSERT_THAT(recorded, IsOk());
  ASSERT_EQ(recorded->size(), 1u);
  EXPECT_EQ((*recorded)[0].step, 4);
}

// Note [Export copies] in engine/formats/hf_export.h: the engine gets the job's
// model.hf_dir resolved (no link on the way); a preset job gets none.
TEST_F(CheckpointOwnershipTest, ExportPassesTheJobsResolvedModelDirectory) {
  const std::string model_dir = MakeTempDir();
  const std::string link = out_dir_ + "/model-link";
  fs::create_directory_symlink(model_dir, link);
  JobRecord job;  // as SuspendedJobWithCheckpoints, trained from `link`
  job.seq = 1;
  job.id = JobIdForSeq(1);
  job.owner = "alice";
  job.request = Request("from-hf", 8);
  job.request.spec.model.preset.clear();
  job.request.spec.model.hf_dir = link;
  job.request.spec.output_dir = (fs::path(options_.jobs_dir) / job.id).string();
  job.state = JobState::kSuspended;
  job.create_time_unix_ms = NowUnixMs();
  job.host_memory_bytes = 1 << 20;
  job.resume_from = RecordFakeCheckpoint(job, 2).dir;
  MEGATRAIN_ASSERT_OK(store_->InsertJob(job, JobEvent::StateChange(job.id, job.state, "x")));
  StartManager();

  MEGATRAIN_ASSERT_OK(
      manager_->ExportCheckpoint(kAlice, CheckpointId(job.id, 2), out_dir_ + "/hf", ""));
  const JobRecord preset = RunToEnd("preset");
  MEGATRAIN_ASSERT_OK(
      manager_->ExportCheckpoint(kAlice, CheckpointId(preset.id, 4), out_dir_ + "/hf2", ""));

  EXPECT_THAT(backend_.export_source_dirs(),
              ::testing::ElementsAre(fs::canonical(model_dir).string(), ""));
}

// model.init_from resolves through the records, as export and delete do:
// the job gets the recorded directory (not one the caller sent).
TEST_F(CheckpointOwnershipTest, InitFromResolvesAnOwnCheckpointThroughItsRecord) {
  StartManager();
  const JobRecord source = RunToEnd("a");
  JobRequest request = Request("tuned", 6);  // restore: steps 5 and 6
  request.spec.model.init_from.checkpoint = CheckpointId(source.id, 4);
  request.spec.model.init_from.optimizer = engine::InitOptimizer::kRestore;
  request.spec.model.init_from.checkpoint_dir = "/etc";  // dropped
  const JobRecord job = Submit(kAlice, request, "tune-1");
  // The same request again is the same job (the resolved directory aside).
  absl::StatusOr<JobRecord> repeat = manager_->Submit(kAlice, request, "tune-1");
  ASSERT_THAT(repeat, IsOk());
  EXPECT_EQ(repeat->id, job.id);
  absl::StatusOr<JobRecord> stored = store_->GetJob(job.id);
  ASSERT_THAT(stored, IsOk());
  const engine::InitFrom& init = stored->request.spec.model.init_from;
  EXPECT_EQ(init.checkpoint, CheckpointId(source.id, 4));
  EXPECT_EQ(init.optimizer, engine::InitOptimizer::kRestore);
  absl::StatusOr<std::vector<CheckpointRecord>> recorded = store_->ListCheckpoints(source.id);
  ASSERT_THAT(recorded, IsOk());
  ASSERT_EQ(recorded->size(), 2u);
  EXPECT_EQ((*recorded)[1].step, 4);
  EXPECT_EQ(init.checkpoint_dir, (*recorded)[1].dir);
  WaitFor(job.id, StateIs(JobState::kSucceeded));
}

TEST_F(CheckpointOwnershipTest, InitFromRefusesUnknownForeignHostileAndMismatchedCheckpoints) {
  StartManager();
  const JobRecord source = RunToEnd("a");
  const auto submit = [&](const Principal& who, const std::string& checkpoint) {
    JobRequest request = Request("tuned", 2);
    request.spec.model.init_from.checkpoint = checkpoint;
    return manager_->Submit(who, std::move(request), "").status();
  };
  EXPECT_THAT(submit(kAlice, CheckpointId(source.id, 3)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("model.init_from.checkpoint: ")));
  EXPECT_THAT(submit(kAlice, "job-000099/step-4"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("model.init_from.checkpoint: ")));
  EXPECT_THAT(
      submit(kBob, CheckpointId(source.id, 4)),
      StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("model.init_from.checkpoint: ")));
  for (const std::string hostile :
       {"../" + source.id + "/step-4", source.request.spec.output_dir + "/step-4",
        source.id + "/../step-4"}) {
    EXPECT_THAT(submit(kAlice, hostile),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("model.init_from.checkpoint: expected '<job id>/step-<step>'")))
        << hostile;
  }
  backend_.init_from_model_status =
      absl::InvalidArgumentError("model.init_from.checkpoint x: the checkpoint's model is not");
  EXPECT_THAT(submit(kAlice, CheckpointId(source.id, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model is not")));
}

// optimizer: restore goes on from the checkpoint's step: a job whose last
// step is not past it would train nothing and end SUCCEEDED, so it is
// refused at submit naming the field that set its step count; a fresh
// optimizer counts from step 1 and may run fewer steps.
TEST_F(CheckpointOwnershipTest, InitFromRestoreWithoutStepsLeftIsInvalidArgument) {
  StartManager();
  const JobRecord source = RunToEnd("a");
  const auto submit = [&](int64_t max_steps, int64_t max_tokens, engine::InitOptimizer optimizer) {
    JobRequest request = Request("tuned", max_steps);
    request.spec.train.max_tokens = max_tokens;
    request.spec.model.init_from.checkpoint = CheckpointId(source.id, 4);
    request.spec.model.init_from.optimizer = optimizer;
    return manager_->Submit(kAlice, std::move(request), "").status();
  };
  EXPECT_THAT(submit(4, 0, engine::InitOptimizer::kRestore),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("train.max_steps: 4 leaves nothing to train after "
                                       "model.init_from.checkpoint " +
                                       CheckpointId(source.id, 4)),
                             HasSubstr("give more steps than 4"))));
  // max_tokens: one step of the default shape, not past step 4.
  const JobRequest shape = Request("shape");
  const int64_t step_tokens = shape.spec.train.micro_batch * shape.spec.train.seq_len *
                              shape.spec.train.gradient_accumulation_steps;
  EXPECT_THAT(submit(0, step_tokens, engine::InitOptimizer::kRestore),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("train.max_tokens: ", step_tokens, " (1 steps)"))));
  EXPECT_THAT(submit(2, 0, engine::InitOptimizer::kFresh), IsOk());
  EXPECT_THAT(submit(5, 0, engine::InitOptimizer::kRestore), IsOk());
}

// A queued job that will start from a checkpoint (model.init_from) keeps
// it from being deleted, as a queued job's resume_from does; once the job
// is cancelled the delete goes through. Other checkpoints are deletable.
TEST_F(CheckpointOwnershipTest, DeleteOfACheckpointAQueuedJobStartsFromIsFailedPrecondition) {
  StartManager();
  const JobRecord source = RunToEnd("a");
  backend_.gated = true;  // the blocker holds the only device: "tuned" stays QUEUED
  const JobRecord blocker = Submit(kAlice, Request("blocker", 1));
  std::shared_ptr<FakeJobControl> running = backend_.WaitForCreated(2, kTimeout);
  ASSERT_NE(running, nullptr);
  JobRequest request = Request("tuned", 2);
  request.spec.model.init_from.checkpoint = CheckpointId(source.id, 4);
  const JobRecord tuned = Submit(kAlice, request);
  ASSERT_EQ(StateOf(tuned.id), JobState::kQueued);

  EXPECT_THAT(manager_->DeleteCheckpoint(kAlice, CheckpointId(source.id, 4)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is where QUEUED job " + tuned.id + " starts from")));
  EXPECT_THAT(manager_->DeleteCheckpoint(kAlice, CheckpointId(source.id, 2)), IsOk());
  ASSERT_THAT(manager_->Cancel(kAlice, tuned.id), IsOk());
  EXPECT_THAT(manager_->DeleteCheckpoint(kAlice, CheckpointId(source.id, 4)), IsOk());

  ASSERT_THAT(manager_->Cancel(kAlice, blocker.id, /*force=*/true), IsOk());
  WaitFor(blocker.id, StateIs(JobState::kCancelled));
}

TEST_F(CheckpointOwnershipTest, DeleteRemovesTheFilesWithoutTheManagersLock) {
  StartManager();
  const JobRecord job = RunToEnd("a");
  // The removal blocks (a hung disk) until released; meanwhile calls that
  // take the job manager's lock must still be answered.
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false;
  bool released = false;
  backend_.before_remove_checkpoint = [&](const std::string&) {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
  };
  std::thread deleter(
      [&] { EXPECT_THAT(manager_->DeleteCheckpoint(kAlice, CheckpointId(job.id, 2)), IsOk()); });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, absl::ToChronoNanoseconds(kTimeout), [&] { return entered; }));
  }
  // The record is gone before the files: nothing can resume from it now.
  absl::StatusOr<std::vector<CheckpointRecord>> recorded = store_->ListCheckpoints(job.id);
  ASSERT_THAT(recorded, IsOk());
  EXPECT_EQ(recorded->size(), 1u);
  // GetStatus, Submit and Resume take the lock; a held lock would hang them.
  EXPECT_THAT(manager_->GetStatus(), IsOk());
  const JobRecord bob = Submit(kBob, Request("bob", 2));
  EXPECT_FALSE(bob.id.empty());
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  cv.notify_all();
  deleter.join();
  EXPECT_FALSE(fs::exists(job.request.spec.output_dir + "/step-2"));
  backend_.before_remove_checkpoint = nullptr;
}

TEST_F(CheckpointOwnershipTest, DeleteThatCannotRemoveTheFilesKeepsTheRecord) {
  StartManager();
  const JobRecord job = RunToEnd("a");
  // The job's output_dir swapped for a symbolic link: the removal refuses
  // to go through it, and the checkpoint stays recorded for a retry.
  const std::string moved = out_dir_ + "/moved";
  fs::rename(job.request.spec.output_dir, moved);
  fs::create_directory_symlink(moved, job.request.spec.output_dir);
  EXPECT_THAT(manager_->DeleteCheckpoint(kAlice, CheckpointId(job.id, 2)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("symbolic link")));
  EXPECT_TRUE(fs::exists(moved + "/step-2"));
  absl::StatusOr<std::vector<CheckpointRecord>> recorded = store_->ListCheckpoints(job.id);
  ASSERT_THAT(recorded, IsOk());
  EXPECT_EQ(recorded->size(), 2u);
}

TEST_F(CheckpointOwnershipTest, ExportRefusesACheckpointReplacedAfterItWasRecorded) {
  StartManager();
  const JobRecord job = RunToEnd("a");
  // Same step, same place, written by another job: its state names that job.
  WriteFakeCheckpoint(job.request.spec.output_dir + "/step-4", 4, "job-000077");
  EXPECT_THAT(manager_->ExportCheckpoint(kAlice, CheckpointId(job.id, 4), out_dir_ + "/hf", ""),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("names job 'job-000077'"), HasSubstr("step-4/state.json"))));
  EXPECT_FALSE(fs::exists(out_dir_ + "/hf/config.json"));
}

TEST_F(CheckpointOwnershipTest, RetentionForgetsTheRecordsOfDeletedCheckpoints) {
  StartManager();
  JobRequest request = Request("a", 6);
  request.spec.checkpoint.every_steps = 2;
  request.spec.checkpoint.keep_last = 1;  // the fake deletes older step-* dirs
  const JobRecord job = Submit(kAlice, std::move(request));
  WaitFor(job.id, StateIs(JobState::kSucceeded));
  absl::StatusOr<std::vector<CheckpointRecord>> recorded = store_->ListCheckpoints(job.id);
  ASSERT_THAT(recorded, IsOk());
  ASSERT_EQ(recorded->size(), 1u);
  EXPECT_EQ((*recorded)[0].step, 6);
}

// --- Resume -------------------------------------------------------------------

TEST_F(CheckpointOwnershipTest, CrashRecoveryIgnoresAForgedNewerCheckpoint) {
  JobRecord job = SuspendedJobWithCheckpoints("alice", {2});
  MEGATRAIN_ASSERT_OK(store_->UpdateState(
      [&] {
        JobRecord running = job;
        running.state = JobState::kRunning;
        return running;
      }(),
      JobEvent::StateChange(job.id, JobState::kRunning, "started")));
  WriteFakeCheckpoint(job.request.spec.output_dir + "/step-6", 6, job.id);  // no record
  StartManager();
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  EXPECT_EQ(control->resume_from, job.request.spec.output_dir + "/step-2");
  EXPECT_EQ(control->job_id, job.id);
  WaitFor(job.id, StateIs(JobState::kSucceeded));
}

TEST_F(CheckpointOwnershipTest, CorruptNewestCheckpointIsQuarantinedAndTheOlderOneResumes) {
  const JobRecord job = SuspendedJobWithCheckpoints("alice", {2, 4});
  Corrupt(job.request.spec.output_dir + "/step-4");
  StartManager();
  MEGATRAIN_ASSERT_OK(manager_->Resume(kAlice, job.id).status());
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  EXPECT_EQ(control->resume_from, job.request.spec.output_dir + "/step-2");
  EXPECT_EQ(control->start_step, 2);
  std::vector<JobEvent> events = WaitFor(job.id, StateIs(JobState::kSucceeded));

  EXPECT_FALSE(fs::exists(job.request.spec.output_dir + "/step-4"));
  EXPECT_TRUE(fs::exists(job.request.spec.output_dir + "/quarantined-step-4/state"));
  bool quarantined_event = false;
  for (const JobEvent& event : events) {
    quarantined_event =
        quarantined_event || (absl::StrContains(event.message, "failed verification at resume") &&
                              absl::StrContains(event.message, "quarantined as"));
  }
  EXPECT_TRUE(quarantined_event);
  // The quarantined one is no longer the job's.
  absl::StatusOr<std::vector<CheckpointRecord>> listed = manager_->ListCheckpoints(kAlice, job.id);
  ASSERT_THAT(listed, IsOk());
  for (const CheckpointRecord& checkpoint : *listed) {
    EXPECT_NE(checkpoint.dir, job.request.spec.output_dir + "/step-4");
  }
}

TEST_F(CheckpointOwnershipTest, ResumeQuarantinesACheckpointNamingAnotherJob) {
  const JobRecord job = SuspendedJobWithCheckpoints("alice", {2, 4});
  // The newest one replaced by another job's checkpoint of the same step.
  WriteFakeCheckpoint(job.request.spec.output_dir + "/step-4", 4, "job-000042");
  StartManager();
  MEGATRAIN_ASSERT_OK(manager_->Resume(kAlice, job.id).status());
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  EXPECT_EQ(control->start_step, 2);
  WaitFor(job.id, StateIs(JobState::kSucceeded));
  EXPECT_TRUE(fs::exists(job.request.spec.output_dir + "/quarantined-step-4"));
}

TEST_F(CheckpointOwnershipTest, AllCheckpointsCorruptFailsWithDataLossNamingTheFiles) {
  const JobRecord job = SuspendedJobWithCheckpoints("alice", {2, 4});
  Corrupt(job.request.spec.output_dir + "/step-2");
  Corrupt(job.request.spec.output_dir + "/step-4");
  StartManager();
  MEGATRAIN_ASSERT_OK(manager_->Resume(kAlice, job.id).status());
  WaitFor(job.id, StateIs(JobState::kFailed));
  absl::StatusOr<JobRecord> failed = manager_->Get(kAlice, job.id);
  ASSERT_THAT(failed, IsOk());
  EXPECT_EQ(failed->state, JobState::kFailed);
  EXPECT_EQ(failed->error_code, absl::StatusCode::kDataLoss);
  EXPECT_THAT(failed->message, AllOf(HasSubstr("no intact checkpoint"), HasSubstr("step-4/state"),
                                     HasSubstr("step-2/state"), HasSubstr("quarantined as")));
  EXPECT_EQ(backend_.created_count(), 0);  // the engine never saw them
}

TEST_F(CheckpointOwnershipTest, LegacyRecordWithoutHashOrJobIdStillResumes) {
  // A record from schema version 2 (no manifest hash) of a checkpoint whose
  // state names no job (format 1 before job ids).
  JobRecord job = SuspendedJobWithCheckpoints("alice", {});
  const engine::CheckpointInfo info =
      WriteFakeCheckpoint(job.request.spec.output_dir + "/step-3", 3, "");
  CheckpointRecord legacy;
  legacy.job_id = job.id;
  legacy.step = 3;
  legacy.dir = info.dir;
  MEGATRAIN_ASSERT_OK(store_->RecordCheckpoint(legacy));
  job.resume_from = info.dir;
  MEGATRAIN_ASSERT_OK(
      store_->UpdateState(job, JobEvent::StateChange(job.id, job.state, "suspended")));
  StartManager();
  MEGATRAIN_ASSERT_OK(manager_->Resume(kAlice, job.id).status());
  std::shared_ptr<FakeJobControl> control = backend_.WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  EXPECT_EQ(control->start_step, 3);
  WaitFor(job.id, StateIs(JobState::kSucceeded));
}

// --- The database ---------------------------------------------------------------

TEST_F(CheckpointOwnershipTest, EmptyStoreBesideJobDirectoriesRefusesToStart) {
  fs::create_directories(options_.jobs_dir + "/job-000001");
  fs::create_directories(options_.jobs_dir + "/job-000002");
  EXPECT_THAT(JobManager::Create(options_, store_.get(), &backend_, &metrics_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("job database is empty"), HasSubstr("2 job directories"),
                             HasSubstr("job-000001, job-000002"),
                             HasSubstr("Restore the database from a backup"))));
}

TEST_F(CheckpointOwnershipTest, SubmitFailsClearlyWhenTheDatabaseWasDeleted) {
  StartManager();
  fs::remove(db_path_);
  EXPECT_THAT(manager_->Submit(kAlice, Request("a"), ""),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(db_path_), HasSubstr("was deleted while megatraind runs"),
                             HasSubstr("refusing to write"))));
}

}  // namespace
}  // namespace megatrain::server
