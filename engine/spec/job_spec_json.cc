// See job_spec_json.h.
#include "engine/spec/job_spec_json.h"

#include "absl/strings/str_cat.h"
#include "engine/spec/spec_fields.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {
namespace {

using nlohmann::json;

// Reads j[key] into *out when present and not null; throws json::exception
// for a value of the wrong type.
template <typename T>
void Get(const json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it != j.end() && !it->is_null()) *out = it->get<T>();
}

// j[key] when it is an object, else an empty object (a missing section
// keeps its defaults).
const json& Section(const json& j, const char* key) {
  static const json* empty = new json(json::object());
  auto it = j.find(key);
  return (it != j.end() && it->is_object()) ? *it : *empty;
}

// Fields added after the format was pinned (job_spec_test's former-writer
// bytes) are written only when they differ from their default, so that a
// default spec keeps its bytes and older readers see what they know.
// Note [Spec field table]: a row's value into `j` (kPinned always,
// kIfSet when it differs from the section's default).
constexpr bool kPinned = true;
constexpr bool kIfSet = false;
template <typename T>
void PutField(json& j, const char* key, const T& value, const T& default_value, bool pinned) {
  if (pinned || value != default_value) j[key] = value;
}

json TrainToJson(const TrainSpec& t) {
  json j = {{"micro_batch", t.micro_batch},
            {"seq_len", t.seq_len},
            {"gradient_accumulation_steps", t.gradient_accumulation_steps},
            {"max_steps", t.max_steps},
            {"max_tokens", t.max_tokens},
            {"compute_dtype", ComputeDtypeName(t.compute_dtype)},
            {"seed", t.seed},
            {"nan_policy", NanPolicyName(t.nan_policy)},
            {"offload_activations", t.offload_activations}};
  if (t.allow_seq_len_above_max_position_embeddings) {
    j["allow_seq_len_above_max_position_embeddings"] = true;
  }
  if (t.schedule.has_value()) j["schedule"] = StepScheduleName(*t.schedule);
  if (t.activations != ActivationPlacement::kAuto) {
    j["activations"] = ActivationPlacementName(t.activations);
  }
  if (t.cuda_graphs != CudaGraphs::kAuto) j["cuda_graphs"] = CudaGraphsName(t.cuda_graphs);
  if (t.devices != 1) j["devices"] = t.devices;
  if (t.resident_layers != kAutoResidentLayers) j["resident_layers"] = t.resident_layers;
#define MEGATRAIN_PUT(name, kind, range, pinned) \
  PutField(j, #name, t.name, TrainSpec{}.name, pinned);
  MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_PUT)
#undef MEGATRAIN_PUT
  return j;
}

json OptimizerToJson(const OptimizerSpec& o) {
  json j = {{"weight_decay", o.weight_decay},
            {"warmup_steps", o.warmup_steps},
            {"schedule", std::string(LrScheduleKindName(o.schedule))},
            {"min_lr_ratio", o.min_lr_ratio}};
#define MEGATRAIN_PUT(name, kind, range, pinned) \
  PutField(j, #name, o.name, OptimizerSpec{}.name, pinned);
  MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_PUT)
#undef MEGATRAIN_PUT
  return j;
}

absl::Status ModelAndDataFromJson(const json& j, JobSpec* spec) {
  const json& model = Section(j, "model");
  Get(model, "preset", &spec->model.preset);
  Get(model, "hf_dir", &spec->model.hf_dir);
  if (auto it = model.find("output_router_logits"); it != model.end() && !it->is_null()) {
    spec->model.output_router_logits = it->get<bool>();
  }
  // Absent (no init_from, or a spec written before the field): none.
  if (auto it = model.find("init_from"); it != model.end() && it->is_object()) {
    Get(*it, "checkpoint", &spec->model.init_from.checkpoint);
    Get(*it, "checkpoint_dir", &spec->model.init_from.checkpoint_dir);
    if (auto h = it->find("manifest_xxh64"); h != it->end() && h->is_number_unsigned()) {
      spec->model.init_from.manifest_xxh64 = h->get<uint64_t>();
    }
    std::string optimizer(InitOptimizerName(spec->model.init_from.optimizer));
    Get(*it, "optimizer", &optimizer);
    absl::StatusOr<InitOptimizer> parsed = ParseInitOptimizer(optimizer);
    if (!parsed.ok()) {
      return absl::DataLossError(absl::StrCat("job spec JSON: ", parsed.status().message()));
    }
    spec->model.init_from.optimizer = *parsed;
  }
  const json& data = Section(j, "data");
  Get(data, "tokens", &spec->data.tokens);
  Get(data, "eval_tokens", &spec->data.eval_tokens);
  Get(data, "text", &spec->data.text);
  Get(data, "tokenizer", &spec->data.tokenizer);
  Get(data, "eval_fraction", &spec->data.eval_fraction);
  Get(data, "shuffle_seed", &spec->data.shuffle_seed);
  // Absent (the default, or a spec written before the field): auto.
  std::string attention(DocumentAttentionName(spec->data.packing.document_attention));
  Get(Section(data, "packing"), "document_attention", &attention);
  absl::StatusOr<DocumentAttention> mode = ParseDocumentAttention(attention);
  if (!mode.ok()) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", mode.status().message()));
  }
  spec->data.packing.document_attention = *mode;
  return absl::OkStatus();
}

