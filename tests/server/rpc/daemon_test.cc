// End-to-end tests of the daemon in-process: the real gRPC services, store,
// auth and /metrics, driven through the real CLI (client/cli.h) and raw gRPC,
// with the fake engine (fake_engine_backend.h) instead of training. The same
// flows run against the real engine in tests/integration/.
#include "server/rpc/daemon.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>

#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "client/connection.h"
#include "server/core/auth.h"
#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

using ::megatrain::server::testing::FakeEngineBackend;
using ::megatrain::server::testing::FakeJobControl;
using ::megatrain::server::testing::MakeTempDir;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kTimeout = absl::Seconds(30);

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

// Runs the real CLI in-process.
CliResult Cli(std::vector<std::string> args) {
  args.insert(args.begin(), "megatrain");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  std::ostringstream out, err;
  CliResult result;
  result.code = client::RunCli(static_cast<int>(argv.size()), argv.data(), out, err,
                               /*interactive=*/false);
  result.out = out.str();
  result.err = err.str();
  return result;
}

json ParseJson(const CliResult& result) {
  json parsed = json::parse(result.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(parsed.is_discarded()) << result.out << result.err;
  return parsed;
}

// Follows WatchJob until the job enters `state` (true) or the stream ends.
bool WaitForState(const std::string& address, const std::string& job_id, v1::JobState state) {
  auto connection = client::Connection::Create({address, "", false, "", "", "", ""});
  if (!connection.ok()) return false;
  auto context = (*connection)->NewContext(kTimeout);
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  auto reader = (*connection)->jobs().WatchJob(context.get(), request);
  v1::JobEvent event;
  while (reader->Read(&event)) {
    if (event.has_state_change() && event.state_change().state() == state) {
      context->TryCancel();
      reader->Finish();
      return true;
    }
  }
  reader->Finish();
  return false;
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("MEGATRAIN_TOKEN");
    unsetenv("MEGATRAIN_SERVER");
    state_dir_ = MakeTempDir();
    jobs_dir_ = MakeTempDir();
    options_.listen = "127.0.0.1:0";
    options_.metrics_listen = "127.0.0.1:0";
    options_.state_dir = state_dir_;
    options_.device = "cpu";
    options_.host_memory_budget_bytes = 64 << 20;
  }

  void StartDaemon(bool gated = false) {
    auto backend = std::make_unique<FakeEngineBackend>();
    backend->gated = gated;
    backend->footprint_bytes_by_preset["huge"] = int64_t{1} << 40;
    backend_ = backend.get();
    auto daemon = Daemon::Start(options_, std::move(backend));
    ASSERT_THAT(daemon, IsOk());
    daemon_ = *std::move(daemon);
    address_ = daemon_->grpc_address();
  }

  void StopDaemon() {
    ASSERT_TRUE(daemon_->Shutdown(kTimeout));
    daemon_.reset();
    backend_ = nullptr;
  }

  // Writes a job file next to its (fake) data and returns its path.
  std::string WriteJob(const std::string& name, const std::string& extra = "",
                       int64_t max_steps = 5, const std::string& preset = "tiny") {
    const std::string path = absl::StrCat(jobs_dir_, "/", name, ".yaml");
    std::ofstream(path) << "name: " << name << "\nmodel:\n  preset: " << preset
                        << "\ndata:\n  tokens: data/tiny\ntrain:\n  micro_batch: 8\n"
                        << "  max_steps: " << max_steps << "\n"
                        << "checkpoint:\n  every_steps: 2\n"
                        << extra;
    return path;
  }

  std::string state_dir_;
  std::string jobs_dir_;
  DaemonOptions options_;
  FakeEngineBackend* backend_ = nullptr;  // owned by daemon_
  std::unique_ptr<Daemon> daemon_;
  std::string address_;
};

