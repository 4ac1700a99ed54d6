// Conversions between megatrain.v1 messages and the server's core types
// (server/core/job.h, engine::JobSpec), and absl::Status -> grpc::Status. Only the
// RPC handlers include this file: proto types stop at the handler .cc files.
//
// Thread-safety: pure functions.
#ifndef MEGATRAIN_SERVER_PROTO_CONVERT_H_
#define MEGATRAIN_SERVER_PROTO_CONVERT_H_

#include <vector>

#include "absl/strings/string_view.h"

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "megatrain/v1/checkpoint.pb.h"
#include "megatrain/v1/job.pb.h"
#include "megatrain/v1/server.pb.h"
#include "server/core/audit_record.h"
#include "server/core/job.h"

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
// ValidateJobRequest and the engine's ValidateJobSpec. Strings over the caps
// of Note [String caps] are INVALID_ARGUMENT, checked first.
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

// Note [String caps]
// Every string a caller sends has a maximum length, checked here, at the
// RPC boundary, before anything is stored, logged or echoed: a hostile
// client cannot grow the database, the audit log or another user's listing
// with one request. The caps are in bytes and far above any legitimate use
// (job ids are "job-000001", user names at most 64 bytes); docs/api.md
// ("Limits") lists them. A string over its cap is INVALID_ARGUMENT naming
// the field, its length and the cap; the message quotes at most
// kMaxQuotedInputBytes of it (QuoteForError, logging.h). No string may
// hold a NUL byte (it would cut a path or a name for every C API below).
// Labels and request_id use the caps of server/core/job.h (kMaxLabels,
// kMaxLabelKeyLength, kMaxLabelValueLength, kMaxRequestIdLength).
inline constexpr size_t kMaxIdBytes = 128;            // job_id, checkpoint_id
inline constexpr size_t kMaxJobNameBytes = 256;       // JobSpec.name
inline constexpr size_t kMaxPathBytes = 4096;         // every path (PATH_MAX on Linux)
inline constexpr size_t kMaxPageTokenBytes = 256;     // page_token
inline constexpr size_t kMaxUserNameBytes = 64;       // owner / user filters (auth.h names)
inline constexpr size_t kMaxKeywordBytes = 64;        // preset, schedule, dtype, method filter
inline constexpr size_t kMaxMetricPrefixBytes = 256;  // GetMetricsRequest.name_prefix

// INVALID_ARGUMENT "`field`: N bytes, more than the M allowed (starts
// '...')" when `value` is longer than `max_bytes`, "`field`: contains a NUL
// byte" when it holds one (Note [String caps]); OK otherwise.
absl::Status CheckLength(absl::string_view field, absl::string_view value, size_t max_bytes);

// The caps of Note [String caps] for each request (INVALID_ARGUMENT naming
// the field). JobRequestFromProto checks the JobSpec's own strings.
absl::Status CheckRequestBounds(const v1::SubmitJobRequest& request);
absl::Status CheckRequestBounds(const v1::GetJobRequest& request);
absl::Status CheckRequestBounds(const v1::ListJobsRequest& request);
absl::Status CheckRequestBounds(const v1::CancelJobRequest& request);
absl::Status CheckRequestBounds(const v1::SuspendJobRequest& request);
absl::Status CheckRequestBounds(const v1::ResumeJobRequest& request);
absl::Status CheckRequestBounds(const v1::WatchJobRequest& request);
absl::Status CheckRequestBounds(const v1::CreateCheckpointRequest& request);
absl::Status CheckRequestBounds(const v1::ListCheckpointsRequest& request);
absl::Status CheckRequestBounds(const v1::ExportCheckpointRequest& request);
absl::Status CheckRequestBounds(const v1::DeleteCheckpointRequest& request);
absl::Status CheckRequestBounds(const v1::GetMetricsRequest& request);
absl::Status CheckRequestBounds(const v1::ListAuditRecordsRequest& request);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_PROTO_CONVERT_H_