// The keywords of train.schedule, train.activations and train.cuda_graphs
// (step_schedule.h; absent: auto).
absl::Status ScheduleFromJson(const json& train, TrainSpec* t) {
  std::string schedule = StepScheduleRequestName(t->schedule);
  Get(train, "schedule", &schedule);
  absl::StatusOr<std::optional<StepSchedule>> order = ParseStepSchedule(schedule, "train.schedule");
  std::string activations = ActivationPlacementName(t->activations);
  Get(train, "activations", &activations);
  absl::StatusOr<ActivationPlacement> placement =
      ParseActivationPlacement(activations, "train.activations");
  std::string cuda_graphs = CudaGraphsName(t->cuda_graphs);
  Get(train, "cuda_graphs", &cuda_graphs);
  absl::StatusOr<CudaGraphs> graphs = ParseCudaGraphs(cuda_graphs, "train.cuda_graphs");
  for (const absl::Status& status : {order.status(), placement.status(), graphs.status()}) {
    if (!status.ok()) return absl::DataLossError(absl::StrCat("job spec JSON: ", status.message()));
  }
  t->schedule = *order;
  t->activations = *placement;
  t->cuda_graphs = *graphs;
  return absl::OkStatus();
}

absl::Status TrainFromJson(const json& j, TrainSpec* t) {
  const json& train = Section(j, "train");
  Get(train, "micro_batch", &t->micro_batch);
  Get(train, "seq_len", &t->seq_len);
  Get(train, "gradient_accumulation_steps", &t->gradient_accumulation_steps);
  Get(train, "max_steps", &t->max_steps);
  Get(train, "max_tokens", &t->max_tokens);
  std::string dtype = ComputeDtypeName(t->compute_dtype);
  Get(train, "compute_dtype", &dtype);
  absl::StatusOr<ComputeDtype> compute_dtype = ParseComputeDtype(dtype);
  if (!compute_dtype.ok()) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", compute_dtype.status().message()));
  }
  t->compute_dtype = *compute_dtype;
  Get(train, "seed", &t->seed);
  // Specs written before nan_policy replaced the bool skip_nonfinite_steps.
  bool skip_nonfinite_steps = t->nan_policy == NanPolicy::kSkip;
  Get(train, "skip_nonfinite_steps", &skip_nonfinite_steps);
  std::string nan_policy = skip_nonfinite_steps ? "skip" : "fail";
  Get(train, "nan_policy", &nan_policy);
  absl::StatusOr<NanPolicy> policy = ParseNanPolicy(nan_policy);
  if (!policy.ok()) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", policy.status().message()));
  }
  t->nan_policy = *policy;
  // Absent in specs written before the field existed: off, as they ran.
  Get(train, "offload_activations", &t->offload_activations);
  Get(train, "allow_seq_len_above_max_position_embeddings",
      &t->allow_seq_len_above_max_position_embeddings);
#define MEGATRAIN_GET(name, kind, range, pinned) Get(train, #name, &t->name);
  MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_GET)
#undef MEGATRAIN_GET
  Get(train, "devices", &t->devices);                  // absent before data parallelism: 1
  Get(train, "resident_layers", &t->resident_layers);  // absent: auto
  return ScheduleFromJson(train, t);
}

absl::Status MemoryFromJson(const json& j, MemorySpec* m) {
  std::string tier(NvmeTierModeName(m->nvme_tier));
  Get(Section(j, "memory"), "nvme_tier", &tier);
  absl::StatusOr<NvmeTierMode> mode = ParseNvmeTierMode(tier);
  if (!mode.ok()) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", mode.status().message()));
  }
  m->nvme_tier = *mode;
  std::string weight_stream(WeightStreamName(m->weight_stream));
  Get(Section(j, "memory"), "weight_stream", &weight_stream);
  absl::StatusOr<WeightStream> stream = ParseWeightStream(weight_stream);
  if (!stream.ok()) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", stream.status().message()));
  }
  m->weight_stream = *stream;
  std::string landing(GradientLandingName(m->gradient_landing));
  Get(Section(j, "memory"), "gradient_landing", &landing);
  absl::StatusOr<GradientLanding> land = ParseGradientLanding(landing);
  if (!land.ok()) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", land.status().message()));
  }
  m->gradient_landing = *land;
  return absl::OkStatus();
}

