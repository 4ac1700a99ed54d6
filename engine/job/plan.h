// Plan before you run: where a job's bytes go (host memory, pinned, device,
// NVMe), whether it fits a machine and how, and a projected step time from
// the machine's rates. `megatrain plan` and the PlanJob RPC print it.
//
// Note [Plan projection]
// Sizes come from the job's MemoryFootprint (EstimateFootprint, with
// WithNvmeMoments for the NVMe tier): the plan adds no sizes of its own.
// The step time is a roofline over the resources a step keeps busy, which
// the executor overlaps (Notes [Optimizer overlap] in step/trainer.h and
// [Activation offload] in step/executor.h):
//   compute = (8 N - 2 N_kept + 12 L C T) x tokens / (matmul peak x
//             kPlanMatmulFraction) (6N of training plus 2N for the forward
//             recomputed under activation checkpointing, less the layers
//             whose forward graph is kept, N_kept: Note [Kept layer graphs]
//             in step/executor.h; 12 L C T the attention, PaLM appendix B,
//             no causal discount)
//   h2d     = micro-batches x 2 x streamed weight bytes / H2D rate
//             (each block goes up for forward and again for backward)
//   d2h     = micro-batches (1 with device gradient accumulation) x
//             streamed fp32 gradient bytes / D2H rate
//   adamw   = parameters / AdamW rate
//   nvme    = moment bytes read / read rate + written / write rate
//   step    = max(compute, h2d, d2h, adamw, nvme) + kPlanStepOverheadSeconds
// With train.devices N > 1 (data parallelism, docs/distributed.md) the
// terms are one GPU's: compute and the micro-batches divided by N, each GPU
// loading 1/N of every streamed block (sharded streaming: the rest comes
// over the peer links, not counted) and landing 1/N of its gradient once
// (the ranks sum their micro-batches on the device); the CPU AdamW is the
// whole model's (the ranks split it, and the cores). MFU is per GPU. A
// host whose GPUs have no fast peer link streams every block to every GPU
// (docs/distributed.md): the projection is then optimistic by up to N x
// the h2d term.
// kPlanMatmulFraction is calibrated on llama-8b at 8 x 2048 on an H200
// (docs/performance.md: 2.230 s per step against 780 TFLOP/s measured).
#ifndef MEGATRAIN_ENGINE_JOB_PLAN_H_
#define MEGATRAIN_ENGINE_JOB_PLAN_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "engine/job/training_job.h"
#include "engine/model/model_config.h"
#include "engine/runtime/cancellation.h"

