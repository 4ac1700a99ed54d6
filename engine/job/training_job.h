// The engine's job-level API: everything the server needs to run one training
// job, with no LibTorch, gRPC or protobuf types. A TrainingJob owns a
// Trainer (host store + streaming executor + CPU AdamW), its data loader and
// its checkpoints; the server owns queueing, persistence, auth and metrics.
//
// Field names follow the job file (examples/jobs/tiny.yaml) and the proto
// (proto/megatrain/v1/job.proto): `train.micro_batch`, `optimizer.lr`, ...;
// error messages name the field by that path.
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
#include "engine/model/model_config.h"
#include "engine/optim/nan_policy.h"
#include "engine/model/precision.h"
#include "engine/runtime/stats.h"

namespace megatrain::engine {

// Where the model comes from: exactly one of `preset` and `hf_dir`.
struct ModelSource {
  std::string preset;  // "tiny", "llama-1b", ... (PresetConfig)
  std::string hf_dir;  // HF directory: config.json + safetensors
  // Mixture-of-experts models: the router's load-balancing loss on (true)
  // or off (false) in place of config.json's `output_router_logits` (Note
  // [Load-balancing loss across micro-batches] in engine/step/moe_block.h);
  // unset keeps the config's. Set for a dense model: INVALID_ARGUMENT.
  std::optional<bool> output_router_logits;
};

// Where the training data comes from: exactly one of `tokens` and `text`.
struct DataSpec {
  std::string tokens;       // a token shard file or a directory of *.mtt shards
  std::string eval_tokens;  // optional held-out shards (then eval_fraction = 0)
  std::string text;         // plain text or JSONL {"text": ...}; needs tokenizer
  // With `text`: a HF tokenizer (directory with tokenizer.json, or the
  // file) or a SentencePiece .model; default: model.hf_dir's tokenizer.json.
  std::string tokenizer;
  double eval_fraction = 0.0;  // held-out share of documents, [0, 0.5]
  uint64_t shuffle_seed = 1234;
};

struct TrainSpec {
  int64_t micro_batch = 8;                  // sequences per forward/backward
  int64_t seq_len = 128;                    // tokens per sequence
  int64_t gradient_accumulation_steps = 1;  // micro-batches per step
  int64_t max_steps = 0;                    // optimizer steps (0: use max_tokens)
  int64_t max_tokens = 0;                   // tokens (0: use max_steps)
  ComputeDtype compute_dtype = ComputeDtype::kFp32;
  double max_grad_norm = 1.0;  // global-norm clipping; 0 = off
  uint64_t seed = 0;           // weight init and RNG
  // NaN/inf loss or gradient norm: skip the step (default) or fail the job
  // (engine/optim/nan_policy.h; Note [Non-finite steps] in trainer.h).
  NanPolicy nan_policy = NanPolicy::kSkip;
  // Saved layer inputs in pinned host memory during forward, back one layer
  // ahead in backward (Note [Activation offload] in executor.h): costs
  // (L-1) * micro_batch * seq_len * hidden_size * 4 bytes of pinned host
  // memory and as many bytes each way over PCIe per micro-batch. For long
  // sequences; bit-identical results.
  bool offload_activations = false;
};

struct OptimizerSpec {
  double lr = 3e-4;  // peak learning rate
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t warmup_steps = 0;
  std::string schedule = "cosine";  // cosine | linear | constant
  double min_lr_ratio = 0.0;        // final lr / peak lr
};

struct EvalSpec {
  int64_t every_steps = 0;  // 0 = no periodic eval
  int64_t batches = 4;      // micro-batches per eval
};

struct CheckpointSpec {
  int64_t every_steps = 0;  // 0 = only on request / suspend / end
  int64_t keep_last = 2;    // newest checkpoints kept
  int64_t keep_every = 0;   // also keep every N-th step (0 = none)
};

// A whole job, as submitted.
struct JobSpec {
  std::string name;
  ModelSource model;
  DataSpec data;
  TrainSpec train;
  OptimizerSpec optimizer;
  EvalSpec eval;
  CheckpointSpec checkpoint;
  std::string output_dir;  // checkpoints and exports go under it
  // The daemon's id of the job ("job-000012"): written into every checkpoint
  // (state.json "job_id") and required of a checkpoint it resumes from. Set
  // by the daemon when the job starts, never taken from the user (not in
  // the job file or the proto); empty for a standalone run, which writes no
  // id and resumes from any checkpoint.
  std::string job_id;
};

// Checks every field. INVALID_ARGUMENT naming the field path and the value
// ("train.micro_batch: must be in [1, 4096], got 0"); UNIMPLEMENTED for an
// unsupported architecture. Does not touch the file system. `output_dir`
// may still be empty here (the server assigns one); Create() needs it.
absl::Status ValidateJobSpec(const JobSpec& spec);

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
  // (Note [Embedding lookahead] in trainer.h): 2 x B x T x C fp32 at most,
  // 0 with tied embeddings. Part of host_total_bytes, not of host.
  int64_t embedding_lookahead_bytes = 0;
};

// Computes the footprint of `spec`'s model (reads config.json for hf_dir).
absl::StatusOr<MemoryFootprint> EstimateFootprint(const JobSpec& spec);
// As EstimateFootprint, with an hf_dir model's config.json given as
// `hf_config_json` (read by the caller) instead of read from disk; a preset
// spec ignores it. Errors of ParseHfConfig, prefixed "model.hf_dir".
absl::StatusOr<MemoryFootprint> EstimateFootprintFromHfConfig(const JobSpec& spec,
                                                              absl::string_view hf_config_json);

