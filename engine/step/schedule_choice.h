// The trainer's choice of a step schedule (issue 16): the order of work
// (micro-batch-major or layer-major), the layer-major wave and where the
// wave's saved layer inputs live, from the sizes of the plan. Every part
// of the choice can be forced by an option (TrainerOptions, megatrain-bench
// --schedule / --wave / --activations, the job spec's train.schedule,
// train.wave, train.activations). No LibTorch types: the server and the
// benchmark use this header.
//
// Note [Schedule choice]
// With A micro-batches per step the micro-batch-major schedule streams
// every layer 2A times per step; layer-major streams it twice per wave
// (Note [Layer-major schedule] in step_plan.h), at the price of keeping the
// wave's saved layer inputs at once. Auto therefore picks:
//   * schedule: layer-major when A > 1 on a GPU (with A = 1 both orders
//     are the same plan) or when a wave is asked for; micro-batch-major on
//     the CPU, which has no link to save (the CPU runtime still runs
//     layer-major when asked);
//   * wave: all A micro-batches (the weights cross the link once per
//     step), unless their activations do not fit the activation budget:
//     then the largest wave whose activations fit (at least 1); a wave
//     asked for is capped at A;
//   * activations: on the device, where the wave's live activations are W
//     x (L + 2) x [B, T, C] fp32 (L saved inputs, the hidden state and its
//     gradient per micro-batch). Pinned host memory (the activation-offload
//     path: W x 3 x [B, T, C] fp32 stay on the device, plus the ring of
//     two; W x (L - 1) inputs in pinned host memory) only when asked for
//     (`activations: host`; the wave is then A or the one asked for). Auto
//     never moves them to the host on its own: admission (the footprint,
//     engine/job/training_job.h) counts the offload's pinned bytes only
//     when the spec asks for it, and a move it did not count outgrew the
//     host: Qwen3-32B's widths with 56 layers at accumulation 4 (28.9 B
//     parameters, 463 GB of store on a 503 GiB host) would have added 4 x
//     55 x 335 MB = 74 GB of pinned inputs, and the kernel killed the
//     process (docs/performance-history.md, "2026-11-29 (streamed
//     14-32B)"). A smaller wave costs one more pass of the weights over
//     the link per extra wave, not host memory.
//   The activation budget is kActivationBudgetFraction of the device
//   memory left after the executor's own buffers (weight and gradient
//   slots, resident blocks, accumulation buffers: Note [Executor memory
//   plan] in executor.h); the rest is the working memory of one layer's
//   recompute and backward and of the loss chunks.
// Layer-major with one wave sums the streamed gradients in the gradient
// slots and needs no accumulation buffers: auto device gradient
// accumulation is on only when a step of A micro-batches would use them
// (A > 1, and not one layer-major wave of all A) and their 4 bytes per
// streamed parameter fit kDeviceGradAccumulationMaxFraction of the device.
//
// Note [Auto resident layers]
// A resident block (Notes [Resident layers] and [Resident embedding] in
// executor.h) keeps fp32 master, two AdamW moments, fp32 gradient and
// (decoder layers, and a tied embedding, under bf16) the compute copy on
// the device and is updated there: it never crosses the link and takes no
// CPU AdamW, so with every block resident a step is resident PyTorch's
// (with activation checkpointing). After the schedule (above, decided with
// only the forced resident blocks), auto fills what is left of the device:
//   * the embedding first (its chain is at both ends of every step: the
//     gather and upload before layer 0, dx and the scatter after the last
//     backward, and with tied embeddings the [V, C] lm_head's load and
//     gradient landing); a tied table also leaves the weight and gradient
//     slots, which then only need the largest streamed block;
//   * then decoder layers 0..R-1 (earliest first: the next forward needs
//     them first, Note [Resident layers]), R as large as fits, with or
//     without clipping. With clipping no CPU update can start before the
//     global norm is known, so every streamed layer's CPU AdamW is on the
//     critical path of the next forward. Without clipping the CPU updates
//     run behind backward, but only where the host's AdamW is faster than
//     the GPU's step: a resident layer's fused device update costs ~38
//     bytes of device memory traffic per parameter (Note [Fused device
//     AdamW]), a CPU update ~40 bytes of host memory traffic, and hosts
//     differ: on some the CPU AdamW of the streamed layers outlasts the
//     GPU's step (docs/performance-history.md, "2026-11-24 (head-GEMM)");
// such that
//   PlanExecutorMemory(final options).device_bytes()  (slots, ring,
//       resident blocks, accumulation buffers: exactly what is allocated)
//   + the wave's saved layer inputs outside that plan
//   + WorkingBytes (one layer's recompute and backward, the loss chunks)
//   + the margin (kResidentMarginBytes + kResidentMarginFraction of the
//     device: CUDA context, cuBLAS workspaces, allocator fragmentation)
//   <= the device's total memory.
// Then, with what is still left, auto keeps the forward graphs of
// resident dense layers 0..K-1 (Note [Kept layer graphs] in executor.h:
// no recompute in their backward), K as large as fits with
//   K x wave x KeptGraphBytes (engine/step/working_bytes.h)
// added to the sum above; only on a GPU, without CUDA graphs (where those
// are on, a micro-batch is small and the launches, not the recompute,
// bound a layer), without activation offload, for dense models with plain
// causal attention (no soft-capping or sliding layers, which keep more
// than KeptGraphBytes bounds). With every decoder layer resident an auto
// layer-major order saves no link traffic while its wave multiplies each
// kept layer's graphs, so auto turns micro-batch-major when that keeps
// more of them (llama-1b at accumulation 4 on an H200: 16 kept instead of
// 9 in waves of 4). The
// resident fill goes first: a resident layer saves its link traffic and
// its CPU AdamW, a kept graph a quarter of its layer's compute. So a model
// that fits the device whole (llama-1b and llama-3b on an H200) trains
// without checkpointing the layers whose graphs fit, and a streamed one
// keeps none unless memory is left over.
// Mixture-of-experts layers count like dense ones (every expert: 11.2 GB
// per layer of Qwen3-30B-A3B at 18 bytes/param): they gain the most, since
// they compute little per parameter and their CPU AdamW, after the global
// norm, is otherwise exposed. With 4 of 6 layers of Qwen3-30B-A3B's
// widths resident, 1.69x the tokens/s of every layer streamed, optimizer
// exposed 0.13 s instead of 1.09 s (one H200, clip 1.0, accumulation 4;
// docs/performance.md); the plan's device bytes were within 1% of the
// measured peak. The CPU keeps everything streamed (no device
// memory to save anything in; the CPU runtime still honours forced
// resident blocks, which is how the tests run them). Forced options
// (TrainerOptions::resident_layers / resident_embedding /
// device_grad_accumulation, megatrain-bench --resident_layers ...) stand as
// given, even when they do not fit. `megatrain plan` (engine/job/plan.cc)
// calls this same function for its machine, so its device bytes are the
// trainer's.
//
// Thread-safety: pure functions.
#ifndef MEGATRAIN_ENGINE_STEP_SCHEDULE_CHOICE_H_
#define MEGATRAIN_ENGINE_STEP_SCHEDULE_CHOICE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/model_config.h"
#include "engine/model/precision.h"
#include "engine/runtime/cancellation.h"
#include "engine/spec/step_schedule.h"  // ActivationPlacement, ParseStepSchedule, ...
#include "engine/step/step_plan.h"
#include "engine/step/working_bytes.h"  // WorkingBytes, LossWorkingBytes