namespace megatrain::engine {

// Share of the bf16 matmul peak the layer kernels reach (Note [Plan
// projection]: llama-8b, 8 x 2048, H200: (8N + attention) x 16384 tokens =
// 1.105e15 FLOP in 2.23 - 0.06 s = 509 TFLOP/s of 780).
inline constexpr double kPlanMatmulFraction = 0.65;
// Per-step time outside the overlapped streams: the start gap before the
// first layer (57-70 ms measured on the H200, docs/performance.md).
inline constexpr double kPlanStepOverheadSeconds = 0.06;

// A machine to plan for. Rates are per second; a zero rate leaves its term
// out of the projection (and the plan says so).
struct PlanMachine {
  std::string description;             // where the numbers come from
  int64_t host_memory_bytes = 0;       // host memory jobs may use
  int64_t nvme_bytes = 0;              // NVMe tier capacity; 0 = no tier
  int64_t gpu_memory_bytes = 0;        // one device's memory
  double h2d_bytes_per_second = 0;     // pinned host -> device
  double d2h_bytes_per_second = 0;     // device -> pinned host
  double matmul_flops_per_second = 0;  // bf16 dense matmul peak
  double adamw_params_per_second = 0;  // CPU AdamW
  double nvme_read_bytes_per_second = 0;
  double nvme_write_bytes_per_second = 0;
};

// The nvidia-h200 machine of docs/performance.md (one H200, 128 GiB host):
// link 55 GB/s each way (pinned, measured at daemon start), bf16 matmul
// 780 TFLOP/s, CPU AdamW 5.78 G params/s; no NVMe tier (nvme_bytes 0, and
// 6.5 / 5.0 GB/s read / write, a PCIe 4 data-centre SSD's sequential rates,
// for when a size is given). Inline: the server resolves machines without
// linking the engine.
inline PlanMachine DefaultPlanMachine() {
  PlanMachine m;
  m.description = "nvidia-h200 (docs/performance.md)";
  m.host_memory_bytes = int64_t{128} << 30;
  m.nvme_bytes = 0;
  m.gpu_memory_bytes = int64_t{139} << 30;
  m.h2d_bytes_per_second = 55e9;
  m.d2h_bytes_per_second = 55e9;
  m.matmul_flops_per_second = 780e12;
  m.adamw_params_per_second = 5.78e9;
  m.nvme_read_bytes_per_second = 6.5e9;
  m.nvme_write_bytes_per_second = 5.0e9;
  return m;
}

// Bytes of one job per tier.
struct TierBytes {
  int64_t host_bytes = 0;    // all host memory (pageable + pinned)
  int64_t pinned_bytes = 0;  // of host_bytes, page-locked
  int64_t device_bytes = 0;  // one GPU's memory (the estimate)
  int64_t nvme_bytes = 0;    // files on the NVMe tier
};

// Seconds of one optimizer step, by resource (Note [Plan projection]).
struct StepProjection {
  int64_t tokens = 0;      // micro_batch x seq_len x gradient_accumulation_steps
  double model_flops = 0;  // 6N + attention per token, x tokens (MFU's numerator)
  double compute_seconds = 0;
  double h2d_seconds = 0;
  double d2h_seconds = 0;
  double adamw_seconds = 0;
  double nvme_seconds = 0;
  double step_seconds = 0;
  std::string bound;  // the largest term: "compute", "h2d", "d2h", "adamw", "nvme"
  double tokens_per_second = 0;
  double mfu = 0;  // model_flops / step_seconds / matmul peak
};

struct JobPlan {
  int64_t params = 0;
  // GPUs the plan is for (train.devices): the projection is one GPU's
  // share of the step (Note [Plan projection]).
  int64_t devices = 1;
  NvmeTierMode nvme_tier = NvmeTierMode::kOff;  // resolved: kOff or kMoments
  MemoryFootprint footprint;                    // with the resolved tier
  TierBytes tiers;
  bool fits = false;
  // How it fits or why not, e.g. "fits in host memory (146.2 GB of 1.50
  // TB)" or "does not fit: host 2.16 TB > 1.50 TB even with the moments on
  // NVMe (no NVMe tier)", then "; " and the footprint's host bytes per
  // parameter by kind (DescribeHostBytesPerParam).
  std::string verdict;
  StepProjection projection;
};

// Plans `spec` (its model given as `config`) on `machine`. spec.memory
// .nvme_tier kAuto puts the moments on NVMe only when the job does not fit
// the host otherwise and the tier has room; kMoments always (then fits
// needs the tier). Errors: INVALID_ARGUMENT naming the machine field for a
// negative size or rate; the status of `cancel` (CANCELLED,
// DEADLINE_EXCEEDED), which is checked between the plan's phases and
// between the tries of its resident-layer search, as soon as it is not OK.
absl::StatusOr<JobPlan> PlanJob(const JobSpec& spec, const ModelConfig& config,
                                const PlanMachine& machine,
                                const Cancellation& cancel = Cancellation());

// The model of a plan: exactly one of `preset`, `hf_config_json` (a HF
// config.json's text) and `family` with `param_count`.
struct PlanModel {
  std::string preset;
  std::string hf_config_json;
  std::string family;
  double param_count = 0;
};

// Resolves `model` and plans `spec` with it: the one call behind the
// PlanJob RPC. Only spec.train and spec.memory are read; they are checked
// as ValidateJobSpec checks a job (INVALID_ARGUMENT naming the field), and
// so is the model (INVALID_ARGUMENT "model: set exactly one of ..." or the
// errors of PresetConfig, ParseHfConfig and ConfigForParamCount), and
// `cancel` as PlanJob checks it.
absl::StatusOr<JobPlan> PlanJobForModel(const PlanModel& model, const JobSpec& spec,
                                        const PlanMachine& machine,
                                        const Cancellation& cancel = Cancellation());

// A model of `family` with about `params` parameters, for planning models
// the presets do not have: the Llama-3 shape (8B, 70B or 405B: hidden,
// intermediate, heads) closest below `params`, its layer count scaled to
// match (e.g. 120e9 -> the 70B shape with 138 layers, 120.2 B). Families:
// "llama". Errors: INVALID_ARGUMENT for params outside [1e8, 1e13] or an
// unknown family (naming the known ones).
absl::StatusOr<ModelConfig> ConfigForParamCount(absl::string_view family, double params);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_JOB_PLAN_H_
