// Hardening of the daemon's RPC surface, in-process with the fake engine
// (daemon_harness.h): message size limits both ways, calls whose deadline
// has passed do nothing, WatchJob streams end when their clients cancel,
// time out or vanish (and are counted and limited), and jobs and exports
// stay under --data_roots / --output_roots (Note [Path checks] in
// server/core/path_policy.h). No sleeps: every wait is on the daemon's stream
// count, the fake engine or an RPC, bounded by kTimeout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <thread>

#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/audit_log.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/rpc_call.h"
#include "tests/server/daemon_harness.h"

namespace megatrain::server {
namespace {

using ::megatrain::server::testing::DaemonHarness;
using ::megatrain::server::testing::FakeEngineBackend;
using ::megatrain::server::testing::GrpcStatusIs;
using ::megatrain::server::testing::kAliceToken;
using ::megatrain::server::testing::kBobToken;
using ::megatrain::server::testing::kHarnessTimeout;
using ::megatrain::server::testing::kRootToken;
using ::megatrain::server::testing::MakeTempDir;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

constexpr absl::Duration kTimeout = kHarnessTimeout;

class DaemonHardeningTest : public DaemonHarness {
 protected:
  grpc::Status SubmitStatus(client::Connection& connection, const v1::JobSpec& spec) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::Job job;
    return connection.jobs().SubmitJob(connection.NewContext(kTimeout).get(), request, &job);
  }

  // GetServerStatus answers: the daemon still serves.
  void ExpectServing(client::Connection& connection) {
    v1::ServerStatus status;
    grpc::Status rpc =
        connection.server().GetServerStatus(connection.NewContext(kTimeout).get(), {}, &status);
    EXPECT_TRUE(rpc.ok()) << rpc.error_message();
  }

  double MetricValue(client::Connection& connection, const std::string& name) {
    v1::GetMetricsRequest request;
    request.set_name_prefix(name);
    v1::GetMetricsResponse response;
    EXPECT_TRUE(connection.server()
                    .GetMetrics(connection.NewContext(kTimeout).get(), request, &response)
                    .ok());
    for (const v1::MetricFamily& family : response.families()) {
      if (family.name() == name && family.samples_size() > 0) return family.samples(0).value();
    }
    ADD_FAILURE() << "no metric " << name;
    return -1;
  }
};

// --- message size ---

TEST_F(DaemonHardeningTest, RequestLargerThanMaxMessageBytesIsResourceExhausted) {
  options_.max_message_bytes = 64 << 10;
  StartDaemon();
  auto alice = Connect(kAliceToken);
  v1::JobSpec spec = Spec("big");
  spec.set_name(std::string(100 << 10, 'x'));  // 100 KiB > 64 KiB
  EXPECT_THAT(SubmitStatus(*alice, spec),
              GrpcStatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "larger than max"));
  // Nothing was submitted, and the daemon keeps serving.
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(alice->jobs().ListJobs(alice->NewContext(kTimeout).get(), {}, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);
  EXPECT_THAT(SubmitStatus(*alice, Spec("small")), GrpcStatusIs(grpc::StatusCode::OK, ""));
}

TEST_F(DaemonHardeningTest, ResponseLargerThanMaxMessageBytesIsResourceExhausted) {
  options_.max_message_bytes = 64 << 10;
  StartDaemon();
  auto alice = Connect(kAliceToken);
  // 12 jobs with 32 labels of 250 bytes each: ~8 KiB per job, ~96 KiB in
  // one ListJobs page.
  for (int job_idx = 0; job_idx < 12; ++job_idx) {
    v1::JobSpec spec = Spec(absl::StrCat("labelled-", job_idx));
    for (int label_idx = 0; label_idx < 32; ++label_idx) {
      (*spec.mutable_labels())[absl::StrCat("k", label_idx)] = std::string(250, 'v');
    }
    ASSERT_THAT(SubmitStatus(*alice, spec), GrpcStatusIs(grpc::StatusCode::OK, ""));
  }
  v1::ListJobsResponse jobs;
  EXPECT_THAT(alice->jobs().ListJobs(alice->NewContext(kTimeout).get(), {}, &jobs),
              GrpcStatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, ""));
  // Smaller pages fit.
  v1::ListJobsRequest request;
  request.set_page_size(4);
  ASSERT_TRUE(alice->jobs().ListJobs(alice->NewContext(kTimeout).get(), request, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 4);
}

// --- deadlines ---

TEST(CheckDeadlineTest, PassedDeadlineIsDeadlineExceeded) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  EXPECT_THAT(CheckDeadline(now + kMinCallTimeLeft, now), IsOk());
  EXPECT_THAT(CheckDeadline(now + absl::Seconds(1), now), IsOk());
  EXPECT_THAT(CheckDeadline(absl::InfiniteFuture(), now), IsOk());
  // What an already-expired deadline looks like on arrival: a 1 ns timeout
  // rounded up to the next millisecond.
  EXPECT_THAT(CheckDeadline(now + absl::Milliseconds(1), now),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("had 1ms left")));
  EXPECT_THAT(CheckDeadline(now, now),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("nothing was done")));
  EXPECT_THAT(CheckDeadline(now - absl::Seconds(2), now),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("passed 2s before")));
}

