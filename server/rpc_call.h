// RpcCall: the bookkeeping every RPC handler does the same way: authenticate
// the caller from the `authorization` metadata, and on return convert the
// absl::Status (ToGrpcStatus) and record megatrain_rpcs_total /
// megatrain_rpc_duration_seconds.
//
// Example:
//   grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context,
//                                       const v1::GetJobRequest* request, v1::Job* job) {
//     RpcCall call("GetJob", context, *auth_, metrics_);
//     absl::StatusOr<Principal> caller = call.Authenticate();
//     if (!caller.ok()) return call.Finish(caller.status());
//     ...
//     return call.Finish(absl::OkStatus());
//   }
//
// Thread-safety: one RpcCall per call, used on the handler's thread.
#ifndef MEGATRAIN_SERVER_RPC_CALL_H_
#define MEGATRAIN_SERVER_RPC_CALL_H_

#include "absl/strings/string_view.h"

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/auth.h"
#include "server/metrics.h"

namespace megatrain::server {

class RpcCall {
 public:
  // `method` must be a string literal (it labels metrics).
  RpcCall(absl::string_view method, grpc::ServerContext* context, const Authenticator& auth,
          ServerMetrics* metrics)
      : method_(method), context_(context), auth_(auth), metrics_(metrics), start_(absl::Now()) {}

  // The caller, or UNAUTHENTICATED.
  absl::StatusOr<Principal> Authenticate() const;

  // Records the call's metrics (and logs INTERNAL / UNKNOWN errors) and
  // returns `status` as a grpc::Status. Call exactly once.
  grpc::Status Finish(const absl::Status& status);

  // The call's deadline; absl::InfiniteFuture() when it has none.
  absl::Time deadline() const;

 private:
  const absl::string_view method_;
  grpc::ServerContext* const context_;
  const Authenticator& auth_;
  ServerMetrics* const metrics_;
  const absl::Time start_;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_RPC_CALL_H_
