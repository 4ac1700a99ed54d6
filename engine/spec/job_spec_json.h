// The job spec as JSON: the one writer and the one reader. The engine
// stores the text in every checkpoint (state.json "job_spec_json", so a
// checkpoint says how it was made); the server's job store keeps it with
// the request's priority and labels added (server/core/job_request_json.h).
//
// Format: an object with the sections of the job file, every field written
// (field names as in job_spec.h), keys in sorted order, no whitespace, e.g.
//   {"checkpoint":{"every_steps":0,"keep_every":0,"keep_last":2},
//    "data":{...},"eval":{...},"model":{"hf_dir":"","preset":"tiny"},
//    "name":"","optimizer":{...},"output_dir":"/runs/a","train":{...}}
// compute_dtype is "fp32" | "tf32" | "bf16", nan_policy "skip" | "fail".
// `job_id` is not part of it (the daemon sets it; checkpoints record it in
// state.json "job_id"). The bytes must stay what checkpoints and job stores
// already hold: tests/engine/spec/job_spec_json_test.cc pins them.
//
// Thread-safety: pure functions.
#ifndef MEGATRAIN_ENGINE_SPEC_JOB_SPEC_JSON_H_
#define MEGATRAIN_ENGINE_SPEC_JOB_SPEC_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/spec/job_spec.h"
#include "nlohmann/json_fwd.hpp"

namespace megatrain::engine {

// Every field of `spec` but job_id, as a JSON object (callers may add
// keys of their own beside the sections before dumping it).
nlohmann::json JobSpecToJsonObject(const JobSpec& spec);

// JobSpecToJsonObject(spec) as text (deterministic: equal specs give equal
// text).
std::string JobSpecToJson(const JobSpec& spec);

// Reads the fields of an object written by JobSpecToJsonObject into `spec`.
// Missing fields keep the values `spec` has (callers start from the
// defaults); unknown keys are ignored. Reads the spellings of older
// writers: train.skip_nonfinite_steps (a bool, before train.nan_policy); a
// missing train.offload_activations is off, as those jobs ran; a missing
// data.packing.document_attention is auto (the default: a job with masked
// data written before the field resumes isolated). Does not
// validate (ValidateJobSpec does). DATA_LOSS "job spec JSON: ..." for a
// field of the wrong type or an unknown keyword (compute_dtype, nan_policy,
// document_attention, the schedule's, optimizer.schedule, memory.*): the text
// was written by us, so a bad one is a corrupt store or checkpoint.
absl::Status JobSpecFromJsonObject(const nlohmann::json& object, JobSpec* spec);

// Parses `text` and reads it as JobSpecFromJsonObject does. DATA_LOSS for
// text that is not a JSON object.
absl::StatusOr<JobSpec> JobSpecFromJson(absl::string_view text);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_JOB_SPEC_JSON_H_
