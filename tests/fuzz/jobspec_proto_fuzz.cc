// libFuzzer target for the daemon's side of SubmitJob: bytes ->
// megatrain.v1.JobSpec (ParseFromString, as gRPC does) -> JobRequestFromProto
// (server/rpc/proto_convert.cc) -> ValidateJobRequest (server/core/job.cc), and the
// JSON form in which the job store keeps a request (server/core/job_request_json.cc).
//
// Not covered: the engine's ValidateJobSpec (engine/job/training_job.cc). It is
// compiled with the trainer, so linking it would put LibTorch into this
// build; tests/engine/job/training_job_test.cc covers it. Without it, specs with
// non-finite numbers reach the JSON checks here, which the daemon never
// stores (ValidateJobSpec refuses them); the checks allow for that.
//
// Invariants checked (a violation traps):
//   - a refused spec is INVALID_ARGUMENT;
//   - JobRequestToProto(request) converts back to the same request;
//   - the JSON of an accepted request parses back (JobRequestFromJson) and,
//     when its numbers are finite, gives the same JSON again.
// Crashes, sanitizer reports and escaping exceptions are findings too.
//
// Run: deploy/run-fuzzers.sh, or by hand
//   build-fuzz/jobspec_proto_fuzz tests/fuzz/corpus/jobspec_proto_fuzz
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "megatrain/v1/job.pb.h"
#include "server/core/job.h"
#include "server/core/job_request_json.h"
#include "server/rpc/proto_convert.h"
#include "tests/fuzz/jobspec_fuzz_util.h"

namespace {

using ::megatrain::fuzz::Check;
using ::megatrain::fuzz::ConvertAsDaemon;
using ::megatrain::server::JobRequest;
using ::megatrain::server::JobRequestFromJson;
using ::megatrain::server::JobRequestFromProto;
using ::megatrain::server::JobRequestToJson;
using ::megatrain::server::JobRequestToProto;

// True when every floating-point field is finite (JSON has no NaN or
// infinity: nlohmann writes null, which reads back as the default).
bool AllFinite(const JobRequest& request) {
  const auto& spec = request.spec;
  for (double value : {spec.data.eval_fraction, spec.train.max_grad_norm, spec.optimizer.lr,
                       spec.optimizer.beta1, spec.optimizer.beta2, spec.optimizer.eps,
                       spec.optimizer.weight_decay, spec.optimizer.min_lr_ratio}) {
    if (!std::isfinite(value)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  megatrain::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  megatrain::v1::JobSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return 0;

  absl::StatusOr<JobRequest> request = ConvertAsDaemon(spec);
  if (!request.ok()) return 0;

  // What GetJob / ListJobs send back converts to the same request.
  const std::string json = JobRequestToJson(*request);
  megatrain::v1::JobSpec echoed;
  JobRequestToProto(*request, &echoed);
  absl::StatusOr<JobRequest> again = JobRequestFromProto(echoed);
  Check(again.ok());
  Check(JobRequestToJson(*again) == json);

  // The job store's form.
  absl::StatusOr<JobRequest> stored = JobRequestFromJson(json);
  Check(stored.ok());
  if (AllFinite(*request)) Check(JobRequestToJson(*stored) == json);
  return 0;
}
