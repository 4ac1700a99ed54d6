// The streaming executor: forward and backward of a Llama-family model whose
// weights live in host memory, one block at a time on the device.
//
// Note [Streaming pipeline]
// Per optimizer step the executor plans the sequence of block uses (a
// StepPlan, Note [Step plan] in step/step_plan.h): for each
// micro-batch, the decoder layers 0..L-1 (forward), the head (final norm,
// lm_head, loss and its backward; with tied embeddings the embedding block
// too), then layers L-1..0 again (backward). The embedding lookup and its
// backward run on the host (a gather of B*T rows from the fp32 master and a
// scatter-add into its gradient), so the [V, C] table never crosses PCIe
// unless it is tied to lm_head (or on the device: Note [Resident
// embedding]).
//
//   kH2D:     load(use i+K-1) into slot (i+K-1)%K ... waits slot_free
//   kCompute: wait weights_ready(i) -> layer math -> record slot_free(i)
//                                               -> record grad_ready(r)
//   kD2H:     wait grad_ready(r) -> copy grads to pinned staging r
//                                -> record staged(r)
//   host:     accumulator thread waits staged(r) -> grad += staging (fp32)
//             -> slot r free again; when a block's last contribution of
//             the step lands, calls on_block_final(block).
//
// K device weight slots (default 3) hold compute-dtype copies of blocks; a
// block still resident in a slot is not loaded again (the last layer's
// forward, head and backward share one load). Forward keeps only the input
// activation of every layer ([B, T, C] fp32, on the device); backward
// recomputes a layer's forward from it with autograd local to that layer
// (activation checkpointing), so no autograd graph spans layers.
//
// Gradients leave the device in fp32: a block's first contribution of the
// step is copied straight into the store's gradient (no host work: with one
// micro-batch per step nothing is accumulated on the host at all), the
// others land in pinned staging and are added there on the host, so gradient accumulation over M
// micro-batches yields the gradient of the whole global batch. The loss is the mean over all
// counted tokens of the global batch: every micro-batch's backward is scaled by 1 / (counted tokens
// of the global batch).
//
// Host synchronisation points inside ForwardBackward: waiting for the
// pinned activation upload buffer before rewriting it (once per
// micro-batch), reading the loss at the end, and the final drain.
//
// Note [Activation offload]
// At long sequence lengths the saved layer inputs dominate device memory
// (L * B * T * C * 4 bytes; docs/performance.md has the sizes). With
// ExecutorOptions::offload_activations, forward copies each saved input (layers 0..L-2; the last
// layer's input is needed right after the head) to a pinned host buffer on kD2H as soon as it
// exists, and frees the device copy once that copy is done (the compute stream waits on it one
// layer later, so it never stalls in practice). Backward brings the inputs back on kH2D into a ring
// of two device buffers, one layer ahead (layer L-2's during the head), so the copy overlaps the
// previous layer's backward. The values are bit-identical to keeping them on the device.
//
// Note [Resident layers]
// Between two steps the next forward needs decoder layer 0 first, and its
// update is the last of the step to become possible: its gradient is final
// only when backward ends, then it crosses PCIe (D2H), the CPU runs AdamW
// on it and the compute copy crosses back (H2D), all while the GPU waits
// (docs/performance.md has the times). With
// ExecutorOptions::resident_layers = N the first N decoder layers never
// leave the device: their weights (compute dtype), fp32 master weights,
// AdamW moments and fp32 gradient live in device memory (18 bytes per
// parameter with bf16 compute, 16 with fp32), gradient accumulation over
// micro-batches happens there (the same fp32 adds in the same order as on
// the host, so the gradient is bit-identical), and their AdamW runs on the
// device, all resident blocks in one call (MultiTensorAdamWStep, Note
// [Fused device AdamW] in tensor_adamw.h: equal to the CPU kernel's to a
// few ulp). Their squared gradient norm still reaches on_block_final, in
// the usual order, as a scalar copied to the host. The update the trainer
// asks for (ScheduleResidentUpdate) is enqueued at the start of the next
// pass, on the compute stream before its first layer, and timed as compute.
// The host store's copies of these layers (master, moments, streaming
// copy, gradient) are not kept current: SyncResidentToStore writes them
// back (checkpoints), LoadResidentFromStore reads them after the store was
// written (a resume).
//
// Note [Kept layer graphs]
// Activation checkpointing (the default) saves only a decoder layer's
// input in forward and recomputes the layer under autograd in backward:
// one more forward per layer and step, about a quarter of a dense layer's
// training FLOPs. With ExecutorOptions::kept_graph_layers = K, resident
// decoder layers 0..K-1 (K <= resident_layers) run their forward under
// autograd instead and keep its graph (the saved tensors of the norms,
// projections, attention and MLP) until their backward, which then runs
// through it without the recompute. Only resident layers can: a streamed
// layer's weight slot is reused before its backward. The bytes are those
// of KeptGraphBytes (engine/step/working_bytes.h) per layer and
// micro-batch whose graph is alive at once: K of them per micro-batch,
// times the layer-major wave (the schedule choice counts them, Note
// [Auto resident layers] in schedule_choice.h). The graph's forward runs
// the same operations as the recompute, so the gradients are those of
// checkpointing (bit for bit in fp32 on the CPU, tested). Not with
// activation offload or mixture-of-experts layers (refused by Create);
// a kept layer runs eagerly, not from CUDA graphs (Note [Layer graphs]).
//
// Note [Device gradient accumulation]
// With several micro-batches per step and host landing, every streamed
// block's gradient leaves the device once per micro-batch: the first
// contribution straight into the store, the later ones into pinned
// staging, added there by the host (3 x 4 bytes of host memory traffic
// per parameter and micro-batch). With small micro-batches that D2H and
// the host adds, not the link's H2D, pace the pass (docs/performance.md).
// With ExecutorOptions::device_grad_accumulation the
// executor keeps an fp32 gradient buffer per streamed dense block
// (decoder layers and the head; 4 bytes per parameter, allocated at the
// first pass with more than one micro-batch) and adds each micro-batch's
// contribution there, in micro-batch order, with the same fp32 adds the
// host did (so the gradient is bit for bit the same); the block's sum then
// lands in the store once, with its squared norm computed on the device.
// A pass with one micro-batch does not use it. If the allocation fails
// (device memory), the executor falls back to host accumulation and says
// so once on stderr.
//
// Note [Resident embedding]
// The embedding's chain is the other one at the step boundary: the host
// gathers the next micro-batch's rows from the fp32 master (after the row
// gate has updated them, Note [Embedding rows on demand] in trainer.h) and
// uploads [B, T, C] fp32 before layer 0 can start, and the last backward
// ends with dx ([B, T, C] fp32) crossing to the host for the scatter-add.
// With ExecutorOptions::resident_embedding the [V, C] table joins the
// resident blocks (after the resident layers, in their order) with its
// fp32 master, AdamW moments and fp32 gradient on the device (16 bytes per
// parameter; an untied table is read in fp32 only, so there is no
// compute-dtype copy; a tied one is also lm_head: under bf16 it keeps the
// compute copy the head reads, 18 bytes per parameter, its lm_head
// gradient is summed into the same device gradient before the rows', as
// the host path lands it first, and it no longer visits a weight slot):
// forward gathers its rows on the device (at::embedding; only the token
// ids and labels cross PCIe), backward's dx is summed into the gradient
// with at::embedding_dense_backward (sorted by token, deterministic on CUDA;
// fp32 like the host's scatter-add, but not necessarily in the same order,
// so equal to rounding rather than bit for bit) and the whole-table AdamW
// runs on the device with the resident layers'. Nothing of the embedding
// then waits on the host between two passes.
//
// Thread-safety: one executor is driven by one thread at a time. The
// on_block_final callback runs on the executor's accumulator thread.
#ifndef MEGATRAIN_ENGINE_EXECUTOR_H_
#define MEGATRAIN_ENGINE_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/optim/adamw.h"
#include "engine/data/batch.h"
#include "engine/runtime/device_runtime.h"
#include "engine/store/host_store.h"
#include "engine/model/precision.h"
#include "engine/runtime/stats.h"
#include "engine/runtime/thread_pool.h"
#include "engine/step/final_gradient.h"
#include "engine/step/step_plan.h"

