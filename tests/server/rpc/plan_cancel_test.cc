// Issue 36: an engine call under an RPC stops when its client goes (Note
// [Cancelled engine calls] in server/rpc/rpc_call.h). A real daemon plans
// (PlanJob) or sizes for admission (SubmitJob) a 4,096-layer model with the
// real engine; a probe holds the engine call at its first cancellation
// check until the call is stopped (so the outcome never depends on how fast
// the engine runs), then records what the engine returned: CANCELLED when
// the client cancels, DEADLINE_EXCEEDED when its deadline passes or the
// daemon's own bound (--max_engine_call_seconds) does for a client that
// would wait longer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/server/daemon_harness.h"

namespace megatrain::server::testing {
namespace {

using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// The fake engine, except PlanJob and the admission estimate of an hf_dir
// model: the real engine's, with their cancellation held at the first
// check until it is not OK.
class PlanProbeBackend : public FakeEngineBackend {
 public:
  absl::StatusOr<engine::JobPlan> PlanJob(const engine::PlanModel& model,
                                          const engine::JobSpec& spec,
                                          const engine::PlanMachine& machine,
                                          const engine::Cancellation& cancel) override {
    bool first = true;
    absl::StatusOr<engine::JobPlan> plan =
        real_->PlanJob(model, spec, machine, HeldAtFirstCheck(cancel, &first));
    engine_status = plan.status();
    done.Notify();
    return plan;
  }

  absl::StatusOr<engine::MemoryFootprint> EstimateFootprintFromHfConfig(
      const engine::JobSpec& spec, const std::string& hf_config_json,
      const engine::Cancellation& cancel) override {
    bool first = true;
    absl::StatusOr<engine::MemoryFootprint> footprint = real_->EstimateFootprintFromHfConfig(
        spec, hf_config_json, HeldAtFirstCheck(cancel, &first));
    engine_status = footprint.status();
    done.Notify();
    return footprint;
  }

  absl::Notification entered;  // the engine call reached its first check
  absl::Notification done;     // the engine returned engine_status
  absl::Status engine_status;  // written before done

 private:
  // `cancel`, held at its first check until it is not OK. `first` outlives
  // the engine call that checks the result.
  engine::Cancellation HeldAtFirstCheck(const engine::Cancellation& cancel, bool* first) {
    return engine::Cancellation([this, &cancel, first]() -> absl::Status {
      if (!*first) return cancel.Check();
      *first = false;
      entered.Notify();
      absl::Status status = cancel.Check();
      // Polls: gRPC signals a cancelled or expired call to a synchronous
      // handler only through ServerContext::IsCancelled. Bounded by the
      // harness timeout, so that a failure is a hang caught early.
      const absl::Time give_up = absl::Now() + kHarnessTimeout;
      while (status.ok() && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(1));
        status = cancel.Check();
      }
      return status;
    });
  }

  const std::unique_ptr<EngineBackend> real_ = NewEngineBackend();
};

class PlanCancelTest : public DaemonHarness {
 protected:
  void StartProbedDaemon() {
    auto backend = std::make_unique<PlanProbeBackend>();
    probe_ = backend.get();
    auto daemon = Daemon::Start(options_, std::move(backend));
    ASSERT_THAT(daemon, ::megatrain::testing::IsOk());
    daemon_ = *std::move(daemon);
    address_ = daemon_->grpc_address();
  }

  // A Llama-shaped model at the 4,096-layer bound (Note [Model bounds]).
  static constexpr char kLargeModelConfig[] =
      R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 1024,
          "intermediate_size": 4096, "num_attention_heads": 16,
          "num_hidden_layers": 4096})";

  static v1::PlanJobRequest LargeModelRequest() {
    v1::PlanJobRequest request;
    request.set_hf_config_json(kLargeModelConfig);
    request.mutable_machine()->set_gpu_memory_bytes(int64_t{80} << 30);
    return request;
  }

  PlanProbeBackend* probe_ = nullptr;  // owned by daemon_
};

