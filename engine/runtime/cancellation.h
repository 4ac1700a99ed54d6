// Cancellation: how a caller stops a long engine computation that it no
// longer wants (a plan or a footprint estimate of a large model, Note
// [Model bounds] in engine/model/model_config.h) without the engine knowing
// who asks. The daemon's RPC handlers make one that reads the call's
// grpc::ServerContext (the client cancelled, its deadline or the daemon's
// own bound passed: server/rpc/rpc_call.h); tests make one that stops after
// N checks. The engine calls Check() between the steps of its work (between
// the tries of the resident-layer search, between footprint phases) and
// returns its status as soon as it is not OK.
//
// Example:
//   const engine::Cancellation cancel([&] {
//     return context->IsCancelled() ? absl::CancelledError("client went")
//                                   : absl::OkStatus();
//   });
//   absl::StatusOr<JobPlan> plan = PlanJobForModel(model, spec, machine, cancel);
//
// Thread-safety: Check() is const and calls the poll function on the
// computing thread; that function must be safe to call from there, and
// cheap (it runs once per step, up to a few hundred times per call).
#ifndef MEGATRAIN_ENGINE_RUNTIME_CANCELLATION_H_
#define MEGATRAIN_ENGINE_RUNTIME_CANCELLATION_H_

#include <functional>
#include <utility>

#include "absl/status/status.h"

namespace megatrain::engine {

class Cancellation {
 public:
  // Never cancelled: Check() is always OK.
  Cancellation() = default;
  // `poll` returns OK to go on, or the status to stop with (CANCELLED,
  // DEADLINE_EXCEEDED, with a message saying why); empty: never cancelled.
  explicit Cancellation(std::function<absl::Status()> poll) : poll_(std::move(poll)) {}

  // OK to go on; else the poll's status, which the engine returns unchanged.
  absl::Status Check() const { return poll_ ? poll_() : absl::OkStatus(); }

 private:
  std::function<absl::Status()> poll_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_RUNTIME_CANCELLATION_H_
