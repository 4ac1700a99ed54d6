// The job-level training loop (training_job.h): model, data, trainer,
// evaluation and checkpoints of one job.
#include "engine/job/training_job.h"
#include "engine/store/nvme_tier.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/data/data_loader.h"
#include "engine/fs/dir_fd.h"
#include "engine/fs/mapped_file.h"
#include "engine/step/executor.h"
#include "engine/step/schedule_choice.h"
#include "engine/formats/hf_model.h"
#include "engine/model/moe_layout.h"
#include "engine/store/host_store.h"
#include "engine/optim/lr_schedule.h"
#include "engine/runtime/status_macros.h"
#include "engine/data/text_corpus.h"
#include "engine/job/job_trainer.h"
#include "engine/job/step_options.h"
#include "engine/step/trainer.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;

// The job's model options on top of the config (model.output_router_logits).
absl::StatusOr<ModelConfig> ApplyModelOptions(const ModelSource& model, ModelConfig config) {
  if (!model.output_router_logits.has_value()) return config;
  if (config.moe == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.output_router_logits: only mixture-of-experts models (mixtral, qwen2_moe, "
        "qwen3_moe, gpt_oss) have a router; this model_type is '",
        config.model_type, "'"));
  }
  MoeModelConfig moe = MoeModelConfigOf(config);
  moe.moe.output_router_logits = *model.output_router_logits;
  return ModelConfigOf(moe);
}

absl::StatusOr<ModelConfig> ResolveModel(const ModelSource& model) {
  if (!model.preset.empty()) {
    MEGATRAIN_ASSIGN_OR_RETURN(ModelConfig preset, PresetConfig(model.preset));
    return ApplyModelOptions(model, std::move(preset));
  }
  absl::StatusOr<ModelConfig> config = LoadHfConfig(model.hf_dir);
  if (!config.ok()) return Annotate(config.status(), "model.hf_dir");
  return ApplyModelOptions(model, *std::move(config));
}

// Whether the job's gradients are counted in the ring (Note [Gradient ring]
// in step/grad_lander.h): memory.gradient_landing ring, or auto where the
// trainer surely takes it (clipping off, one micro-batch per step). Auto with accumulation is
// counted as the arena: whether the device sums the micro-batches is known only on the device.
// With train.devices > 1 what DataParallelTrainer takes (DataParallelGradientRing: the job's
// ranks reduce on the device path, which sums several micro-batches per rank on the device).
bool CountsGradientRing(const JobSpec& spec, const ModelConfig& config) {
  const GradientLanding landing = spec.memory.gradient_landing;
  if (spec.train.devices > 1) {
    return DataParallelGradientRing(StepOptionsOf(spec), config,
                                    static_cast<int>(spec.train.devices), GradientReduction::kAuto);
  }
  if (landing == GradientLanding::kRing) return true;
  return landing == GradientLanding::kAuto &&
         !ClippingForbidsGradientRing(spec.train.max_grad_norm) &&
         spec.train.gradient_accumulation_steps == 1;
}

// Whether the footprint plans the embedding resident on the device: an
// untied table, as the trainer's auto does on a GPU that holds it (Note
// [Auto resident layers] in step/schedule_choice.h). Its gradient is then
// not in host memory and it has no lookahead buffers.
bool PlansResidentEmbedding(const ModelConfig& config) { return !config.tie_word_embeddings; }

HostStoreOptions StoreOptions(const JobSpec& spec, const ModelConfig& config, bool pin) {
  HostStoreOptions o;
  o.gradient_ring = CountsGradientRing(spec, config);
  // With train.devices > 1 and the ring the shared store keeps no gradient
  // (Note [Ring shards]); each rank's embedding landing is counted apart.
  o.embedding_grad_in_host = !PlansResidentEmbedding(config) && spec.train.devices <= 1;
  o.streaming_bf16 = spec.train.compute_dtype == ComputeDtype::kBf16 &&
                     spec.memory.weight_stream == WeightStream::kBf16;
  o.pin = pin;
  return o;
}

// Whether the spec asks for the saved layer inputs in pinned host memory
// (RequestedActivations).
bool OffloadsActivations(const JobSpec& spec) {
  return ScheduleRequestOf(StepOptionsOf(spec)).activations == ActivationPlacement::kHost;
}

// Micro-batches whose layer inputs are saved at once: the layer-major wave
// the spec asks for on a GPU (RequestedOrder, Note [Schedule choice] in
// step/schedule_choice.h), else 1. Auto's smaller wave, when the inputs do
// not fit the device, is not foreseen here: it only lowers the device
// bytes. Auto never moves them to host memory, so the pinned bytes counted
// here are all there are.
int64_t SavedMicroBatches(const JobSpec& spec) {
  return RequestedOrder(ScheduleRequestOf(StepOptionsOf(spec)), /*gpu=*/true).wave;
}

// Layer inputs saved for backward that stay on the device: all L of them
// per saved micro-batch, or with offload the last layer's of each plus
// the ring of two device buffers that brings the others back (Note
// [Activation offload] in executor.h; nothing is offloaded when L = 1).
int64_t DeviceSavedLayers(const JobSpec& spec, const ModelConfig& config) {
  const int64_t layers = config.num_hidden_layers;
  const int64_t saved = SavedMicroBatches(spec);
  return OffloadsActivations(spec) && layers > 1 ? saved + 2 : saved * layers;
}

// Whether the job's moments go to the NVMe tier: moments always (without
// the daemon's directory the job fails at start), auto when the daemon
// resolved it to the tier by handing the job its directory.
bool UsesNvmeTier(const JobSpec& spec) {
  return spec.memory.nvme_tier == NvmeTierMode::kMoments ||
         (spec.memory.nvme_tier == NvmeTierMode::kAuto && !spec.memory.nvme_dir.empty());
}

