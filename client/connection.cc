// See connection.h.
#include "client/connection.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"

namespace megatrain::client {
namespace {

// Largest response accepted, in bytes: above the daemon's default
// --max_message_bytes, so that the daemon's limit is the one that applies.
constexpr int kMaxReceiveMessageBytes = 64 << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Create(const ConnectionOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments args;
  const bool tls = options.tls || !options.tls_ca.empty() || !options.tls_cert.empty() ||
                   !options.tls_key.empty();
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca.empty()) {
      absl::StatusOr<std::string> ca = ReadFile(options.tls_ca, "--tls_ca");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
    }
    if (options.tls_cert.empty() != options.tls_key.empty()) {
      return absl::InvalidArgumentError("--tls_cert and --tls_key: give both or neither");
    }
    if (!options.tls_cert.empty()) {
      absl::StatusOr<std::string> cert = ReadFile(options.tls_cert, "--tls_cert");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFile(options.tls_key, "--tls_key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  // The daemon sends up to its --max_message_bytes (16 MiB by default; a
  // page of 1000 jobs with many labels); gRPC's client default is 4 MiB.
  args.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::unique_ptr<Connection> connection(new Connection());
  connection->token_ = options.token;
  connection->channel_ = grpc::CreateCustomChannel(options.server, credentials, args);
  connection->jobs_ = v1::JobService::NewStub(connection->channel_);
  connection->checkpoints_ = v1::CheckpointService::NewStub(connection->channel_);
  connection->server_ = v1::ServerService::NewStub(connection->channel_);
  return connection;
}

std::unique_ptr<grpc::ClientContext> Connection::NewContext(absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!token_.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  }
  return context;
}

}  // namespace megatrain::client
