// JobRequest <-> JSON text, the form in which the job store keeps a job's
// spec: the spec's JSON object (engine/spec/job_spec_json.h, the one writer
// and reader of the spec) with the request's "priority" and "labels" added.
//
// Thread-safety: pure functions.
#ifndef MEGATRAIN_SERVER_JOB_REQUEST_JSON_H_
#define MEGATRAIN_SERVER_JOB_REQUEST_JSON_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "server/core/job.h"

namespace megatrain::server {

// Serialises every field of `request` (deterministic: equal requests give
// equal text, so the text also serves to compare requests).
std::string JobRequestToJson(const JobRequest& request);

// Parses text written by JobRequestToJson. Missing fields keep their
// defaults. DATA_LOSS for malformed text (the store is corrupt).
absl::StatusOr<JobRequest> JobRequestFromJson(absl::string_view text);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_JOB_REQUEST_JSON_H_
