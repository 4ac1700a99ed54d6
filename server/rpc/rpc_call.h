// RpcCall: the bookkeeping every RPC handler does the same way: refuse a
// call whose deadline already passed or whose client already went away
// (before any work), authenticate the caller from the `authorization`
// metadata, and on return convert the absl::Status (ToGrpcStatus), record
// megatrain_rpcs_total / megatrain_rpc_duration_seconds and, for mutating
// RPCs, an audit record (audit_log.h).
//
// Example:
//   grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
//                                          const v1::CancelJobRequest* request, v1::Job* job) {
//     RpcCall call("CancelJob", context, *auth_, metrics_, audit_);  // audited
//     call.set_audit_target(request->job_id());
//     absl::StatusOr<Principal> caller = call.Start();
//     if (!caller.ok()) return call.Finish(caller.status());
//     ...
//     return call.Finish(absl::OkStatus());
//   }
//
// Bounds (Note [String caps], proto_convert.h): handlers check their
// request with CheckRequestBounds right after Start; Finish cuts every error
// message to kMaxStatusMessageBytes, so that no reply echoes more than that
// of a caller's input whatever the layer below quoted.
//
// Thread-safety: one RpcCall per call, used on the handler's thread.
#ifndef MEGATRAIN_SERVER_RPC_CALL_H_
#define MEGATRAIN_SERVER_RPC_CALL_H_

#include <optional>
#include <string>

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/runtime/cancellation.h"
#include "server/core/audit_log.h"
#include "server/core/auth.h"
#include "server/core/metrics.h"

namespace megatrain::server {

// The least time a call must have left when the daemon starts it. gRPC
// sends a deadline that already passed as a 1 ns timeout and the receiving
// side rounds deadlines up to the millisecond, so a call the client has
// already given up on can arrive looking as if it had ~1 ms left; below this
// margin the daemon cannot tell the two apart.
inline constexpr absl::Duration kMinCallTimeLeft = absl::Milliseconds(5);

// Longest error message a reply carries, in bytes; longer ones are cut and
// say so. Why 1 KiB: a message names a field, a value and a reason; a path
// cap (4096) quoted twice would otherwise be echoed whole.
inline constexpr size_t kMaxStatusMessageBytes = 1024;

// `status` with its message cut to kMaxStatusMessageBytes (on a UTF-8
// boundary, ending "... (message cut)"); the code is kept.
absl::Status CapStatusMessage(const absl::Status& status);

// DEADLINE_EXCEEDED when less than kMinCallTimeLeft remains between `now`
// and `deadline` (so also when it passed): the client has given up, or will
// before any answer reaches it, so the call must do nothing. Thread-safe.
absl::Status CheckDeadline(absl::Time deadline, absl::Time now);

// Note [Cancelled engine calls]
// An engine call under an RPC that can take long on a large model
// (PlanJob's plan, SubmitJob's admission estimate: seconds at the 4,096
// layers of Note [Model bounds] on 2 cores) is handed the
// engine::Cancellation of RpcCall::EngineCancellation
// (engine/runtime/cancellation.h). The engine checks it between the steps
// of its work (the tries of the resident-layer search, the footprint's
// phases, each a layout of every block) and stops the call with
//   DEADLINE_EXCEEDED  once the client's deadline has passed, or the
//                      daemon's own bound (--max_engine_call_seconds,
//                      kDefaultMaxEngineCall, counted from the call's
//                      start) so that a client that sets no deadline
//                      cannot hold a core for longer;
//   CANCELLED          once the client cancelled or hung up
//                      (grpc::ServerContext::IsCancelled) while more than
//                      kDeadlineHangUpSlack of its deadline was left.
// A client's deadline runs on the client's clock from the moment it sent
// the call; the daemon's copy starts when the request arrives, later by
// the request's transit (milliseconds, more on a loaded host). So the
// client hangs up first, and the daemon sees a cancel just before its
// copy of the deadline: a hang-up within kDeadlineHangUpSlack of the
// deadline is reported as DEADLINE_EXCEEDED, what the client saw.
// Nothing is kept of a stopped call: a submission is not queued.
inline constexpr absl::Duration kDefaultMaxEngineCall = absl::Seconds(60);
inline constexpr absl::Duration kDeadlineHangUpSlack = absl::Seconds(1);

class RpcCall {
 public:
  // `method` must be a string literal (it labels metrics). With a non-null
  // `audit` the call is a mutating one and Finish records it there.
  RpcCall(absl::string_view method, grpc::ServerContext* context, const Authenticator& auth,
          ServerMetrics* metrics, AuditLog* audit = nullptr)
      : method_(method),
        context_(context),
        auth_(auth),
        metrics_(metrics),
        audit_(audit),
        start_(absl::Now()) {}

  // Authenticates the caller (UNAUTHENTICATED), then refuses the call when
  // its deadline has passed (DEADLINE_EXCEEDED) or the client cancelled it
  // (CANCELLED), and an audited call when the audit log cannot record it
  // (RESOURCE_EXHAUSTED, UNAVAILABLE; AuditLog::CheckWritable). The handler
  // must do no work unless this is OK.
  absl::StatusOr<Principal> Start();

  // What an audited call acts on: a job id or a checkpoint id
  // ("job-000001/step-20"; its job id is derived). Set as soon as known.
  void set_audit_target(absl::string_view target);
  // Method-specific context for the audit record ("out_dir=/x dtype=bf16").
  void set_audit_detail(std::string detail) { audit_detail_ = std::move(detail); }

  // Records the call's metrics (and logs INTERNAL / UNKNOWN errors), writes
  // the audit record of an audited call, and returns `status` as a
  // grpc::Status, its message cut by CapStatusMessage. Call exactly once.
  grpc::Status Finish(const absl::Status& status);

  // The call's deadline; absl::InfiniteFuture() when it has none.
  absl::Time deadline() const;

  // Note [Cancelled engine calls]: a cancellation for an engine call made
  // by this handler, which stops it once the client cancels, its deadline
  // passes or `max_engine_call` (> 0) has passed since the call started.
  // Valid while the call is (the handler's scope).
  engine::Cancellation EngineCancellation(absl::Duration max_engine_call) const;

 private:
  const absl::string_view method_;
  grpc::ServerContext* const context_;
  const Authenticator& auth_;
  ServerMetrics* const metrics_;
  AuditLog* const audit_;
  const absl::Time start_;
  std::optional<Principal> caller_;  // set by a successful Authenticate
  std::string audit_target_;
  std::string audit_job_id_;
  std::string audit_detail_;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_RPC_CALL_H_