// The job's subdirectory of the daemon's NVMe directory, holding its
// moment files (Note [Tiered trainer] in step/trainer.h): created through
// a descriptor of that directory (Note [Directory descriptors] in
// fs/dir_fd.h), emptied first (a crashed run's files are never reused: a
// resume reads the moments from its checkpoint), removed with everything
// in it when the job object goes away (finished, failed, cancelled,
// suspended). Not thread-safe; move-only through unique_ptr.
class NvmeJobDir {
 public:
  // FAILED_PRECONDITION naming memory.nvme_tier without a directory;
  // INVALID_ARGUMENT for a job id that is not one path component; the
  // directory's errors naming it.
  static absl::StatusOr<std::unique_ptr<NvmeJobDir>> Create(const JobSpec& spec) {
    if (spec.memory.nvme_dir.empty()) {
      return absl::FailedPreconditionError(
          "memory.nvme_tier: moments needs the daemon's NVMe directory (megatraind --nvme_dir), "
          "and this daemon has none");
    }
    const std::string name =
        spec.job_id.empty() ? absl::StrCat("standalone-", ::getpid()) : absl::StrCat(spec.job_id);
    if (name == "." || name == ".." || absl::StrContains(name, '/')) {
      return absl::InvalidArgumentError(
          absl::StrCat("job id '", name, "' is not a directory name"));
    }
    MEGATRAIN_ASSIGN_OR_RETURN(DirFd root, DirFd::Open(spec.memory.nvme_dir));
    MEGATRAIN_RETURN_IF_ERROR(root.RemoveTreeAt(name));
    MEGATRAIN_ASSIGN_OR_RETURN(DirFd dir, root.OpenChild(name, DirFd::Create::kYes));
    return std::unique_ptr<NvmeJobDir>(new NvmeJobDir(std::move(root), std::move(dir), name));
  }
  ~NvmeJobDir() {
    const absl::Status removed = root_.RemoveTreeAt(name_);
    if (!removed.ok()) std::fprintf(stderr, "megatrain: %s\n", removed.ToString().c_str());
  }
  std::string path() const { return absl::StrCat(root_.path(), "/", name_); }
  std::string io_path() const { return dir_.IoPath(); }

 private:
  NvmeJobDir(DirFd root, DirFd dir, std::string name)
      : root_(std::move(root)), dir_(std::move(dir)), name_(std::move(name)) {}
  DirFd root_, dir_;
  std::string name_;
};

// MemoryFootprint's largest streamed block and its slots (Note [No
// expert-group sub-blocks] in job/plan.cc), from the executor's memory plan
// with no resident layer or embedding (the floor every setting keeps).
void SetLargestBlock(const ModelConfig& config, ExecutorOptions exec, MemoryFootprint* f) {
  exec.resident_layers = 0;
  exec.resident_embedding = false;
  const ExecutorMemoryPlan floor = PlanExecutorMemory(config, exec);
  f->largest_block_params = floor.max_slot_numel;
  f->block_slot_bytes = floor.weight_slot_bytes + floor.cast_staging_bytes + floor.grad_slot_bytes;
  const ModelLayout layout = ModelLayout::Create(config);
  for (int64_t i = 0; i < static_cast<int64_t>(layout.blocks.size()); ++i) {
    if (i == layout.embedding_block() && !config.tie_word_embeddings) continue;
    if (layout.blocks[i].numel == floor.max_slot_numel) {
      f->largest_block_layer_idx = layout.blocks[i].layer_idx;
      return;
    }
  }
}

// The footprint of `spec` on `config`. `cancel` is checked between the
// phases that each lay out every block (the host store, the executor's
// plan, the largest block): its status is returned when it is not OK.
absl::StatusOr<MemoryFootprint> FootprintOf(const JobSpec& spec, const ModelConfig& config,
                                            const Cancellation& cancel) {
  MEGATRAIN_RETURN_IF_ERROR(cancel.Check());
  MemoryFootprint f;
  f.params = config.ParamCount();
  f.host = HostStore::EstimateBytes(config, StoreOptions(spec, config, /*pin=*/true));
  MEGATRAIN_RETURN_IF_ERROR(cancel.Check());
  const int64_t esize = spec.train.compute_dtype == ComputeDtype::kBf16 ? 2 : 4;
  const int64_t tokens = spec.train.micro_batch * spec.train.seq_len;
  // The executor's buffers exactly as it allocates them (Note [Executor
  // memory plan] in executor.h), with the trainer's auto settings on a GPU
  // (embedding and accumulation buffers as upper bounds: they stay on the
  // host when the device is too small for them; the CPU has none of them,
  // but the estimate is for a GPU).
  ExecutorOptions exec = ExecutorOptionsOf(StepOptionsOf(spec));
  exec.gradient_ring = CountsGradientRing(spec, config);
  exec.offload_activations = OffloadsActivations(spec);
  if (SavedMicroBatches(spec) > 1) {
    exec.schedule = StepSchedule::kLayerMajor;
    exec.wave = static_cast<int>(SavedMicroBatches(spec));
  }
  // (A forced count above the model's layers is refused at submission and
  // by the trainer; capped here so that the estimate stays defined.)
  exec.resident_layers = std::min<int64_t>(
      ResolveResidentLayers(config, static_cast<int>(spec.train.resident_layers), /*cuda=*/true),
      config.num_hidden_layers);
  exec.resident_embedding = PlansResidentEmbedding(config);
  exec.device_grad_accumulation = spec.train.gradient_accumulation_steps > 1;
  // Note [Ring shards]: each rank's ring holds its shard of a block.
  exec.grad_shard_world = static_cast<int>(std::max<int64_t>(1, spec.train.devices));
  const ExecutorMemoryPlan plan = PlanExecutorMemory(config, exec);
  MEGATRAIN_RETURN_IF_ERROR(cancel.Check());
  SetLargestBlock(config, exec, &f);
  MEGATRAIN_RETURN_IF_ERROR(cancel.Check());
  f.activation_offload_bytes = plan.activation_offload_bytes;
  f.host.staging = plan.pinned_bytes();
  f.gradient_ring_bytes = plan.grad_ring_bytes;
  // Note [Embedding lookahead]: untied and on the host only.
  f.embedding_lookahead_bytes = config.tie_word_embeddings || exec.resident_embedding
                                    ? 0
                                    : 2 * tokens * config.hidden_size * 4;
  if (spec.train.devices > 1) {
    // Note [Shared host store] (step/gradient_reducer.h): the weights,
    // moments, streaming copy and reduced gradient once; each rank's
    // pinned landing gradients and executor staging; no embedding
    // lookahead. Note [Shard-only landing] (store/host_store.h): on the
    // device path (NCCL, as on a GPU) the ranks sum their micro-batches on
    // the device (DataParallelTrainer asks for device gradient
    // accumulation), land their shards in the shared gradient itself, and
    // only the embedding's rows, unless it is resident, in a buffer of
    // their own. With the ring (Note [Ring shards] in
    // step/gradient_reducer.h) the shared store has no gradient and each
    // rank's ring holds shards (1/N of a layer per buffer), in staging.
    const int64_t ranks = spec.train.devices;
    const ModelLayout layout = ModelLayout::Create(config);
    const int64_t embedding_bytes =
        (layout.blocks[layout.embedding_block()].numel + 1023) / 1024 * 1024 * 4;
    const int64_t landing = exec.resident_embedding ? 0 : embedding_bytes;
    f.host.pinned += ranks * landing;
    f.host.grad += ranks * landing;
    f.host.staging *= ranks;
    f.gradient_ring_bytes *= ranks;
    f.embedding_lookahead_bytes = 0;
  }
  f.host_total_bytes = f.host.Total() + f.embedding_lookahead_bytes;
  f.device_resident_bytes = plan.resident_bytes + plan.grad_accumulation_bytes;
  // Device: the plan, the saved layer inputs outside it (fp32; with
  // offload the ring of two is in the plan), and the working set of one
  // layer's recompute + backward (~12 [B,T,max(C,F)] tensors, a rough
  // bound).
  const int64_t saved_outside_plan =
      DeviceSavedLayers(spec, config) - (plan.activation_ring_bytes > 0 ? 2 : 0);
  f.device_estimate_bytes =
      plan.device_bytes() + saved_outside_plan * tokens * config.hidden_size * 4 +
      12 * tokens * std::max(config.hidden_size, config.intermediate_size) * esize +
      LossWorkingBytes(config, spec.train.compute_dtype, tokens);  // the logits' chunk
  return UsesNvmeTier(spec) ? WithNvmeMoments(f, config, spec.train.devices) : f;
}

