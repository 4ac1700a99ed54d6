// The engine's job-level API: everything the server needs to run one training
// job, with no LibTorch, gRPC or protobuf types. A TrainingJob owns a
// Trainer (host store + streaming executor + CPU AdamW), its data loader and
// its checkpoints; the server owns queueing, persistence, auth and metrics.
//
// The job spec itself (JobSpec, ValidateJobSpec, MaxSteps, its JSON) is the
// job-spec library, engine/spec/ (included here); checkpoints' listing,
// verification and export are engine/checkpoint/checkpoint_info.h.
#ifndef MEGATRAIN_ENGINE_TRAINING_JOB_H_
#define MEGATRAIN_ENGINE_TRAINING_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/checkpoint/checkpoint_info.h"
#include "engine/model/model_config.h"
#include "engine/runtime/cancellation.h"
#include "engine/runtime/stats.h"
#include "engine/spec/job_spec.h"
#include "engine/spec/job_spec_json.h"

namespace megatrain::engine {

// Host and device memory a job needs, in bytes. See docs/operations.md for
// the bytes-per-parameter table: fp32 master 4, fp32 gradient 4, AdamW
// exp_avg 4 and exp_avg_sq 4, bf16 streaming copy 2 (bf16 only).
struct MemoryFootprint {
  int64_t params = 0;                 // model parameters (elements)
  HostStoreBytes host;                // by kind
  int64_t host_total_bytes = 0;       // all host memory of the job
  int64_t device_estimate_bytes = 0;  // weight slots + activations + resident state (rough)
  // Part of device_estimate_bytes: what the auto settings keep on a GPU at
  // most (Notes [Resident layers], [Resident embedding] and [Device
  // gradient accumulation] in executor.h): two decoder layers with their
  // AdamW state (16 bytes per parameter + the compute copy), an untied
  // embedding table (16 bytes per parameter; kept on the host when it
  // exceeds an eighth of the device), and with gradient accumulation the
  // streamed blocks' fp32 gradients (4 bytes per parameter; kept on the
  // host beyond a quarter of the device). 0 is never assumed: the CPU has
  // none of them, but the estimate is for a GPU.
  int64_t device_resident_bytes = 0;
  // Pinned host bytes of train.offload_activations ((L-1) saved layer
  // inputs, [B, T, C] fp32 each); 0 without it. Part of host.staging (the
  // executor's pinned buffers) and so of host_total_bytes.
  int64_t activation_offload_bytes = 0;
  // Pageable host bytes of the embedding lookahead's two side buffers
  // (Note [Embedding lookahead] in trainer.h): 2 x B x T x C fp32 for an
  // untied embedding updated on the host; 0 with tied embeddings and for
  // the resident embedding the footprint plans (every untied table:
  // device_resident_bytes). Part of host_total_bytes, not of host.
  //
  // The host bytes follow that plan: with the gradient ring the store keeps
  // no gradient for a resident embedding (HostStoreOptions::
  // embedding_grad_in_host). A GPU that cannot hold the table keeps it on
  // the host, which then needs 4 x V x C bytes of gradient and these
  // buffers more than host_total_bytes says.
  int64_t embedding_lookahead_bytes = 0;
  // Pinned host bytes of the gradient ring (Note [Gradient ring] in
  // step/grad_lander.h): kGradRingBuffers x 4 x GradRingNumels (the
  // largest streamed decoder layer); with train.devices N > 1 every
  // rank's ring, each of 1/N of that layer (ceil; Note [Ring shards] in
  // step/gradient_reducer.h); 0 without it. Part of host.staging.
  int64_t gradient_ring_bytes = 0;
  // Bytes in files on the NVMe tier (memory.nvme_tier: moments): the two
  // AdamW moments (every rank's shard files with train.devices > 1, Note
  // [Tier shards] in store/nvme_tier.h), host.exp_avg and host.exp_avg_sq
  // then 0 and host.staging counting the tier's NvmeTierStagingBytes() per
  // rank. 0 without the tier.
  int64_t nvme_bytes = 0;
  // Note [No expert-group sub-blocks] (job/plan.cc): the largest block
  // that streams through the device's weight slots (a decoder layer, a MoE
  // layer with all its experts, or the head with lm_head): its decoder
  // layer (-1: the head), its parameters, and the device bytes of the
  // executor's weight slots (compute dtype, plus the fp32 cast staging
  // under memory.weight_stream fp32; none under host_cast, whose ring is
  // pinned host memory) and gradient slots (fp32) sized for
  // it, with no layer resident. A floor of device memory that no
  // micro_batch, sequence length or residency setting lowers. Part of
  // device_estimate_bytes.
  int64_t largest_block_layer_idx = -1;
  int64_t largest_block_params = 0;
  int64_t block_slot_bytes = 0;
};

// The host bytes of `f` per parameter, by kind, on one line: "host 12.14
// bytes/param = master 4.00 + grad 0.00 + exp_avg 4.00 + exp_avg_sq 4.00 +
// streaming 0.00 + staging 0.14 (gradient ring 0.10) + lookahead 0.00"
// (two decimals; the NVMe tier's bytes after it when there are any).
// What `megatrain plan` and megatrain-bench print (docs/operations.md
// "Sizing host memory").
std::string DescribeHostBytesPerParam(const MemoryFootprint& f);

// RESOURCE_EXHAUSTED when `f.block_slot_bytes` exceeds `device_bytes` (the
// memory of the device `device` names, in bytes; <= 0: unknown, OK): the
// job can never run there. The message names the block (decoder layer or
// head), its parameters, the slots' bytes and the device's bytes. Inline so
// that the daemon's admission checks it without linking the engine.
// Example: "decoder layer 0 is one streamed block of 237000000 parameters:
// its weight and gradient slots need 3318000000 bytes (3.09 GiB) > device
// cuda:0 2147483648 bytes (2.00 GiB); ...".
inline absl::Status CheckBlockSlotsFitDevice(const MemoryFootprint& f, int64_t device_bytes,
                                             absl::string_view device) {
  if (device_bytes <= 0 || f.block_slot_bytes <= device_bytes) return absl::OkStatus();
  auto gib = [](int64_t bytes) {
    return absl::StrCat(static_cast<double>(bytes * 100 / (int64_t{1} << 30)) / 100.0, " GiB");
  };
  return absl::ResourceExhaustedError(absl::StrCat(
      f.largest_block_layer_idx >= 0 ? absl::StrCat("decoder layer ", f.largest_block_layer_idx)
                                     : std::string("the head"),
      " is one streamed block of ", f.largest_block_params,
      " parameters: its weight and gradient slots need ", f.block_slot_bytes, " bytes (",
      gib(f.block_slot_bytes), ") > device ", device, " ", device_bytes, " bytes (",
      gib(device_bytes),
      "); no micro_batch or sequence length makes it fit and expert-group sub-blocks are not "
      "built (docs/architecture.md)"));
}

// `f` (computed with everything in host memory for `config` on `devices`
// ranks, train.devices) with the AdamW moments moved to the NVMe tier
// (Note [NVMe tier]): the one place that turns the all-in-RAM footprint
// into the tiered one. nvme_bytes: every rank's moment files
// (NvmeTierFileBytes, Note [Tier shards]); host.staging: each rank's
// NvmeTierStagingBytes(); with devices > 1 and an embedding planned
// resident, each rank's landing buffer of its gradient (nothing is
// resident with the tier). Idempotent.
MemoryFootprint WithNvmeMoments(const MemoryFootprint& f, const ModelConfig& config,
                                int64_t devices);

// The footprint of `spec` with its model given as `config` (reads no file).
MemoryFootprint EstimateFootprintForConfig(const JobSpec& spec, const ModelConfig& config);
// As above, checking `cancel` between its phases (engine/runtime/
// cancellation.h): its status (CANCELLED, DEADLINE_EXCEEDED) once not OK.
absl::StatusOr<MemoryFootprint> EstimateFootprintForConfig(const JobSpec& spec,
                                                           const ModelConfig& config,
                                                           const Cancellation& cancel);
// model.init_from at submit: the model of the checkpoint in
// `checkpoint_dir` (the daemon's resolution of spec.model.init_from) must
// be spec's model (preset, or hf_dir's config.json read here): same
// tensors and shapes. INVALID_ARGUMENT naming model.init_from.checkpoint and
// what differs; the checkpoint's config.json errors (DATA_LOSS, NOT_FOUND)
// with the same prefix; ResolveModel's errors naming model.hf_dir.
absl::Status CheckInitFromModel(const JobSpec& spec, const std::string& checkpoint_dir);

// Computes the footprint of `spec`'s model (reads config.json for hf_dir).
absl::StatusOr<MemoryFootprint> EstimateFootprint(const JobSpec& spec);
// As EstimateFootprint, with an hf_dir model's config.json given as
// `hf_config_json` (read by the caller) instead of read from disk; a preset
// spec ignores it. Errors of ParseHfConfig, prefixed "model.hf_dir"; the
// status of `cancel` (checked between the estimate's phases) once it is not
// OK.
absl::StatusOr<MemoryFootprint> EstimateFootprintFromHfConfig(
    const JobSpec& spec, absl::string_view hf_config_json,
    const Cancellation& cancel = Cancellation());

// Engine-side state of a running job, reported through JobObserver.
struct StepReport {
  int64_t step = 0;  // optimizer steps done, counted from 1
  int64_t max_steps = 0;
  double loss = 0;       // mean over the global batch's counted tokens (MoE
                         // with the aux loss: + router_aux_loss_coef x aux)
  double aux_loss = 0;   // MoE: mean load-balancing loss of a micro-batch
  double grad_norm = 0;  // before clipping
  double lr = 0;
  // Tokens/s of the job: all its devices together (the global batch's
  // tokens over the step's wall time).
  double tokens_per_s = 0;
  // Devices the job trains on (train.devices; Note [Data-parallel job] in
  // job/job_trainer.h), and the tokens/s of each: its share of the global
  // batch (every rank trains the same number of equal micro-batches, in
  // lockstep, so the shares are equal: tokens_per_s / devices).
  int64_t devices = 1;
  double device_tokens_per_s = 0;
  double mfu = 0;        // model FLOPs / bf16 dense peak of one device, [0, 1]
                         // (per device: device_tokens_per_s's FLOPs)
  bool skipped = false;  // non-finite loss or gradient norm: the update
                         // was not applied (train.nan_policy skip); `step`
                         // is then the last applied step's number
  StepStats stats;       // phases, bytes of this step (with several
                         // devices: rank 0's, except `tokens`, the
                         // global batch's)
  // With several devices in this process: each device's own stats (its
  // share of the tokens, its own H2D/D2H bytes and seconds), in the order
  // of the job's devices; empty for one device.
  std::vector<StepStats> device_stats;
};

// Receives job progress. Called on the job's thread; must not block long.
class JobObserver {
 public:
  virtual ~JobObserver() = default;
  virtual void OnStep(const StepReport& report) {}
  virtual void OnEval(int64_t step, double eval_loss) {}
  virtual void OnCheckpoint(int64_t step, const std::string& checkpoint_dir, double seconds) {}
  // A checkpoint was written and published (`info.manifest_xxh64` and
  // `info.job_id` filled), `seconds` after it was started. The default
  // forwards to OnCheckpoint; the daemon overrides this one to record the
  // checkpoint (its ownership) in the job store.
  virtual void OnCheckpointWritten(const CheckpointInfo& info, double seconds);
};

// Under NanPolicy::kSkip, this many skipped steps in a row fail the job
// (FAILED_PRECONDITION): a model that produces nothing but NaN would
// otherwise loop for ever without advancing. Any applied step resets the
// count.
inline constexpr int64_t kMaxConsecutiveSkippedSteps = 20;

// Why Run() returned.
enum class JobOutcome { kSucceeded, kCancelled, kSuspended };

// One job's training loop. Thread-safety: Run() is called from one thread;
// RequestStop / RequestCheckpoint may be called from any thread at any time
// and take effect at the next step boundary.
//
// Debug knob (testing only, never part of a job spec): when the daemon's or
// test's environment has MEGATRAIN_DEBUG_POISON_STEP=<step>[:loss|:grad],
// Create() arranges for that step of every job it creates to go non-finite
// once (trainer.h, NonFiniteInjection): `loss` (default) makes the loss and
// all gradients NaN, `grad` makes the embedding's gradient inf. A malformed
// value is INVALID_ARGUMENT naming the variable.
class TrainingJob {
 public:
  // Builds the model (initialises weights from `spec.train.seed` or loads
  // the HF checkpoint), the data loader and the device pipeline on `device`
  // ("cpu", "cuda", "cuda:N"). With `resume_from` (a checkpoint directory),
  // restores weights, AdamW state, step, RNG and data cursor exactly.
  // Errors: those of ValidateJobSpec; NOT_FOUND / DATA_LOSS for missing or
  // corrupt model, data or checkpoint files (naming the file);
  // RESOURCE_EXHAUSTED when memory cannot be allocated or pinned.
  static absl::StatusOr<std::unique_ptr<TrainingJob>> Create(
      const JobSpec& spec, const std::string& device,
      const std::optional<std::string>& resume_from);