namespace megatrain::engine {

struct ExecutorOptions;  // engine/step/executor.h

// Auto's share of the device memory left after the executor's buffers that
// the wave's activations may take (Note [Schedule choice]). 1/2: llama-3b
// at 4 x [8, 2048] keeps 4 x 30 x [8, 2048, 3072] fp32 = 24.2 GB, which
// fits beside its ~20 GB of executor buffers on an 80 GB H100 (budget
// ~30 GB); the other half covers one layer's recompute and backward.
inline constexpr double kActivationBudgetFraction = 0.5;

// Note [Auto resident layers]: the device memory auto leaves free beside
// its plan. 2 GiB covers the CUDA context and library workspaces (~0.5-1
// GB on an H100) and 5% of the device the caching allocator's
// fragmentation: 6.1 GB of an 80 GB H100, 9.2 GB of a 141 GB H200.
inline constexpr int64_t kResidentMarginBytes = int64_t{2} << 30;
inline constexpr double kResidentMarginFraction = 0.05;

// Auto's limit for device gradient accumulation (Note [Schedule choice]):
// 4 bytes per streamed parameter over the device's total memory. 1/4:
// llama-1b's 4.5 GB and llama-3b's 12 GB fit an 80 GB H100, llama-8b's
// 26 GB fits neither an H100 nor an H200.
inline constexpr double kDeviceGradAccumulationMaxFraction = 1.0 / 4;

// Note [Layer graphs] in step/layer_graphs.h: auto replays dense decoder
// layers from CUDA graphs on a GPU when a micro-batch has at most this many
// tokens (B x T). Below it a layer's kernels are short enough that host
// launch work between them leaves the GPU idle (llama-1b at 1 x 2048:
// 43% of a step, docs/performance-history.md "2026-11-24 (CUDA-graphs)"); above it the kernels
// hide the launches and the graphs' memory buys little.
inline constexpr int64_t kCudaGraphMaxTokens = 4096;

// What the options ask for.
struct ScheduleRequest {
  std::optional<StepSchedule> schedule;  // empty: auto
  int wave = 0;                          // layer-major micro-batches per wave; 0: auto
  ActivationPlacement activations = ActivationPlacement::kAuto;
  int64_t gradient_accumulation_steps = 1;  // A: micro-batches per optimizer step
  // Note [Auto resident layers]: -1 auto; else the decoder layers
  // (in [0, num_hidden_layers]) / the embedding (0 or 1) kept on the device.
  int resident_layers = -1;
  int resident_embedding = -1;
  // Note [Device gradient accumulation] in executor.h: -1 auto, 0 off, 1 on.
  int device_grad_accumulation = -1;
  // Note [Layer graphs]: -1 auto (kCudaGraphMaxTokens), 0 off, 1 on.
  int cuda_graphs = -1;
  // Note [Kept layer graphs] in executor.h: -1 auto (Note [Auto resident
  // layers]); else the resident decoder layers whose forward graph is kept
  // (0: activation checkpointing everywhere), at most the resident count
  // (a larger one keeps them all). Not with mixture-of-experts models or
  // `activations: host` (INVALID_ARGUMENT when > 0).
  int kept_graph_layers = -1;
};

// What the trainer runs.
struct ScheduleChoice {
  StepSchedule schedule = StepSchedule::kMicroBatchMajor;
  int wave = 1;  // micro-batches per wave (1 for micro-batch-major)
  bool offload_activations = false;
  int64_t layer_input_bytes = 0;  // one [B, T, C] fp32 saved layer input
  // The wave's live activations on the device, in bytes (Note [Schedule
  // choice]), and the budget they were held against (0 on the CPU).
  int64_t activation_device_bytes = 0;
  int64_t activation_budget_bytes = 0;
  // Note [Auto resident layers]: what stays on the device, and whether
  // the layer count was given (ScheduleRequest::resident_layers >= 0)
  // rather than auto's.
  int resident_layers = 0;
  bool resident_layers_forced = false;
  bool resident_embedding = false;
  bool device_grad_accumulation = false;
  bool cuda_graphs = false;  // Note [Layer graphs] (dense layers only)
  // Note [Kept layer graphs]: resident layers 0..kept_graph_layers-1 keep
  // their forward graph; `kept_graph_bytes` is their planned device memory
  // (kept_graph_layers x wave x KeptGraphBytes; 0 on the CPU).
  int kept_graph_layers = 0;
  int64_t kept_graph_bytes = 0;
  // The device's memory as planned, in bytes (all 0 on the CPU): its
  // total, the executor's buffers with the options above
  // (PlanExecutorMemory(...).device_bytes(), of it `resident_bytes` the
  // resident blocks), the working set and the margin auto left free.
  int64_t device_total_bytes = 0;
  int64_t executor_device_bytes = 0;
  int64_t resident_bytes = 0;
  int64_t grad_accumulation_bytes = 0;  // of executor_device_bytes
  int64_t working_bytes = 0;
  int64_t margin_bytes = 0;
  // Everything planned on the device: executor_device_bytes + the saved
  // layer inputs outside it + kept_graph_bytes + working_bytes (the margin
  // not included); 0 on the CPU.
  int64_t planned_device_bytes() const;
  // One line for the job's events and the bench's stderr, e.g.
  // "layer-major, wave 4, activations on the device (9.7 GB on the device
  // of a 37.1 GB budget); resident: 16 layers (auto) and the embedding
  // (22.2 GB; 38.0 GB of 80.0 GB planned)", with ", forward graphs of 16
  // layers kept (40.8 GB)" when graphs are kept; a forced layer count reads
  // "resident: 4 layers (resident_layers) ...".
  std::string Describe() const;
};

// The order of a step and its wave as `request` asks for them (Note
// [Schedule choice]), before the activation budget: layer-major when
// forced, or auto with A > 1 micro-batches on a GPU (`gpu`) or a wave
// asked for; the wave asked for capped at A, else A (1 for
// micro-batch-major). ChooseSchedule starts from it (and may shrink an
// auto wave to fit); the footprint (engine/job/training_job.h), which
// plans for a GPU of unknown size, stops there. `request` as
// ChooseSchedule checks it.
struct ScheduleOrder {
  StepSchedule schedule = StepSchedule::kMicroBatchMajor;
  int64_t wave = 1;  // micro-batches whose layer inputs are saved at once
};
ScheduleOrder RequestedOrder(const ScheduleRequest& request, bool gpu);

// Checks `request` (INVALID_ARGUMENT naming the option: `wave` must be in
// kWaveRange, [0, 4096] (engine/spec/job_spec.h), and 0 or 1 with
// micro-batch-major; `gradient_accumulation_steps` >= 1; resident_layers -1
// or in [0, num_hidden_layers]; resident_embedding and
// device_grad_accumulation -1, 0 or 1) and resolves it for `config` on a
// device of `device_total_bytes` (0: the CPU), with the executor's other
// options (compute dtype, [micro_batch, seq_len], slots) from `executor`
// (Notes [Schedule choice] and [Auto resident layers]). The residency and
// schedule fields of `executor` are not read. `cancel` is checked before
// the search and between its tries (each plans every block: ~13 tries at
// 4,096 layers); its status (CANCELLED, DEADLINE_EXCEEDED) is returned as
// soon as it is not OK.
absl::StatusOr<ScheduleChoice> ChooseSchedule(const ModelConfig& config,
                                              const ScheduleRequest& request,
                                              const ExecutorOptions& executor,
                                              int64_t device_total_bytes,
                                              const Cancellation& cancel = Cancellation());

// Whether a forced resident layer count (ScheduleRequest::resident_layers
// >= 0) can run on `choice`'s device: RESOURCE_EXHAUSTED, starting with
// `field` (the caller's name of the option, e.g. "resident_layers" or
// "train.resident_layers"), when the executor's buffers alone
// (choice.executor_device_bytes: slots, resident blocks, accumulation
// buffers, exactly what is allocated) exceed the device's total memory,
// so that no step can ever run; the message says how many layers auto
// keeps there (ChooseSchedule with the count left to auto). OK for auto,
// on the CPU (device_total_bytes 0) and whenever they fit (activations
// and working memory are not counted: those are ChooseSchedule's
// estimates, and the plan reports them).
// `config`, `request`, `executor` and `cancel` are ChooseSchedule's
// arguments; a cancelled search returns its status (CANCELLED,
// DEADLINE_EXCEEDED) instead.
absl::Status CheckForcedResidentLayersFit(const ModelConfig& config, const ScheduleRequest& request,
                                          const ExecutorOptions& executor,
                                          const ScheduleChoice& choice, absl::string_view field,
                                          const Cancellation& cancel = Cancellation());

// `executor` with `choice`'s schedule, wave, activation placement and
// resident blocks.
ExecutorOptions WithChoice(const ExecutorOptions& executor, const ScheduleChoice& choice);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_SCHEDULE_CHOICE_H_