namespace megatrain::engine {

struct ExecutorOptions {
  ComputeDtype compute_dtype = ComputeDtype::kFp32;
  int64_t micro_batch = 1;        // B
  int64_t seq_len = 128;          // T
  int num_weight_slots = 3;       // K device weight buffers, >= 3
  int num_grad_slots = 2;         // device gradient buffers = pinned staging buffers, >= 2
  int64_t loss_chunk_tokens = 0;  // rows of logits at a time; 0 = auto (kLossChunkLogitBytes)
  // Note [Chunked MLP] in model/layers.h: the dense MLP runs in chunks of
  // rows when one [B*T, F] compute-dtype tensor would exceed this many
  // bytes (>= 1; the default kMlpChunkBytes, smaller in tests).
  int64_t mlp_chunk_bytes = int64_t{1} << 30;
  // Note [Fused kernels] in model/fused_math.h: the dense layers' gated MLP
  // product and their residual add + pre-MLP RMSNorm run as fused kernels
  // (CUDA, bf16 compute; other dtypes keep the ATen ops; MoE layers do not
  // use them). A CPU build refuses it (UNIMPLEMENTED).
  // Off by default until a GPU measurement shows a gain.
  bool fused_kernels = false;
  // Activation offload (Note [Activation offload]): the saved input of every
  // decoder layer but the last ([B, T, C] fp32, B*T*C*4 bytes each) goes to
  // pinned host memory during forward and comes back, one layer ahead,
  // during backward. Costs (L-1)*B*T*C*4 bytes of pinned host memory and as
  // many bytes each way over PCIe per micro-batch; saves them on the device.
  bool offload_activations = false;
  // Decoder layers 0..resident_layers-1 stay on the device with their AdamW
  // state (Note [Resident layers]); in [0, num_hidden_layers].
  int resident_layers = 0;
  // Resident decoder layers 0..kept_graph_layers-1 keep their forward's
  // autograd graph for backward instead of recomputing it (Note [Kept
  // layer graphs]); in [0, resident_layers], 0 with offload_activations or
  // mixture-of-experts layers.
  int kept_graph_layers = 0;
  // The embedding table stays on the device with its AdamW state (Note
  // [Resident embedding]): V * C * 16 bytes of device memory (18 when tied
  // under bf16).
  bool resident_embedding = false;
  // Streamed blocks' gradients summed over micro-batches on the device
  // (Note [Device gradient accumulation]): 4 bytes per streamed decoder-layer
  // and head parameter of device memory, from the first pass with more
  // than one micro-batch.
  bool device_grad_accumulation = false;
  // Note [Abandoned steps]: when not null and set (by another thread), a
  // pass stops before its next plan action and returns CANCELLED; the pass's
  // gradients are lost and the host store may hold a partly landed step, so
  // the caller must not train on (only drop) the executor afterwards. Used
  // by a forced cancel (TrainingJob::StopKind::kForceCancel). Not owned.
  const std::atomic<bool>* abandon_step = nullptr;
  // The order of a pass's work (Note [Layer-major schedule] in
  // step/step_plan.h). Layer-major runs the micro-batches in waves of
  // `wave` (in [1, 4096]; a pass with fewer micro-batches is one wave):
  // the saved inputs of a wave (wave x L x [B, T, C] fp32) stay on the
  // device, or with offload_activations take wave x (L-1) host slots.
  StepSchedule schedule = StepSchedule::kMicroBatchMajor;
  int wave = 1;
  // bf16 compute only: the store has no bf16 copy; slots load the fp32
  // master and cast on the device (Note [Weight streaming] in
  // step/weight_slots.h), in chunks of cast_chunk_elements (>= 1; the
  // default kCastChunkElements, smaller in tests).
  bool stream_fp32_master = false;
  int64_t cast_chunk_elements = int64_t{1} << 24;
  // With stream_fp32_master: the master is cast to bf16 by host threads
  // (the pool) into a pinned ring just ahead of each load, and the slots
  // copy bf16 (Note [Host cast] in step/host_cast.h; memory.weight_stream
  // host_cast): no device staging, half the weight H2D bytes, the same
  // bits. In chunks of host_cast_chunk_elements (>= 1; the default
  // kHostCastChunkElements, smaller in tests).
  bool host_cast = false;
  int64_t host_cast_chunk_elements = int64_t{1} << 22;
  // fp32 elements per chunk of a dense block's host-accumulated gradient
  // (>= 1; Note [Bounded gradient staging] in step/grad_lander.h; the
  // default kGradChunkElements, smaller in tests).
  int64_t grad_chunk_elements = int64_t{1} << 23;
  // Seeds train-time noise: mixtral's router jitter, keyed by (noise_seed,
  // the step ForwardBackward is given, micro-batch, layer) (Note [Router
  // jitter] in model/moe_layers.h). The trainer passes its seed.
  uint64_t noise_seed = 0;
  // Note [Gradient ring] in step/grad_lander.h: host blocks' gradients land
  // in a ring of pinned buffers, handed on to the callback in pieces of at
  // most a buffer (FinalGradient), with a store made with
  // HostStoreOptions::gradient_ring (the two must agree). A pass must land
  // whole gradients: one micro-batch, or several summed on the device
  // (device_grad_accumulation, or layer-major in one wave); others fail
  // with FAILED_PRECONDITION. Not for mixture-of-experts models.
  bool gradient_ring = false;
  // Note [Layer graphs] in step/layer_graphs.h: dense decoder layers'
  // forward and recompute-and-backward replayed from CUDA graphs (the CPU
  // runtime re-runs them, which is how the tests exercise the logic);
  // mixture-of-experts layers always run eagerly. Costs LayerGraphBytes of
  // device memory.
  bool cuda_graphs = false;
  // Note [Sharded weight streaming] in step/weight_slots.h: the ranks of
  // this host that share each streamed block's loads (1: none) and this
  // executor's index among them; training passes then gather the shards
  // through the function SetWeightGather installs (required when the
  // world is above 1). Slots hold ShardedSlotNumel elements.
  int weight_shard_world = 1;
  int weight_shard_rank = 0;
  // With gradient_ring: the ranks each streamed block's gradient is
  // reduce-scattered over before it lands (GradientReducer::
  // gradient_shard_world; Note [Ring shards] in gradient_reducer.h), so
  // that a ring buffer holds one shard, ceil(numel / world) elements.
  // 1: whole blocks land.
  int grad_shard_world = 1;
};

// Note [Executor memory plan]
// The memory an executor allocates, by kind, in bytes, computed from the
// model and the options alone: the executor's parts allocate exactly these
// buffers (tests/engine/step/executor_parity_test.cc checks it against what
// they hold), and admission (EstimateFootprint in training_job.h) and its
// out-of-memory advice read the same numbers, so that the estimate cannot
// drift from the allocation.
struct ExecutorMemoryPlan {
  int64_t max_slot_numel = 0;  // elements of the largest block that visits a device slot
  // Device memory.
  int64_t weight_slot_bytes = 0;      // num_weight_slots x max_slot_numel, compute dtype
  int64_t cast_staging_bytes = 0;     // stream_fp32_master without host_cast:
                                      // CastStagingNumel(max_slot_numel, cast_chunk_elements) fp32
  int64_t grad_slot_bytes = 0;        // num_grad_slots x max_slot_numel, fp32
  int64_t activation_ring_bytes = 0;  // offload: 2 x [B, T, C] fp32 (Note [Activation offload])
  int64_t resident_bytes = 0;         // Notes [Resident layers] and [Resident embedding]
  // Note [Device gradient accumulation]: allocated at the first pass with
  // more than one micro-batch; 0 when off.
  int64_t grad_accumulation_bytes = 0;
  // cuda_graphs: an upper bound of the graphs' static tensors and their
  // shared pool's temporaries (LayerGraphBytes); 0 when off.
  int64_t layer_graph_bytes = 0;
  // Pinned host memory.
  int64_t grad_staging_bytes = 0;  // num_grad_slots x (B*T*C fp32, none with a resident
                                   // embedding, + one fp64 norm) + the chunk ring (none
                                   // with the gradient ring; GradLanderPinnedBytes)
  // gradient_ring: elements of each ring buffer (GradRingNumels, Note
  // [Gradient ring] in grad_lander.h) and their fp32 bytes; empty / 0 without.
  std::vector<int64_t> grad_ring_numels;
  int64_t grad_ring_bytes = 0;
  int64_t input_staging_bytes = 0;       // B*T x (C fp32 + one int64 label), or x (int64 id
                                         // + label) with a resident embedding
  int64_t activation_offload_bytes = 0;  // W x (L-1) x [B, T, C] fp32, offload only
                                         // (W: the layer-major wave, else 1)
  int64_t host_cast_staging_bytes = 0;   // host_cast: HostCastRingOf(max_slot_numel,
                                         // host_cast_chunk_elements) bf16 (one block + a chunk)

