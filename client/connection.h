// Connection: one gRPC channel to megatraind with its three service stubs,
// and the per-call context (bearer token, deadline).
//
// Thread-safety: stubs are thread-safe; NewContext may be called from any
// thread. Ownership: owns the channel and stubs.
#ifndef MEGATRAIN_CLIENT_CONNECTION_H_
#define MEGATRAIN_CLIENT_CONNECTION_H_

#include <memory>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "megatrain/v1/checkpoint.grpc.pb.h"
#include "megatrain/v1/job.grpc.pb.h"
#include "megatrain/v1/server.grpc.pb.h"

namespace megatrain::client {

struct ConnectionOptions {
  // Daemon address "host:port".
  std::string server = "127.0.0.1:50051";
  // Bearer token; empty sends none (daemon without --auth_tokens).
  std::string token;
  // TLS: on when `tls` or any tls_* file is given. tls_ca: PEM roots
  // (default: system roots); tls_cert + tls_key: client certificate for
  // mutual TLS; tls_server_name overrides the name checked in the server's
  // certificate.
  bool tls = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  // A TCP connection of its own: gRPC otherwise shares one connection
  // between channels to the same address with the same arguments
  // (megatrain-loadtest models separate clients this way).
  bool own_connection = false;
};

class Connection {
 public:
  // Creates the channel (connects lazily). NOT_FOUND for unreadable TLS
  // files; INVALID_ARGUMENT for a client cert without key or vice versa.
  static absl::StatusOr<std::unique_ptr<Connection>> Create(const ConnectionOptions& options);

  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::CheckpointService::Stub& checkpoints() { return *checkpoints_; }
  v1::ServerService::Stub& server() { return *server_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  // A context carrying the token, with a deadline `timeout` from now
  // (absl::InfiniteDuration(): none).
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration timeout) const;

 private:
  Connection() = default;

  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::CheckpointService::Stub> checkpoints_;
  std::unique_ptr<v1::ServerService::Stub> server_;
};

// grpc::Status -> absl::Status (same code and message).
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace megatrain::client

#endif  // MEGATRAIN_CLIENT_CONNECTION_H_