  // As Create, on the `devices` the daemon granted the job (exactly
  // spec.train.devices of them): one device is Create; N > 1 trains data
  // parallel, one rank per device (Note [Data-parallel job] in
  // job/job_trainer.h): {"cuda:0", "cuda:1"} over NCCL, or N CPU ranks
  // over gloo for {"cpu", "cpu"} (or "cpu:K": every CPU "device" is the
  // CPU). A resume loads a checkpoint written with any device count.
  // Errors: Create's; INVALID_ARGUMENT naming train.devices when the
  // devices do not match it (JobRankDevices); UNIMPLEMENTED when this
  // build lacks the c10d backend (gloo or NCCL).
  static absl::StatusOr<std::unique_ptr<TrainingJob>> CreateOnDevices(
      const JobSpec& spec, const std::vector<std::string>& devices,
      const std::optional<std::string>& resume_from);

  virtual ~TrainingJob() = default;

  // Trains until max_steps / max_tokens, or until a stop request. Writes a
  // checkpoint before returning kSuspended, and at the end. Skipped steps
  // (train.nan_policy: skip) do not count towards max_steps. Errors:
  //   INTERNAL (CUDA, LibTorch);
  //   RESOURCE_EXHAUSTED for GPU out of memory (ExplainDeviceOutOfMemory's
  //     message), or a full disk while checkpointing (naming the path and
  //     ENOSPC / EDQUOT / EFBIG; the partial checkpoint is removed, earlier
  //     ones are intact: the job can be resumed from them);
  //   DATA_LOSS (data);
  //   FAILED_PRECONDITION for a non-finite step under nan_policy fail
  //     ("step 12: loss nan, gradient norm nan: not finite ..."), or
  //     kMaxConsecutiveSkippedSteps skipped steps in a row under skip.
  virtual absl::StatusOr<JobOutcome> Run(JobObserver* observer) = 0;