  // Every device buffer (the accumulation buffers included).
  int64_t device_bytes() const {
    return weight_slot_bytes + cast_staging_bytes + grad_slot_bytes + activation_ring_bytes +
           resident_bytes + grad_accumulation_bytes + layer_graph_bytes;
  }
  int64_t pinned_bytes() const {
    return grad_staging_bytes + grad_ring_bytes + input_staging_bytes + activation_offload_bytes +
           host_cast_staging_bytes;
  }
};

// The memory plan of an executor for `config` with `options` (which must
// pass StreamingExecutor::Create's checks). No allocation; thread-safe.
ExecutorMemoryPlan PlanExecutorMemory(const ModelConfig& config, const ExecutorOptions& options);

// Where one data-parallel rank's pass sits in its step's global batch
// (Note [Data-parallel step] in step/gradient_reducer.h). The default, {},
// is a pass that is the whole batch.
struct BatchShare {
  // Counted tokens (labels != -100) of the global batch; the pass's token
  // losses are divided by it, so that the ranks' gradients sum to the
  // global batch's. 0: the pass's own count.
  int64_t global_counted_tokens = 0;
  // Index of the pass's first micro-batch in the global batch: keys the
  // train-time noise (Note [Router jitter] in model/moe_layers.h) as one
  // device accumulating the whole batch would.
  int64_t first_micro_batch = 0;
};

// What one ForwardBackward produced.
struct ForwardBackwardResult {
  double loss_sum = 0;         // sum of token losses over the global batch (nats)
  int64_t counted_tokens = 0;  // labels != -100 in the global batch
  double loss() const { return counted_tokens > 0 ? loss_sum / counted_tokens : 0.0; }
  // MoE models with the load-balancing loss on (Note [Load-balancing loss
  // across micro-batches] in step/moe_block.h): sum over the micro-batches
  // of each one's aux loss, how many were summed, and the coefficient the
  // gradient used. All 0 otherwise.
  double aux_loss_sum = 0;
  int64_t aux_loss_terms = 0;
  double router_aux_loss_coef = 0;
  // Mean aux loss of one micro-batch (what transformers reports as
  // `aux_loss` for one forward); 0 without the aux loss.
  double aux_loss() const { return aux_loss_terms > 0 ? aux_loss_sum / aux_loss_terms : 0.0; }
  // The objective whose gradient ForwardBackward takes: loss() +
  // router_aux_loss_coef * aux_loss_sum (transformers' Trainer's loss of
  // the step).
  double objective() const { return loss() + router_aux_loss_coef * aux_loss_sum; }
  StepStats stats;  // phases and bytes (optimizer fields left 0)
};

class StreamingExecutor {
 public:
  // Allocates device slots and pinned staging for `store`'s model. `store`,
  // `runtime` and `pool` must outlive the executor. Errors:
  // INVALID_ARGUMENT for bad options (naming the field);
  // FAILED_PRECONDITION when `store`'s options disagree with them (weight
  // stream, gradient ring, an embedding gradient the store does not keep);
  // RESOURCE_EXHAUSTED when device or pinned memory runs out.
  static absl::StatusOr<std::unique_ptr<StreamingExecutor>> Create(HostStore* store,
                                                                   DeviceRuntime* runtime,
                                                                   ThreadPool* pool,
                                                                   const ExecutorOptions& options);

