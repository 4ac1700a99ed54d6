// See data_checks.h.
#include "server/core/data_checks.h"

namespace megatrain::server {

engine::DataInputsToCheck DataInputsOf(const engine::JobSpec& spec, int64_t model_vocab_size) {
  engine::DataInputsToCheck inputs;
  inputs.text = spec.data.text;
  if (!spec.data.text.empty()) {
    // The tokenizer TrainingJob uses for data.text (engine/job/training_job.cc,
    // PrepareData): data.tokenizer, else the model directory.
    const bool own = !spec.data.tokenizer.empty();
    inputs.tokenizer = own ? spec.data.tokenizer : spec.model.hf_dir;
    inputs.tokenizer_field = own ? "data.tokenizer" : "model.hf_dir";
  }
  inputs.tokens = spec.data.tokens;
  inputs.eval_tokens = spec.data.eval_tokens;
  inputs.model_vocab_size = model_vocab_size;
  return inputs;
}

absl::Status CheckJobData(const engine::JobSpec& spec, int64_t model_vocab_size,
                          EngineBackend* backend) {
  const absl::Status checked = backend->CheckDataInputs(DataInputsOf(spec, model_vocab_size));
  if (checked.ok()) return checked;
  // INVALID_ARGUMENT whatever the engine said: the submission is wrong.
  return absl::InvalidArgumentError(checked.message());
}

}  // namespace megatrain::server