// FootprintOf, never cancelled.
MemoryFootprint FootprintOf(const JobSpec& spec, const ModelConfig& config) {
  return *FootprintOf(spec, config, Cancellation());
}

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

// The debug knob of training_job.h: MEGATRAIN_DEBUG_POISON_STEP=<step>[:loss|:grad].
constexpr char kPoisonStepEnv[] = "MEGATRAIN_DEBUG_POISON_STEP";

absl::StatusOr<NonFiniteInjection> DebugInjectionFromEnv() {
  NonFiniteInjection inject;
  const char* env = std::getenv(kPoisonStepEnv);
  if (env == nullptr || *env == '\0') return inject;
  absl::string_view text(env);
  absl::string_view kind = "loss";
  if (const size_t colon = text.find(':'); colon != absl::string_view::npos) {
    kind = text.substr(colon + 1);
    text = text.substr(0, colon);
  }
  if (!absl::SimpleAtoi(text, &inject.step) || inject.step < 1 ||
      (kind != "loss" && kind != "grad")) {
    return absl::InvalidArgumentError(absl::StrCat(
        kPoisonStepEnv, ": expected <step>[:loss|:grad] with step >= 1, got '", env, "'"));
  }
  inject.kind =
      kind == "grad" ? NonFiniteInjection::Kind::kGradient : NonFiniteInjection::Kind::kLoss;
  return inject;
}

}  // namespace

MemoryFootprint WithNvmeMoments(const MemoryFootprint& f, const ModelConfig& config,
                                int64_t devices) {
  if (f.nvme_bytes > 0) return f;
  const int64_t ranks = std::max<int64_t>(1, devices);
  const ModelLayout layout = ModelLayout::Create(config);
  MemoryFootprint tiered = f;
  // Note [Tier shards] in store/nvme_tier.h: every rank's shard files, and
  // each rank's own read/write staging.
  tiered.nvme_bytes = NvmeTierFileBytes(layout, static_cast<int>(ranks));
  tiered.host.exp_avg = tiered.host.exp_avg_sq = 0;
  tiered.host.staging += ranks * NvmeTierStagingBytes();
  if (ranks > 1 && PlansResidentEmbedding(config)) {
    // Note [Tiered trainer]: nothing resident, so each rank lands the
    // embedding's gradient in a pinned buffer of its own (Note
    // [Shard-only landing] in store/host_store.h), as FootprintOf counts
    // for an embedding on the host.
    const int64_t landing =
        (layout.blocks[layout.embedding_block()].numel + 1023) / 1024 * 1024 * 4;
    tiered.host.pinned += ranks * landing;
    tiered.host.grad += ranks * landing;
  }
  tiered.host_total_bytes = tiered.host.Total() + tiered.embedding_lookahead_bytes;
  return tiered;
}

std::string DescribeHostBytesPerParam(const MemoryFootprint& f) {
  const double params = static_cast<double>(std::max<int64_t>(1, f.params));
  auto per = [params](int64_t bytes) { return static_cast<double>(bytes) / params; };
  std::string out = absl::StrFormat(
      "host %.2f bytes/param = master %.2f + grad %.2f + exp_avg %.2f + exp_avg_sq %.2f + "
      "streaming %.2f + staging %.2f (gradient ring %.2f) + lookahead %.2f",
      per(f.host_total_bytes), per(f.host.master), per(f.host.grad), per(f.host.exp_avg),
      per(f.host.exp_avg_sq), per(f.host.streaming), per(f.host.staging),
      per(f.gradient_ring_bytes), per(f.embedding_lookahead_bytes));
  if (f.nvme_bytes > 0) absl::StrAppendFormat(&out, "; NVMe %.2f bytes/param", per(f.nvme_bytes));
  return out;
}

MemoryFootprint EstimateFootprintForConfig(const JobSpec& spec, const ModelConfig& config) {
  return FootprintOf(spec, config);
}

absl::StatusOr<MemoryFootprint> EstimateFootprintForConfig(const JobSpec& spec,
                                                           const ModelConfig& config,
                                                           const Cancellation& cancel) {
  return FootprintOf(spec, config, cancel);
}