  ~StreamingExecutor();

  // Forward + backward over the micro-batches of one optimizer step (each
  // [B, T] as in options). Overwrites the store's gradients with the
  // gradient of the mean loss over all counted tokens (with the gradient
  // ring, a streamed block's gradient reaches only the callback:
  // FinalGradient::data). `on_block_final` (may be
  // empty) is called once per block (per piece with the ring), on the
  // accumulator thread, as soon as that block's gradient is final
  // (BlockFinalCallback, final_gradient.h). Reads the master weights (for
  // the embedding) and the streaming copies; the caller must not change them
  // until this returns. `step` is the optimizer step the pass belongs to
  // (from 1; the trainer's step number): with options.noise_seed it keys
  // the pass's train-time noise (Note [Router jitter] in
  // model/moe_layers.h), so a pass repeated with the same step, or after a
  // resume, draws the same noise. `share`: a data-parallel rank's place in
  // the global batch (the gradient is then of the global batch's token
  // count; BatchShare).
  // Errors: INVALID_ARGUMENT for a token id or label out of range, position
  // ids that do not describe documents (MicroBatch::position_ids), or a
  // wrong size (naming micro-batch and position); RESOURCE_EXHAUSTED for
  // device out of memory (suggesting a smaller micro_batch); INTERNAL for
  // CUDA or LibTorch failures. After an error the gradients are undefined;
  // weights are untouched.
  absl::StatusOr<ForwardBackwardResult> ForwardBackward(
      absl::Span<const MicroBatch> micro_batches, const BlockFinalCallback& on_block_final = {},
      int64_t step = 0, const BatchShare& share = {});

