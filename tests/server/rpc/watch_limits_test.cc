// Tests of the per-user cap on WatchJob streams (server/rpc/job_service.h):
// one user cannot hold every stream, others still get theirs, and a freed
// slot is usable again. Runs the in-process daemon (daemon_harness.h).
#include <memory>
#include <string>
#include <vector>

#include "tests/server/daemon_harness.h"

namespace megatrain::server::testing {
namespace {

using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

class WatchLimitsTest : public DaemonHarness {
 protected:
  // One watch stream on its own connection; the history's first event has
  // been read, so the stream is open on the daemon.
  struct Watcher {
    std::unique_ptr<client::Connection> connection;
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader;
  };

  Watcher Open(const std::string& token, const std::string& job_id) {
    Watcher w;
    w.connection = Connect(token);
    w.context = w.connection->NewContext(kHarnessTimeout);
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    w.reader = w.connection->jobs().WatchJob(w.context.get(), request);
    return w;
  }

  static void Close(Watcher& w) {
    w.context->TryCancel();
    v1::JobEvent event;
    while (w.reader->Read(&event)) {
    }
    w.reader->Finish();
  }
};

TEST_F(WatchLimitsTest, OneUserCannotTakeEveryStream) {
  options_.max_watch_streams = 4;  // three per user: ceil(3/4 * 4)
  StartDaemon(/*gated=*/true);
  auto alice = Connect(kAliceToken);
  auto bob = Connect(kBobToken);
  const std::string alice_job = Submit(*alice, Spec("alice-job", 1000));
  const std::string bob_job = Submit(*bob, Spec("bob-job", 1000));

  std::vector<Watcher> alice_watchers;
  for (int watcher_idx = 0; watcher_idx < 3; ++watcher_idx) {
    alice_watchers.push_back(Open(kAliceToken, alice_job));
    v1::JobEvent event;
    ASSERT_TRUE(alice_watchers.back().reader->Read(&event)) << "watcher " << watcher_idx;
  }
  ASSERT_TRUE(daemon_->WaitForWatchStreams(3, kHarnessTimeout)) << daemon_->watch_streams();
  {
    Watcher refused = Open(kAliceToken, alice_job);
    v1::JobEvent event;
    EXPECT_FALSE(refused.reader->Read(&event));
    EXPECT_THAT(refused.reader->Finish(),
                GrpcStatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED,
                             "user 'alice' already has 3 WatchJob streams open (at most 3 per "
                             "user)"));
  }
  // Bob still gets the last stream.
  Watcher bob_watcher = Open(kBobToken, bob_job);
  v1::JobEvent event;
  EXPECT_TRUE(bob_watcher.reader->Read(&event));
  ASSERT_TRUE(daemon_->WaitForWatchStreams(4, kHarnessTimeout)) << daemon_->watch_streams();

  // A slot alice gives back is hers to use again.
  Close(alice_watchers[0]);
  ASSERT_TRUE(daemon_->WaitForWatchStreams(3, kHarnessTimeout)) << daemon_->watch_streams();
  Watcher again = Open(kAliceToken, alice_job);
  EXPECT_TRUE(again.reader->Read(&event));
  Close(again);
  Close(bob_watcher);
  for (size_t watcher_idx = 1; watcher_idx < alice_watchers.size(); ++watcher_idx) {
    Close(alice_watchers[watcher_idx]);
  }
  EXPECT_TRUE(daemon_->WaitForWatchStreams(0, kHarnessTimeout)) << daemon_->watch_streams();
}

TEST_F(WatchLimitsTest, PerUserFlagSetsTheCap) {
  options_.max_watch_streams = 4;
  options_.max_watch_streams_per_user = 1;
  StartDaemon(/*gated=*/true);
  auto alice = Connect(kAliceToken);
  auto bob = Connect(kBobToken);
  const std::string alice_job = Submit(*alice, Spec("alice-job", 1000));
  const std::string bob_job = Submit(*bob, Spec("bob-job", 1000));

  Watcher first = Open(kAliceToken, alice_job);
  v1::JobEvent event;
  ASSERT_TRUE(first.reader->Read(&event));
  ASSERT_TRUE(daemon_->WaitForWatchStreams(1, kHarnessTimeout)) << daemon_->watch_streams();
  {
    Watcher refused = Open(kAliceToken, alice_job);
    EXPECT_FALSE(refused.reader->Read(&event));
    EXPECT_THAT(refused.reader->Finish(),
                GrpcStatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED,
                             "user 'alice' already has 1 WatchJob streams open (at most 1 per "
                             "user)"));
  }
  Watcher bob_watcher = Open(kBobToken, bob_job);
  EXPECT_TRUE(bob_watcher.reader->Read(&event));
  ASSERT_TRUE(daemon_->WaitForWatchStreams(2, kHarnessTimeout)) << daemon_->watch_streams();
  Close(first);
  Close(bob_watcher);
  EXPECT_TRUE(daemon_->WaitForWatchStreams(0, kHarnessTimeout)) << daemon_->watch_streams();
}

TEST_F(WatchLimitsTest, PerUserFlagAboveTheTotalIsRefusedAtStart) {
  DaemonOptions options = options_;
  options.max_watch_streams = 4;
  options.max_watch_streams_per_user = 5;
  EXPECT_THAT(Daemon::Start(options, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max_watch_streams_per_user: must be in [0, "
                                 "--max_watch_streams = 4]")));
  options.max_watch_streams_per_user = -1;
  EXPECT_THAT(Daemon::Start(options, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max_watch_streams_per_user: must be in [0, ")));
}

}  // namespace
}  // namespace megatrain::server::testing