absl::Status CheckInitFromModel(const JobSpec& spec, const std::string& checkpoint_dir) {
  MEGATRAIN_ASSIGN_OR_RETURN(ModelConfig config, ResolveModel(spec.model));
  const std::string field =
      absl::StrCat("model.init_from.checkpoint ", spec.model.init_from.checkpoint);
  absl::Status same = CheckCheckpointModel(checkpoint_dir, config);
  if (absl::IsFailedPrecondition(same)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": the checkpoint's model is not the job's model (",
        spec.model.preset.empty() ? "model.hf_dir" : "model.preset", "): ", same.message()));
  }
  return Annotate(same, field);
}

absl::StatusOr<MemoryFootprint> EstimateFootprint(const JobSpec& spec) {
  MEGATRAIN_ASSIGN_OR_RETURN(ModelConfig config, ResolveModel(spec.model));
  return FootprintOf(spec, config);
}

absl::StatusOr<MemoryFootprint> EstimateFootprintFromHfConfig(const JobSpec& spec,
                                                              absl::string_view hf_config_json,
                                                              const Cancellation& cancel) {
  if (spec.model.hf_dir.empty()) {
    MEGATRAIN_ASSIGN_OR_RETURN(ModelConfig config, ResolveModel(spec.model));
    return FootprintOf(spec, config, cancel);
  }
  absl::StatusOr<ModelConfig> config =
      ParseHfConfig(hf_config_json, (fs::path(spec.model.hf_dir) / "config.json").string());
  if (!config.ok()) return Annotate(config.status(), "model.hf_dir");
  return FootprintOf(spec, *config, cancel);
}

absl::Status ExplainDeviceOutOfMemory(const absl::Status& status, const JobSpec& spec,
                                      const ModelConfig& config) {
  if (!absl::IsResourceExhausted(status) ||
      !absl::StartsWith(status.message(), "device out of memory")) {
    return status;
  }
  const int64_t tokens = spec.train.micro_batch * spec.train.seq_len;
  const int64_t layer_bytes = tokens * config.hidden_size * 4;
  const int64_t saved_layers = DeviceSavedLayers(spec, config);
  const MemoryFootprint f = FootprintOf(spec, config);
  std::string advice;
  if (spec.train.micro_batch > 1) {
    advice = absl::StrCat(
        "try train.micro_batch: ", spec.train.micro_batch / 2,
        " with train.gradient_accumulation_steps: ", 2 * spec.train.gradient_accumulation_steps,
        " (same global batch) or a shorter train.seq_len");
  } else {
    advice = "train.micro_batch is already 1: try a shorter train.seq_len";
  }
  if (spec.train.activation_checkpointing == ActivationCheckpointing::kAuto) {
    // Note [Kept layer graphs]: auto may keep resident layers' graphs.
    absl::StrAppend(&advice,
                    "; or train.activation_checkpointing: all (no layer keeps its forward graph)");
  }
  if (!OffloadsActivations(spec) && config.num_hidden_layers > 1) {
    const int64_t offloaded = config.num_hidden_layers - 1;
    absl::StrAppend(&advice, "; or train.offload_activations: true (", offloaded, " x ", tokens,
                    " x ", config.hidden_size, " x 4 B = ", GiB(offloaded * layer_bytes),
                    " of them in pinned host memory instead)");
  }
  return absl::Status(
      status.code(),
      absl::StrCat(
          status.message(), "; job: train.micro_batch ", spec.train.micro_batch,
          " x train.seq_len ", spec.train.seq_len, " = ", tokens,
          " tokens per micro-batch; layer inputs saved for backward (activation "
          "checkpointing; with train.activation_checkpointing: auto resident layers may also "
          "keep their forward graph",
          saved_layers < config.num_hidden_layers
              ? absl::StrCat("; train.offload_activations keeps ", config.num_hidden_layers - 1,
                             " in pinned host memory and these on the device")
              : "",
          ") ", saved_layers, " x ", tokens, " x ", config.hidden_size,
          " x 4 B = ", GiB(saved_layers * layer_bytes), ", device estimate ",
          GiB(f.device_estimate_bytes), " (", GiB(f.device_resident_bytes),
          " of it resident layers, embedding and gradient buffers at most); ", advice));
}

double PeakBf16Flops(const std::string& device_name) {
  if (const char* env = std::getenv("MEGATRAIN_PEAK_TFLOPS")) {
    const double tflops = std::atof(env);
    if (tflops > 0) return tflops * 1e12;
  }
  if (absl::StrContains(device_name, "H100") || absl::StrContains(device_name, "H200"))
    return 989e12;
  if (absl::StrContains(device_name, "A100")) return 312e12;
  return 0;
}

namespace {

class TrainingJobImpl final : public TrainingJob {
 public:
  TrainingJobImpl(JobSpec spec, ModelConfig config) : spec_(std::move(spec)), config_(config) {}

  absl::Status Init(const std::vector<std::string>& devices,
                    const std::optional<std::string>& resume_from);
  absl::StatusOr<JobOutcome> Run(JobObserver* observer) override {
    absl::StatusOr<JobOutcome> outcome = RunSteps(observer);
    if (!outcome.ok() && abandon_step_.load(std::memory_order_relaxed)) {
      // A forced cancel abandoned a training or eval pass: that step is
      // lost, and whatever the pass failed with, the job ends cancelled
      // once the optimizer's queued work has drained.
      absl::Status drained = trainer_->WaitForOptimizer();
      if (!drained.ok()) std::fprintf(stderr, "megatrain: %s\n", drained.ToString().c_str());
      return JobOutcome::kCancelled;
    }
    if (!outcome.ok()) return ExplainDeviceOutOfMemory(outcome.status(), spec_, config_);
    return outcome;
  }
  void RequestStop(StopKind kind) override {
    if (kind == StopKind::kForceCancel) {
      abandon_step_.store(true, std::memory_order_relaxed);
      kind = StopKind::kCancel;
    }
    absl::MutexLock lock(&mu_);
    stop_ = kind;
  }
  void RequestCheckpoint() override {
    absl::MutexLock lock(&mu_);
    checkpoint_requested_ = true;
  }
  int64_t step() const override { return trainer_->step(); }
  int64_t max_steps() const override { return max_steps_; }
  MemoryFootprint footprint() const override { return footprint_; }
  std::string schedule_description() const override {
    return trainer_->first().schedule_choice().Describe();
  }
  std::string data_description() const override { return data_description_; }

