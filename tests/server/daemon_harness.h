// DaemonHarness: a test fixture that starts megatraind in-process (the real
// gRPC services, store, auth, audit log and path policy) with the fake
// engine (fake_engine_backend.h), tokens for two users and an admin, a data
// root and an output root, and talks to it through raw gRPC stubs
// (client/connection.h). Used by the hardening tests (access control,
// audit, RPC limits); daemon_test.cc drives the CLI instead.
//
//   users:  alice (user, token "alice-secret"), bob (user, "bob-secret"),
//           root (admin, "root-secret")
//   roots:  data_dir_ (--data_roots), out_dir_ (--output_roots)
//
// Thread-safety: a test fixture; one test thread (connections may be used
// from helper threads).
#ifndef MEGATRAIN_TESTS_SERVER_DAEMON_HARNESS_H_
#define MEGATRAIN_TESTS_SERVER_DAEMON_HARNESS_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/connection.h"
#include "server/core/auth.h"
#include "server/rpc/daemon.h"
#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server::testing {

// Bound of every wait: far above what any step here takes, so that a
// failure is a hang caught early rather than flakiness.
inline constexpr absl::Duration kHarnessTimeout = absl::Seconds(30);

inline constexpr char kAliceToken[] = "alice-secret";
inline constexpr char kBobToken[] = "bob-secret";
inline constexpr char kRootToken[] = "root-secret";

// Matches a grpc::Status with error code `code` whose message contains
// `substring` ("" matches any message).
//
// Example:
//   EXPECT_THAT(status, GrpcStatusIs(grpc::StatusCode::NOT_FOUND, "not found"));
MATCHER_P2(GrpcStatusIs, code, substring, "") {
  if (arg.error_code() != code) {
    *result_listener << "code " << arg.error_code() << ": " << arg.error_message();
    return false;
  }
  if (arg.error_message().find(substring) == std::string::npos) {
    *result_listener << "message: " << arg.error_message();
    return false;
  }
  return true;
}

class DaemonHarness : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("MEGATRAIN_TOKEN");
    unsetenv("MEGATRAIN_SERVER");
    state_dir_ = MakeTempDir();
    data_dir_ = std::filesystem::canonical(MakeTempDir()).string();
    out_dir_ = std::filesystem::canonical(MakeTempDir()).string();
    std::filesystem::create_directories(data_dir_ + "/tiny");
    const std::string tokens = state_dir_ + "/tokens.yaml";
    std::ofstream(tokens) << "users:\n"
                          << "  - {name: alice, role: user, token_sha256: "
                          << DigestHex(Sha256(kAliceToken)) << "}\n"
                          << "  - {name: bob, role: user, token_sha256: "
                          << DigestHex(Sha256(kBobToken)) << "}\n"
                          << "  - {name: root, role: admin, token_sha256: "
                          << DigestHex(Sha256(kRootToken)) << "}\n";
    // The daemon refuses a tokens file others may read.
    std::filesystem::permissions(
        tokens, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    options_.listen = "127.0.0.1:0";
    options_.metrics_listen = "";
    options_.state_dir = state_dir_;
    options_.device = "cpu";
    options_.host_memory_budget_bytes = 64 << 20;
    options_.auth_tokens = tokens;
    options_.data_roots = data_dir_;
    options_.output_roots = out_dir_;
  }

  void TearDown() override {
    if (daemon_ != nullptr) {
      // Release gated jobs so that the drain can finish.
      EXPECT_TRUE(daemon_->Shutdown(kHarnessTimeout));
    }
  }

  void StartDaemon(bool gated = true) {
    auto backend = std::make_unique<FakeEngineBackend>();
    backend->gated = gated;
    backend->data_parallel = data_parallel_;
    backend_ = backend.get();
    auto daemon = Daemon::Start(options_, std::move(backend));
    ASSERT_THAT(daemon, ::megatrain::testing::IsOk());
    daemon_ = *std::move(daemon);
    address_ = daemon_->grpc_address();
  }

  // A connection presenting `token` (empty: none).
  std::unique_ptr<client::Connection> Connect(const std::string& token) {
    client::ConnectionOptions options;
    options.server = address_;
    options.token = token;
    auto connection = client::Connection::Create(options);
    EXPECT_THAT(connection, ::megatrain::testing::IsOk());
    return connection.ok() ? *std::move(connection) : nullptr;
  }

  // A valid spec of the tiny preset reading the data root.
  v1::JobSpec Spec(const std::string& name, int64_t max_steps = 10) {
    v1::JobSpec spec;
    spec.set_name(name);
    spec.mutable_model()->set_preset("tiny");
    spec.mutable_data()->set_tokens(data_dir_ + "/tiny");
    spec.mutable_train()->set_max_steps(max_steps);
    spec.mutable_checkpoint()->set_every_steps(2);
    return spec;
  }

  // Submits `spec` as the owner of `connection`; returns the job id ("" and
  // a test failure when refused).
  std::string Submit(client::Connection& connection, const v1::JobSpec& spec) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::Job job;
    grpc::Status status =
        connection.jobs().SubmitJob(connection.NewContext(kHarnessTimeout).get(), request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job.id();
  }

  v1::Job GetJob(client::Connection& connection, const std::string& job_id) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::Status status =
        connection.jobs().GetJob(connection.NewContext(kHarnessTimeout).get(), request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }

  std::string state_dir_;
  std::string data_dir_;
  std::string out_dir_;
  DaemonOptions options_;
  // The fake runs train.devices > 1 jobs (set before StartDaemon, with a
  // multi-slot options_.device such as "cpu,cpu:1").
  bool data_parallel_ = false;
  FakeEngineBackend* backend_ = nullptr;  // owned by daemon_
  std::unique_ptr<Daemon> daemon_;
  std::string address_;
};

}  // namespace megatrain::server::testing

#endif  // MEGATRAIN_TESTS_SERVER_DAEMON_HARNESS_H_
