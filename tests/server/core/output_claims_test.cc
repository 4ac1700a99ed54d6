// Issue 36: which directories a job's output_dir and an export's out_dir
// may be. An output root itself is refused (it would claim every job's
// directory below it); a job claims its directory while it is not terminal
// or has recorded checkpoints (a cancelled job without any frees it); an
// export goes outside the jobs directory and every claimed job directory.
// Over the fake engine (job_manager_fixture.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/core/job_manager.h"
#include "server/core/path_policy.h"
#include "tests/server/core/job_manager_fixture.h"
#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server::testing {
namespace {

namespace fs = std::filesystem;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

JobRequest Request(const std::string& name, const std::string& output_dir = "") {
  JobRequest request;
  request.spec.name = name;
  request.spec.model.preset = "tiny";
  request.spec.data.tokens = "/data/tiny";
  request.spec.train.max_steps = 2;
  request.spec.checkpoint.every_steps = 1;
  request.spec.checkpoint.keep_last = 5;
  request.spec.output_dir = output_dir;
  return request;
}

class OutputClaimsTest : public JobManagerFixture {
 protected:
  void SetUp() override {
    JobManagerFixture::SetUp();
    root_ = fs::canonical(MakeTempDir()).string();
    auto policy = PathPolicy::Create({}, {root_, state_dir_});
    ASSERT_THAT(policy, IsOk());
    options_.path_policy = *std::move(policy);
  }

  // Inserts a terminal job of `owner` with `output_dir` (and checkpoint
  // records at `steps`), as an earlier run of the daemon left it.
  JobRecord InsertFinished(int64_t seq, const std::string& owner, JobState state,
                           const std::string& output_dir, std::vector<int64_t> steps) {
    JobRecord job;
    job.seq = seq;
    job.id = JobIdForSeq(seq);
    job.owner = owner;
    job.request = Request("earlier", output_dir);
    job.state = state;
    job.create_time_unix_ms = NowUnixMs();
    for (int64_t step : steps) RecordFakeCheckpoint(job, step);
    EXPECT_THAT(store_->InsertJob(job, JobEvent::StateChange(job.id, job.state, "earlier")),
                IsOk());
    return job;
  }

  std::string root_;  // an output root
};

TEST_F(OutputClaimsTest, OutputDirEqualToAnOutputRootIsInvalidArgument) {
  StartManager();
  for (const std::string& dir : {root_, root_ + "/", root_ + "/."}) {
    EXPECT_THAT(manager_->Submit(kAlice, Request("root", dir), ""),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("output_dir:"), HasSubstr("is the output root"))))
        << dir;
  }
  // Below the root is fine, for every user.
  EXPECT_THAT(manager_->Submit(kAlice, Request("a", root_ + "/alice"), ""), IsOk());
  EXPECT_THAT(manager_->Submit(kBob, Request("b", root_ + "/bob"), ""), IsOk());
}

TEST_F(OutputClaimsTest, CancelledJobWithoutCheckpointsFreesItsPath) {
  InsertFinished(1, "alice", JobState::kCancelled, root_ + "/free", {});
  InsertFinished(2, "alice", JobState::kCancelled, root_ + "/kept", {3});
  StartManager();
  EXPECT_THAT(manager_->Submit(kBob, Request("reuse", root_ + "/free"), ""), IsOk());
  EXPECT_THAT(
      manager_->Submit(kBob, Request("steal", root_ + "/kept/sub"), ""),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another job's output directory")));
}

TEST_F(OutputClaimsTest, AJobWhoseDirectoryAnOlderJobClaimsFailsAtStart) {
  // As a database from before the submit-time check could hold: an older
  // job with checkpoints in root/shared, a queued one inside it.
  InsertFinished(1, "alice", JobState::kCancelled, root_ + "/shared", {2});
  const JobRecord late = InsertFinished(2, "bob", JobState::kQueued, root_ + "/shared/bob", {});
  StartManager();
  WaitFor(late.id, StateIs(JobState::kFailed));
  absl::StatusOr<JobRecord> failed = manager_->Get(kBob, late.id);
  ASSERT_THAT(failed, IsOk());
  EXPECT_THAT(failed->message, HasSubstr("overlaps the output directory of an older job"));
  EXPECT_FALSE(fs::exists(root_ + "/shared/bob"));  // nothing was created there
}

TEST_F(OutputClaimsTest, DeleteThroughASwappedParentIsRefusedAndDeletesNothing) {
  StartManager();
  const JobRecord victim = Submit(kAlice, Request("victim", root_ + "/alice/run"));
  WaitFor(victim.id, StateIs(JobState::kSucceeded));
  const JobRecord mine = Submit(kBob, Request("mine", root_ + "/bob/runs/run"));
  WaitFor(mine.id, StateIs(JobState::kSucceeded));
  // bob's runs/ becomes a link to alice's directory, which has a step-2 too.
  fs::rename(root_ + "/bob/runs", root_ + "/bob/runs.moved");
  fs::create_directory_symlink(root_ + "/alice", root_ + "/bob/runs");
  EXPECT_THAT(manager_->DeleteCheckpoint(kBob, CheckpointId(mine.id, 2)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("not deleted"), HasSubstr("symbolic link"))));
  EXPECT_TRUE(fs::exists(root_ + "/alice/run/step-2"));
}

TEST_F(OutputClaimsTest, ExportIntoAnotherJobsDirectoryOrTheJobsDirectoryIsRefused) {
  StartManager();
  const JobRecord mine = Submit(kAlice, Request("mine", root_ + "/alice"));
  WaitFor(mine.id, StateIs(JobState::kSucceeded));
  const JobRecord hers = Submit(kBob, Request("hers", root_ + "/bob"));
  WaitFor(hers.id, StateIs(JobState::kSucceeded));
  const JobRecord default_dir = Submit(kBob, Request("default"));
  WaitFor(default_dir.id, StateIs(JobState::kSucceeded));
  const std::string checkpoint = CheckpointId(mine.id, 2);
  for (const std::string& out : {root_ + "/bob/hf", root_ + "/bob/step-3", root_ + "/alice/hf"}) {
    EXPECT_THAT(manager_->ExportCheckpoint(kAlice, checkpoint, out, ""),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("out_dir:"), HasSubstr("job's directory"))))
        << out;
  }
  for (const std::string& out :
       {default_dir.request.spec.output_dir + "/hf", options_.jobs_dir + "/job-999999"}) {
    EXPECT_THAT(manager_->ExportCheckpoint(kAlice, checkpoint, out, ""),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("jobs directory")))
        << out;
    EXPECT_FALSE(fs::exists(out)) << out;
  }
  EXPECT_THAT(manager_->ExportCheckpoint(kAlice, checkpoint, root_ + "/exports/hf", ""), IsOk());
}

}  // namespace
}  // namespace megatrain::server::testing
