// The data half of the submission checks (Note [Submit checks] in
// submit_checks.h): what a job trains and evaluates on, checked when it is
// submitted so that a job that would train on nothing, or fail at its start
// naming a path inside its output directory, is refused at once with every
// problem named by its YAML field.
#ifndef MEGATRAIN_SERVER_CORE_DATA_CHECKS_H_
#define MEGATRAIN_SERVER_CORE_DATA_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/data/input_checks.h"
#include "engine/spec/job_spec.h"
#include "server/core/engine_backend.h"

namespace megatrain::server {

// The engine's inputs of `spec`'s data: data.text with the tokenizer it is
// tokenized with (data.tokenizer, else model.hf_dir's tokenizer.json: the
// field named in errors follows), data.tokens, data.eval_tokens, and the
// model's vocab_size (`model_vocab_size`, 0: unknown). Pure.
engine::DataInputsToCheck DataInputsOf(const engine::JobSpec& spec, int64_t model_vocab_size);

// Note [Data checks at submit] (engine/data/input_checks.h), through
// `backend`: INVALID_ARGUMENT listing every problem of the job's data, each
// starting with its field (data.text, data.tokenizer, model.hf_dir,
// data.tokens, data.eval_tokens). Reads files (a whole tokenizer.json):
// call it before taking the job manager's lock. Thread-safe.
absl::Status CheckJobData(const engine::JobSpec& spec, int64_t model_vocab_size,
                          EngineBackend* backend);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_CORE_DATA_CHECKS_H_
