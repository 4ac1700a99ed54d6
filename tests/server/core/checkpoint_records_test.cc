// Tests of server/core/checkpoint_records.h over a real JobStore and the
// fake engine's checkpoints (one `state` file each; fake_engine_backend.h),
// without a JobManager: recording a written checkpoint, verification
// against the record, and the choice of the checkpoint a resume starts from
// with its quarantines, whose events are returned and never appended here.
#include "server/core/checkpoint_records.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/server/core/job_manager_fixture.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::server {
namespace {

namespace fs = std::filesystem;

using ::megatrain::server::testing::JobManagerFixture;
using ::megatrain::server::testing::WriteFakeCheckpoint;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::SizeIs;

class CheckpointRecordsTest : public JobManagerFixture {
 protected:
  // A SUSPENDED job in the store with recorded checkpoints at `steps`,
  // resuming from the last.
  JobRecord SuspendedJob(const std::vector<int64_t>& steps) {
    JobRecord job;
    job.seq = 1;
    job.id = JobIdForSeq(1);
    job.owner = "alice";
    job.request.spec.name = "suspended";
    job.request.spec.output_dir = (fs::path(options_.jobs_dir) / job.id).string();
    job.state = JobState::kSuspended;
    for (int64_t step : steps) job.resume_from = RecordFakeCheckpoint(job, step).dir;
    EXPECT_THAT(store_->InsertJob(job, JobEvent::StateChange(job.id, job.state, "suspended")),
                IsOk());
    return job;
  }

  static void Corrupt(const std::string& checkpoint_dir) {
    std::ofstream(fs::path(checkpoint_dir) / "state", std::ios::trunc) << "garbage";
  }

  // Events in the store's log for `job_id`.
  size_t StoredEvents(const std::string& job_id) {
    absl::StatusOr<std::vector<JobEvent>> events = store_->ListEvents(job_id, 0, 100);
    EXPECT_THAT(events, IsOk());
    return events.ok() ? events->size() : 0;
  }
};

TEST_F(CheckpointRecordsTest, SelectResumeTakesTheIntactNewestWithoutEvents) {
  const JobRecord job = SuspendedJob({2, 4});
  CheckpointRecords records(store_.get(), &backend_);

  ResumeSelection selection = records.SelectResume(job);

  ASSERT_THAT(selection.dir, IsOk());
  EXPECT_EQ(*selection.dir, job.request.spec.output_dir + "/step-4");
  EXPECT_THAT(selection.events, SizeIs(0));
}

TEST_F(CheckpointRecordsTest, SelectResumeOfAFreshStartIsEmpty) {
  JobRecord job = SuspendedJob({});
  CheckpointRecords records(store_.get(), &backend_);

  ResumeSelection selection = records.SelectResume(job);

  ASSERT_THAT(selection.dir, IsOk());
  EXPECT_EQ(*selection.dir, "");
}

TEST_F(CheckpointRecordsTest, CorruptNewestIsQuarantinedAndItsEventsReturnedNotAppended) {
  const JobRecord job = SuspendedJob({2, 4});
  Corrupt(job.request.spec.output_dir + "/step-4");
  CheckpointRecords records(store_.get(), &backend_);
  const size_t events_before = StoredEvents(job.id);

  ResumeSelection selection = records.SelectResume(job);

  ASSERT_THAT(selection.dir, IsOk());
  EXPECT_EQ(*selection.dir, job.request.spec.output_dir + "/step-2");
  ASSERT_THAT(selection.events, SizeIs(2));
  EXPECT_THAT(selection.events[0].message,
              AllOf(HasSubstr("checkpoint job-000001/step-4 failed verification at resume"),
                    HasSubstr("quarantined as")));
  EXPECT_EQ(selection.events[0].state, JobState::kSuspended);
  EXPECT_THAT(selection.events[1].message,
              HasSubstr("resuming from the newest intact checkpoint job-000001/step-2"));
  EXPECT_EQ(StoredEvents(job.id), events_before);  // the caller appends them
  EXPECT_TRUE(fs::exists(job.request.spec.output_dir + "/quarantined-step-4/state"));
  absl::StatusOr<std::vector<CheckpointRecord>> present = records.Present(job.id);
  ASSERT_THAT(present, IsOk());
  ASSERT_THAT(*present, SizeIs(1));
  EXPECT_EQ(present->front().step, 2);
}

TEST_F(CheckpointRecordsTest, NoIntactCheckpointIsDataLossNamingEachOne) {
  const JobRecord job = SuspendedJob({2, 4});
  Corrupt(job.request.spec.output_dir + "/step-2");
  Corrupt(job.request.spec.output_dir + "/step-4");
  CheckpointRecords records(store_.get(), &backend_);

  ResumeSelection selection = records.SelectResume(job);

  EXPECT_THAT(selection.dir, StatusIs(absl::StatusCode::kDataLoss,
                                      AllOf(HasSubstr("no intact checkpoint to resume from"),
                                            HasSubstr("/step-4"), HasSubstr("/step-2"))));
  EXPECT_THAT(selection.events, SizeIs(2));  // one quarantine each
}

TEST_F(CheckpointRecordsTest, UnrecordedResumeDirectoryIsRefused) {
  JobRecord job = SuspendedJob({});
  job.resume_from = job.request.spec.output_dir + "/step-9";
  WriteFakeCheckpoint(job.resume_from, 9, job.id);
  CheckpointRecords records(store_.get(), &backend_);

  EXPECT_THAT(records.SelectResume(job).dir,
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("is not a checkpoint recorded for this job")));
}

