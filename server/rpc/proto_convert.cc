// See proto_convert.h.
#include "server/rpc/proto_convert.h"

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/runtime/status_macros.h"
#include "engine/spec/document_attention.h"
#include "engine/spec/keyword.h"
#include "engine/spec/nvme_tier_mode.h"
#include "engine/spec/spec_fields.h"
#include "server/core/logging.h"

namespace megatrain::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

absl::Status CheckAbsolute(absl::string_view field, const std::string& path) {
  if (path.empty() || std::filesystem::path(path).is_absolute()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field,
                   ": must be an absolute path on the daemon's machine (the CLI resolves relative "
                   "paths against the job file's directory), got ",
                   QuoteForError(path)));
}

// The strings of a JobSpec against Note [String caps].
absl::Status CheckJobSpecBounds(const v1::JobSpec& spec) {
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("spec.name", spec.name(), kMaxJobNameBytes));
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("model.preset", spec.model().preset(), kMaxKeywordBytes));
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("model.hf_dir", spec.model().hf_dir(), kMaxPathBytes));
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("model.init_from.checkpoint",
                                        spec.model().init_from().checkpoint(), kMaxKeywordBytes));
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("data.tokens", spec.data().tokens(), kMaxPathBytes));
  MEGATRAIN_RETURN_IF_ERROR(
      CheckLength("data.eval_tokens", spec.data().eval_tokens(), kMaxPathBytes));
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("data.text", spec.data().text(), kMaxPathBytes));
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("data.tokenizer", spec.data().tokenizer(), kMaxPathBytes));
  // Keyword rows (Note [Spec field table]) need no cap: a word not in the
  // row's table is refused quoting at most 32 bytes of it, escaped.
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("output_dir", spec.output_dir(), kMaxPathBytes));
  if (spec.labels_size() > kMaxLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat("labels: at most ", kMaxLabels, " labels, got ", spec.labels_size()));
  }
  for (const auto& [key, value] : spec.labels()) {
    MEGATRAIN_RETURN_IF_ERROR(CheckLength("labels (a key)", key, kMaxLabelKeyLength));
    MEGATRAIN_RETURN_IF_ERROR(CheckLength(absl::StrCat("labels.", EscapeControlCharacters(key)),
                                          value, kMaxLabelValueLength));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckLength(absl::string_view field, absl::string_view value, size_t max_bytes) {
  if (const size_t nul = value.find('\0'); nul != absl::string_view::npos) {
    // A NUL cuts the string for every C API below (paths, the terminal).
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": contains a NUL byte (at byte ", nul, "); not allowed"));
  }
  if (value.size() <= max_bytes) return absl::OkStatus();
  // Why 32: enough to recognise the value, little enough to echo.
  constexpr size_t kQuotedPrefixBytes = 32;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", value.size(), " bytes, more than the ", max_bytes,
                   " allowed (starts ", QuoteForError(value.substr(0, kQuotedPrefixBytes)), ")"));
}

absl::Status CheckRequestBounds(const v1::SubmitJobRequest& request) {
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("request_id", request.request_id(), kMaxRequestIdLength));
  return CheckJobSpecBounds(request.spec());
}

absl::Status CheckRequestBounds(const v1::GetJobRequest& request) {
  return CheckLength("job_id", request.job_id(), kMaxIdBytes);
}

absl::Status CheckRequestBounds(const v1::ListJobsRequest& request) {
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("page_token", request.page_token(), kMaxPageTokenBytes));
  return CheckLength("owner", request.owner(), kMaxUserNameBytes);
}

absl::Status CheckRequestBounds(const v1::CancelJobRequest& request) {
  return CheckLength("job_id", request.job_id(), kMaxIdBytes);
}

absl::Status CheckRequestBounds(const v1::SuspendJobRequest& request) {
  return CheckLength("job_id", request.job_id(), kMaxIdBytes);
}

absl::Status CheckRequestBounds(const v1::ResumeJobRequest& request) {
  return CheckLength("job_id", request.job_id(), kMaxIdBytes);
}

absl::Status CheckRequestBounds(const v1::WatchJobRequest& request) {
  return CheckLength("job_id", request.job_id(), kMaxIdBytes);
}

