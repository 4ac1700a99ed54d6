// Cross-user access, one test per RPC that names a job or checkpoint: user
// bob may not Get, Watch, Cancel, Suspend, Resume, CreateCheckpoint,
// ListCheckpoints, Export or Delete user alice's job or checkpoint
// (PERMISSION_DENIED, and nothing changes), while the admin root may. An
// unknown id is NOT_FOUND for everyone. Each refusal is in the audit log
// where the RPC mutates. Runs the real daemon in-process with the fake
// engine (daemon_harness.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <future>

#include "absl/strings/str_cat.h"
#include "tests/server/daemon_harness.h"

namespace megatrain::server {
namespace {

using ::megatrain::server::testing::DaemonHarness;
using ::megatrain::server::testing::FakeJobControl;
using ::megatrain::server::testing::GrpcStatusIs;
using ::megatrain::server::testing::kAliceToken;
using ::megatrain::server::testing::kBobToken;
using ::megatrain::server::testing::kHarnessTimeout;
using ::megatrain::server::testing::kRootToken;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = kHarnessTimeout;

// The message of a refusal of bob's (auth.cc, CheckOwnerAccess).
constexpr char kDenied[] = "belongs to another user; user 'bob' may only access their own jobs";

class AccessControlTest : public DaemonHarness {
 protected:
  void SetUp() override {
    DaemonHarness::SetUp();
    StartDaemon(/*gated=*/true);
    alice_ = Connect(kAliceToken);
    bob_ = Connect(kBobToken);
    root_ = Connect(kRootToken);
    // Alice's job runs (gated) on the only device.
    job_id_ = Submit(*alice_, Spec("alices"));
    control_ = backend_->WaitForCreated(1, kTimeout);
    ASSERT_NE(control_, nullptr);
  }

  // Lets alice's job run to step 2, where it writes checkpoint step-2.
  std::string MakeCheckpoint() {
    control_->AllowSteps(2);
    EXPECT_TRUE(control_->WaitForStep(2, kTimeout));
    return job_id_ + "/step-2";
  }

  v1::JobState State() { return GetJob(*alice_, job_id_).state(); }

  // The newest audit record of `method` on `job_id`, as root reads it.
  v1::AuditRecord LastAudit(const std::string& method, const std::string& job_id) {
    v1::ListAuditRecordsRequest request;
    request.set_method(method);
    request.set_job_id(job_id);
    request.set_page_size(1);
    v1::ListAuditRecordsResponse response;
    grpc::Status status =
        root_->server().ListAuditRecords(root_->NewContext(kTimeout).get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.records_size() > 0 ? response.records(0) : v1::AuditRecord();
  }

  std::unique_ptr<client::Connection> alice_, bob_, root_;
  std::string job_id_;
  std::shared_ptr<FakeJobControl> control_;
};

TEST_F(AccessControlTest, GetJobOfAnotherUserIsDeniedAdminMayGetIt) {
  v1::GetJobRequest request;
  request.set_job_id(job_id_);
  v1::Job job;
  EXPECT_THAT(bob_->jobs().GetJob(bob_->NewContext(kTimeout).get(), request, &job),
              GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, kDenied));
  ASSERT_TRUE(root_->jobs().GetJob(root_->NewContext(kTimeout).get(), request, &job).ok());
  EXPECT_EQ(job.owner(), "alice");
}

TEST_F(AccessControlTest, UnknownJobIsNotFoundForUsersAndAdmins) {
  v1::GetJobRequest request;
  request.set_job_id("job-999999");
  v1::Job job;
  for (client::Connection* connection : {bob_.get(), root_.get()}) {
    EXPECT_THAT(connection->jobs().GetJob(connection->NewContext(kTimeout).get(), request, &job),
                GrpcStatusIs(grpc::StatusCode::NOT_FOUND, "job 'job-999999' not found"));
  }
}

TEST_F(AccessControlTest, ListJobsOfAnotherUserIsDeniedAdminListsEveryone) {
  v1::ListJobsRequest request;
  request.set_owner("alice");
  v1::ListJobsResponse response;
  EXPECT_THAT(bob_->jobs().ListJobs(bob_->NewContext(kTimeout).get(), request, &response),
              GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED,
                           "user 'bob' may only list their own jobs, not 'alice'"));
  request.clear_owner();
  ASSERT_TRUE(bob_->jobs().ListJobs(bob_->NewContext(kTimeout).get(), request, &response).ok());
  EXPECT_EQ(response.jobs_size(), 0);
  ASSERT_TRUE(root_->jobs().ListJobs(root_->NewContext(kTimeout).get(), request, &response).ok());
  ASSERT_EQ(response.jobs_size(), 1);
  EXPECT_EQ(response.jobs(0).owner(), "alice");
}

TEST_F(AccessControlTest, WatchJobOfAnotherUserIsDeniedAdminMayWatch) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id_);
  v1::JobEvent event;
  {
    auto context = bob_->NewContext(kTimeout);
    auto reader = bob_->jobs().WatchJob(context.get(), request);
    EXPECT_FALSE(reader->Read(&event));
    EXPECT_THAT(reader->Finish(), GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, kDenied));
  }
  auto context = root_->NewContext(kTimeout);
  auto reader = root_->jobs().WatchJob(context.get(), request);
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_THAT(event.state_change().message(), HasSubstr("submitted by alice"));
  context->TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(AccessControlTest, CancelJobOfAnotherUserIsDeniedAndAuditedAdminMayCancel) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id_);
  v1::Job job;
  EXPECT_THAT(bob_->jobs().CancelJob(bob_->NewContext(kTimeout).get(), request, &job),
              GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, kDenied));
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  v1::AuditRecord refused = LastAudit("CancelJob", job_id_);
  EXPECT_EQ(refused.user(), "bob");
  EXPECT_EQ(refused.role(), "user");
  EXPECT_EQ(refused.code(), "PERMISSION_DENIED");
  EXPECT_EQ(refused.target(), job_id_);
  EXPECT_THAT(refused.message(), HasSubstr(kDenied));
  EXPECT_THAT(refused.peer(), HasSubstr("127.0.0.1"));

  ASSERT_TRUE(root_->jobs().CancelJob(root_->NewContext(kTimeout).get(), request, &job).ok());
  ASSERT_TRUE(control_->WaitForEnd(kTimeout));
  v1::AuditRecord allowed = LastAudit("CancelJob", job_id_);
  EXPECT_EQ(allowed.user(), "root");
  EXPECT_EQ(allowed.role(), "admin");
  EXPECT_EQ(allowed.code(), "OK");
  EXPECT_GT(allowed.seq(), refused.seq());
}