TEST_F(PlanCancelTest, ClientCancellingMidPlanStopsTheEngineWithCancelled) {
  StartProbedDaemon();
  auto alice = Connect(kAliceToken);
  auto context = alice->NewContext(kHarnessTimeout);
  grpc::Status client_status;
  std::thread caller([&] {
    v1::PlanJobResponse response;
    client_status = alice->server().PlanJob(context.get(), LargeModelRequest(), &response);
  });
  ASSERT_TRUE(probe_->entered.WaitForNotificationWithTimeout(kHarnessTimeout));
  context->TryCancel();
  caller.join();
  EXPECT_EQ(client_status.error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(probe_->done.WaitForNotificationWithTimeout(kHarnessTimeout));
  EXPECT_THAT(probe_->engine_status,
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("PlanJob: the client cancelled")));
}

TEST_F(PlanCancelTest, ClientDeadlineMidPlanStopsTheEngineWithDeadlineExceeded) {
  StartProbedDaemon();
  auto alice = Connect(kAliceToken);
  // Long enough to reach the handler on a loaded machine; the probe holds
  // the plan until it passes whatever the plan's speed.
  auto context = alice->NewContext(absl::Seconds(3));
  v1::PlanJobResponse response;
  const grpc::Status status =
      alice->server().PlanJob(context.get(), LargeModelRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(probe_->entered.HasBeenNotified()) << "the call never reached the engine";
  ASSERT_TRUE(probe_->done.WaitForNotificationWithTimeout(kHarnessTimeout));
  EXPECT_THAT(probe_->engine_status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                                              HasSubstr("PlanJob: the call's deadline passed")));
}

TEST_F(PlanCancelTest, ACallerWithALongDeadlineIsStoppedAtTheDaemonsBound) {
  options_.max_engine_call_seconds = 0.2;
  StartProbedDaemon();
  auto alice = Connect(kAliceToken);
  // 30 s: the daemon's 0.2 s bound passes first.
  auto context = alice->NewContext(kHarnessTimeout);
  v1::PlanJobResponse response;
  const grpc::Status status =
      alice->server().PlanJob(context.get(), LargeModelRequest(), &response);
  EXPECT_THAT(status, GrpcStatusIs(grpc::StatusCode::DEADLINE_EXCEEDED,
                                   "ran past the daemon's bound of 200ms "
                                   "(--max_engine_call_seconds)"));
  ASSERT_TRUE(probe_->done.WaitForNotificationWithTimeout(kHarnessTimeout));
  EXPECT_EQ(probe_->engine_status.code(), absl::StatusCode::kDeadlineExceeded);
}

// SubmitJob's admission estimate of an hf_dir model is an engine call
// too: a client that cancels mid-estimate stops it, and nothing is queued.
TEST_F(PlanCancelTest, ClientCancellingMidSubmitStopsTheEstimateAndQueuesNothing) {
  std::filesystem::create_directories(data_dir_ + "/model");
  std::ofstream(data_dir_ + "/model/config.json") << kLargeModelConfig;
  StartProbedDaemon();
  auto alice = Connect(kAliceToken);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec("large");
  request.mutable_spec()->mutable_model()->clear_preset();
  request.mutable_spec()->mutable_model()->set_hf_dir(data_dir_ + "/model");
  auto context = alice->NewContext(kHarnessTimeout);
  grpc::Status client_status;
  std::thread caller([&] {
    v1::Job job;
    client_status = alice->jobs().SubmitJob(context.get(), request, &job);
  });
  const bool entered = probe_->entered.WaitForNotificationWithTimeout(kHarnessTimeout);
  context->TryCancel();
  caller.join();
  ASSERT_TRUE(entered) << "the submission never reached the engine's estimate: "
                       << client_status.error_message();
  EXPECT_EQ(client_status.error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(probe_->done.WaitForNotificationWithTimeout(kHarnessTimeout));
  EXPECT_THAT(probe_->engine_status,
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("SubmitJob: the client cancelled")));
  v1::ListJobsRequest list;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(alice->jobs().ListJobs(alice->NewContext(kHarnessTimeout).get(), list, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);
}

TEST_F(PlanCancelTest, AnEngineCallBoundOutsideItsRangeIsAStartUpError) {
  options_.max_engine_call_seconds = 0;
  EXPECT_THAT(Daemon::Start(options_, std::make_unique<FakeEngineBackend>()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max_engine_call_seconds: must be in (0, 3600], got 0")));
}

}  // namespace
}  // namespace megatrain::server::testing