absl::Status CheckRequestBounds(const v1::CreateCheckpointRequest& request) {
  return CheckLength("job_id", request.job_id(), kMaxIdBytes);
}

absl::Status CheckRequestBounds(const v1::ListCheckpointsRequest& request) {
  return CheckLength("job_id", request.job_id(), kMaxIdBytes);
}

absl::Status CheckRequestBounds(const v1::ExportCheckpointRequest& request) {
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("checkpoint_id", request.checkpoint_id(), kMaxIdBytes));
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("out_dir", request.out_dir(), kMaxPathBytes));
  return CheckLength("dtype", request.dtype(), kMaxKeywordBytes);
}

absl::Status CheckRequestBounds(const v1::DeleteCheckpointRequest& request) {
  return CheckLength("checkpoint_id", request.checkpoint_id(), kMaxIdBytes);
}

absl::Status CheckRequestBounds(const v1::GetMetricsRequest& request) {
  return CheckLength("name_prefix", request.name_prefix(), kMaxMetricPrefixBytes);
}

absl::Status CheckRequestBounds(const v1::ListAuditRecordsRequest& request) {
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("user", request.user(), kMaxUserNameBytes));
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("job_id", request.job_id(), kMaxIdBytes));
  MEGATRAIN_RETURN_IF_ERROR(CheckLength("method", request.method(), kMaxKeywordBytes));
  return CheckLength("page_token", request.page_token(), kMaxPageTokenBytes);
}