 private:
  absl::StatusOr<JobOutcome> RunSteps(JobObserver* observer);
  absl::Status PrepareData();
  // Note [Long conversations]: data_description_ from the loader and the
  // tokenize report of the job's data.
  std::string DescribeData() const;
  // Init's steps: the data loader and eval batches; the trainer's options
  // from the spec; the checkpoint state, step and data cursor of a resume.
  absl::Status OpenData();
  absl::StatusOr<TrainerOptions> MakeTrainerOptions();
  absl::Status Resume(const std::string& resume_from);
  // model.init_from: the checkpoint's weights (and AdamW state with
  // `optimizer: restore`) into the new job's store. The data cursor is the
  // job's own (its start).
  absl::Status InitFromCheckpoint();
  absl::Status WriteCheckpointNow(JobObserver* observer);
  // One step boundary's requests: a stop ends the run (after a checkpoint
  // for a suspend not yet checkpointed), a checkpoint request is served.
  // Returns the outcome when the run must end.
  absl::StatusOr<std::optional<JobOutcome>> ServeRequests(JobObserver* observer,
                                                          int64_t* last_checkpoint_step);
  // gradient_accumulation_steps micro-batches from the training data.
  absl::StatusOr<std::vector<MicroBatch>> ReadStepBatches();
  // This step's batches (read ahead by the previous step, or now), and the
  // next step's, read ahead into next_batches_ unless this is the last step.
  absl::StatusOr<std::vector<MicroBatch>> TakeStepBatches();
  StepReport ReportOf(const StepResult& result, double flops_per_token, double peak) const;
  // Periodic eval and checkpoint after applied step `step`.
  absl::Status AfterStep(JobObserver* observer, int64_t step, int64_t* last_checkpoint_step);

  JobSpec spec_;
  ModelConfig config_;
  int64_t max_steps_ = 0;
  MemoryFootprint footprint_;
  // The moment files' directory (null without the tier): destroyed after
  // the trainer, which holds the files open.
  std::unique_ptr<NvmeJobDir> nvme_dir_;
  // One device or data parallel (Note [Data-parallel job]).
  std::unique_ptr<JobTrainer> trainer_;
  std::optional<DataLoader> loader_;
  // The next step's batches, read one step ahead so that each step knows
  // the next one's token ids (Note [Embedding lookahead] in trainer.h),
  // and the loader's cursor before them: the one a checkpoint records.
  std::vector<MicroBatch> next_batches_;
  std::optional<DataCursor> consumed_cursor_;
  std::vector<MicroBatch> eval_batches_;
  std::string train_tokens_, eval_tokens_;
  int64_t eos_id_ = 0;
  // The tokenize report of the job's data (data.text: this run's; data.tokens:
  // the directory's tokenize.json), when there is one.
  std::optional<TokenizeReport> data_report_;
  std::string data_description_;