TEST_F(CheckpointRecordsTest, RecordWrittenRecordsItAndReturnsTheCheckpointEvent) {
  const JobRecord job = SuspendedJob({2});
  const engine::CheckpointInfo info =
      WriteFakeCheckpoint(job.request.spec.output_dir + "/step-6", 6, job.id);
  // Retention removed step 2: its record goes too.
  ::megatrain::testing::RemoveTestTree(job.request.spec.output_dir + "/step-2");
  CheckpointRecords records(store_.get(), &backend_);

  const JobEvent event = records.RecordWritten(job.id, job.owner, info, 1.5);

  EXPECT_EQ(event.kind, JobEvent::Kind::kCheckpoint);
  EXPECT_EQ(event.step, 6);
  EXPECT_EQ(event.checkpoint_dir, info.dir);
  EXPECT_DOUBLE_EQ(event.checkpoint_seconds, 1.5);
  absl::StatusOr<std::vector<CheckpointRecord>> recorded = store_->ListCheckpoints(job.id);
  ASSERT_THAT(recorded, IsOk());
  ASSERT_THAT(*recorded, SizeIs(1));
  EXPECT_EQ(recorded->front().step, 6);
  EXPECT_EQ(recorded->front().owner, "alice");
  EXPECT_EQ(recorded->front().manifest_xxh64, info.manifest_xxh64);
  EXPECT_EQ(records.LatestDir(job), info.dir);
}

TEST_F(CheckpointRecordsTest, FindOfAnUnrecordedStepIsNotFound) {
  const JobRecord job = SuspendedJob({2});
  CheckpointRecords records(store_.get(), &backend_);

  EXPECT_THAT(records.Find(job, 3, "job-000001/step-3"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("checkpoint 'job-000001/step-3' not found (job job-000001 has 1 "
                                 "recorded checkpoints)")));
}

TEST(CheckpointRecordsVerifyTest, RecordAndCheckpointMustAgree) {
  CheckpointRecord record;
  record.job_id = "job-000001";
  record.step = 4;
  record.dir = "/jobs/job-000001/step-4";
  record.manifest_xxh64 = 0x1234;
  engine::CheckpointInfo found;
  found.step = 4;
  found.job_id = "job-000001";
  found.manifest_xxh64 = 0x1234;
  EXPECT_THAT(CheckpointRecords::VerifyAgainstRecord(record, found), IsOk());

  engine::CheckpointInfo other_step = found;
  other_step.step = 5;
  EXPECT_THAT(CheckpointRecords::VerifyAgainstRecord(record, other_step),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("state.json: step 5, but it was recorded as step 4")));
  engine::CheckpointInfo other_job = found;
  other_job.job_id = "job-000042";
  EXPECT_THAT(CheckpointRecords::VerifyAgainstRecord(record, other_job),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("names job 'job-000042'")));
  engine::CheckpointInfo other_manifest = found;
  other_manifest.manifest_xxh64 = 0x9999;
  EXPECT_THAT(
      CheckpointRecords::VerifyAgainstRecord(record, other_manifest),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("manifest.json: XXH64 0000000000009999, but "
                                                      "0000000000001234 was recorded")));
}

TEST(CheckpointRecordsVerifyTest, LegacyRecordTrustsPathAndStep) {
  CheckpointRecord legacy;  // from before schema version 3: no hash
  legacy.job_id = "job-000001";
  legacy.step = 4;
  engine::CheckpointInfo found;  // its state.json names no job
  found.step = 4;
  found.manifest_xxh64 = 0x1234;
  EXPECT_THAT(CheckpointRecords::VerifyAgainstRecord(legacy, found), IsOk());
}

}  // namespace
}  // namespace megatrain::server