TEST_F(AccessControlTest, SuspendJobOfAnotherUserIsDeniedAdminMaySuspend) {
  v1::SuspendJobRequest request;
  request.set_job_id(job_id_);
  v1::Job job;
  EXPECT_THAT(bob_->jobs().SuspendJob(bob_->NewContext(kTimeout).get(), request, &job),
              GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, kDenied));
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(LastAudit("SuspendJob", job_id_).code(), "PERMISSION_DENIED");
  ASSERT_TRUE(root_->jobs().SuspendJob(root_->NewContext(kTimeout).get(), request, &job).ok());
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUSPENDING);
}

TEST_F(AccessControlTest, ResumeJobOfAnotherUserIsDeniedAdminMayResume) {
  // A second job of alice's waits behind the first; she holds it.
  const std::string held = Submit(*alice_, Spec("held"));
  v1::SuspendJobRequest suspend;
  suspend.set_job_id(held);
  v1::Job job;
  ASSERT_TRUE(alice_->jobs().SuspendJob(alice_->NewContext(kTimeout).get(), suspend, &job).ok());
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUSPENDED);

  v1::ResumeJobRequest request;
  request.set_job_id(held);
  EXPECT_THAT(bob_->jobs().ResumeJob(bob_->NewContext(kTimeout).get(), request, &job),
              GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, kDenied));
  EXPECT_EQ(GetJob(*alice_, held).state(), v1::JOB_STATE_SUSPENDED);
  EXPECT_EQ(LastAudit("ResumeJob", held).user(), "bob");
  ASSERT_TRUE(root_->jobs().ResumeJob(root_->NewContext(kTimeout).get(), request, &job).ok());
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
}

TEST_F(AccessControlTest, CreateCheckpointOfAnotherUsersJobIsDeniedAdminMayCreate) {
  v1::CreateCheckpointRequest request;
  request.set_job_id(job_id_);
  v1::Checkpoint checkpoint;
  EXPECT_THAT(
      bob_->checkpoints().CreateCheckpoint(bob_->NewContext(kTimeout).get(), request, &checkpoint),
      GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, kDenied));
  EXPECT_EQ(LastAudit("CreateCheckpoint", job_id_).code(), "PERMISSION_DENIED");
  // The gated job writes the requested checkpoint at its next step
  // boundary, without a step.
  grpc::Status status = root_->checkpoints().CreateCheckpoint(root_->NewContext(kTimeout).get(),
                                                              request, &checkpoint);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(checkpoint.id(), job_id_ + "/step-0");
  v1::AuditRecord allowed = LastAudit("CreateCheckpoint", job_id_);
  EXPECT_EQ(allowed.user(), "root");
  EXPECT_EQ(allowed.target(), job_id_ + "/step-0");
}