TEST_F(DaemonTest, SubmitWaitSucceedsAndGetJsonShowsTheState) {
  StartDaemon();
  CliResult submit = Cli({"--server", address_, "submit", WriteJob("tiny"), "--wait"});
  ASSERT_EQ(submit.code, 0) << submit.out << submit.err;
  EXPECT_THAT(submit.out, HasSubstr("submitted job-000001"));
  EXPECT_THAT(submit.out, HasSubstr("job-000001 ended SUCCEEDED"));

  // Flags after the subcommand work too.
  CliResult get = Cli({"get", "job-000001", "--json", "--server", address_});
  ASSERT_EQ(get.code, 0) << get.err;
  json job = ParseJson(get);
  EXPECT_EQ(job["state"], "SUCCEEDED");
  EXPECT_EQ(job["owner"], "local");
  EXPECT_EQ(job["progress"]["step"], 5);
  EXPECT_EQ(job["spec"]["data"]["tokens"], jobs_dir_ + "/data/tiny");
  EXPECT_LT(job["progress"]["loss"].get<double>(), 5.0);

  CliResult human = Cli({"--server", address_, "get", "job-000001"});
  ASSERT_EQ(human.code, 0);
  EXPECT_THAT(human.out, HasSubstr("SUCCEEDED"));
}

TEST_F(DaemonTest, WatchPrintsProgressAndTheEnd) {
  StartDaemon();
  ASSERT_EQ(Cli({"--server", address_, "submit", WriteJob("tiny")}).code, 0);
  CliResult watch = Cli({"--server", address_, "watch", "job-000001"});
  ASSERT_EQ(watch.code, 0) << watch.err;
  EXPECT_THAT(watch.out, HasSubstr("job-000001 QUEUED: submitted by local"));
  EXPECT_THAT(watch.out, HasSubstr("job-000001 step 5/5"));
  EXPECT_THAT(watch.out, HasSubstr("tok/s"));
  EXPECT_THAT(watch.out, HasSubstr("checkpoint job-000001/step-2"));
  EXPECT_THAT(watch.out, HasSubstr("job-000001 ended SUCCEEDED"));

  CliResult events = Cli({"--server", address_, "--json", "watch", "job-000001"});
  ASSERT_EQ(events.code, 0);
  std::istringstream lines(events.out);
  std::string line;
  int steps = 0;
  while (std::getline(lines, line)) {
    json event = json::parse(line, nullptr, false);
    if (event.is_discarded()) continue;
    if (event["kind"] == "step") ++steps;
  }
  EXPECT_EQ(steps, 5);
}

