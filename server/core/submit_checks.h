// Note [Submit checks]
// Everything about a job that can be checked cheaply at submission is
// checked there, so that a bad job is refused at once instead of failing
// when it reaches the front of the queue (minutes or hours later):
//   - data.tokens / data.eval_tokens exist, and every shard's 64-byte
//     header parses with a file size that matches it (a truncated copy);
//     data.text and data.tokenizer exist;
//   - a shard header's vocab_size above the model's vocab_size (its ids
//     may reach past the embedding: another model's tokenizer);
//   - model.hf_dir's safetensors headers and offsets (every file; no
//     tensor data is read) and the embedding's shape against config.json;
//   - eval.every_steps > 0 needs an eval set (data.eval_fraction > 0 or
//     data.eval_tokens);
//   - train.seq_len above the model's max_position_embeddings needs
//     train.allow_seq_len_above_max_position_embeddings;
//   - train.resident_layers at most the model's num_hidden_layers;
//   - train.devices > 1 over a mixture-of-experts model (not built).
// Every refusal is INVALID_ARGUMENT and starts with the field's name
// (a config.json the engine cannot parse keeps its code: UNIMPLEMENTED for
// an unsupported architecture; so does data parallelism over experts). The
// checks read headers only (at most engine::kMaxCheckedShards shard files of
// 64 bytes each, and safetensors headers), run before the job manager takes
// its lock (Note [Lock-free admission] in job_manager.h), after the path
// policy allowed every path (Note [Per-user data roots]) and after
// PreflightJobInputs refused FIFOs and device nodes. Inputs may still
// change before the job starts; the engine checks them fully then.
#ifndef MEGATRAIN_SERVER_CORE_SUBMIT_CHECKS_H_
#define MEGATRAIN_SERVER_CORE_SUBMIT_CHECKS_H_

#include "absl/status/status.h"
#include "engine/job/training_job.h"
#include "server/core/engine_backend.h"
#include "server/core/path_policy.h"

namespace megatrain::server {

// Note [Submit checks]. `inputs` is what PreflightJobInputs read; `backend`
// reads the headers. Thread-safe (reads files, no shared state).
absl::Status CheckSubmission(const engine::JobSpec& spec, const JobInputs& inputs,
                             EngineBackend* backend);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_CORE_SUBMIT_CHECKS_H_
