// Helpers shared by the job spec fuzz targets (job_yaml_fuzz.cc,
// jobspec_proto_fuzz.cc): the invariant check, quiet protobuf logging, and
// the daemon's conversion of a received megatrain.v1.JobSpec with its
// invariant (a refusal is INVALID_ARGUMENT). Header-only: each target is one
// translation unit.
#ifndef MEGATRAIN_TESTS_FUZZ_JOBSPEC_FUZZ_UTIL_H_
#define MEGATRAIN_TESTS_FUZZ_JOBSPEC_FUZZ_UTIL_H_

#include <string>

#include <google/protobuf/stubs/logging.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "megatrain/v1/job.pb.h"
#include "server/core/job.h"
#include "server/rpc/proto_convert.h"

namespace megatrain::fuzz {

// A violated invariant traps, which libFuzzer reports as a crash.
inline void Check(bool condition) {
  if (!condition) __builtin_trap();
}

// Silences protobuf's log: it logs every string field with invalid UTF-8
// (ERROR, not fatal), which mutated inputs hit all the time. Call from
// LLVMFuzzerInitialize.
inline void QuietProtobufLogs() {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
}

// What the daemon does with a submitted spec: JobRequestFromProto, then
// ValidateJobRequest. Checks that either refusal is INVALID_ARGUMENT; returns
// JobRequestFromProto's result (a request that ValidateJobRequest refused is
// still returned).
inline absl::StatusOr<server::JobRequest> ConvertAsDaemon(const v1::JobSpec& spec) {
  absl::StatusOr<server::JobRequest> request = server::JobRequestFromProto(spec);
  if (!request.ok()) {
    Check(request.status().code() == absl::StatusCode::kInvalidArgument);
    return request;
  }
  const absl::Status valid = server::ValidateJobRequest(*request);
  Check(valid.ok() || valid.code() == absl::StatusCode::kInvalidArgument);
  return request;
}

}  // namespace megatrain::fuzz

#endif  // MEGATRAIN_TESTS_FUZZ_JOBSPEC_FUZZ_UTIL_H_