TEST_F(DaemonTest, CheckpointsJsonListsIdsAndExportWritesADirectory) {
  StartDaemon();
  ASSERT_EQ(Cli({"--server", address_, "submit", WriteJob("tiny"), "--wait"}).code, 0);
  CliResult listed = Cli({"--server", address_, "checkpoints", "job-000001", "--json"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  json checkpoints = ParseJson(listed)["checkpoints"];
  ASSERT_EQ(checkpoints.size(), 2u);  // steps 2, 4, 5 written; keep_last 2
  EXPECT_EQ(checkpoints[0]["id"], "job-000001/step-4");
  EXPECT_EQ(checkpoints[1]["id"], "job-000001/step-5");

  const std::string out_dir = MakeTempDir() + "/hf";
  CliResult exported = Cli({"--server", address_, "export", "job-000001/step-5", "--out", out_dir});
  ASSERT_EQ(exported.code, 0) << exported.err;
  EXPECT_TRUE(std::filesystem::exists(out_dir + "/config.json"));

  CliResult missing =
      Cli({"--server", address_, "export", "job-000001/step-3", "--out", out_dir + "2"});
  EXPECT_EQ(missing.code, client::ExitCodeFor(absl::StatusCode::kNotFound));
  EXPECT_THAT(missing.err, HasSubstr("NOT_FOUND"));
}

TEST_F(DaemonTest, ListPaginatesAndAllFollowsPages) {
  StartDaemon(/*gated=*/true);
  for (int job_idx = 0; job_idx < 5; ++job_idx) {
    ASSERT_EQ(Cli({"--server", address_, "submit", WriteJob(absl::StrCat("j", job_idx))}).code, 0);
  }
  json page1 = ParseJson(Cli({"--server", address_, "list", "--page_size", "2", "--json"}));
  ASSERT_EQ(page1["jobs"].size(), 2u);
  EXPECT_EQ(page1["jobs"][0]["id"], "job-000005");
  const std::string token = page1["next_page_token"];
  ASSERT_FALSE(token.empty());
  json page2 = ParseJson(
      Cli({"--server", address_, "list", "--page_size", "2", "--page_token", token, "--json"}));
  ASSERT_EQ(page2["jobs"].size(), 2u);
  EXPECT_EQ(page2["jobs"][0]["id"], "job-000003");
  json all = ParseJson(Cli({"--server", address_, "list", "--page_size", "2", "--all", "--json"}));
  EXPECT_EQ(all["jobs"].size(), 5u);
  EXPECT_EQ(all["next_page_token"], "");
  json queued = ParseJson(Cli({"--server", address_, "list", "--state", "queued", "--json"}));
  EXPECT_EQ(queued["jobs"].size(), 4u);
  CliResult bad_state = Cli({"--server", address_, "list", "--state", "sleeping"});
  EXPECT_EQ(bad_state.code, client::kExitUsage);
  CliResult bad_token = Cli({"--server", address_, "list", "--page_token", "zzz"});
  EXPECT_EQ(bad_token.code, client::kExitUsage);  // bad input
  EXPECT_THAT(bad_token.err, HasSubstr("INVALID_ARGUMENT: page_token"));
}

TEST_F(DaemonTest, CancelSuspendResumeThroughTheCli) {
  StartDaemon(/*gated=*/true);
  ASSERT_EQ(Cli({"--server", address_, "submit", WriteJob("long", "", 4)}).code, 0);
  std::shared_ptr<FakeJobControl> control = backend_->WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  control->AllowSteps(1);
  ASSERT_TRUE(control->WaitForStep(1, kTimeout));

  CliResult suspend = Cli({"--server", address_, "suspend", "job-000001"});
  ASSERT_EQ(suspend.code, 0) << suspend.err;
  EXPECT_THAT(suspend.out, HasSubstr("SUSPENDING"));
  ASSERT_TRUE(WaitForState(address_, "job-000001", v1::JOB_STATE_SUSPENDED));
  json job = ParseJson(Cli({"--server", address_, "get", "job-000001", "--json"}));
  ASSERT_EQ(job["state"], "SUSPENDED");
  EXPECT_EQ(job["resume_from"], state_dir_ + "/jobs/job-000001/step-1");

  CliResult resume = Cli({"--server", address_, "resume", "job-000001"});
  ASSERT_EQ(resume.code, 0) << resume.err;
  std::shared_ptr<FakeJobControl> resumed = backend_->WaitForCreated(2, kTimeout);
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->start_step, 1);

  // Issue 20: resume of a job that is not SUSPENDED fails at once.
  CliResult again = Cli({"--server", address_, "resume", "job-000001"});
  EXPECT_EQ(again.code, client::ExitCodeFor(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(again.err, HasSubstr("FAILED_PRECONDITION: job job-000001 is"));
  EXPECT_THAT(again.err, HasSubstr("only SUSPENDED jobs resume"));

  CliResult cancel = Cli({"--server", address_, "cancel", "--force", "job-000001"});
  ASSERT_EQ(cancel.code, 0) << cancel.err;
  CliResult watch = Cli({"--server", address_, "watch", "job-000001"});
  EXPECT_EQ(watch.code, client::kExitJobNotSucceeded);
  EXPECT_THAT(watch.out, HasSubstr("ended CANCELLED"));
  EXPECT_EQ(resumed->last_stop(), engine::TrainingJob::StopKind::kForceCancel);
  // Status text is not an error: error_message only for FAILED.
  json job_after = ParseJson(Cli({"--server", address_, "get", "job-000001", "--json"}));
  EXPECT_EQ(job_after["error_message"], "");
  EXPECT_THAT(job_after["status_message"].get<std::string>(), HasSubstr("cancel"));
  EXPECT_THAT(watch.out, HasSubstr("forced cancel requested by"));
  // Checkpoint of a job that is not RUNNING fails at once.
  CliResult checkpoint = Cli({"--server", address_, "checkpoint", "job-000001"});
  EXPECT_EQ(checkpoint.code, client::ExitCodeFor(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(checkpoint.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(checkpoint.err, Not(HasSubstr("waiting")));
}

// Issue 20: the CLI's contract without a daemon: --version, `tokenize` in
// --help, a job file that does not load is bad input (2), and a daemon that
// is down gets a message naming the address tried and how to start one.
TEST(CliContractTest, VersionHelpBadInputAndNoDaemon) {
  CliResult version = Cli({"--version"});
  EXPECT_EQ(version.code, 0);
  EXPECT_THAT(version.out, HasSubstr(std::string("megatrain ") + client::Version()));
  CliResult help = Cli({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.out, HasSubstr("megatrain tokenize"));
  CliResult missing_file = Cli({"--server", "127.0.0.1:1", "submit", "/nonexistent/job.yaml"});
  EXPECT_EQ(missing_file.code, client::kExitUsage);
  CliResult down = Cli({"--server", "127.0.0.1:1", "--timeout", "5", "list"});
  EXPECT_EQ(down.code, client::ExitCodeFor(absl::StatusCode::kUnavailable));
  EXPECT_THAT(down.err, HasSubstr("UNAVAILABLE"));
  EXPECT_THAT(down.err, HasSubstr("no megatraind answered at 127.0.0.1:1"));
  EXPECT_THAT(down.err, HasSubstr("megatraind --state_dir=DIR --listen=127.0.0.1:1"));
}

TEST_F(DaemonTest, InvalidSpecsAreRefusedNamingTheField) {
  StartDaemon();
  CliResult bad_value =
      Cli({"--server", address_, "submit", WriteJob("bad", "optimizer:\n  lr: 0.1\n") /* valid */});
  ASSERT_EQ(bad_value.code, 0) << bad_value.err;

  const std::string zero = absl::StrCat(jobs_dir_, "/zero.yaml");
  std::ofstream(zero) << "model: {preset: tiny}\ntrain: {micro_batch: 0, max_steps: 5}\n";
  CliResult engine_refusal = Cli({"--server", address_, "submit", zero});
  EXPECT_EQ(engine_refusal.code, client::kExitUsage);
  EXPECT_THAT(engine_refusal.err,
              HasSubstr("INVALID_ARGUMENT: train.micro_batch: must be in [1, 4096], got 0"));

  const std::string not_bool = absl::StrCat(jobs_dir_, "/not-bool.yaml");
  std::ofstream(not_bool) << "model: {preset: tiny}\n"
                          << "train: {offload_activations: 3, max_steps: 5}\n";
  CliResult bad_bool = Cli({"--server", address_, "submit", not_bool});
  EXPECT_EQ(bad_bool.code, client::kExitUsage);
  EXPECT_THAT(bad_bool.err,
              HasSubstr("INVALID_ARGUMENT: " + not_bool +
                        ": train.offload_activations: expected true or false, got '3'"));

  CliResult unknown_key = Cli({"--server", address_, "submit", WriteJob("typo", "trian: {}\n")});
  EXPECT_EQ(unknown_key.code, client::kExitUsage);
  EXPECT_THAT(unknown_key.err, HasSubstr("trian: unknown key"));

  const std::string global = absl::StrCat(jobs_dir_, "/global.yaml");
  std::ofstream(global) << "model: {preset: tiny}\ntrain: {global_batch: 12, max_steps: 5}\n";
  CliResult conversion = Cli({"--server", address_, "submit", global});
  EXPECT_EQ(conversion.code, client::kExitUsage);
  EXPECT_THAT(conversion.err, HasSubstr("INVALID_ARGUMENT: train.global_batch"));
}

TEST_F(DaemonTest, JobThatCanNeverFitIsResourceExhausted) {
  StartDaemon();
  CliResult huge = Cli({"--server", address_, "submit", WriteJob("huge", "", 5, "huge")});
  EXPECT_EQ(huge.code, client::ExitCodeFor(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(huge.err, HasSubstr("RESOURCE_EXHAUSTED: job needs 1024.00 GiB"));
  EXPECT_THAT(huge.err, HasSubstr("--host_memory_budget is 64.00 MiB"));
}

TEST_F(DaemonTest, ResubmitWithTheSameRequestIdIsIdempotent) {
  StartDaemon(/*gated=*/true);
  const std::string file = WriteJob("tiny");
  json first =
      ParseJson(Cli({"--server", address_, "--json", "submit", file, "--request_id", "r1"}));
  json again =
      ParseJson(Cli({"--server", address_, "--json", "submit", file, "--request_id", "r1"}));
  EXPECT_EQ(first["id"], again["id"]);
  json listed = ParseJson(Cli({"--server", address_, "--json", "list"}));
  EXPECT_EQ(listed["jobs"].size(), 1u);
}

TEST_F(DaemonTest, StatusAndMetrics) {
  StartDaemon();
  ASSERT_EQ(Cli({"--server", address_, "submit", WriteJob("tiny"), "--wait"}).code, 0);
  json status = ParseJson(Cli({"--server", address_, "status", "--json"}));
  EXPECT_EQ(status["devices"][0]["name"], "cpu");
  EXPECT_EQ(status["host_memory"]["budget_bytes"], 64 << 20);
  EXPECT_EQ(status["queue"]["succeeded"], 1);
  EXPECT_EQ(status["caller_role"], "admin");
  EXPECT_FALSE(status["auth_enabled"].get<bool>());

  CliResult metrics = Cli({"--server", address_, "metrics", "--prefix", "megatrain_tokens"});
  ASSERT_EQ(metrics.code, 0);
  EXPECT_THAT(metrics.out, HasSubstr("megatrain_tokens_total 5120"));

  httplib::Client http("127.0.0.1", daemon_->metrics_port());
  httplib::Result scraped = http.Get("/metrics");
  ASSERT_TRUE(scraped);
  EXPECT_THAT(scraped->body, HasSubstr("megatrain_tokens_total 5120"));
  EXPECT_THAT(scraped->body, HasSubstr("megatrain_rpcs_total{code=\"OK\",method=\"SubmitJob\"} 1"));
  EXPECT_THAT(scraped->body, HasSubstr("megatrain_jobs{state=\"succeeded\"} 1"));
}

// grpc.health.v1.Health/Check through the generic stub (no health protos
// ship with Debian's gRPC): an empty HealthCheckRequest; the response
// HealthCheckResponse{status: SERVING} encodes as 08 01.
std::string HealthCheck(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty_message("");
  grpc::ByteBuffer request(&empty_message, 1);  // HealthCheckRequest{} is 0 bytes
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(status); });
  grpc::Status status = done.get_future().get();
  if (!status.ok()) return absl::StrCat("error ", status.error_code());
  std::vector<grpc::Slice> slices;
  response.Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return absl::BytesToHexString(bytes);
}

TEST_F(DaemonTest, HealthServiceReportsServing) {
  StartDaemon();
  EXPECT_EQ(HealthCheck(address_), "0801");
}

TEST_F(DaemonTest, ShutdownCheckpointsRunningJobAndRestartResumesIt) {
  StartDaemon(/*gated=*/true);
  ASSERT_EQ(Cli({"--server", address_, "submit", WriteJob("long", "", 4)}).code, 0);
  std::shared_ptr<FakeJobControl> control = backend_->WaitForCreated(1, kTimeout);
  ASSERT_NE(control, nullptr);
  control->AllowSteps(3);
  ASSERT_TRUE(control->WaitForStep(3, kTimeout));
  StopDaemon();

  options_.listen = "127.0.0.1:0";
  StartDaemon(/*gated=*/false);
  CliResult watch = Cli({"--server", address_, "watch", "job-000001"});
  ASSERT_EQ(watch.code, 0) << watch.out << watch.err;
  EXPECT_THAT(watch.out, HasSubstr("daemon shut down; re-queued, resumes from"));
  std::shared_ptr<FakeJobControl> resumed = backend_->WaitForCreated(1, kTimeout);
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->start_step, 3);
}

TEST_F(DaemonTest, SecondDaemonOnTheSameStateDirIsRefused) {
  StartDaemon();
  EXPECT_THAT(Daemon::Start(options_, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in use by another")));
}

TEST_F(DaemonTest, WithoutAuthOnlyLoopbackIsServed) {
  options_.listen = "0.0.0.0:0";
  EXPECT_THAT(Daemon::Start(options_, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("without --auth_tokens the daemon serves only loopback")));
  options_.listen = "[::1]:0";
  auto daemon = Daemon::Start(options_, std::make_unique<FakeEngineBackend>());
  if (daemon.ok()) {
    EXPECT_THAT((*daemon)->grpc_address(), HasSubstr("[::1]:"));
  } else {
    // Machines without IPv6 loopback cannot bind it; the check passed.
    EXPECT_THAT(daemon, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("--listen")));
  }
}

TEST_F(DaemonTest, BadFlagsAreInvalidArgument) {
  options_.tls_cert = "/tmp/cert.pem";
  EXPECT_THAT(Daemon::Start(options_, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls_cert and --tls_key")));
  options_.tls_cert.clear();
  options_.device = "gpu";
  EXPECT_THAT(Daemon::Start(options_, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--device")));
}

TEST(ParseByteSizeTest, AcceptsUnits) {
  EXPECT_EQ(*ParseByteSize("1000", "--x"), 1000);
  EXPECT_EQ(*ParseByteSize("2KiB", "--x"), 2048);
  EXPECT_EQ(*ParseByteSize("1.5G", "--x"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("100GB", "--x"), int64_t{100000000000});
  EXPECT_EQ(*ParseByteSize("512gib", "--x"), int64_t{512} << 30);
  EXPECT_THAT(ParseByteSize("lots", "--host_memory_budget"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--host_memory_budget")));
  EXPECT_THAT(ParseByteSize("5 parsecs", "--x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--x")));
}

// --- auth ---

class AuthDaemonTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    const std::string tokens = absl::StrCat(state_dir_, "/tokens.yaml");
    std::ofstream(tokens) << "users:\n"
                          << "  - {name: alice, role: user, token_sha256: "
                          << DigestHex(Sha256("alice-secret")) << "}\n"
                          << "  - {name: bob, role: user, token_sha256: "
                          << DigestHex(Sha256("bob-secret")) << "}\n"
                          << "  - {name: root, role: admin, token_sha256: "
                          << DigestHex(Sha256("root-secret")) << "}\n";
    // The daemon refuses a tokens file others may read.
    std::filesystem::permissions(
        tokens, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    options_.auth_tokens = tokens;
    // With auth on, jobs read only under --data_roots (the job files'
    // data/ lives in jobs_dir_).
    options_.data_roots = jobs_dir_;
  }
};

TEST_F(AuthDaemonTest, EveryRpcRefusesAMissingOrBadToken) {
  StartDaemon();
  auto connection = client::Connection::Create({address_, "", false, "", "", "", ""});
  ASSERT_THAT(connection, IsOk());
  for (const std::string& token : {std::string(""), std::string("wrong")}) {
    auto bad = client::Connection::Create({address_, token, false, "", "", "", ""});
    ASSERT_THAT(bad, IsOk());
    client::Connection& c = **bad;
    std::vector<grpc::Status> statuses;
    {
      v1::Job job;
      statuses.push_back(c.jobs().SubmitJob(c.NewContext(kTimeout).get(), {}, &job));
      statuses.push_back(c.jobs().GetJob(c.NewContext(kTimeout).get(), {}, &job));
      statuses.push_back(c.jobs().CancelJob(c.NewContext(kTimeout).get(), {}, &job));
      statuses.push_back(c.jobs().SuspendJob(c.NewContext(kTimeout).get(), {}, &job));
      statuses.push_back(c.jobs().ResumeJob(c.NewContext(kTimeout).get(), {}, &job));
      v1::ListJobsResponse list;
      statuses.push_back(c.jobs().ListJobs(c.NewContext(kTimeout).get(), {}, &list));
      auto watch_context = c.NewContext(kTimeout);
      auto reader = c.jobs().WatchJob(watch_context.get(), {});
      v1::JobEvent event;
      while (reader->Read(&event)) {
      }
      statuses.push_back(reader->Finish());
      v1::Checkpoint checkpoint;
      statuses.push_back(
          c.checkpoints().CreateCheckpoint(c.NewContext(kTimeout).get(), {}, &checkpoint));
      v1::ListCheckpointsResponse checkpoints;
      statuses.push_back(
          c.checkpoints().ListCheckpoints(c.NewContext(kTimeout).get(), {}, &checkpoints));
      v1::ExportCheckpointResponse exported;
      statuses.push_back(
          c.checkpoints().ExportCheckpoint(c.NewContext(kTimeout).get(), {}, &exported));
      v1::DeleteCheckpointResponse deleted;
      statuses.push_back(
          c.checkpoints().DeleteCheckpoint(c.NewContext(kTimeout).get(), {}, &deleted));
      v1::ServerStatus status;
      statuses.push_back(c.server().GetServerStatus(c.NewContext(kTimeout).get(), {}, &status));
      v1::GetMetricsResponse metrics;
      statuses.push_back(c.server().GetMetrics(c.NewContext(kTimeout).get(), {}, &metrics));
    }
    ASSERT_EQ(statuses.size(), 13u);
    for (size_t rpc_idx = 0; rpc_idx < statuses.size(); ++rpc_idx) {
      EXPECT_EQ(statuses[rpc_idx].error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << "rpc #" << rpc_idx << " token '" << token
          << "': " << statuses[rpc_idx].error_message();
    }
  }
}

TEST_F(AuthDaemonTest, UsersManageOnlyTheirJobsAdminsAll) {
  StartDaemon(/*gated=*/true);
  const std::string file = WriteJob("alices");
  CliResult submitted = Cli({"--server", address_, "--token", "alice-secret", "submit", file});
  ASSERT_EQ(submitted.code, 0) << submitted.err;

  CliResult no_token = Cli({"--server", address_, "get", "job-000001"});
  EXPECT_EQ(no_token.code, client::ExitCodeFor(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(no_token.err, HasSubstr("UNAUTHENTICATED: missing bearer token"));
  CliResult bad_token = Cli({"--server", address_, "--token", "nope", "get", "job-000001"});
  EXPECT_THAT(bad_token.err, HasSubstr("UNAUTHENTICATED: invalid bearer token"));

  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"get", "job-000001"},
        {"cancel", "job-000001"},
        {"suspend", "job-000001"},
        {"resume", "job-000001"},
        {"watch", "job-000001"},
        {"checkpoints", "job-000001"},
        {"checkpoint", "job-000001"},
        {"export", "job-000001/step-0", "--out", jobs_dir_ + "/export"},
        {"delete-checkpoint", "job-000001/step-0"},
        {"list", "--owner", "alice"}}) {
    std::vector<std::string> args = {"--server", address_, "--token", "bob-secret"};
    args.insert(args.end(), command.begin(), command.end());
    CliResult denied = Cli(args);
    EXPECT_EQ(denied.code, client::ExitCodeFor(absl::StatusCode::kPermissionDenied)) << command[0];
    EXPECT_THAT(denied.err, HasSubstr("PERMISSION_DENIED")) << command[0];
  }

  // The token also comes from MEGATRAIN_TOKEN.
  setenv("MEGATRAIN_TOKEN", "bob-secret", 1);
  json bobs = ParseJson(Cli({"--server", address_, "list", "--json"}));
  unsetenv("MEGATRAIN_TOKEN");
  EXPECT_EQ(bobs["jobs"].size(), 0u);

  json admin = ParseJson(
      Cli({"--server", address_, "--token", "root-secret", "get", "job-000001", "--json"}));
  EXPECT_EQ(admin["owner"], "alice");
  CliResult admin_cancel =
      Cli({"--server", address_, "--token", "root-secret", "cancel", "job-000001"});
  EXPECT_EQ(admin_cancel.code, 0) << admin_cancel.err;
  json status =
      ParseJson(Cli({"--server", address_, "--token", "alice-secret", "status", "--json"}));
  EXPECT_EQ(status["caller"], "alice");
  EXPECT_TRUE(status["auth_enabled"].get<bool>());
}

TEST_F(AuthDaemonTest, WithAuthAnyAddressMayBeServedOnceCleartextTokensAreAllowed) {
  options_.listen = "0.0.0.0:0";
  EXPECT_THAT(Daemon::Start(options_, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bearer tokens would cross the network in clear")));
  options_.allow_cleartext_tokens = true;
  StartDaemon();
  EXPECT_GT(daemon_->grpc_port(), 0);
}

// --- TLS ---

// Self-signed certificates made with the openssl CLI (the test is skipped
// where it is missing). A self-signed certificate is its own CA, so the
// server's doubles as the client's trust root and the client's as the
// server's --tls_client_ca.
class TlsDaemonTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    if (std::system("openssl version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl CLI";
    for (const std::string name : {"server", "client"}) {
      const std::string command =
          absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=", name,
                       " -addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout ", state_dir_,
                       "/", name, ".key -out ", state_dir_, "/", name, ".pem > /dev/null 2>&1");
      ASSERT_EQ(std::system(command.c_str()), 0) << command;
    }
    options_.tls_cert = state_dir_ + "/server.pem";
    options_.tls_key = state_dir_ + "/server.key";
  }
};

TEST_F(TlsDaemonTest, ServesTlsToClientsTrustingItsCertificate) {
  StartDaemon();
  CliResult trusted =
      Cli({"--server", address_, "--tls_ca", state_dir_ + "/server.pem", "status", "--json"});
  ASSERT_EQ(trusted.code, 0) << trusted.err;
  EXPECT_EQ(ParseJson(trusted)["version"], kVersion);
  CliResult plaintext = Cli({"--server", address_, "--timeout", "5", "status"});
  EXPECT_EQ(plaintext.code, client::ExitCodeFor(absl::StatusCode::kUnavailable));
  EXPECT_THAT(plaintext.err, HasSubstr("UNAVAILABLE"));
}

TEST_F(TlsDaemonTest, MutualTlsRequiresAClientCertificate) {
  options_.tls_client_ca = state_dir_ + "/client.pem";
  StartDaemon();
  CliResult with_cert =
      Cli({"--server", address_, "--tls_ca", state_dir_ + "/server.pem", "--tls_cert",
           state_dir_ + "/client.pem", "--tls_key", state_dir_ + "/client.key", "status"});
  EXPECT_EQ(with_cert.code, 0) << with_cert.err;
  CliResult without_cert = Cli(
      {"--server", address_, "--timeout", "5", "--tls_ca", state_dir_ + "/server.pem", "status"});
  EXPECT_EQ(without_cert.code, client::ExitCodeFor(absl::StatusCode::kUnavailable));
  EXPECT_THAT(without_cert.err, HasSubstr("UNAVAILABLE"));
}

TEST_F(TlsDaemonTest, MissingKeyFileIsNotFound) {
  options_.tls_key = state_dir_ + "/nonexistent.key";
  EXPECT_THAT(Daemon::Start(options_, std::make_unique<FakeEngineBackend>()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--tls_key")));
}

}  // namespace
}  // namespace megatrain::server