namespace {

// Note [Spec field table] (engine/spec/spec_fields.h): a row from its
// proto section `in` into the spec's section `out`, and back. A number
// row's Optional proto field keeps the default when unset; a keyword row's
// unset or empty string keeps it, and an unknown word is INVALID_ARGUMENT
// naming the field (`prefix` is the section's path, "train.").
#define MEGATRAIN_PROTO_HAS_Optional(message, name) message.has_##name()
#define MEGATRAIN_PROTO_HAS_Plain(message, name) true
#define MEGATRAIN_NUMBER_FROM_PROTO(name, kind, range, json, proto) \
  if (MEGATRAIN_PROTO_HAS_##proto(in, name)) out->name = in.name();
#define MEGATRAIN_KEYWORD_FROM_PROTO(name, keywords, json) \
  errors.Add(                                              \
      KeywordFromProto(in.name(), absl::StrCat(prefix, #name), engine::keywords, &out->name));
#define MEGATRAIN_NUMBER_TO_PROTO(name, kind, range, json, proto) out->set_##name(in.name);
#define MEGATRAIN_KEYWORD_TO_PROTO(name, keywords, json) \
  out->set_##name(KeywordOrUnknown(engine::keywords, in.name));

template <typename T, size_t N>
absl::Status KeywordFromProto(const std::string& word, absl::string_view field,
                              const engine::Keyword<T> (&keywords)[N], T* out) {
  if (word.empty()) return absl::OkStatus();
  MEGATRAIN_ASSIGN_OR_RETURN(*out, engine::ParseKeyword(keywords, word, field));
  return absl::OkStatus();
}

// The keyword of `value`; "?" for an enum cast from a bad integer (a
// spec ValidateJobSpec refuses).
template <typename T, size_t N>
std::string KeywordOrUnknown(const engine::Keyword<T> (&keywords)[N], const T& value) {
  const char* word = engine::KeywordName(keywords, value);
  return word != nullptr ? word : "?";
}

// The rows of the train section; every bad keyword at once.
absl::Status TrainRowsFromProto(const v1::TrainSpec& in, engine::TrainSpec* out) {
  MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_NUMBER_FROM_PROTO)
  engine::SpecErrors errors;
  constexpr absl::string_view prefix = "train.";
  MEGATRAIN_TRAIN_KEYWORD_FIELDS(MEGATRAIN_KEYWORD_FROM_PROTO)
  return errors.ToStatus();
}

// The rows of the optimizer, eval, checkpoint and memory sections.
absl::Status OtherRowsFromProto(const v1::JobSpec& proto, engine::JobSpec* spec) {
  engine::SpecErrors errors;
  {
    const v1::OptimizerSpec& in = proto.optimizer();
    engine::OptimizerSpec* out = &spec->optimizer;
    constexpr absl::string_view prefix = "optimizer.";
    MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_NUMBER_FROM_PROTO)
    MEGATRAIN_OPTIMIZER_KEYWORD_FIELDS(MEGATRAIN_KEYWORD_FROM_PROTO)
  }
  {
    const v1::EvalSpec& in = proto.eval();
    engine::EvalSpec* out = &spec->eval;
    MEGATRAIN_EVAL_NUMBER_FIELDS(MEGATRAIN_NUMBER_FROM_PROTO)
  }
  {
    const v1::CheckpointSpec& in = proto.checkpoint();
    engine::CheckpointSpec* out = &spec->checkpoint;
    MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(MEGATRAIN_NUMBER_FROM_PROTO)
  }
  const v1::MemorySpec& in = proto.memory();
  engine::MemorySpec* out = &spec->memory;
  constexpr absl::string_view prefix = "memory.";
  MEGATRAIN_MEMORY_KEYWORD_FIELDS(MEGATRAIN_KEYWORD_FROM_PROTO)
  return errors.ToStatus();
}

// The rows of every section, back into the proto.
void RowsToProto(const engine::JobSpec& spec, v1::JobSpec* proto) {
  {
    const engine::TrainSpec& in = spec.train;
    v1::TrainSpec* out = proto->mutable_train();
    MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_NUMBER_TO_PROTO)
    MEGATRAIN_TRAIN_KEYWORD_FIELDS(MEGATRAIN_KEYWORD_TO_PROTO)
  }
  {
    const engine::OptimizerSpec& in = spec.optimizer;
    v1::OptimizerSpec* out = proto->mutable_optimizer();
    MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_NUMBER_TO_PROTO)
    MEGATRAIN_OPTIMIZER_KEYWORD_FIELDS(MEGATRAIN_KEYWORD_TO_PROTO)
  }
  {
    const engine::EvalSpec& in = spec.eval;
    v1::EvalSpec* out = proto->mutable_eval();
    MEGATRAIN_EVAL_NUMBER_FIELDS(MEGATRAIN_NUMBER_TO_PROTO)
  }
  {
    const engine::CheckpointSpec& in = spec.checkpoint;
    v1::CheckpointSpec* out = proto->mutable_checkpoint();
    MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(MEGATRAIN_NUMBER_TO_PROTO)
  }
  // memory.nvme_tier always written: a job's spec holds the resolved
  // tier (auto became off or moments at submission), and `get` shows
  // it rather than "".
  const engine::MemorySpec& in = spec.memory;
  v1::MemorySpec* out = proto->mutable_memory();
  MEGATRAIN_MEMORY_KEYWORD_FIELDS(MEGATRAIN_KEYWORD_TO_PROTO)
}

// train.global_batch (server-side only), after the rows: sets
// gradient_accumulation_steps = global_batch / micro_batch, which a
// given gradient_accumulation_steps must agree with.
absl::Status GlobalBatchFromProto(const v1::TrainSpec& train, engine::TrainSpec* train_spec) {
  if (!train.has_global_batch()) return absl::OkStatus();
  const int64_t global_batch = train.global_batch();
  const int64_t micro_batch = train_spec->micro_batch;
  if (global_batch <= 0 || micro_batch <= 0 || global_batch % micro_batch != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.global_batch: must be a positive "
                     "multiple of train.micro_batch (",
                     micro_batch, "), got ", global_batch));
  }
  const int64_t steps = global_batch / micro_batch;
  if (train.has_gradient_accumulation_steps() && train_spec->gradient_accumulation_steps != steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.gradient_accumulation_steps: ", train_spec->gradient_accumulation_steps,
                     " disagrees with train.global_batch / train.micro_batch = ", global_batch,
                     " / ", micro_batch, " = ", steps, "; give one of the two"));
  }
  train_spec->gradient_accumulation_steps = steps;
  return absl::OkStatus();
}

