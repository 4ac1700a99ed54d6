// libFuzzer target for the job file parser (client/job_file.cc): YAML text
// -> megatrain.v1.JobSpec, as `megatrain submit` reads it.
//
// Each input is parsed as a job file in /jobs/dir. Accepted specs then take
// the path a submission takes: serialised (what the CLI sends), parsed back
// (what the daemon receives) and converted by the daemon
// (JobRequestFromProto, ValidateJobRequest).
//
// Invariants checked (a violation traps):
//   - an error is INVALID_ARGUMENT and names the file ("fuzz.yaml: ...");
//   - an accepted spec never has both model.preset and model.hf_dir;
//   - every path field of an accepted spec is empty or absolute (the CLI
//     resolves relative paths against the job file's directory);
//   - the accepted spec survives the wire: it serialises, parses back equal,
//     and the daemon's conversion never refuses it for a relative path
//     (its path refusal's whole phrase, not input echoed in another refusal).
// Crashes, sanitizer reports and exceptions escaping the parser are findings
// too (libFuzzer reports an uncaught exception as a crash).
//
// Run: deploy/run-fuzzers.sh, or by hand
//   build-fuzz/job_yaml_fuzz -dict=tests/fuzz/job_yaml_fuzz.dict \
//       tests/fuzz/corpus/job_yaml_fuzz
#include <cstddef>
#include <cstdint>
#include <string>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "client/job_file.h"
#include "megatrain/v1/job.pb.h"
#include "server/core/job.h"
#include "tests/fuzz/jobspec_fuzz_util.h"

namespace {

using ::megatrain::client::ParseJobYaml;
using ::megatrain::fuzz::Check;
using ::megatrain::fuzz::ConvertAsDaemon;
using ::megatrain::server::JobRequest;

// Serialised with map entries in key order, so that equal messages give
// equal bytes (plain serialisation leaves the order of `labels` open).
std::string DeterministicBytes(const megatrain::v1::JobSpec& spec) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    Check(spec.SerializeToCodedStream(&coded));
  }
  return bytes;
}

bool EmptyOrAbsolute(const std::string& path) { return path.empty() || path.front() == '/'; }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  megatrain::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view yaml(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<megatrain::v1::JobSpec> spec = ParseJobYaml(yaml, "/jobs/dir", "fuzz.yaml");
  if (!spec.ok()) {
    Check(spec.status().code() == absl::StatusCode::kInvalidArgument);
    Check(absl::StartsWith(spec.status().message(), "fuzz.yaml: "));
    return 0;
  }
  Check(spec->model().preset().empty() || spec->model().hf_dir().empty());
  Check(EmptyOrAbsolute(spec->model().hf_dir()));
  Check(EmptyOrAbsolute(spec->data().tokens()));
  Check(EmptyOrAbsolute(spec->data().eval_tokens()));
  Check(EmptyOrAbsolute(spec->data().text()));
  Check(EmptyOrAbsolute(spec->data().tokenizer()));
  Check(EmptyOrAbsolute(spec->output_dir()));

  // The wire: the daemon must receive what the CLI sends.
  std::string bytes;
  Check(spec->SerializeToString(&bytes));
  megatrain::v1::JobSpec received;
  Check(received.ParseFromString(bytes));
  Check(DeterministicBytes(received) == DeterministicBytes(*spec));

  // The daemon's own path refusal (CheckAbsolute in server/rpc/
  // proto_convert.cc), whole: refusals echo what they refuse (a label key,
  // a preset name), and an input may spell the shorter "must be an
  // absolute path" there (the fuzzer found one).
  absl::StatusOr<JobRequest> request = ConvertAsDaemon(received);
  if (!request.ok()) {
    Check(!absl::StrContains(request.status().message(),
                             ": must be an absolute path on the daemon's machine"));
  }
  return 0;
}
