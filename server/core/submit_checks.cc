// See submit_checks.h.
#include "server/core/submit_checks.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/runtime/status_macros.h"
#include "server/core/data_checks.h"

namespace megatrain::server {
namespace {

// `field: message`, INVALID_ARGUMENT whatever the code of `status` (the
// submission is bad; nothing was lost).
absl::Status Refuse(absl::string_view field, const absl::Status& status) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", status.message()));
}

absl::Status CheckExists(absl::string_view field, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "': ", std::strerror(errno)));
}

absl::Status CheckEval(const engine::JobSpec& spec) {
  if (spec.eval.every_steps <= 0) return absl::OkStatus();
  if (spec.data.eval_fraction > 0 || !spec.data.eval_tokens.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "eval.every_steps: ", spec.eval.every_steps,
      " but the job has no eval set; set data.eval_fraction > 0 or data.eval_tokens, or "
      "eval.every_steps: 0"));
}

absl::Status CheckShards(absl::string_view field, const std::string& path, int64_t vocab_size,
                         EngineBackend* backend) {
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<engine::TokenShardHeaderFacts>> shards =
      backend->ReadTokenShardHeaders(path);
  if (!shards.ok()) return Refuse(field, shards.status());
  for (const engine::TokenShardHeaderFacts& shard : *shards) {
    if (vocab_size > 0 && shard.vocab_size > static_cast<uint64_t>(vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", shard.path, " was written for vocab_size ", shard.vocab_size,
          " (its header), above the model's vocab_size ", vocab_size,
          ": its token ids may not exist in this model (tokenized for another model?)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSubmission(const engine::JobSpec& spec, const JobInputs& inputs,
                             EngineBackend* backend) {
  MEGATRAIN_RETURN_IF_ERROR(CheckEval(spec));
  MEGATRAIN_RETURN_IF_ERROR(CheckExists("data.text", spec.data.text));
  MEGATRAIN_RETURN_IF_ERROR(CheckExists("data.tokenizer", spec.data.tokenizer));
  const std::string config_json = inputs.hf_config_json.value_or("");
  absl::StatusOr<EngineBackend::ModelLimits> limits = backend->ModelLimitsOf(spec, config_json);
  if (!limits.ok()) {
    // The config's own code: UNIMPLEMENTED for an unsupported architecture.
    return absl::Status(limits.status().code(),
                        absl::StrCat(spec.model.hf_dir.empty() ? "model.preset" : "model.hf_dir",
                                     ": ", limits.status().message()));
  }
  if (limits->max_position_embeddings > 0 && spec.train.seq_len > limits->max_position_embeddings &&
      !spec.train.allow_seq_len_above_max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.seq_len: ", spec.train.seq_len, " is above the model's max_position_embeddings ",
        limits->max_position_embeddings,
        " (positions it was never trained on); lower it, or set "
        "train.allow_seq_len_above_max_position_embeddings: true"));
  }
  if (limits->num_hidden_layers > 0 && spec.train.resident_layers > limits->num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.resident_layers: ", spec.train.resident_layers,
                     " is more than the model's num_hidden_layers ", limits->num_hidden_layers));
  }
  MEGATRAIN_RETURN_IF_ERROR(
      CheckShards("data.tokens", spec.data.tokens, limits->vocab_size, backend));
  MEGATRAIN_RETURN_IF_ERROR(
      CheckShards("data.eval_tokens", spec.data.eval_tokens, limits->vocab_size, backend));
  MEGATRAIN_RETURN_IF_ERROR(CheckJobData(spec, limits->vocab_size, backend));  // data_checks.h
  if (!spec.model.hf_dir.empty()) {
    absl::Status weights = backend->CheckHfWeightHeaders(spec.model.hf_dir, config_json);
    if (!weights.ok()) return Refuse("model.hf_dir", weights);
  }
  return absl::OkStatus();
}

}  // namespace megatrain::server