TEST_F(AccessControlTest, ListCheckpointsOfAnotherUsersJobIsDeniedAdminMayList) {
  MakeCheckpoint();
  v1::ListCheckpointsRequest request;
  request.set_job_id(job_id_);
  v1::ListCheckpointsResponse response;
  EXPECT_THAT(
      bob_->checkpoints().ListCheckpoints(bob_->NewContext(kTimeout).get(), request, &response),
      GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, kDenied));
  ASSERT_TRUE(root_->checkpoints()
                  .ListCheckpoints(root_->NewContext(kTimeout).get(), request, &response)
                  .ok());
  ASSERT_EQ(response.checkpoints_size(), 1);
  EXPECT_EQ(response.checkpoints(0).id(), job_id_ + "/step-2");
}

TEST_F(AccessControlTest, ExportOfAnotherUsersCheckpointIsDeniedAdminMayExport) {
  const std::string checkpoint_id = MakeCheckpoint();
  v1::ExportCheckpointRequest request;
  request.set_checkpoint_id(checkpoint_id);
  request.set_out_dir(out_dir_ + "/bobs-copy");
  v1::ExportCheckpointResponse response;
  EXPECT_THAT(
      bob_->checkpoints().ExportCheckpoint(bob_->NewContext(kTimeout).get(), request, &response),
      GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, kDenied));
  EXPECT_FALSE(std::filesystem::exists(out_dir_ + "/bobs-copy"));
  v1::AuditRecord refused = LastAudit("ExportCheckpoint", job_id_);
  EXPECT_EQ(refused.target(), checkpoint_id);
  EXPECT_THAT(refused.detail(), HasSubstr("out_dir=" + out_dir_ + "/bobs-copy"));

  request.set_out_dir(out_dir_ + "/admins-copy");
  grpc::Status status =
      root_->checkpoints().ExportCheckpoint(root_->NewContext(kTimeout).get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(std::filesystem::exists(out_dir_ + "/admins-copy/config.json"));
}

TEST_F(AccessControlTest, DeleteOfAnotherUsersCheckpointIsDeniedAdminMayDelete) {
  const std::string checkpoint_id = MakeCheckpoint();
  const std::string dir = GetJob(*alice_, job_id_).spec().output_dir() + "/step-2";
  ASSERT_TRUE(std::filesystem::exists(dir));
  v1::DeleteCheckpointRequest request;
  request.set_checkpoint_id(checkpoint_id);
  v1::DeleteCheckpointResponse response;
  EXPECT_THAT(
      bob_->checkpoints().DeleteCheckpoint(bob_->NewContext(kTimeout).get(), request, &response),
      GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, kDenied));
  EXPECT_TRUE(std::filesystem::exists(dir));
  EXPECT_EQ(LastAudit("DeleteCheckpoint", job_id_).code(), "PERMISSION_DENIED");
  ASSERT_TRUE(root_->checkpoints()
                  .DeleteCheckpoint(root_->NewContext(kTimeout).get(), request, &response)
                  .ok());
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST_F(AccessControlTest, UnauthenticatedAttemptIsAuditedWithoutAUser) {
  auto anonymous = Connect("not-a-token");
  v1::CancelJobRequest request;
  request.set_job_id(job_id_);
  v1::Job job;
  EXPECT_THAT(anonymous->jobs().CancelJob(anonymous->NewContext(kTimeout).get(), request, &job),
              GrpcStatusIs(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token"));
  v1::AuditRecord record = LastAudit("CancelJob", job_id_);
  EXPECT_EQ(record.user(), "");
  EXPECT_EQ(record.code(), "UNAUTHENTICATED");
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
}

TEST_F(AccessControlTest, SubmissionsAreAuditedWithTheNewJobId) {
  v1::AuditRecord record = LastAudit("SubmitJob", job_id_);
  EXPECT_EQ(record.user(), "alice");
  EXPECT_EQ(record.code(), "OK");
  EXPECT_EQ(record.target(), job_id_);
  EXPECT_THAT(record.detail(), HasSubstr("name=alices"));
  // Reads are not audited.
  GetJob(*alice_, job_id_);
  EXPECT_EQ(LastAudit("GetJob", job_id_).seq(), 0);
}

TEST_F(AccessControlTest, OnlyAdminsReadTheAuditLog) {
  v1::ListAuditRecordsRequest request;
  v1::ListAuditRecordsResponse response;
  EXPECT_THAT(bob_->server().ListAuditRecords(bob_->NewContext(kTimeout).get(), request, &response),
              GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, "the audit log is for admins"));
  ASSERT_TRUE(
      root_->server().ListAuditRecords(root_->NewContext(kTimeout).get(), request, &response).ok());
  EXPECT_GE(response.records_size(), 1);
}

}  // namespace
}  // namespace megatrain::server