// The train section: the rows, the global_batch rule, precision, NaN
// policy, the flags, devices and resident layers.
absl::Status TrainFromProto(const v1::TrainSpec& train, engine::TrainSpec* train_spec) {
  MEGATRAIN_RETURN_IF_ERROR(TrainRowsFromProto(train, train_spec));
  MEGATRAIN_RETURN_IF_ERROR(GlobalBatchFromProto(train, train_spec));
  switch (train.compute_dtype()) {
    case v1::COMPUTE_DTYPE_UNSPECIFIED:
    case v1::COMPUTE_DTYPE_FP32:
      train_spec->compute_dtype = engine::ComputeDtype::kFp32;
      break;
    case v1::COMPUTE_DTYPE_TF32:
      train_spec->compute_dtype = engine::ComputeDtype::kTf32;
      break;
    case v1::COMPUTE_DTYPE_BF16:
      train_spec->compute_dtype = engine::ComputeDtype::kBf16;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("train.compute_dtype: unknown value ",
                                                     static_cast<int>(train.compute_dtype())));
  }
  train_spec->seed = train.seed();
  switch (train.nan_policy()) {
    case v1::NAN_POLICY_UNSPECIFIED:
    case v1::NAN_POLICY_SKIP:
      train_spec->nan_policy = engine::NanPolicy::kSkip;
      break;
    case v1::NAN_POLICY_FAIL:
      train_spec->nan_policy = engine::NanPolicy::kFail;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("train.nan_policy: unknown value ", static_cast<int>(train.nan_policy())));
  }
  if (train.has_offload_activations()) {
    train_spec->offload_activations = train.offload_activations();
  }
  if (train.has_allow_seq_len_above_max_position_embeddings()) {
    train_spec->allow_seq_len_above_max_position_embeddings =
        train.allow_seq_len_above_max_position_embeddings();
  }
  if (train.has_devices()) train_spec->devices = train.devices();
  if (train.has_resident_layers()) {
    // Unset is auto; a negative count is no spelling of it.
    if (train.resident_layers() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.resident_layers: must be >= 0 (leave "
                       "it unset for auto), got ",
                       train.resident_layers()));
    }
    train_spec->resident_layers = train.resident_layers();
  }
  return absl::OkStatus();
}