// Engine-side state of a running job, reported through JobObserver.
struct StepReport {
  int64_t step = 0;  // optimizer steps done, counted from 1
  int64_t max_steps = 0;
  double loss = 0;       // mean over the global batch's counted tokens (MoE
                         // with the aux loss: + router_aux_loss_coef x aux)
  double aux_loss = 0;   // MoE: mean load-balancing loss of a micro-batch
  double grad_norm = 0;  // before clipping
  double lr = 0;
  double tokens_per_s = 0;
  double mfu = 0;        // model FLOPs / bf16 dense peak, [0, 1]
  bool skipped = false;  // non-finite loss or gradient norm: the update
                         // was not applied (train.nan_policy skip); `step`
                         // is then the last applied step's number
  StepStats stats;       // phases, bytes of this step
};

struct CheckpointInfo;  // below

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

  enum class StopKind { kCancel, kSuspend };
  virtual void RequestStop(StopKind kind) = 0;
  // Asks for a checkpoint at the next step boundary.
  virtual void RequestCheckpoint() = 0;

  virtual int64_t step() const = 0;
  virtual int64_t max_steps() const = 0;
  virtual MemoryFootprint footprint() const = 0;
};

// Adds the job's numbers to a device out-of-memory error: `status` is
// returned unchanged unless it is RESOURCE_EXHAUSTED with a message starting
// "device out of memory" (how the executor reports LibTorch's
// OutOfMemoryError). The result keeps the code and the original message and
// adds the micro-batch shape, the activations saved for backward (one
// [B, T, C] fp32 layer input per layer: activation checkpointing is always
// on; with train.offload_activations only 3 of them stay on the device), the
// whole-job device estimate (and its resident part), a smaller train.micro_batch to try (half, with
// gradient_accumulation_steps doubled to keep the global batch) and, when it
// is off, train.offload_activations with the pinned host bytes it would take.
// TrainingJob applies it to every error of Create and Run.
// Example (llama-1b preset, bf16, micro_batch 64, seq_len 8192), after the
// executor's "device out of memory (...): CUDA out of memory. Tried to
// allocate ...":
//   ; job: train.micro_batch 64 x train.seq_len 8192 = 524288 tokens per
//   micro-batch; layer inputs saved for backward (activation checkpointing
//   is always on) 16 x 524288 x 2048 x 4 B = 64.00 GiB, device estimate
//   168.40 GiB (5.95 GiB of it resident layers, embedding and gradient
//   buffers at most); try train.micro_batch: 32 with
//   train.gradient_accumulation_steps: 2 (same global batch) or a shorter
//   train.seq_len; or train.offload_activations: true (15 x 524288 x 2048 x
//   4 B = 60.00 GiB of them in pinned host memory instead)
absl::Status ExplainDeviceOutOfMemory(const absl::Status& status, const JobSpec& spec,
                                      const ModelConfig& config);

// The job spec as JSON (field names as in the job file), stored in
// checkpoints so a checkpoint describes how it was made.
std::string JobSpecToJson(const JobSpec& spec);

// Dense bf16 peak of a device, in FLOP/s, for MFU (NVIDIA datasheets:
// H100/H200 SXM 989e12, A100 312e12); 0 when unknown (MFU not reported).
// MEGATRAIN_PEAK_TFLOPS in the environment overrides it.
double PeakBf16Flops(const std::string& device_name);

// A checkpoint written by a job (see docs/checkpoint-format.md).
struct CheckpointInfo {
  std::string dir;
  int64_t step = 0;
  int64_t bytes = 0;
  // The job id its state.json names; empty for a checkpoint written without
  // one (a standalone run or a format-1 checkpoint from before job ids).
  // Filled by WriteCheckpoint and VerifyCheckpoint, not by ListCheckpoints.
  std::string job_id;
  // XXH64 (seed 0) of its manifest.json: identifies the checkpoint's whole
  // content (the manifest holds every other file's XXH64). Filled by
  // WriteCheckpoint and VerifyCheckpoint, 0 from ListCheckpoints.
  uint64_t manifest_xxh64 = 0;
};

inline void JobObserver::OnCheckpointWritten(const CheckpointInfo& info, double seconds) {
  OnCheckpoint(info.step, info.dir, seconds);
}

// Checks checkpoint `checkpoint_dir` (a `step-*` directory) without loading
// it: manifest.json parses, state.json matches its size and XXH64 and
// parses, and its step equals the manifest's. With `check_data`, every
// other file listed in the manifest is read whole and must match its size
// and XXH64 (reads the whole checkpoint once). Returns its step, job id and
// manifest hash (dir and bytes filled too).
// Errors: NOT_FOUND when the directory is missing; DATA_LOSS naming the file
// for anything that does not verify; UNIMPLEMENTED for a newer format.
// Implemented in checkpoint.cc.
absl::StatusOr<CheckpointInfo> VerifyCheckpoint(const std::string& checkpoint_dir, bool check_data);

// Checkpoints under `output_dir`, oldest first. NOT_FOUND if it is missing.
absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& output_dir);

// Writes checkpoint `checkpoint_dir` as an HF model directory `out_dir`
// (config.json, safetensors shards <= 5 GB, index). `dtype` "bf16" | "fp32".
absl::Status ExportHfModel(const std::string& checkpoint_dir, const std::string& out_dir,
                           const std::string& dtype);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_TRAINING_JOB_H_
