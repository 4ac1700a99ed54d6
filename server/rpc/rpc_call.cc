// See rpc_call.h.
#include "server/rpc/rpc_call.h"

#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/core/logging.h"
#include "server/rpc/proto_convert.h"

namespace megatrain::server {

absl::Status CheckDeadline(absl::Time deadline, absl::Time now) {
  if (deadline - now >= kMinCallTimeLeft) return absl::OkStatus();
  if (deadline > now) {
    return absl::DeadlineExceededError(
        absl::StrCat("the call had ", absl::FormatDuration(deadline - now),
                     " left when the daemon started it, less than the ",
                     absl::FormatDuration(kMinCallTimeLeft), " a call needs; nothing was done"));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the call's deadline passed ", absl::FormatDuration(now - deadline),
                   " before the daemon started it; nothing was done"));
}

absl::Status CapStatusMessage(const absl::Status& status) {
  if (status.message().size() <= kMaxStatusMessageBytes) return status;
  constexpr absl::string_view kCut = "... (message cut)";
  size_t end = kMaxStatusMessageBytes - kCut.size();
  const absl::string_view message = status.message();
  while (end > 0 && (static_cast<unsigned char>(message[end]) & 0xC0) == 0x80) --end;
  return absl::Status(status.code(), absl::StrCat(message.substr(0, end), kCut));
}

absl::StatusOr<Principal> RpcCall::Start() {
  const auto& metadata = context_->client_metadata();
  auto it = metadata.find("authorization");
  absl::string_view value;
  if (it != metadata.end()) value = absl::string_view(it->second.data(), it->second.size());
  absl::StatusOr<Principal> caller = auth_.Authenticate(value);
  if (!caller.ok()) return caller.status();
  caller_ = *caller;
  // gRPC runs a handler even when the call's deadline passed while it was
  // queued (or the client gave up); doing the work then helps nobody.
  absl::Status deadline = CheckDeadline(this->deadline(), absl::Now());
  if (!deadline.ok()) return deadline;
  if (context_->IsCancelled()) {
    return absl::CancelledError("the client cancelled the call before the daemon started it");
  }
  // Note [Audit fail closed] (audit_log.h): no mutating call without its record.
  if (audit_ != nullptr) {
    absl::Status writable = audit_->CheckWritable();
    if (!writable.ok()) return writable;
  }
  return caller;
}

void RpcCall::set_audit_target(absl::string_view target) {
  audit_target_ = std::string(target);
  // "job-000001/step-20" belongs to job-000001.
  audit_job_id_ = std::string(target.substr(0, target.find('/')));
}

grpc::Status RpcCall::Finish(const absl::Status& full_status) {
  const absl::Status status = CapStatusMessage(full_status);
  metrics_->RecordRpc(method_, status.code(), absl::ToDoubleSeconds(absl::Now() - start_));
  if (status.code() == absl::StatusCode::kInternal || status.code() == absl::StatusCode::kUnknown) {
    LogError(absl::StrCat(method_, ": ", status.ToString()));
  }
  if (audit_ != nullptr) {
    AuditRecord record;
    if (caller_.has_value()) {
      record.user = caller_->name;
      record.role = std::string(RoleName(caller_->role));
    }
    record.peer = context_->peer();
    record.method = std::string(method_);
    record.target = audit_target_;
    record.job_id = audit_job_id_;
    record.code = status.code();
    record.message = std::string(status.message());
    record.detail = audit_detail_;
    audit_->Record(std::move(record));
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

engine::Cancellation RpcCall::EngineCancellation(absl::Duration max_engine_call) const {
  grpc::ServerContext* const context = context_;
  const absl::string_view method = method_;
  const absl::Time client_deadline = deadline();
  const absl::Time own_deadline = start_ + max_engine_call;
  return engine::Cancellation([=]() -> absl::Status {
    // The deadline first: gRPC also marks a call whose deadline passed as
    // cancelled.
    const absl::Time now = absl::Now();
    if (now >= client_deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(method, ": the call's deadline passed; the engine call was stopped"));
    }
    if (now >= own_deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          method, ": the engine call ran past the daemon's bound of ",
          absl::FormatDuration(max_engine_call), " (--max_engine_call_seconds) and was stopped"));
    }
    if (context->IsCancelled()) {
      // A client whose deadline passes hangs up on its own clock, before
      // the daemon's copy of the deadline (which starts when the request
      // arrives) passes here: a hang-up that close to the deadline is the
      // deadline's (Note [Cancelled engine calls]).
      if (client_deadline - now <= kDeadlineHangUpSlack) {
        return absl::DeadlineExceededError(
            absl::StrCat(method, ": the call's deadline passed; the engine call was stopped"));
      }
      return absl::CancelledError(absl::StrCat(
          method, ": the client cancelled the call or went away; the engine call was stopped"));
    }
    return absl::OkStatus();
  });
}

}  // namespace megatrain::server