  // kCancel and kSuspend take effect at the next step boundary;
  // kForceCancel (a cancel that does not wait) also abandons the running
  // step between two of its blocks (Note [Abandoned steps] in
  // engine/step/executor.h), losing that step's work: Run() then returns
  // kCancelled within about one block's compute time (with several
  // devices it waits for the step boundary: Note [Data-parallel job]).
  enum class StopKind { kCancel, kSuspend, kForceCancel };
  virtual void RequestStop(StopKind kind) = 0;
  // Asks for a checkpoint at the next step boundary.
  virtual void RequestCheckpoint() = 0;

  virtual int64_t step() const = 0;
  virtual int64_t max_steps() const = 0;
  virtual MemoryFootprint footprint() const = 0;
  // The step schedule the trainer chose, one line (ScheduleChoice::Describe
  // in engine/step/schedule_choice.h); empty when not known.
  virtual std::string schedule_description() const { return ""; }
  // Note [Long conversations]: what the long-document rule did to the
  // job's SFT / chat data, one line for the job's events, e.g.
  //   "data: 120 documents with loss masks, 3 longer than train.seq_len 64
  //   (trained across windows); megatrain tokenize --max_document_tokens 64
  //   --long_documents truncate: 7 truncated, 0 dropped"
  // Empty when the data has no loss masks and no tokenize report with a
  // long-document rule.
  virtual std::string data_description() const { return ""; }
};

// Adds the job's numbers to a device out-of-memory error: `status` is
// returned unchanged unless it is RESOURCE_EXHAUSTED with a message starting
// "device out of memory" (how the executor reports LibTorch's
// OutOfMemoryError). The result keeps the code and the original message and
// adds the micro-batch shape, the activations saved for backward (one
// [B, T, C] fp32 layer input per layer, activation checkpointing's; with
// train.offload_activations only 3 of them stay on the device; with
// train.activation_checkpointing auto resident layers may also keep their
// forward graph, and `all` is suggested), the
// whole-job device estimate (and its resident part), a smaller train.micro_batch to try (half, with
// gradient_accumulation_steps doubled to keep the global batch) and, when it
// is off, train.offload_activations with the pinned host bytes it would take.
// TrainingJob applies it to every error of Create and Run.
// Example (llama-1b preset, bf16, micro_batch 64, seq_len 8192), after the
// executor's "device out of memory (...): CUDA out of memory. Tried to
// allocate ...":
//   ; job: train.micro_batch 64 x train.seq_len 8192 = 524288 tokens per
//   micro-batch; layer inputs saved for backward (activation checkpointing;
//   with train.activation_checkpointing: auto resident layers may also keep
//   their forward graph) 16 x 524288 x 2048 x 4 B = 64.00 GiB, device
//   estimate 168.40 GiB (5.95 GiB of it resident layers, embedding and
//   gradient buffers at most); try train.micro_batch: 32 with
//   train.gradient_accumulation_steps: 2 (same global batch) or a shorter
//   train.seq_len; or train.activation_checkpointing: all (no layer keeps
//   its forward graph); or train.offload_activations: true (15 x 524288 x
//   2048 x 4 B = 60.00 GiB of them in pinned host memory instead)
absl::Status ExplainDeviceOutOfMemory(const absl::Status& status, const JobSpec& spec,
                                      const ModelConfig& config);

// Dense bf16 peak of a device, in FLOP/s, for MFU (NVIDIA datasheets:
// H100/H200 SXM 989e12, A100 312e12); 0 when unknown (MFU not reported).
// MEGATRAIN_PEAK_TFLOPS in the environment overrides it.
double PeakBf16Flops(const std::string& device_name);

inline void JobObserver::OnCheckpointWritten(const CheckpointInfo& info, double seconds) {
  OnCheckpoint(info.step, info.dir, seconds);
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_TRAINING_JOB_H_
