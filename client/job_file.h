// Job files: YAML mapped onto megatrain.v1.JobSpec (docs/job-spec.md).
//
// Keys are those of job.proto (name, model, data, train, optimizer, eval,
// checkpoint, output_dir, priority, labels); train.compute_dtype is "fp32" |
// "tf32" | "bf16"; train.offload_activations is a YAML bool (true/false).
// An unknown key, a value of the wrong type, a bad compute_dtype or both
// model.preset and model.hf_dir is INVALID_ARGUMENT naming the file and the
// key path:
//   "tiny.yaml: train.micro_btch: unknown key (known: micro_batch, ...)".
// Relative paths (model.hf_dir, data.tokens, data.text, data.tokenizer,
// output_dir) are resolved against the directory of the file, so that a job
// file and its data can move together; the daemon only accepts absolute
// paths.
//
// Thread-safety: pure functions.
#ifndef MEGATRAIN_CLIENT_JOB_FILE_H_
#define MEGATRAIN_CLIENT_JOB_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "megatrain/v1/job.pb.h"

namespace megatrain::client {

// Parses job-file text. `base_dir` (absolute) resolves relative paths;
// `source` names the file in error messages.
absl::StatusOr<v1::JobSpec> ParseJobYaml(absl::string_view yaml, const std::string& base_dir,
                                         absl::string_view source);

// Reads and parses the job file at `path`. NOT_FOUND when it cannot be read.
absl::StatusOr<v1::JobSpec> LoadJobFile(const std::string& path);

}  // namespace megatrain::client

#endif  // MEGATRAIN_CLIENT_JOB_FILE_H_
