// See checkpoint_service.h.
#include "server/rpc/checkpoint_service.h"

#include "absl/strings/str_cat.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/rpc_call.h"
#include "server/rpc/strict_parse.h"

namespace megatrain::server {

void CheckpointServiceImpl::ParseRequestsStrictly() {
  constexpr absl::string_view kService = "megatrain.v1.CheckpointService";
  MarkMethodStreamed(
      MethodIndex(kService, "CreateCheckpoint", v1::CreateCheckpointRequest::descriptor()),
      NewStrictUnaryHandler(this, &CheckpointServiceImpl::CreateCheckpoint));
  MarkMethodStreamed(
      MethodIndex(kService, "ListCheckpoints", v1::ListCheckpointsRequest::descriptor()),
      NewStrictUnaryHandler(this, &CheckpointServiceImpl::ListCheckpoints));
  MarkMethodStreamed(
      MethodIndex(kService, "ExportCheckpoint", v1::ExportCheckpointRequest::descriptor()),
      NewStrictUnaryHandler(this, &CheckpointServiceImpl::ExportCheckpoint));
  MarkMethodStreamed(
      MethodIndex(kService, "DeleteCheckpoint", v1::DeleteCheckpointRequest::descriptor()),
      NewStrictUnaryHandler(this, &CheckpointServiceImpl::DeleteCheckpoint));
}

grpc::Status CheckpointServiceImpl::CreateCheckpoint(grpc::ServerContext* context,
                                                     const v1::CreateCheckpointRequest* request,
                                                     v1::Checkpoint* response) {
  RpcCall call("CreateCheckpoint", context, *auth_, metrics_, audit_);
  call.set_audit_target(request->job_id());
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  absl::StatusOr<CheckpointRecord> checkpoint = manager_->CreateCheckpoint(
      *caller, request->job_id(), call.deadline(), [context] { return context->IsCancelled(); });
  if (!checkpoint.ok()) return call.Finish(checkpoint.status());
  call.set_audit_target(CheckpointId(checkpoint->job_id, checkpoint->step));
  CheckpointToProto(*checkpoint, response);
  return call.Finish(absl::OkStatus());
}

grpc::Status CheckpointServiceImpl::ListCheckpoints(grpc::ServerContext* context,
                                                    const v1::ListCheckpointsRequest* request,
                                                    v1::ListCheckpointsResponse* response) {
  RpcCall call("ListCheckpoints", context, *auth_, metrics_);
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  absl::StatusOr<std::vector<CheckpointRecord>> checkpoints =
      manager_->ListCheckpoints(*caller, request->job_id());
  if (!checkpoints.ok()) return call.Finish(checkpoints.status());
  for (const CheckpointRecord& checkpoint : *checkpoints) {
    CheckpointToProto(checkpoint, response->add_checkpoints());
  }
  return call.Finish(absl::OkStatus());
}

grpc::Status CheckpointServiceImpl::ExportCheckpoint(grpc::ServerContext* context,
                                                     const v1::ExportCheckpointRequest* request,
                                                     v1::ExportCheckpointResponse* response) {
  RpcCall call("ExportCheckpoint", context, *auth_, metrics_, audit_);
  call.set_audit_target(request->checkpoint_id());
  call.set_audit_detail(absl::StrCat("out_dir=", request->out_dir(), " dtype=", request->dtype()));
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  absl::StatusOr<engine::HfExportReport> report = manager_->ExportCheckpoint(
      *caller, request->checkpoint_id(), request->out_dir(), request->dtype());
  if (!report.ok()) return call.Finish(report.status());
  response->set_out_dir(request->out_dir());
  for (const std::string& name : report->copied_files) response->add_copied_files(name);
  for (const std::string& note : report->skipped_files) response->add_skipped_files(note);
  return call.Finish(absl::OkStatus());
}

grpc::Status CheckpointServiceImpl::DeleteCheckpoint(grpc::ServerContext* context,
                                                     const v1::DeleteCheckpointRequest* request,
                                                     v1::DeleteCheckpointResponse* response) {
  RpcCall call("DeleteCheckpoint", context, *auth_, metrics_, audit_);
  call.set_audit_target(request->checkpoint_id());
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  return call.Finish(manager_->DeleteCheckpoint(*caller, request->checkpoint_id()));
}

}  // namespace megatrain::server