TEST_F(DaemonHardeningTest, CallWithAnExpiredDeadlineIsDeadlineExceededAndDoesNothing) {
  StartDaemon();
  auto alice = Connect(kAliceToken);
  for (const absl::Duration timeout : {-absl::Seconds(1), absl::ZeroDuration()}) {
    auto context = alice->NewContext(kTimeout);
    context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = Spec("late");
    v1::Job job;
    EXPECT_THAT(alice->jobs().SubmitJob(context.get(), request, &job),
                GrpcStatusIs(grpc::StatusCode::DEADLINE_EXCEEDED, ""));
  }
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(alice->jobs().ListJobs(alice->NewContext(kTimeout).get(), {}, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);
  EXPECT_EQ(backend_->created_count(), 0);
}

// --- WatchJob streams ---

// One watcher on its own channel (its own TCP connection), like a separate
// client process.
struct Watcher {
  std::unique_ptr<client::Connection> connection;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader;
};

TEST_F(DaemonHardeningTest, WatchersThatCancelTimeOutOrVanishAreAllFreed) {
  options_.max_watch_streams = 64;
  StartDaemon(/*gated=*/true);
  auto alice = Connect(kAliceToken);
  const std::string job_id = Submit(*alice, Spec("watched", 1000));
  ASSERT_NE(backend_->WaitForCreated(1, kTimeout), nullptr);

  // 48 watchers of a job that runs until the test ends: 16 will cancel, 16
  // have a short deadline, 16 drop their connection without a word.
  constexpr int kWatchers = 48;
  // Long enough for 16 streams to open on a loaded sanitized build (10 s
  // was not: under ASan on a 2-core machine shared with other builds the
  // first deadlines expired before the last stream opened), short enough
  // to keep the test under half a minute: the deadline group opens last.
  constexpr absl::Duration kShortDeadline = absl::Seconds(25);
  std::vector<Watcher> watchers(kWatchers);
  auto open = [&](int watcher_idx, absl::Duration deadline) {
    Watcher& w = watchers[watcher_idx];
    w.connection = Connect(kAliceToken);
    w.context = w.connection->NewContext(deadline);
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    w.reader = w.connection->jobs().WatchJob(w.context.get(), request);
    v1::JobEvent event;
    EXPECT_TRUE(w.reader->Read(&event)) << "watcher " << watcher_idx;  // the history
  };
  for (int watcher_idx = 0; watcher_idx < kWatchers; ++watcher_idx) {
    if (watcher_idx % 3 != 1) open(watcher_idx, absl::InfiniteDuration());
  }
  ASSERT_TRUE(daemon_->WaitForWatchStreams(kWatchers * 2 / 3, kTimeout))
      << daemon_->watch_streams();
  for (int watcher_idx = 1; watcher_idx < kWatchers; watcher_idx += 3) {
    open(watcher_idx, kShortDeadline);
  }
  ASSERT_TRUE(daemon_->WaitForWatchStreams(kWatchers, kTimeout)) << daemon_->watch_streams();
  EXPECT_EQ(MetricValue(*alice, "megatrain_watch_streams"), kWatchers);

  for (int watcher_idx = 0; watcher_idx < kWatchers; ++watcher_idx) {
    Watcher& w = watchers[watcher_idx];
    if (watcher_idx % 3 == 0) {
      w.context->TryCancel();
      v1::JobEvent event;
      while (w.reader->Read(&event)) {
      }
      EXPECT_EQ(w.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    } else if (watcher_idx % 3 == 1) {
      // Blocks until the deadline passes; the job never ends.
      v1::JobEvent event;
      while (w.reader->Read(&event)) {
      }
      EXPECT_EQ(w.reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    } else {
      // Gone without Finish: destroying the call and the channel resets the
      // stream and closes the connection.
      w.reader.reset();
      w.context.reset();
      w.connection.reset();
    }
  }
  // The daemon notices each within a second (WatchJob's wake-up period).
  EXPECT_TRUE(daemon_->WaitForWatchStreams(0, kTimeout)) << daemon_->watch_streams();
  EXPECT_EQ(MetricValue(*alice, "megatrain_watch_streams"), 0);
  ExpectServing(*alice);
  EXPECT_EQ(GetJob(*alice, job_id).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(DaemonHardeningTest, WatchStreamsBeyondTheLimitAreResourceExhausted) {
  options_.max_watch_streams = 2;
  StartDaemon(/*gated=*/true);
  auto alice = Connect(kAliceToken);
  const std::string job_id = Submit(*alice, Spec("watched", 1000));
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  std::vector<Watcher> open(2);
  for (Watcher& w : open) {
    w.connection = Connect(kAliceToken);
    w.context = w.connection->NewContext(kTimeout);
    w.reader = w.connection->jobs().WatchJob(w.context.get(), request);
    v1::JobEvent event;
    ASSERT_TRUE(w.reader->Read(&event));
  }
  {
    auto context = alice->NewContext(kTimeout);
    auto reader = alice->jobs().WatchJob(context.get(), request);
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event));
    EXPECT_THAT(reader->Finish(), GrpcStatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                               "2 WatchJob streams (--max_watch_streams)"));
  }
  // Unary calls still pass, and a slot freed is usable again.
  ExpectServing(*alice);
  open[0].context->TryCancel();
  open[0].reader->Finish();
  ASSERT_TRUE(daemon_->WaitForWatchStreams(1, kTimeout));
  auto context = alice->NewContext(kTimeout);
  auto reader = alice->jobs().WatchJob(context.get(), request);
  v1::JobEvent event;
  EXPECT_TRUE(reader->Read(&event));
  context->TryCancel();
  reader->Finish();
}

TEST_F(DaemonHardeningTest, BadLimitFlagsAreInvalidArgument) {
  DaemonOptions options = options_;
  options.max_message_bytes = 100;
  EXPECT_THAT(Daemon::Start(options, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max_message_bytes")));
  options = options_;
  options.max_threads = 2;
  EXPECT_THAT(
      Daemon::Start(options, std::make_unique<FakeEngineBackend>()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max_threads: must be >= 8")));
  options = options_;
  options.max_threads = 16;
  options.max_watch_streams = 9;
  EXPECT_THAT(Daemon::Start(options, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max_watch_streams: must be in [1, --max_threads / 2 = 8]")));
  // The job limits: 0 is "no limit", a negative value a typo.
  for (int DaemonOptions::*limit :
       {&DaemonOptions::max_running_jobs_per_user, &DaemonOptions::max_devices_per_user,
        &DaemonOptions::max_queued_jobs_per_user, &DaemonOptions::max_queued_jobs}) {
    options = options_;
    options.*limit = -1;
    EXPECT_THAT(Daemon::Start(options, std::make_unique<FakeEngineBackend>()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(": must be >= 0 (0: no limit), got -1")));
  }
  options = options_;
  options.max_devices_per_user = -2;
  EXPECT_THAT(Daemon::Start(options, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--max_devices_per_user: must be >= 0 (0: no limit), got -2"));
}

// --- devices (Note [Device limit] in server/core/job_manager.h) ---

TEST_F(DaemonHardeningTest, DeviceLimitRefusesAtSubmitAndSkipsTheUserOverRpc) {
  options_.device = "cpu,cpu:1";
  options_.max_devices_per_user = 1;
  data_parallel_ = true;
  StartDaemon();
  auto alice = Connect(kAliceToken);
  auto bob = Connect(kBobToken);
  auto root = Connect(kRootToken);
  v1::JobSpec wide = Spec("wide");
  wide.mutable_train()->set_devices(2);
  wide.mutable_train()->set_gradient_accumulation_steps(2);
  for (client::Connection* who : {alice.get(), root.get()}) {
    grpc::Status refused = SubmitStatus(*who, wide);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(refused.error_message(),
              "train.devices 2 exceeds --max_devices_per_user 1; the job can never run on this "
              "daemon");
  }
  wide.mutable_train()->set_devices(0);  // all
  grpc::Status all = SubmitStatus(*alice, wide);
  EXPECT_EQ(all.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(all.error_message(),
            "train.devices 2 exceeds --max_devices_per_user 1 (train.devices: all is this "
            "daemon's 2 devices); the job can never run on this daemon");

  // Alice's second job waits with a device free; bob's passes it.
  const std::string first = Submit(*alice, Spec("first"));
  const std::string second = Submit(*alice, Spec("second"));
  const std::string bobs = Submit(*bob, Spec("bobs"));
  EXPECT_EQ(GetJob(*alice, first).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(GetJob(*alice, second).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(GetJob(*bob, bobs).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(GetJob(*bob, bobs).device(), "cpu:1");
}

// --- path roots ---

TEST_F(DaemonHardeningTest, SubmitOutsideTheDataRootsIsPermissionDenied) {
  StartDaemon();
  auto alice = Connect(kAliceToken);
  v1::JobSpec outside = Spec("outside");
  outside.mutable_data()->set_tokens("/etc");
  EXPECT_THAT(SubmitStatus(*alice, outside),
              GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED,
                           "data.tokens: '/etc' is outside the daemon's data roots (" + data_dir_));

  // A symbolic link inside the root that leads out of it.
  fs::create_directory_symlink("/etc", data_dir_ + "/escape");
  v1::JobSpec escape = Spec("escape");
  escape.mutable_data()->set_tokens(data_dir_ + "/escape/ssl");
  EXPECT_THAT(SubmitStatus(*alice, escape),
              GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, "resolves to '/etc/ssl'"));

  v1::JobSpec dotdot = Spec("dotdot");
  dotdot.mutable_data()->set_tokens(data_dir_ + "/../secret");
  EXPECT_THAT(SubmitStatus(*alice, dotdot),
              GrpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT,
                           "data.tokens: '..' components are not allowed"));

  v1::JobSpec output = Spec("output");
  output.set_output_dir(data_dir_ + "/run");
  EXPECT_THAT(
      SubmitStatus(*alice, output),
      GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED,
                   "output_dir: '" + data_dir_ + "/run' is outside the daemon's output roots"));

  // Inside both roots, and the default output directory, are fine.
  v1::JobSpec inside = Spec("inside");
  inside.set_output_dir(out_dir_ + "/inside");
  EXPECT_THAT(SubmitStatus(*alice, inside), GrpcStatusIs(grpc::StatusCode::OK, ""));
  EXPECT_THAT(SubmitStatus(*alice, Spec("default-output")), GrpcStatusIs(grpc::StatusCode::OK, ""));
}

TEST_F(DaemonHardeningTest, JobWhosePathEscapesAfterSubmissionFailsAtStart) {
  StartDaemon(/*gated=*/true);
  auto alice = Connect(kAliceToken);
  const std::string first = Submit(*alice, Spec("first"));  // holds the only device
  ASSERT_NE(backend_->WaitForCreated(1, kTimeout), nullptr);
  fs::create_directories(data_dir_ + "/later");
  v1::JobSpec spec = Spec("second");
  spec.mutable_data()->set_tokens(data_dir_ + "/later/shards");
  const std::string second = Submit(*alice, spec);
  // While it waits, its data directory becomes a link out of the root.
  fs::remove(data_dir_ + "/later");
  fs::create_directory_symlink("/etc", data_dir_ + "/later");
  v1::CancelJobRequest cancel;
  cancel.set_job_id(first);
  v1::Job job;
  ASSERT_TRUE(alice->jobs().CancelJob(alice->NewContext(kTimeout).get(), cancel, &job).ok());
  // The second job starts, is checked again and fails without running.
  v1::WatchJobRequest watch;
  watch.set_job_id(second);
  auto context = alice->NewContext(kTimeout);
  auto reader = alice->jobs().WatchJob(context.get(), watch);
  v1::JobEvent event;
  while (reader->Read(&event)) {
  }
  ASSERT_TRUE(reader->Finish().ok());
  v1::Job failed = GetJob(*alice, second);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.error_code(), "PERMISSION_DENIED");
  EXPECT_THAT(failed.error_message(),
              HasSubstr("data.tokens: '" + data_dir_ + "/later/shards' resolves to '/etc/shards'"));
  EXPECT_EQ(backend_->created_count(), 1);
}

TEST_F(DaemonHardeningTest, ExportOutsideTheOutputRootsIsPermissionDenied) {
  StartDaemon(/*gated=*/false);
  auto alice = Connect(kAliceToken);
  const std::string job_id = Submit(*alice, Spec("exported", 2));
  v1::WatchJobRequest watch;
  watch.set_job_id(job_id);
  auto context = alice->NewContext(kTimeout);
  auto reader = alice->jobs().WatchJob(context.get(), watch);
  v1::JobEvent event;
  while (reader->Read(&event)) {
  }
  ASSERT_TRUE(reader->Finish().ok());

  v1::ExportCheckpointRequest request;
  request.set_checkpoint_id(job_id + "/step-2");
  v1::ExportCheckpointResponse response;
  const std::string outside = fs::canonical(testing::MakeTempDir()).string() + "/hf";
  request.set_out_dir(outside);
  EXPECT_THAT(
      alice->checkpoints().ExportCheckpoint(alice->NewContext(kTimeout).get(), request, &response),
      GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED,
                   "out_dir: '" + outside + "' is outside the daemon's output roots"));
  EXPECT_FALSE(fs::exists(outside));
  request.set_out_dir(out_dir_ + "/a/../b");
  EXPECT_THAT(
      alice->checkpoints().ExportCheckpoint(alice->NewContext(kTimeout).get(), request, &response),
      GrpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT, "out_dir: '..' components"));
  request.set_out_dir(out_dir_ + "/hf");
  grpc::Status status =
      alice->checkpoints().ExportCheckpoint(alice->NewContext(kTimeout).get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(fs::exists(out_dir_ + "/hf/config.json"));
}

TEST_F(DaemonHardeningTest, WithAuthUnsetRootsDefaultToTheStateDirectory) {
  options_.data_roots.clear();
  options_.output_roots.clear();
  StartDaemon();
  const std::string state = fs::canonical(state_dir_).string();
  EXPECT_THAT(daemon_->path_policy().data_roots(), ::testing::ElementsAre(state + "/data"));
  EXPECT_THAT(daemon_->path_policy().output_roots(), ::testing::ElementsAre(state + "/jobs"));
  EXPECT_TRUE(fs::is_directory(state + "/data"));
  auto alice = Connect(kAliceToken);
  EXPECT_THAT(SubmitStatus(*alice, Spec("elsewhere")),
              GrpcStatusIs(grpc::StatusCode::PERMISSION_DENIED, "--data_roots"));
}

TEST_F(DaemonHardeningTest, WithoutAuthUnsetRootsAreUnrestricted) {
  options_.auth_tokens.clear();
  options_.data_roots.clear();
  options_.output_roots.clear();
  StartDaemon();
  EXPECT_TRUE(daemon_->path_policy().data_roots().empty());
  EXPECT_TRUE(daemon_->path_policy().output_roots().empty());
}

TEST_F(DaemonHardeningTest, AuditJsonLinesFileRecordsMutatingCalls) {
  StartDaemon();
  auto alice = Connect(kAliceToken);
  auto root = Connect(kRootToken);
  const std::string job_id = Submit(*alice, Spec("audited"));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  v1::Job job;
  ASSERT_TRUE(root->jobs().CancelJob(root->NewContext(kTimeout).get(), cancel, &job).ok());
  std::ifstream in(state_dir_ + "/audit.jsonl");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr("\"method\":\"SubmitJob\""));
  EXPECT_THAT(lines[0], HasSubstr("\"user\":\"alice\""));
  EXPECT_THAT(lines[1], HasSubstr("\"method\":\"CancelJob\""));
  EXPECT_THAT(lines[1], HasSubstr("\"user\":\"root\""));
  EXPECT_THAT(lines[1], HasSubstr("\"target\":\"" + job_id + "\""));
  EXPECT_THAT(lines[1], HasSubstr("\"code\":\"OK\""));
  EXPECT_THAT(lines[1], ::testing::ContainsRegex("\"time\":\"20[0-9-]+T[0-9:.]+Z\""));
}

// --- issue 14: nothing unbounded from untrusted callers ---

// A call of `method` ("/megatrain.v1.JobService/GetJob") carrying `payload`
// as its request bytes, whatever they are.
grpc::Status RawCall(client::Connection& connection, const std::string& method,
                     const std::string& payload) {
  grpc::internal::RpcMethod rpc(method.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Slice slice(payload);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      connection.channel().get(), rpc, connection.NewContext(kTimeout).get(), request, &response);
}

TEST_F(DaemonHardeningTest, MalformedRequestIsInvalidArgumentOnEveryMethod) {
  StartDaemon();
  auto alice = Connect(kAliceToken);
  // Field 1, length-delimited, claims 5 bytes but 2 follow: does not parse.
  const std::string truncated(
      "\x0a\x05"
      "ab",
      4);
  const std::vector<std::pair<std::string, std::string>> methods = {
      {"/megatrain.v1.JobService/SubmitJob", "megatrain.v1.SubmitJobRequest"},
      {"/megatrain.v1.JobService/GetJob", "megatrain.v1.GetJobRequest"},
      {"/megatrain.v1.JobService/ListJobs", "megatrain.v1.ListJobsRequest"},
      {"/megatrain.v1.JobService/CancelJob", "megatrain.v1.CancelJobRequest"},
      {"/megatrain.v1.JobService/SuspendJob", "megatrain.v1.SuspendJobRequest"},
      {"/megatrain.v1.JobService/ResumeJob", "megatrain.v1.ResumeJobRequest"},
      {"/megatrain.v1.JobService/WatchJob", "megatrain.v1.WatchJobRequest"},
      {"/megatrain.v1.CheckpointService/CreateCheckpoint", "megatrain.v1.CreateCheckpointRequest"},
      {"/megatrain.v1.CheckpointService/ListCheckpoints", "megatrain.v1.ListCheckpointsRequest"},
      {"/megatrain.v1.CheckpointService/ExportCheckpoint", "megatrain.v1.ExportCheckpointRequest"},
      {"/megatrain.v1.CheckpointService/DeleteCheckpoint", "megatrain.v1.DeleteCheckpointRequest"},
      {"/megatrain.v1.ServerService/GetServerStatus", "megatrain.v1.GetServerStatusRequest"},
      {"/megatrain.v1.ServerService/GetMetrics", "megatrain.v1.GetMetricsRequest"},
      {"/megatrain.v1.ServerService/ListAuditRecords", "megatrain.v1.ListAuditRecordsRequest"},
  };
  for (const auto& [method, type] : methods) {
    EXPECT_THAT(RawCall(*alice, method, truncated),
                GrpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT,
                             "the request is not a valid " + type + " message"))
        << method;
  }
  // Well-formed bytes still reach the handlers (an empty GetServerStatus
  // request; a GetJob naming no job).
  EXPECT_TRUE(RawCall(*alice, "/megatrain.v1.ServerService/GetServerStatus", "").ok());
  EXPECT_THAT(RawCall(*alice, "/megatrain.v1.JobService/GetJob", std::string("\x0a\x03job", 5)),
              GrpcStatusIs(grpc::StatusCode::NOT_FOUND, "job"));
  ExpectServing(*alice);
}

TEST_F(DaemonHardeningTest, OverlongStringsAreInvalidArgumentAndNeverStored) {
  StartDaemon();
  auto alice = Connect(kAliceToken);
  auto root = Connect(kRootToken);
  const std::string huge(1 << 20, 'j');  // 1 MiB, under --max_message_bytes
  v1::GetJobRequest get;
  get.set_job_id(huge);
  v1::Job job;
  grpc::Status status = alice->jobs().GetJob(alice->NewContext(kTimeout).get(), get, &job);
  EXPECT_THAT(status, GrpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT,
                                   "job_id: 1048576 bytes, more than the 128 allowed"));
  EXPECT_LT(status.error_message().size(), 300u) << "the reply echoes the input";

  v1::JobSpec spec = Spec("x");
  spec.set_name(std::string(kMaxJobNameBytes + 1, 'n'));
  EXPECT_THAT(SubmitStatus(*alice, spec),
              GrpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT, "spec.name: 257 bytes"));
  spec = Spec("x");
  spec.mutable_data()->set_tokens("/" + std::string(kMaxPathBytes, 'p'));
  EXPECT_THAT(SubmitStatus(*alice, spec),
              GrpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT, "data.tokens: 4097 bytes"));
  v1::ListJobsRequest list;
  list.set_page_token(std::string(kMaxPageTokenBytes + 1, 't'));
  v1::ListJobsResponse jobs;
  EXPECT_THAT(alice->jobs().ListJobs(alice->NewContext(kTimeout).get(), list, &jobs),
              GrpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT, "page_token: 257 bytes"));

  // Nothing was created; the refused CancelJob's audit record holds at most
  // the target cap of its 1 MiB id.
  ASSERT_TRUE(alice->jobs().ListJobs(alice->NewContext(kTimeout).get(), {}, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(huge);
  EXPECT_THAT(alice->jobs().CancelJob(alice->NewContext(kTimeout).get(), cancel, &job),
              GrpcStatusIs(grpc::StatusCode::INVALID_ARGUMENT, "job_id: 1048576 bytes"));
  v1::ListAuditRecordsResponse audit;
  ASSERT_TRUE(root->server().ListAuditRecords(root->NewContext(kTimeout).get(), {}, &audit).ok());
  ASSERT_GE(audit.records_size(), 1);
  const v1::AuditRecord& record = audit.records(0);
  EXPECT_EQ(record.method(), "CancelJob");
  EXPECT_EQ(record.code(), "INVALID_ARGUMENT");
  EXPECT_LE(record.target().size(), kMaxAuditTargetBytes);
  EXPECT_LE(record.job_id().size(), kMaxAuditTargetBytes);
  EXPECT_LE(record.message().size(), kMaxAuditTextBytes);
}

TEST_F(DaemonHardeningTest, RefusedAuthenticationRecordsAreRateLimitedPerPeer) {
  StartDaemon();
  auto intruder = Connect("wrong-token");
  auto root = Connect(kRootToken);
  constexpr int kCalls = 60;
  const absl::Time start = absl::Now();
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job-000001");
  for (int call_idx = 0; call_idx < kCalls; ++call_idx) {
    v1::Job job;
    ASSERT_THAT(intruder->jobs().CancelJob(intruder->NewContext(kTimeout).get(), cancel, &job),
                GrpcStatusIs(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token"));
  }
  // Refills during the loop (one per kRefusedAuthRefill) may add a few.
  const int64_t refills = (absl::Now() - start) / kRefusedAuthRefill + 1;
  v1::ListAuditRecordsRequest request;
  request.set_page_size(1000);
  v1::ListAuditRecordsResponse audit;
  ASSERT_TRUE(
      root->server().ListAuditRecords(root->NewContext(kTimeout).get(), request, &audit).ok());
  int refused = 0;
  for (const v1::AuditRecord& record : audit.records()) {
    if (record.code() == "UNAUTHENTICATED") ++refused;
  }
  EXPECT_GE(refused, kRefusedAuthBurst);
  EXPECT_LE(refused, kRefusedAuthBurst + refills);
  // Authenticated calls are recorded as ever.
  const std::string job_id = Submit(*root, Spec("after-the-flood"));
  ASSERT_TRUE(
      root->server().ListAuditRecords(root->NewContext(kTimeout).get(), request, &audit).ok());
  EXPECT_EQ(audit.records(0).target(), job_id);
}

TEST_F(DaemonHardeningTest, MutatingCallsAreRefusedWhileTheAuditLogCannotBeWritten) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  options_.audit_log = "/dev/full";  // every write fails with ENOSPC
  StartDaemon();
  auto alice = Connect(kAliceToken);
  // The first call goes ahead (nothing has failed yet); its record fails.
  const std::string job_id = Submit(*alice, Spec("first"));
  EXPECT_THAT(SubmitStatus(*alice, Spec("second")),
              GrpcStatusIs(grpc::StatusCode::UNAVAILABLE, "the audit log cannot record"));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  v1::Job job;
  EXPECT_THAT(alice->jobs().CancelJob(alice->NewContext(kTimeout).get(), cancel, &job),
              GrpcStatusIs(grpc::StatusCode::UNAVAILABLE, "No space left on device"));
  // Reads still work; the job was not cancelled.
  EXPECT_NE(GetJob(*alice, job_id).state(), v1::JOB_STATE_CANCELLED);
  ExpectServing(*alice);
}

TEST_F(DaemonHardeningTest, SecondDaemonOnTheSameAddressFailsToStart) {
  StartDaemon();
  DaemonOptions second = options_;
  second.state_dir = MakeTempDir();  // another state dir: only the port is shared
  second.listen = address_;
  EXPECT_THAT(Daemon::Start(second, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("cannot bind " + address_ + ": the address is in use")));
  auto alice = Connect(kAliceToken);
  ExpectServing(*alice);
}

mode_t ModeOf(const std::string& path) {
  struct stat info;
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return info.st_mode & 07777;
}

TEST_F(DaemonHardeningTest, StateDirectoryDatabaseAndLogsAreOwnerOnly) {
  fs::permissions(state_dir_, fs::perms::all);  // 0777, as a careless operator might
  StartDaemon();
  auto alice = Connect(kAliceToken);
  Submit(*alice, Spec("modes"));
  EXPECT_EQ(ModeOf(state_dir_), 0700u);
  for (const char* name : {"megatrain.db", "megatraind.lock", "audit.jsonl"}) {
    EXPECT_EQ(ModeOf(state_dir_ + "/" + name), 0600u) << name;
  }
  for (const char* name : {"megatrain.db-wal", "megatrain.db-shm"}) {
    if (fs::exists(state_dir_ + "/" + name)) {
      EXPECT_EQ(ModeOf(state_dir_ + "/" + name) & 077, 0u) << name;
    }
  }
}

TEST_F(DaemonHardeningTest, SecretFilesOthersMayReadAreRefusedNamingTheFix) {
  fs::permissions(options_.auth_tokens, fs::perms::others_read, fs::perm_options::add);
  EXPECT_THAT(Daemon::Start(options_, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--auth_tokens: '" + options_.auth_tokens +
                                 "' has mode 0604: other users could read or change this "
                                 "secret; run 'chmod 600 " +
                                 options_.auth_tokens + "'")));
  fs::permissions(options_.auth_tokens, fs::perms::owner_read | fs::perms::owner_write);
  options_.tls_cert = state_dir_ + "/server.pem";
  options_.tls_key = state_dir_ + "/server.key";
  std::ofstream(options_.tls_key) << "not read: its mode is checked first\n";
  fs::permissions(options_.tls_key, fs::perms::owner_read | fs::perms::owner_write |
                                        fs::perms::group_read | fs::perms::others_read);
  EXPECT_THAT(Daemon::Start(options_, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--tls_key: '" + options_.tls_key + "' has mode 0644")));
}

TEST_F(DaemonHardeningTest, NonLoopbackWithTokensNeedsTlsOrAnExplicitFlag) {
  options_.listen = "0.0.0.0:0";
  EXPECT_THAT(Daemon::Start(options_, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--allow_cleartext_tokens")));
  options_.allow_cleartext_tokens = true;
  StartDaemon();
  EXPECT_GT(daemon_->grpc_port(), 0);
}

TEST_F(DaemonHardeningTest, NearlyFullStateDiskRefusesMutatingCallsWithResourceExhausted) {
  StartDaemon();
  auto alice = Connect(kAliceToken);
  const std::string job_id = Submit(*alice, Spec("before"));
  ASSERT_TRUE(daemon_->Shutdown(kTimeout));
  daemon_.reset();
  // No file system has this much free: the state disk counts as full.
  options_.state_dir_min_free_bytes = std::numeric_limits<int64_t>::max();
  StartDaemon();
  alice = Connect(kAliceToken);
  EXPECT_THAT(SubmitStatus(*alice, Spec("after")),
              GrpcStatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED,
                           "mutating calls are refused until space is freed"));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  v1::Job job;
  EXPECT_THAT(alice->jobs().CancelJob(alice->NewContext(kTimeout).get(), cancel, &job),
              GrpcStatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "state directory"));
  // Reads go on.
  EXPECT_EQ(GetJob(*alice, job_id).id(), job_id);
  ExpectServing(*alice);
}

// --shutdown_timeout always applies: an RPC handler blocked in file I/O
// (here a checkpoint removal held by the fake backend, a stand-in for a
// hung disk) does not hold Shutdown past its timeout.
TEST_F(DaemonHardeningTest, ShutdownReturnsWithinItsTimeoutWhileAHandlerIsBlocked) {
  StartDaemon(/*gated=*/false);
  auto alice = Connect(kAliceToken);
  const std::string job_id = Submit(*alice, Spec("short", 2));
  {
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    auto context = alice->NewContext(kTimeout);
    auto reader = alice->jobs().WatchJob(context.get(), request);
    v1::JobEvent event;
    bool succeeded = false;
    while (!succeeded && reader->Read(&event)) {
      succeeded =
          event.has_state_change() && event.state_change().state() == v1::JOB_STATE_SUCCEEDED;
    }
    ASSERT_TRUE(succeeded);
    context->TryCancel();
    while (reader->Read(&event)) {
    }
    reader->Finish();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false;
  bool released = false;
  backend_->before_remove_checkpoint = [&](const std::string&) {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
  };
  std::thread deleter([&] {
    v1::DeleteCheckpointRequest request;
    request.set_checkpoint_id(job_id + "/step-2");
    v1::DeleteCheckpointResponse response;
    (void)alice->checkpoints().DeleteCheckpoint(alice->NewContext(kTimeout).get(), request,
                                                &response);
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, absl::ToChronoNanoseconds(kTimeout), [&] { return entered; }));
  }
  const absl::Time start = absl::Now();
  EXPECT_FALSE(daemon_->Shutdown(absl::Seconds(1)));
  // 1 s of timeout, 1 s for cancelled calls to unwind, and scheduling.
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  cv.notify_all();
  deleter.join();
  daemon_.reset();  // waits for the handler, now unblocked
}

}  // namespace
}  // namespace megatrain::server
