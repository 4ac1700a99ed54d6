// The job spec: what a training job is asked to do (model, data, batch
// shape, optimizer, evaluation, checkpoints), its validation and its step
// count. One library without LibTorch (CMake target megatrain_spec), used by
// the engine's job runner (engine/job/training_job.h), checkpoints
// (engine/checkpoint/checkpoint.h: retention) and the server (which stores,
// converts and admits specs without linking the engine).
//
// Field names follow the job file (examples/jobs/tiny.yaml), the proto
// (proto/megatrain/v1/job.proto) and the JSON (job_spec_json.h):
// `train.micro_batch`, `optimizer.lr`, ...; error messages name the field by
// that path. docs/job-spec.md documents every field. Keyword fields are
// enums, parsed once at the edges (server/rpc/proto_convert.cc,
// job_spec_json.cc, megatrain-bench's flags); engine/job/step_options.h
// turns a spec into the step's options.
//
// Note [One place per bound]: each numeric bound of a field is written once,
// as a k...Range constant below, and checked with CheckIntInRange /
// CheckRealInRange, which write the one message form
// "train.micro_batch: must be in [1, 4096], got 0". Code below the job
// (data loader, LR schedule, executor) that checks the same field checks it
// against the same constant, so the bounds cannot drift apart.
//
// Thread-safety: value types and pure functions.
#ifndef MEGATRAIN_ENGINE_SPEC_JOB_SPEC_H_
#define MEGATRAIN_ENGINE_SPEC_JOB_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/model/precision.h"
#include "engine/spec/document_attention.h"
#include "engine/spec/lr_schedule_kind.h"
#include "engine/spec/memory_modes.h"
#include "engine/spec/nan_policy.h"
#include "engine/spec/nvme_tier_mode.h"
#include "engine/spec/init_from.h"
#include "engine/spec/step_schedule.h"