  // Forward only (no train-time noise); returns loss sum and counted
  // tokens (stats: bytes, time).
  absl::StatusOr<ForwardBackwardResult> Evaluate(absl::Span<const MicroBatch> micro_batches);

  // Forward only (no train-time noise); the logits of every position of one micro-batch,
  // [B, T, V] fp32 row-major in host memory (B*T*V*4 bytes: meant for
  // checks against other implementations, not for training-size batches).
  absl::StatusOr<std::vector<float>> Logits(const MicroBatch& micro_batch);

  // Installs a gate called (on the enqueuing thread) before the executor
  // reads a block's host weights: before the H2D copy of its streaming
  // copy and before the host gather of embedding rows. The trainer uses it
  // to let the CPU optimizer of the previous step finish block by block
  // while this pass already runs (Note [Optimizer overlap] in trainer.h).
  // The compute stream's idle time while the enqueuing thread waits in it
  // is reported as optimizer_exposed_seconds (the host time as
  // gate_wait_seconds).
  void SetWeightGate(std::function<void(int64_t block)> wait_until_ready);

  // Installs the device-side reduction of a block's whole gradient before
  // it lands (Note [Device reduce-scatter] in gradient_reducer.h; the
  // function has GradientReducer::ReduceScatterOnDevice's contract). Call
  // before the first pass.
  void SetDeviceReduction(
      std::function<bool(int64_t block, float* grad, int64_t numel, int64_t* begin, int64_t* end)>
          reduce);

