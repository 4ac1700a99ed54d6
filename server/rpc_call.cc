// See rpc_call.h.
#include "server/rpc_call.h"

#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/logging.h"
#include "server/proto_convert.h"

namespace megatrain::server {

absl::StatusOr<Principal> RpcCall::Authenticate() const {
  const auto& metadata = context_->client_metadata();
  auto it = metadata.find("authorization");
  absl::string_view value;
  if (it != metadata.end()) value = absl::string_view(it->second.data(), it->second.size());
  return auth_.Authenticate(value);
}

grpc::Status RpcCall::Finish(const absl::Status& status) {
  metrics_->RecordRpc(method_, status.code(), absl::ToDoubleSeconds(absl::Now() - start_));
  if (status.code() == absl::StatusCode::kInternal || status.code() == absl::StatusCode::kUnknown) {
    LogError(absl::StrCat(method_, ": ", status.ToString()));
  }
  return ToGrpcStatus(status);
}

absl::Time RpcCall::deadline() const {
  const auto deadline = context_->deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

}  // namespace megatrain::server