namespace megatrain::engine {

// Where the model comes from: exactly one of `preset` and `hf_dir`.
struct ModelSource {
  std::string preset;  // "tiny", "llama-1b", ... (PresetConfig)
  std::string hf_dir;  // HF directory: config.json + safetensors
  // Mixture-of-experts models: the router's load-balancing loss on (true)
  // or off (false) in place of config.json's `output_router_logits` (Note
  // [Load-balancing loss across micro-batches] in engine/step/moe_block.h);
  // unset keeps the config's. Set for a dense model: INVALID_ARGUMENT when
  // the model is resolved (EstimateFootprint, TrainingJob::Create).
  std::optional<bool> output_router_logits;
  // Starting weights from a checkpoint of another job of the same user, in
  // place of the preset's initialisation or hf_dir's weights; the model
  // (preset or hf_dir) must still be given and must match the checkpoint's
  // (init_from.h).
  InitFrom init_from;
};

// Where the training data comes from: exactly one of `tokens` and `text`.
struct DataSpec {
  std::string tokens;       // a token shard file or a directory of *.mtt shards
  std::string eval_tokens;  // optional held-out shards (then eval_fraction = 0)
  std::string text;         // plain text or JSONL {"text": ...}; needs tokenizer
  // With `text`: a HF tokenizer (directory with tokenizer.json, or the
  // file) or a SentencePiece .model; default: model.hf_dir's tokenizer.json.
  std::string tokenizer;
  double eval_fraction = 0.0;  // held-out share of documents, kEvalFractionRange
  uint64_t shuffle_seed = 1234;
  // How documents are packed into sequences (docs/job-spec.md, "Packing").
  struct Packing {
    // Whether packed documents see each other (engine/spec/
    // document_attention.h): auto is isolated for masked (SFT, chat) data.
    DocumentAttention document_attention = DocumentAttention::kAuto;
  } packing;
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
  // (engine/spec/nan_policy.h; Note [Non-finite steps] in trainer.h).
  NanPolicy nan_policy = NanPolicy::kSkip;
  // Saved layer inputs in pinned host memory during forward, back one layer
  // ahead in backward (Note [Activation offload] in executor.h): costs
  // (L-1) * micro_batch * seq_len * hidden_size * 4 bytes of pinned host
  // memory and as many bytes each way over PCIe per micro-batch. For long
  // sequences; bit-identical results.
  bool offload_activations = false;
  // seq_len above the model's max_position_embeddings (config.json) is
  // refused at submission unless this is set (server/core/submit_checks.h):
  // RoPE then runs past the positions the model was trained on.
  bool allow_seq_len_above_max_position_embeddings = false;
  // The step schedule (issue 16; Note [Schedule choice] in
  // engine/step/schedule_choice.h): the order (empty: auto; "auto" |
  // "micro-batch-major" | "layer-major" in job files), layer-major
  // micro-batches per wave (0 = auto), where the saved layer inputs live
  // ("auto" | "device" | "host"; offload_activations true means host:
  // RequestedActivations). Auto picks from the plan's sizes on the device.
  // The words are parsed at the edges (the proto conversion, the JSON
  // reader) by step_schedule.h.
  std::optional<StepSchedule> schedule;
  int64_t wave = 0;
  ActivationPlacement activations = ActivationPlacement::kAuto;
  // CUDA graphs of the dense decoder layers (Note [Layer graphs] in
  // engine/step/layer_graphs.h): "auto" | "on" | "off".
  CudaGraphs cuda_graphs = CudaGraphs::kAuto;
  // The fused elementwise kernels (Note [Fused kernels] in
  // engine/model/fused_math.h): "auto" (on in CUDA builds) | "on" | "off".
  FusedKernels fused_kernels = FusedKernels::kAuto;
  // Activation checkpointing (Note [Kept layer graphs] in
  // engine/step/executor.h): "auto" (resident dense layers whose forward
  // graph fits the device keep it and skip the recompute) | "all" (every
  // layer recomputed).
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::kAuto;
  // Devices the job trains on, data parallel (docs/distributed.md): N >= 1,
  // or kAllDevices for every device of the daemon (resolved at submission).
  // gradient_accumulation_steps must be a multiple of N: each device runs
  // the same number of micro-batches of a step.
  int64_t devices = 1;
  // Decoder layers kept on the device (layers 0..N-1 with their fp32
  // master, AdamW moments and gradient; Note [Auto resident layers] in
  // engine/step/schedule_choice.h): kAutoResidentLayers lets the trainer
  // choose, else N in [0, num_hidden_layers] (TrainerOptions::
  // resident_layers, megatrain-bench --resident_layers).
  int64_t resident_layers = -1;
};

// TrainSpec::devices: every device of the daemon ("all" in job files).
inline constexpr int64_t kAllDevices = 0;
// TrainSpec::resident_layers: the trainer's choice ("auto" in job files,
// unset in the proto).
inline constexpr int64_t kAutoResidentLayers = -1;

struct OptimizerSpec {
  double lr = 3e-4;  // peak learning rate
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t warmup_steps = 0;
  LrScheduleKind schedule = LrScheduleKind::kCosine;  // "cosine" | "linear" | "constant"
  double min_lr_ratio = 0.0;                          // final lr / peak lr
};

struct EvalSpec {
  int64_t every_steps = 0;  // 0 = no periodic eval
  int64_t batches = 4;      // micro-batches per eval
};

// Checkpoint frequency and retention (WriteCheckpoint applies the latter).
struct CheckpointSpec {
  int64_t every_steps = 0;  // 0 = only on request / suspend / end
  int64_t keep_last = 2;    // newest checkpoints kept
  int64_t keep_every = 0;   // also keep every N-th step (0 = none)
};

// Where the job's state lives (Note [NVMe tier] in engine/store/nvme_tier.h).
struct MemorySpec {
  NvmeTierMode nvme_tier = NvmeTierMode::kOff;  // memory.nvme_tier
  // The daemon's NVMe directory (--nvme_dir) when this job's moments go to
  // the tier (nvme_tier moments, or auto resolved to the tier by
  // admission); the job keeps its files in a subdirectory named after
  // job_id. Set by the daemon when the job starts, never taken from the
  // user (not in the job file, the proto or the spec's JSON). Empty: auto
  // runs in host memory and moments fails at start (FAILED_PRECONDITION).
  std::string nvme_dir;
  // memory.weight_stream (memory_modes.h): bf16 compute streams a bf16
  // host copy (kBf16, the default), the fp32 master cast on the device
  // (kFp32) or the fp32 master cast on the host into pinned staging
  // (kHostCast).
  WeightStream weight_stream = WeightStream::kBf16;
  // memory.gradient_landing (memory_modes.h): kRing needs
  // train.max_grad_norm 0 (ValidateJobSpec).
  GradientLanding gradient_landing = GradientLanding::kArena;
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
  MemorySpec memory;
  std::string output_dir;  // checkpoints and exports go under it
  // The daemon's id of the job ("job-000012"): written into every checkpoint
  // (state.json "job_id") and required of a checkpoint it resumes from. Set
  // by the daemon when the job starts, never taken from the user (not in
  // the job file, the proto or the spec's JSON); empty for a standalone
  // run, which writes no id and resumes from any checkpoint.
  std::string job_id;
};

// A closed range [min, max] of an integer field.
struct IntRange {
  int64_t min;
  int64_t max;
};

// A range of a real field: [min, max], or (min, max] with `min_open`.
// NaN and infinities are never in it.
struct RealRange {
  double min;
  double max;
  bool min_open = false;
};

// The bounds of the spec's fields (Note [One place per bound]). The caps
// are sanity limits, not hardware ones: they keep every product the engine
// forms from them in int64 (micro_batch x seq_len x
// gradient_accumulation_steps <= 2^48 tokens per step; max_tokens + one
// step's tokens < 2^61) and reject values that are surely typos.
inline constexpr IntRange kMicroBatchRange{1, 4096};
inline constexpr IntRange kSeqLenRange{1, int64_t{1} << 20};
inline constexpr IntRange kGradientAccumulationStepsRange{1, int64_t{1} << 16};
// Layer-major micro-batches per wave; 0 lets the trainer choose.
inline constexpr IntRange kWaveRange{0, 4096};
// train.devices: kAllDevices or 1..64 (the data-parallel ranks one host runs).
inline constexpr IntRange kDevicesRange{0, 64};
// train.resident_layers: kAutoResidentLayers or a layer count (the model's
// num_hidden_layers bounds it at submission, server/core/submit_checks.h).
inline constexpr IntRange kResidentLayersRange{kAutoResidentLayers, 4096};
inline constexpr IntRange kMaxStepsRange{0, int64_t{1} << 40};
inline constexpr IntRange kMaxTokensRange{0, int64_t{1} << 60};
inline constexpr IntRange kEvalEveryStepsRange{0, int64_t{1} << 40};
inline constexpr IntRange kEvalBatchesRange{1, int64_t{1} << 20};
inline constexpr IntRange kCheckpointEveryStepsRange{0, int64_t{1} << 40};
inline constexpr IntRange kCheckpointKeepLastRange{1, int64_t{1} << 20};
inline constexpr IntRange kCheckpointKeepEveryRange{0, int64_t{1} << 40};
// At most half of the documents held out: more leaves too little to train on.
inline constexpr RealRange kEvalFractionRange{0, 0.5};
// Clipping threshold of the global gradient norm; 0 turns clipping off.
inline constexpr RealRange kMaxGradNormRange{0, 1e9};
// A zero peak rate trains nothing: refused as a mistake.
inline constexpr RealRange kLrRange{0, 1, /*min_open=*/true};
// AdamW's betas stay below 1: at 1 the bias correction 1 - beta^t is 0
// (Note [AdamW update] in engine/optim/adamw.h).
inline constexpr RealRange kBeta1Range{0, 0.999999};
inline constexpr RealRange kBeta2Range{0, 0.999999999};
inline constexpr RealRange kEpsRange{0, 1};
inline constexpr RealRange kWeightDecayRange{0, 10};
// The floor is a fraction of the peak rate.
inline constexpr RealRange kMinLrRatioRange{0, 1};

// OK when `value` is in `range`, else INVALID_ARGUMENT
// "<field>: must be in [<min>, <max>], got <value>".
absl::Status CheckIntInRange(absl::string_view field, int64_t value, IntRange range);
// As CheckIntInRange for a real field ("(" for an open lower end); NaN and
// infinities are refused.
absl::Status CheckRealInRange(absl::string_view field, double value, RealRange range);

// Optimizer steps the job runs: `train.max_steps` when > 0, else
// `train.max_tokens` over the tokens of one step (micro_batch x seq_len x
// gradient_accumulation_steps), rounded up. 0 when neither is set or the
// batch shape is not positive (a spec ValidateJobSpec refuses).
int64_t MaxSteps(const JobSpec& spec);

// Collects the errors of several independent checks so that a spec with
// several mistakes is refused once, naming each field ("all errors at
// once"). Not thread-safe (a local of one validation).
//
// Example:
//   SpecErrors errors;
//   errors.Add(CheckIntInRange("train.seq_len", t.seq_len, kSeqLenRange));
//   errors.Add(CheckIntInRange("train.micro_batch", ...));
//   return errors.ToStatus();
class SpecErrors {
 public:
  // Records `status` unless it is OK.
  void Add(const absl::Status& status);
  bool empty() const { return errors_.empty(); }
  // OK when nothing was recorded; else the first error's code with every
  // message, in order, joined by "; " (each starts with its field's name).
  absl::Status ToStatus() const;

 private:
  absl::StatusCode code_ = absl::StatusCode::kOk;
  std::vector<std::string> errors_;
};

// Checks every field against its bound and the fields' combinations (one of
// model.preset / model.hf_dir, one of data.tokens / data.text, a tokenizer
// for text, max_steps or max_tokens, warmup_steps <= MaxSteps, a known
// preset, the enums' values, the schedule's rules between fields). INVALID_ARGUMENT naming the
// field path and the value
// ("train.micro_batch: must be in [1, 4096], got 0"); those of PresetConfig
// for an unknown preset. Every error of the spec at once (SpecErrors: the
// messages joined by "; ", the first one's code). Does not touch the file system (an hf_dir model's
// config is checked when the job is created). `output_dir` may still be
// empty here (the server assigns one); TrainingJob::Create needs it.
absl::Status ValidateJobSpec(const JobSpec& spec);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_JOB_SPEC_H_