  // Installs the in-place sum over the data-parallel ranks of a resident
  // block's final device gradient (Note [Resident blocks on every rank] in
  // gradient_reducer.h; the function has GradientReducer::
  // AllReduceOnDevice's contract). It runs on the kD2H stream, after the
  // backward that finished the gradient and before its norm, so that the
  // compute stream goes on with the next layer meanwhile; the next pass's
  // resident AdamW waits for it. Call before the first pass.
  void SetResidentReduction(std::function<bool(int64_t block, float* grad, int64_t numel)> reduce);

  // Installs the gather of a slot's shards over the ranks (Note [Sharded
  // weight streaming] in step/weight_slots.h; the function has
  // GradientReducer::AllGatherWeights's contract). Call before the first
  // pass when options().weight_shard_world > 1.
  void SetWeightGather(
      std::function<void(int64_t block, void* slot, int64_t shard_numel, int element_bytes)>
          gather);

  // Installs a gate for the embedding rows a micro-batch gathers, called
  // (on the enqueuing thread) with the micro-batch's token ids [B*T] before
  // the host gather, in place of the weight gate of the embedding block.
  // The gate sets row_sources[i] (row_sources.size() == token_ids.size())
  // to the C fp32 values that row token_ids[i] has after every pending
  // update: the store's row once it is current, or a copy of that value
  // held elsewhere (the trainer's lookahead, Note [Embedding lookahead] in
  // trainer.h), valid until the gather is done. The weight gate still
  // guards every read of the whole table (tied lm_head) and every write of
  // its gradient (Note [Embedding rows on demand] in trainer.h). Waits in
  // it count as in the weight gate.
  using EmbeddingRowGate = std::function<void(absl::Span<const int32_t> token_ids,
                                              absl::Span<const float*> row_sources)>;
  void SetEmbeddingRowGate(EmbeddingRowGate gate);

