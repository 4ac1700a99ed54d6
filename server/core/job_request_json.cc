// See job_request_json.h.
#include "server/core/job_request_json.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace megatrain::server {

using nlohmann::json;

std::string JobRequestToJson(const JobRequest& request) {
  const engine::JobSpec& spec = request.spec;
  json j;
  j["name"] = spec.name;
  j["model"] = {{"preset", spec.model.preset}, {"hf_dir", spec.model.hf_dir}};
  if (spec.model.output_router_logits.has_value()) {
    j["model"]["output_router_logits"] = *spec.model.output_router_logits;
  }
  j["data"] = {{"tokens", spec.data.tokens},
               {"eval_tokens", spec.data.eval_tokens},
               {"text", spec.data.text},
               {"tokenizer", spec.data.tokenizer},
               {"eval_fraction", spec.data.eval_fraction},
               {"shuffle_seed", spec.data.shuffle_seed}};
  j["train"] = {{"micro_batch", spec.train.micro_batch},
                {"seq_len", spec.train.seq_len},
                {"gradient_accumulation_steps", spec.train.gradient_accumulation_steps},
                {"max_steps", spec.train.max_steps},
                {"max_tokens", spec.train.max_tokens},
                {"compute_dtype", std::string(engine::ComputeDtypeName(spec.train.compute_dtype))},
                {"max_grad_norm", spec.train.max_grad_norm},
                {"seed", spec.train.seed},
                {"nan_policy", engine::NanPolicyName(spec.train.nan_policy)},
                {"offload_activations", spec.train.offload_activations}};
  j["optimizer"] = {{"lr", spec.optimizer.lr},
                    {"beta1", spec.optimizer.beta1},
                    {"beta2", spec.optimizer.beta2},
                    {"eps", spec.optimizer.eps},
                    {"weight_decay", spec.optimizer.weight_decay},
                    {"warmup_steps", spec.optimizer.warmup_steps},
                    {"schedule", spec.optimizer.schedule},
                    {"min_lr_ratio", spec.optimizer.min_lr_ratio}};
  j["eval"] = {{"every_steps", spec.eval.every_steps}, {"batches", spec.eval.batches}};
  j["checkpoint"] = {{"every_steps", spec.checkpoint.every_steps},
                     {"keep_last", spec.checkpoint.keep_last},
                     {"keep_every", spec.checkpoint.keep_every}};
  j["output_dir"] = spec.output_dir;
  j["priority"] = request.priority;
  j["labels"] = request.labels;  // std::map: sorted, deterministic
  return j.dump();
}

namespace {

// Reads j[key] into *out when present.
template <typename T>
void Get(const json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it != j.end() && !it->is_null()) *out = it->get<T>();
}

const json& Section(const json& j, const char* key) {
  static const json* empty = new json(json::object());
  auto it = j.find(key);
  return (it != j.end() && it->is_object()) ? *it : *empty;
}

}  // namespace

absl::StatusOr<JobRequest> JobRequestFromJson(absl::string_view text) {
  JobRequest request;
  engine::JobSpec& spec = request.spec;
  try {
    const json j = json::parse(text);
    if (!j.is_object()) return absl::DataLossError("job spec JSON: not an object");
    Get(j, "name", &spec.name);
    const json& model = Section(j, "model");
    Get(model, "preset", &spec.model.preset);
    Get(model, "hf_dir", &spec.model.hf_dir);
    if (auto it = model.find("output_router_logits"); it != model.end() && it->is_boolean()) {
      spec.model.output_router_logits = it->get<bool>();
    }
    const json& data = Section(j, "data");
    Get(data, "tokens", &spec.data.tokens);
    Get(data, "eval_tokens", &spec.data.eval_tokens);
    Get(data, "text", &spec.data.text);
    Get(data, "tokenizer", &spec.data.tokenizer);
    Get(data, "eval_fraction", &spec.data.eval_fraction);
    Get(data, "shuffle_seed", &spec.data.shuffle_seed);
    const json& train = Section(j, "train");
    Get(train, "micro_batch", &spec.train.micro_batch);
    Get(train, "seq_len", &spec.train.seq_len);
    Get(train, "gradient_accumulation_steps", &spec.train.gradient_accumulation_steps);
    Get(train, "max_steps", &spec.train.max_steps);
    Get(train, "max_tokens", &spec.train.max_tokens);
    std::string dtype = "fp32";
    Get(train, "compute_dtype", &dtype);
    absl::StatusOr<engine::ComputeDtype> compute_dtype = engine::ParseComputeDtype(dtype);
    if (!compute_dtype.ok()) {
      return absl::DataLossError(absl::StrCat("job spec JSON: ", compute_dtype.status().message()));
    }
    spec.train.compute_dtype = *compute_dtype;
    Get(train, "max_grad_norm", &spec.train.max_grad_norm);
    Get(train, "seed", &spec.train.seed);
    // Jobs stored before nan_policy replaced the bool skip_nonfinite_steps.
    bool skip_nonfinite_steps = true;
    Get(train, "skip_nonfinite_steps", &skip_nonfinite_steps);
    std::string nan_policy = skip_nonfinite_steps ? "skip" : "fail";
    Get(train, "nan_policy", &nan_policy);
    absl::StatusOr<engine::NanPolicy> policy = engine::ParseNanPolicy(nan_policy);
    if (!policy.ok()) {
      return absl::DataLossError(absl::StrCat("job spec JSON: ", policy.status().message()));
    }
    spec.train.nan_policy = *policy;
    // Absent in jobs stored before the field existed: off, as they ran.
    Get(train, "offload_activations", &spec.train.offload_activations);
    const json& optimizer = Section(j, "optimizer");
    Get(optimizer, "lr", &spec.optimizer.lr);
    Get(optimizer, "beta1", &spec.optimizer.beta1);
    Get(optimizer, "beta2", &spec.optimizer.beta2);
    Get(optimizer, "eps", &spec.optimizer.eps);
    Get(optimizer, "weight_decay", &spec.optimizer.weight_decay);
    Get(optimizer, "warmup_steps", &spec.optimizer.warmup_steps);
    Get(optimizer, "schedule", &spec.optimizer.schedule);
    Get(optimizer, "min_lr_ratio", &spec.optimizer.min_lr_ratio);
    const json& eval = Section(j, "eval");
    Get(eval, "every_steps", &spec.eval.every_steps);
    Get(eval, "batches", &spec.eval.batches);
    const json& checkpoint = Section(j, "checkpoint");
    Get(checkpoint, "every_steps", &spec.checkpoint.every_steps);
    Get(checkpoint, "keep_last", &spec.checkpoint.keep_last);
    Get(checkpoint, "keep_every", &spec.checkpoint.keep_every);
    Get(j, "output_dir", &spec.output_dir);
    Get(j, "priority", &request.priority);
    Get(j, "labels", &request.labels);
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", e.what()));
  }
  return request;
}

}  // namespace megatrain::server