  absl::Mutex mu_;
  std::optional<StopKind> stop_ ABSL_GUARDED_BY(mu_);
  // Set once by a forced cancel; read by the executor between plan actions.
  std::atomic<bool> abandon_step_{false};
  bool checkpoint_requested_ ABSL_GUARDED_BY(mu_) = false;
};

// Text input is tokenized once into <output_dir>/data/{train,eval}; a
// resumed job finds the shards there and reuses them. Everything below
// output_dir is reached through directory descriptors from it, never
// through a symbolic link (Note [Directory descriptors] in dir_fd.h): a
// link swapped into data/ fails the job instead of sending shards elsewhere.
absl::Status TrainingJobImpl::PrepareData() {
  eos_id_ = config_.eos_token_id;
  if (!spec_.data.tokens.empty()) {
    train_tokens_ = spec_.data.tokens;
    eval_tokens_ = spec_.data.eval_tokens;
    // Note [Tokenize report]: shards from `megatrain tokenize` say what its
    // long-document rule did; missing or unreadable is simply not reported.
    std::error_code ec;
    if (fs::is_directory(train_tokens_, ec)) {
      absl::StatusOr<TokenizeReport> report = ReadTokenizeReport(train_tokens_);
      if (report.ok()) data_report_ = *std::move(report);
    }
    return absl::OkStatus();
  }
  std::error_code ec;
  const std::string root = fs::absolute(spec_.output_dir, ec).lexically_normal().string();
  if (ec) return Annotate(absl::ErrnoToStatus(ec.value(), spec_.output_dir), "output_dir");
  const fs::path data_dir = fs::path(root) / "data";
  train_tokens_ = (data_dir / "train").string();
  const bool with_eval = spec_.data.eval_fraction > 0;
  if (with_eval) eval_tokens_ = (data_dir / "eval").string();
  absl::StatusOr<DirFd> data_fd = DirFd::OpenBeneath(root, "data", DirFd::Create::kYes);
  if (!data_fd.ok()) return Annotate(data_fd.status(), "data.text");
  constexpr char kReportFile[] = "tokenize.json";
  if (absl::StatusOr<std::string> saved = data_fd->ReadFileAt(kReportFile, int64_t{64} << 10);
      saved.ok()) {
    nlohmann::json report = nlohmann::json::parse(*saved, nullptr, /*allow_exceptions=*/false);
    if (!report.is_discarded() && report.contains("eos_id") &&
        report["eos_id"].is_number_integer()) {
      eos_id_ = report["eos_id"].get<int64_t>();
      return absl::OkStatus();
    }
  }
  TokenizeOptions t;
  t.input_paths = {spec_.data.text};
  // Default: the model directory's tokenizer.json (ValidateJobSpec
  // ensures one of the two is set).
  t.tokenizer_model = spec_.data.tokenizer.empty() ? spec_.model.hf_dir : spec_.data.tokenizer;
  t.vocab_size = config_.vocab_size;
  t.root = root;
  t.output_dir = train_tokens_;
  t.overwrite = true;
  t.eval_fraction = spec_.data.eval_fraction;
  t.split_seed = spec_.data.shuffle_seed;
  if (with_eval) t.eval_output_dir = eval_tokens_;
  absl::StatusOr<TokenizeReport> report = TokenizeToShards(t);
  if (!report.ok()) return Annotate(report.status(), "data.text");
  eos_id_ = report->eos_id;
  data_report_ = *report;
  const std::string text = nlohmann::json{
      {"documents", report->documents},
      {"tokens", report->tokens},
      {"eval_documents", report->eval_documents},
      {"eos_id",
       report->eos_id}}.dump();
  absl::StatusOr<AtomicFileWriter> out = AtomicFileWriter::Create(data_fd->IoPath(kReportFile));
  absl::Status written = out.status();
  if (out.ok()) {
    written = out->Append(
        absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
    if (written.ok()) written = out->Commit();
  }
  if (!written.ok()) {
    return Annotate(
        absl::Status(written.code(), absl::StrReplaceAll(written.message(),
                                                         {{data_fd->IoPath(), data_fd->path()}})),
        "data.text");
  }
  return absl::OkStatus();
}

// Note [Long conversations]
// A conversation (a document with a loss mask) longer than train.seq_len
// cannot be trained in one window. The rule is applied where the data is
// tokenized: `megatrain tokenize --max_document_tokens N --long_documents
// truncate|drop` keeps a longer document's first N tokens or leaves it out
// (TokenizeToShards), and records the rule and both counts in the shards'
// tokenize.json (Note [Tokenize report]). What is still longer than seq_len
// in the job's data (no rule, or N > seq_len) is trained across windows by
// the packing rule (data_loader.h). The job reports both at its start, so
// the counts are in its events (the daemon records data_description() as a
// "data: ..." event).
std::string TrainingJobImpl::DescribeData() const {
  const uint64_t seq_len = static_cast<uint64_t>(spec_.train.seq_len);
  const DataLoader::MaskedDocumentCounts masked = loader_->CountMaskedDocuments(seq_len);
  const bool rule = data_report_.has_value() && data_report_->max_document_tokens > 0;
  const bool isolated = loader_->document_attention() == DocumentAttention::kIsolated;
  if (masked.masked_documents == 0 && !rule && !isolated) return "";
  std::vector<std::string> parts;
  if (masked.masked_documents > 0) {
    parts.push_back(absl::StrFormat(
        "%d training documents with loss masks, %d longer than train.seq_len %d (trained "
        "across windows)",
        masked.masked_documents, masked.longer, seq_len));
  }
  if (rule) {
    parts.push_back(absl::StrFormat(
        "megatrain tokenize --max_document_tokens %d --long_documents %s: %d truncated, %d "
        "dropped",
        data_report_->max_document_tokens,
        data_report_->long_documents == LongDocumentRule::kDrop ? "drop" : "truncate",
        data_report_->truncated_documents, data_report_->dropped_documents));
  }
  if (isolated) {  // Note [Document attention] in engine/model/layers.h
    parts.push_back(
        absl::StrCat("packed documents attend only to themselves (", kDocumentAttentionField, ": ",
                     DocumentAttentionName(spec_.data.packing.document_attention), ")"));
  }
  return absl::StrCat("data: ", absl::StrJoin(parts, "; "));
}

absl::Status TrainingJobImpl::Init(const std::vector<std::string>& devices,
                                   const std::optional<std::string>& resume_from) {
  max_steps_ = MaxSteps(spec_);
  MEGATRAIN_ASSIGN_OR_RETURN(footprint_, EstimateFootprint(spec_));
  std::error_code ec;
  fs::create_directories(spec_.output_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("output_dir: cannot create '", spec_.output_dir, "': ", ec.message()));
  }
  MEGATRAIN_RETURN_IF_ERROR(PrepareData());
  MEGATRAIN_RETURN_IF_ERROR(OpenData());
  MEGATRAIN_ASSIGN_OR_RETURN(TrainerOptions t, MakeTrainerOptions());
  MEGATRAIN_ASSIGN_OR_RETURN(trainer_, JobTrainer::Create(config_, t, spec_.train.seed, devices));
  if (resume_from.has_value()) return Resume(*resume_from);
  if (!spec_.model.init_from.checkpoint.empty()) return InitFromCheckpoint();
  if (!spec_.model.hf_dir.empty()) {
    MEGATRAIN_RETURN_IF_ERROR(
        Annotate(LoadHfWeights(spec_.model.hf_dir, &trainer_->store()), "model.hf_dir"));
  }
  return absl::OkStatus();
}

absl::Status TrainingJobImpl::OpenData() {
  DataLoaderOptions d;
  d.tokens = train_tokens_;
  d.eval_tokens = eval_tokens_;
  d.seq_len = spec_.train.seq_len;
  d.vocab_size = config_.vocab_size;
  d.eos_id = eos_id_;
  d.eval_fraction = spec_.data.text.empty() ? spec_.data.eval_fraction : 0.0;
  d.shuffle_seed = spec_.data.shuffle_seed;
  d.document_attention = spec_.data.packing.document_attention;
  absl::StatusOr<DataLoader> loader = DataLoader::Create(d);
  if (!loader.ok()) return Annotate(loader.status(), "data");
  loader_.emplace(std::move(*loader));
  data_description_ = DescribeData();
  if (spec_.eval.every_steps > 0) {
    absl::StatusOr<std::vector<MicroBatch>> eval =
        loader_->EvalBatches(spec_.train.micro_batch, spec_.eval.batches);
    if (!eval.ok()) return Annotate(eval.status(), "eval");
    eval_batches_ = std::move(*eval);
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainerOptions> TrainingJobImpl::MakeTrainerOptions() {
  TrainerOptions t = StepOptionsOf(spec_);  // t.device: JobTrainer::Create's
  t.abandon_step = &abandon_step_;
  MEGATRAIN_ASSIGN_OR_RETURN(t.debug_nonfinite, DebugInjectionFromEnv());
  if (t.debug_nonfinite.step > 0) {
    std::fprintf(stderr, "megatrain: debug knob %s=%s: step %lld of this job goes non-finite\n",
                 kPoisonStepEnv, std::getenv(kPoisonStepEnv),
                 static_cast<long long>(t.debug_nonfinite.step));
  }
  if (UsesNvmeTier(spec_)) {
    MEGATRAIN_ASSIGN_OR_RETURN(nvme_dir_, NvmeJobDir::Create(spec_));
    t.nvme_dir = nvme_dir_->path();
    t.nvme_dir_io = nvme_dir_->io_path();
  }
  return t;
}

absl::Status TrainingJobImpl::InitFromCheckpoint() {
  const InitFrom& init = spec_.model.init_from;
  if (init.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model.init_from.checkpoint: '", init.checkpoint, "' was not resolved to a directory"));
  }
  if (init.manifest_xxh64 != 0) {  // InitFrom::manifest_xxh64: replaced since submit?
    absl::StatusOr<CheckpointInfo> found = VerifyCheckpoint(init.checkpoint_dir, false);
    if (!found.ok()) {
      return Annotate(found.status(), absl::StrCat("model.init_from.checkpoint ", init.checkpoint));
    }
    if (found->manifest_xxh64 != init.manifest_xxh64) {
      return absl::DataLossError(absl::StrCat(
          "model.init_from.checkpoint ", init.checkpoint, ": ", init.checkpoint_dir,
          " is not the checkpoint recorded at submission (manifest.json replaced since)"));
    }
  }
  const bool restore = init.optimizer == InitOptimizer::kRestore;
  absl::StatusOr<CheckpointState> state =
      ReadCheckpoint(init.checkpoint_dir, &trainer_->store(), trainer_->nvme_tier(),
                     restore ? CheckpointMoments::kRead : CheckpointMoments::kSkip);
  if (!state.ok()) {
    return Annotate(state.status(), absl::StrCat("model.init_from.checkpoint ", init.checkpoint));
  }
  // Fresh: step 0, the store's zeroed moments. Restore: the AdamW step
  // count too, so bias correction and the schedule go on from it.
  if (restore) trainer_->set_step(state->step);
  return absl::OkStatus();
}

absl::Status TrainingJobImpl::Resume(const std::string& resume_from) {
  absl::StatusOr<CheckpointState> state =
      ReadCheckpoint(resume_from, &trainer_->store(), trainer_->nvme_tier());
  if (!state.ok()) return Annotate(state.status(), "resume");
  // Note [Checkpoint ownership] in docs/checkpoint-format.md: a job resumes
  // only from its own checkpoints (one without an id predates ids).
  if (!spec_.job_id.empty() && !state->job_id.empty() && state->job_id != spec_.job_id) {
    return absl::FailedPreconditionError(absl::StrCat("resume: ", resume_from, " belongs to job ",
                                                      state->job_id, ", not to job ", spec_.job_id,
                                                      "; refusing to resume from it"));
  }
  trainer_->set_step(state->step);
  absl::StatusOr<DataCursor> cursor = DataCursor::FromJson(state->data_cursor_json);
  if (!cursor.ok()) return Annotate(cursor.status(), absl::StrCat(resume_from, ": data cursor"));
  return Annotate(loader_->RestoreCursor(*cursor), "resume");
}

absl::Status TrainingJobImpl::WriteCheckpointNow(JobObserver* observer) {
  const auto start = std::chrono::steady_clock::now();
  MEGATRAIN_RETURN_IF_ERROR(trainer_->WaitForOptimizer());
  CheckpointState state;
  state.step = trainer_->step();
  state.rng_state = spec_.train.seed;
  state.job_id = spec_.job_id;
  state.data_cursor_json = (consumed_cursor_ ? *consumed_cursor_ : loader_->cursor()).ToJson();
  state.job_spec_json = JobSpecToJson(spec_);
  state.schedule_json = nlohmann::json{
      {"schedule", std::string(LrScheduleKindName(spec_.optimizer.schedule))},
      {"warmup_steps", spec_.optimizer.warmup_steps},
      {"total_steps", max_steps_},
      {"min_lr_ratio", spec_.optimizer.min_lr_ratio},
      {"peak_lr",
       spec_.optimizer.lr}}.dump();
  MEGATRAIN_ASSIGN_OR_RETURN(CheckpointInfo info,
                             WriteCheckpoint(trainer_->store(), state, spec_.output_dir,
                                             spec_.checkpoint, trainer_->nvme_tier()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (observer != nullptr) observer->OnCheckpointWritten(info, seconds);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<JobOutcome>> TrainingJobImpl::ServeRequests(
    JobObserver* observer, int64_t* last_checkpoint_step) {
  std::optional<StopKind> stop;
  bool checkpoint_now = false;
  {
    absl::MutexLock lock(&mu_);
    stop = stop_;
    checkpoint_now = std::exchange(checkpoint_requested_, false);
  }
  if (stop == StopKind::kCancel) {
    MEGATRAIN_RETURN_IF_ERROR(trainer_->WaitForOptimizer());
    return JobOutcome::kCancelled;
  }
  if (stop == StopKind::kSuspend) {
    if (*last_checkpoint_step != trainer_->step()) {
      MEGATRAIN_RETURN_IF_ERROR(WriteCheckpointNow(observer));
    }
    return JobOutcome::kSuspended;
  }
  if (checkpoint_now) {
    MEGATRAIN_RETURN_IF_ERROR(WriteCheckpointNow(observer));
    *last_checkpoint_step = trainer_->step();
  }
  return std::nullopt;
}

absl::StatusOr<std::vector<MicroBatch>> TrainingJobImpl::ReadStepBatches() {
  std::vector<MicroBatch> out;
  for (int64_t m = 0; m < spec_.train.gradient_accumulation_steps; ++m) {
    absl::StatusOr<MicroBatch> batch = loader_->NextTrainBatch(spec_.train.micro_batch);
    if (!batch.ok()) return Annotate(batch.status(), "data");
    out.push_back(std::move(*batch));
  }
  return out;
}

absl::StatusOr<std::vector<MicroBatch>> TrainingJobImpl::TakeStepBatches() {
  std::vector<MicroBatch> batches = std::move(next_batches_);
  next_batches_.clear();
  consumed_cursor_.reset();
  if (batches.empty()) {
    MEGATRAIN_ASSIGN_OR_RETURN(batches, ReadStepBatches());
  }
  if (trainer_->step() + 1 < max_steps_) {
    DataCursor before = loader_->cursor();
    MEGATRAIN_ASSIGN_OR_RETURN(next_batches_, ReadStepBatches());
    consumed_cursor_ = std::move(before);
  }
  return batches;
}

StepReport TrainingJobImpl::ReportOf(const StepResult& r, double flops_per_token,
                                     double peak) const {
  StepReport report;
  report.step = trainer_->step();
  report.max_steps = max_steps_;
  report.loss = r.loss;
  report.aux_loss = r.aux_loss;
  report.grad_norm = r.grad_norm;
  report.lr = r.lr;
  report.skipped = r.skipped;
  report.stats = r.stats;
  report.device_stats = r.rank_stats;
  // Note [Data-parallel job]: rank 0's stats count its share of the
  // global batch; every rank's share is the same.
  report.devices = trainer_->devices();
  report.stats.tokens = r.stats.tokens * report.devices;
  const double seconds = r.stats.step_seconds;
  report.tokens_per_s = seconds > 0 ? static_cast<double>(report.stats.tokens) / seconds : 0;
  report.device_tokens_per_s = seconds > 0 ? static_cast<double>(r.stats.tokens) / seconds : 0;
  report.mfu = peak > 0 ? report.device_tokens_per_s * flops_per_token / peak : 0;
  return report;
}

absl::Status TrainingJobImpl::AfterStep(JobObserver* observer, int64_t step,
                                        int64_t* last_checkpoint_step) {
  if (spec_.eval.every_steps > 0 && !eval_batches_.empty() &&
      (step % spec_.eval.every_steps == 0 || step == max_steps_)) {
    MEGATRAIN_ASSIGN_OR_RETURN(double eval_loss, trainer_->Evaluate(eval_batches_));
    if (observer != nullptr) observer->OnEval(step, eval_loss);
  }
  if (spec_.checkpoint.every_steps > 0 && step % spec_.checkpoint.every_steps == 0 &&
      step < max_steps_) {
    MEGATRAIN_RETURN_IF_ERROR(WriteCheckpointNow(observer));
    *last_checkpoint_step = step;
  }
  return absl::OkStatus();
}

absl::StatusOr<JobOutcome> TrainingJobImpl::RunSteps(JobObserver* observer) {
  const double flops_per_token = config_.TrainFlopsPerToken(spec_.train.seq_len);
  const double peak = PeakBf16Flops(trainer_->first().device_name());
  int64_t last_checkpoint_step = -1;
  int64_t consecutive_skipped = 0;  // kMaxConsecutiveSkippedSteps
  while (trainer_->step() < max_steps_) {
    MEGATRAIN_ASSIGN_OR_RETURN(std::optional<JobOutcome> outcome,
                               ServeRequests(observer, &last_checkpoint_step));
    if (outcome.has_value()) return *outcome;
    MEGATRAIN_ASSIGN_OR_RETURN(std::vector<MicroBatch> batches, TakeStepBatches());
    MEGATRAIN_ASSIGN_OR_RETURN(
        StepResult r,
        trainer_->Step(batches, next_batches_.empty()
                                    ? absl::Span<const int32_t>()
                                    : absl::MakeConstSpan(next_batches_[0].input_ids)));
    if (observer != nullptr) observer->OnStep(ReportOf(r, flops_per_token, peak));
    consecutive_skipped = r.skipped ? consecutive_skipped + 1 : 0;
    if (consecutive_skipped >= kMaxConsecutiveSkippedSteps) {
      return absl::FailedPreconditionError(absl::StrCat(
          kMaxConsecutiveSkippedSteps,
          " steps in a row had a non-finite loss or gradient norm "
          "and were skipped (train.nan_policy: skip); the last applied step is ",
          trainer_->step(), "; the model has likely diverged (try a lower optimizer.lr)"));
    }
    if (r.skipped && !r.partial) continue;  // nothing changed: no eval, no checkpoint
    MEGATRAIN_RETURN_IF_ERROR(AfterStep(observer, trainer_->step(), &last_checkpoint_step));
  }
  if (last_checkpoint_step != trainer_->step()) {
    MEGATRAIN_RETURN_IF_ERROR(WriteCheckpointNow(observer));
  }
  return JobOutcome::kSucceeded;
}

}  // namespace

namespace {

// Create and CreateOnDevices on `devices` (each named once per rank).
absl::StatusOr<std::unique_ptr<TrainingJob>> CreateOnRanks(
    const JobSpec& spec, const std::vector<std::string>& devices,
    const std::optional<std::string>& resume_from) {
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<std::string> ranks,
                             JobRankDevices(devices, static_cast<int64_t>(devices.size())));
  if (ranks.size() > 1 && !HasCollectiveBackend(ranks.front())) {
    return absl::UnimplementedError(
        absl::StrCat("train.devices: ", ranks.size(), " devices need c10d's ",
                     ranks.front() == "cpu" ? "gloo" : "NCCL", " backend, which this build lacks"));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(ModelConfig config, ResolveModel(spec.model));
  auto job = std::make_unique<TrainingJobImpl>(spec, config);
  MEGATRAIN_RETURN_IF_ERROR(ExplainDeviceOutOfMemory(job->Init(ranks, resume_from), spec, config));
  return std::unique_ptr<TrainingJob>(std::move(job));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingJob>> TrainingJob::Create(
    const JobSpec& spec, const std::string& device, const std::optional<std::string>& resume_from) {
  MEGATRAIN_RETURN_IF_ERROR(ValidateJobSpec(spec));
  if (spec.output_dir.empty()) return absl::InvalidArgumentError("output_dir: required");
  // train.devices N > 1: N ranks from `device` on (megatrain-bench's
  // convention); 1 or all (0): `device` alone.
  const int n = static_cast<int>(std::max<int64_t>(1, spec.train.devices));
  return CreateOnRanks(spec, n > 1 ? DataParallelDevices(device, n) : std::vector{device},
                       resume_from);
}

absl::StatusOr<std::unique_ptr<TrainingJob>> TrainingJob::CreateOnDevices(
    const JobSpec& spec, const std::vector<std::string>& devices,
    const std::optional<std::string>& resume_from) {
  MEGATRAIN_RETURN_IF_ERROR(ValidateJobSpec(spec));
  if (spec.output_dir.empty()) return absl::InvalidArgumentError("output_dir: required");
  MEGATRAIN_RETURN_IF_ERROR(JobRankDevices(devices, spec.train.devices).status());
  return CreateOnRanks(spec, devices, resume_from);
}

}  // namespace megatrain::engine