  // The caller guarantees that the embedding block's gradient in the store
  // is all zero when the next ForwardBackward's scatter-add into it (untied
  // embeddings) begins, so that scatter skips zeroing the whole [V, C]
  // table (Note [Embedding rows on demand] in trainer.h). Applies to the
  // next ForwardBackward only; default false.
  void AssumeEmbeddingGradZero(bool zero);

  // The blocks kept on the device (Notes [Resident layers] and [Resident
  // embedding]), in the order ScheduleResidentUpdate's flags use: decoder
  // layers 0..resident_layers-1, then the embedding when resident.
  const std::vector<int64_t>& resident_blocks() const;

  // Note [Resident layers]: asks for the AdamW update `hp` (step, lr,
  // grad_scale and the optimizer's constants) of every resident block
  // resident_blocks()[i] with apply[i] (apply.size() ==
  // resident_blocks().size()), enqueued at the start of the next
  // ForwardBackward, Evaluate, Logits or SyncResidentToStore. The update
  // spends the blocks' gradients. Errors: INVALID_ARGUMENT for a wrong
  // apply size; FAILED_PRECONDITION when an update is already waiting
  // (nothing is changed then).
  absl::Status ScheduleResidentUpdate(const AdamWStepParams& hp, std::vector<bool> apply);

  // Writes the resident blocks' master weights, AdamW moments and streaming
  // copy (bf16 compute) into the store, and their gradient too when `grads`
  // (the gradient of the last ForwardBackward, unless an update has spent
  // it), after enqueuing a waiting update. Blocks until the copies are
  // done. Errors: INTERNAL for CUDA or LibTorch failures.
  absl::Status SyncResidentToStore(bool grads);

  // Reads the resident blocks' master weights, AdamW moments and streaming
  // copy from the store, after the caller changed it (a resume, loaded
  // weights); drops a waiting update. Blocks until done. Errors: INTERNAL.
  absl::Status LoadResidentFromStore();

  const ExecutorOptions& options() const { return options_; }
  // Device bytes the executor holds: weight and gradient slots, the
  // activation ring, resident blocks and (once allocated) the device
  // gradient accumulation buffers (Note [Executor memory plan]).
  int64_t slot_device_bytes() const;
  // Pinned host bytes of its staging buffers (gradients, input, offloaded
  // activations, the host cast's ring).
  int64_t staging_host_bytes() const;

 private:
  class Impl;
  explicit StreamingExecutor(std::unique_ptr<Impl> impl, const ExecutorOptions& options);
  std::unique_ptr<Impl> impl_;
  ExecutorOptions options_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_EXECUTOR_H_
