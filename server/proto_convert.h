// Conversions between megatrain.v1 messages and the server's core types
// (server/job.h, engine::JobSpec), and absl::Status -> grpc::Status. Only the
// RPC handlers include this file: proto types stop at the handler .cc files.
//
// Thread-safety: pure functions.
#ifndef MEGATRAIN_SERVER_PROTO_CONVERT_H_
#define MEGATRAIN_SERVER_PROTO_CONVERT_H_

#include <vector>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "megatrain/v1/checkpoint.pb.h"
#include "megatrain/v1/job.pb.h"
#include "megatrain/v1/server.pb.h"
#include "server/audit_record.h"
#include "server/job.h"

namespace megatrain::server {

// The one place where an absl::Status becomes a grpc::Status (the canonical
// codes have the same numbers; the message is kept).
grpc::Status ToGrpcStatus(const absl::Status& status);

// A submitted spec as a JobRequest. Fields marked `optional` in job.proto
// keep the engine defaults when absent. INVALID_ARGUMENT naming the field
// path for what only the conversion can see: an unknown compute_dtype, a
// relative path (model.hf_dir, data.tokens, data.text, data.tokenizer,
// output_dir: the CLI resolves them against the job file), a global_batch
// that is not a positive multiple of micro_batch or disagrees with
// gradient_accumulation_steps. Everything else is checked by
// ValidateJobRequest and the engine's ValidateJobSpec.
absl::StatusOr<JobRequest> JobRequestFromProto(const v1::JobSpec& spec);

// The stored request as a JobSpec message (every field set explicitly).
void JobRequestToProto(const JobRequest& request, v1::JobSpec* spec);

void JobToProto(const JobRecord& job, v1::Job* out);
void JobEventToProto(const JobEvent& event, v1::JobEvent* out);
void CheckpointToProto(const CheckpointRecord& checkpoint, v1::Checkpoint* out);
void AuditRecordToProto(const AuditRecord& record, v1::AuditRecord* out);

// ListJobsRequest.states. INVALID_ARGUMENT for JOB_STATE_UNSPECIFIED or an
// unknown value.
absl::StatusOr<std::vector<JobState>> JobStatesFromProto(
    const google::protobuf::RepeatedField<int>& states);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_PROTO_CONVERT_H_