absl::Status OptimizerEvalCheckpointFromJson(const json& j, JobSpec* spec) {
  const json& optimizer = Section(j, "optimizer");
#define MEGATRAIN_GET(name, kind, range, pinned) Get(optimizer, #name, &spec->optimizer.name);
  MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_GET)
#undef MEGATRAIN_GET
  Get(optimizer, "weight_decay", &spec->optimizer.weight_decay);
  Get(optimizer, "warmup_steps", &spec->optimizer.warmup_steps);
  std::string schedule(LrScheduleKindName(spec->optimizer.schedule));
  Get(optimizer, "schedule", &schedule);
  absl::StatusOr<LrScheduleKind> kind = ParseLrScheduleKind(schedule);
  if (!kind.ok()) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", kind.status().message()));
  }
  spec->optimizer.schedule = *kind;
  Get(optimizer, "min_lr_ratio", &spec->optimizer.min_lr_ratio);
  const json& eval = Section(j, "eval");
  Get(eval, "every_steps", &spec->eval.every_steps);
  Get(eval, "batches", &spec->eval.batches);
  const json& checkpoint = Section(j, "checkpoint");
  Get(checkpoint, "every_steps", &spec->checkpoint.every_steps);
  Get(checkpoint, "keep_last", &spec->checkpoint.keep_last);
  Get(checkpoint, "keep_every", &spec->checkpoint.keep_every);
  return absl::OkStatus();
}

}  // namespace

json JobSpecToJsonObject(const JobSpec& s) {
  json j;
  j["name"] = s.name;
  j["model"] = {{"preset", s.model.preset}, {"hf_dir", s.model.hf_dir}};
  if (s.model.output_router_logits.has_value()) {
    j["model"]["output_router_logits"] = *s.model.output_router_logits;
  }
  if (!s.model.init_from.checkpoint.empty()) {
    j["model"]["init_from"] = {{"checkpoint", s.model.init_from.checkpoint},
                               {"optimizer", InitOptimizerName(s.model.init_from.optimizer)},
                               {"checkpoint_dir", s.model.init_from.checkpoint_dir},
                               {"manifest_xxh64", s.model.init_from.manifest_xxh64}};
  }
  j["data"] = {{"tokens", s.data.tokens},
               {"eval_tokens", s.data.eval_tokens},
               {"text", s.data.text},
               {"tokenizer", s.data.tokenizer},
               {"eval_fraction", s.data.eval_fraction},
               {"shuffle_seed", s.data.shuffle_seed}};
  if (s.data.packing.document_attention != DocumentAttention::kAuto) {
    j["data"]["packing"] = {{"document_attention", std::string(DocumentAttentionName(
                                                       s.data.packing.document_attention))}};
  }
  j["train"] = TrainToJson(s.train);
  j["optimizer"] = OptimizerToJson(s.optimizer);
  j["eval"] = {{"every_steps", s.eval.every_steps}, {"batches", s.eval.batches}};
  j["checkpoint"] = {{"every_steps", s.checkpoint.every_steps},
                     {"keep_last", s.checkpoint.keep_last},
                     {"keep_every", s.checkpoint.keep_every}};
  if (s.memory.nvme_tier != NvmeTierMode::kOff) {
    j["memory"] = {{"nvme_tier", std::string(NvmeTierModeName(s.memory.nvme_tier))}};
  }
  if (s.memory.weight_stream != WeightStream::kBf16) {
    j["memory"]["weight_stream"] = std::string(WeightStreamName(s.memory.weight_stream));
  }
  if (s.memory.gradient_landing != GradientLanding::kArena) {
    j["memory"]["gradient_landing"] = std::string(GradientLandingName(s.memory.gradient_landing));
  }
  j["output_dir"] = s.output_dir;
  return j;
}

std::string JobSpecToJson(const JobSpec& spec) { return JobSpecToJsonObject(spec).dump(); }

absl::Status JobSpecFromJsonObject(const json& j, JobSpec* spec) {
  if (!j.is_object()) return absl::DataLossError("job spec JSON: not an object");
  try {
    Get(j, "name", &spec->name);
    if (absl::Status status = ModelAndDataFromJson(j, spec); !status.ok()) return status;
    if (absl::Status status = TrainFromJson(j, &spec->train); !status.ok()) return status;
    if (absl::Status status = OptimizerEvalCheckpointFromJson(j, spec); !status.ok()) {
      return status;
    }
    if (absl::Status status = MemoryFromJson(j, &spec->memory); !status.ok()) return status;
    Get(j, "output_dir", &spec->output_dir);
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> JobSpecFromJson(absl::string_view text) {
  const json j = json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::DataLossError("job spec JSON: does not parse");
  JobSpec spec;
  if (absl::Status status = JobSpecFromJsonObject(j, &spec); !status.ok()) return status;
  return spec;
}

}  // namespace megatrain::engine