// Paths are resolved by the CLI: the daemon takes absolute ones only.
absl::Status CheckAbsolutePaths(const engine::JobSpec& spec) {
  for (const auto& [field, path] :
       {std::pair<absl::string_view, const std::string&>{"model.hf_dir", spec.model.hf_dir},
        {"data.tokens", spec.data.tokens},
        {"data.text", spec.data.text},
        {"data.tokenizer", spec.data.tokenizer},
        {"output_dir", spec.output_dir}}) {
    absl::Status status = CheckAbsolute(field, path);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobRequest> JobRequestFromProto(const v1::JobSpec& in) {
  MEGATRAIN_RETURN_IF_ERROR(CheckJobSpecBounds(in));
  JobRequest request;
  engine::JobSpec& spec = request.spec;
  spec.name = in.name();
  spec.model.preset = in.model().preset();
  spec.model.hf_dir = in.model().hf_dir();
  if (in.model().has_output_router_logits()) {
    spec.model.output_router_logits = in.model().output_router_logits();
  }
  spec.model.init_from.checkpoint = in.model().init_from().checkpoint();
  if (!in.model().init_from().optimizer().empty()) {
    MEGATRAIN_ASSIGN_OR_RETURN(spec.model.init_from.optimizer,
                               engine::ParseInitOptimizer(in.model().init_from().optimizer()));
  }

  const v1::DataSpec& data = in.data();
  spec.data.tokens = data.tokens();
  spec.data.eval_tokens = data.eval_tokens();
  spec.data.text = data.text();
  spec.data.tokenizer = data.tokenizer();
  if (data.has_eval_fraction()) spec.data.eval_fraction = data.eval_fraction();
  if (data.has_shuffle_seed()) spec.data.shuffle_seed = data.shuffle_seed();
  if (!data.packing().document_attention().empty()) {
    MEGATRAIN_ASSIGN_OR_RETURN(spec.data.packing.document_attention,
                               engine::ParseDocumentAttention(data.packing().document_attention()));
  }

  MEGATRAIN_RETURN_IF_ERROR(TrainFromProto(in.train(), &spec.train));
  MEGATRAIN_RETURN_IF_ERROR(OtherRowsFromProto(in, &spec));
  spec.output_dir = in.output_dir();
  spec.optimizer.warmup_steps = in.optimizer().warmup_steps();
  request.priority = in.priority();
  request.labels = std::map<std::string, std::string>(in.labels().begin(), in.labels().end());

  MEGATRAIN_RETURN_IF_ERROR(CheckAbsolutePaths(spec));
  return request;
}

void JobRequestToProto(const JobRequest& request, v1::JobSpec* out) {
  const engine::JobSpec& spec = request.spec;
  out->set_name(spec.name);
  out->mutable_model()->set_preset(spec.model.preset);
  out->mutable_model()->set_hf_dir(spec.model.hf_dir);
  if (spec.model.output_router_logits.has_value()) {
    out->mutable_model()->set_output_router_logits(*spec.model.output_router_logits);
  }
  if (!spec.model.init_from.checkpoint.empty()) {
    v1::InitFrom* init = out->mutable_model()->mutable_init_from();
    init->set_checkpoint(spec.model.init_from.checkpoint);
    init->set_optimizer(engine::InitOptimizerName(spec.model.init_from.optimizer));
  }
  v1::DataSpec* data = out->mutable_data();
  data->set_tokens(spec.data.tokens);
  data->set_eval_tokens(spec.data.eval_tokens);
  data->set_text(spec.data.text);
  data->set_tokenizer(spec.data.tokenizer);
  data->set_eval_fraction(spec.data.eval_fraction);
  data->set_shuffle_seed(spec.data.shuffle_seed);
  data->mutable_packing()->set_document_attention(
      std::string(engine::DocumentAttentionName(spec.data.packing.document_attention)));
  v1::TrainSpec* train = out->mutable_train();
  RowsToProto(spec, out);
  switch (spec.train.compute_dtype) {
    case engine::ComputeDtype::kFp32:
      train->set_compute_dtype(v1::COMPUTE_DTYPE_FP32);
      break;
    case engine::ComputeDtype::kTf32:
      train->set_compute_dtype(v1::COMPUTE_DTYPE_TF32);
      break;
    case engine::ComputeDtype::kBf16:
      train->set_compute_dtype(v1::COMPUTE_DTYPE_BF16);
      break;
  }
  train->set_seed(spec.train.seed);
  train->set_nan_policy(spec.train.nan_policy == engine::NanPolicy::kFail ? v1::NAN_POLICY_FAIL
                                                                          : v1::NAN_POLICY_SKIP);
  train->set_offload_activations(spec.train.offload_activations);
  train->set_allow_seq_len_above_max_position_embeddings(
      spec.train.allow_seq_len_above_max_position_embeddings);
  train->set_devices(static_cast<int32_t>(spec.train.devices));
  if (spec.train.resident_layers != engine::kAutoResidentLayers) {
    train->set_resident_layers(static_cast<int32_t>(spec.train.resident_layers));
  }
  out->mutable_optimizer()->set_warmup_steps(spec.optimizer.warmup_steps);
  out->set_output_dir(spec.output_dir);
  out->set_priority(request.priority);
  for (const auto& [key, value] : request.labels) (*out->mutable_labels())[key] = value;
}

void JobToProto(const JobRecord& job, v1::Job* out) {
  out->set_id(job.id);
  out->set_owner(job.owner);
  JobRequestToProto(job.request, out->mutable_spec());
  out->set_state(static_cast<v1::JobState>(job.state));
  out->set_request_id(job.request_id);
  out->set_create_time_unix_ms(job.create_time_unix_ms);
  out->set_start_time_unix_ms(job.start_time_unix_ms);
  out->set_end_time_unix_ms(job.end_time_unix_ms);
  v1::JobProgress* progress = out->mutable_progress();
  progress->set_step(job.progress.step);
  progress->set_max_steps(job.progress.max_steps);
  progress->set_loss(job.progress.loss);
  if (job.progress.eval_loss.has_value()) progress->set_eval_loss(*job.progress.eval_loss);
  progress->set_tokens_per_s(job.progress.tokens_per_s);
  // 0: unknown (the engine has no peak for the device); absent, not
  // 0.
  if (job.progress.mfu > 0) progress->set_mfu(job.progress.mfu);
  progress->set_tokens(job.progress.tokens);
  progress->set_eta_seconds(job.progress.eta_seconds);
  out->set_device(job.device);
  out->set_host_memory_bytes(job.host_memory_bytes);
  if (job.state == JobState::kFailed && job.error_code != absl::StatusCode::kOk) {
    out->set_error_code(absl::StatusCodeToString(job.error_code));
  }
  // Note [Status text]: error_message only for FAILED; the latest
  // note of any state is status_message.
  if (job.state == JobState::kFailed) out->set_error_message(job.message);
  out->set_status_message(job.message);
  out->set_resume_from(job.resume_from);
  out->set_queue_position(job.queue_position);
}

void JobEventToProto(const JobEvent& event, v1::JobEvent* out) {
  out->set_seq(event.seq);
  out->set_job_id(event.job_id);
  out->set_time_unix_ms(event.time_unix_ms);
  switch (event.kind) {
    case JobEvent::Kind::kStateChange: {
      v1::JobEvent::StateChange* change = out->mutable_state_change();
      change->set_state(static_cast<v1::JobState>(event.state));
      change->set_message(event.message);
      break;
    }
    case JobEvent::Kind::kStep: {
      v1::JobEvent::Step* step = out->mutable_step();
      step->set_step(event.step);
      step->set_max_steps(event.max_steps);
      step->set_loss(event.loss);
      step->set_grad_norm(event.grad_norm);
      step->set_lr(event.lr);
      step->set_tokens_per_s(event.tokens_per_s);
      if (event.mfu > 0) step->set_mfu(event.mfu);  // 0: unknown, absent
      step->set_skipped(event.skipped);
      step->set_step_seconds(event.step_seconds);
      step->set_eta_seconds(event.eta_seconds);
      step->set_aux_loss(event.aux_loss);
      step->set_nvme_read_bytes(event.nvme_read_bytes);
      step->set_nvme_written_bytes(event.nvme_written_bytes);
      step->set_devices(static_cast<int32_t>(event.devices));
      step->set_device_tokens_per_s(event.device_tokens_per_s);
      break;
    }
    case JobEvent::Kind::kEval: {
      v1::JobEvent::Eval* eval = out->mutable_eval();
      eval->set_step(event.step);
      eval->set_eval_loss(event.eval_loss);
      break;
    }
    case JobEvent::Kind::kCheckpoint: {
      v1::JobEvent::CheckpointWritten* checkpoint = out->mutable_checkpoint();
      checkpoint->set_checkpoint_id(CheckpointId(event.job_id, event.step));
      checkpoint->set_step(event.step);
      checkpoint->set_dir(event.checkpoint_dir);
      checkpoint->set_seconds(event.checkpoint_seconds);
      break;
    }
  }
}

void CheckpointToProto(const CheckpointRecord& checkpoint, v1::Checkpoint* out) {
  out->set_id(CheckpointId(checkpoint.job_id, checkpoint.step));
  out->set_job_id(checkpoint.job_id);
  out->set_step(checkpoint.step);
  out->set_dir(checkpoint.dir);
  out->set_bytes(checkpoint.bytes);
  out->set_create_time_unix_ms(checkpoint.create_time_unix_ms);
  out->set_write_seconds(checkpoint.write_seconds);
}

void AuditRecordToProto(const AuditRecord& record, v1::AuditRecord* out) {
  out->set_seq(record.seq);
  out->set_time_unix_ms(record.time_unix_ms);
  out->set_user(record.user);
  out->set_role(record.role);
  out->set_peer(record.peer);
  out->set_method(record.method);
  out->set_target(record.target);
  out->set_job_id(record.job_id);
  out->set_code(absl::StatusCodeToString(record.code));
  out->set_message(record.message);
  out->set_detail(record.detail);
}

absl::StatusOr<std::vector<JobState>> JobStatesFromProto(
    const google::protobuf::RepeatedField<int>& states) {
  std::vector<JobState> result;
  for (int state : states) {
    if (state < static_cast<int>(JobState::kQueued) ||
        state > static_cast<int>(JobState::kCancelled)) {
      return absl::InvalidArgumentError(absl::StrCat("states: unknown job state ", state));
    }
    result.push_back(static_cast<JobState>(state));
  }
  return result;
}

}  // namespace megatrain::server
