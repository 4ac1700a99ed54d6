// One model being trained: the host store, the device runtime, the
// streaming executor and the CPU AdamW, tied into optimizer steps. No
// LibTorch types here: the server and the benchmark use this header.
//
// A step: forward/backward over the micro-batches of the global batch
// (executor.h), global gradient norm (summed per block as each block's
// gradient becomes final), clipping coefficient, then AdamW on every block
// with the learning rate of the schedule; the optimizer also rewrites the
// bf16 streaming copy. Steps are counted from 1.
//
// Note [Optimizer overlap]
// The CPU AdamW moves ~30 bytes of host memory per parameter, as long as a
// whole forward+backward of the GPU for billion-parameter models, so it runs
// on its own thread, block by block, while the GPU works:
//   * with clipping (max_grad_norm > 0) the updates of step k need the
//     global norm, known when backward ends; they are queued in forward order
//     (embedding, layer 0, ..., head) and step k+1's forward waits, block by
//     block, only for the update of the block it is about to load;
//   * without clipping (max_grad_norm <= 0) a block's update is queued as
//     soon as its gradient is final, so it also overlaps step k's backward.
// Among queued updates the optimizer thread always runs the one of the
// earliest block in forward order (embedding, layer 0, ...): without
// clipping, when backward ends, the embedding's and layer 0's updates (the
// last gradients to arrive) go before any lagging later layer, since the
// next forward needs them first. The executor's weight gate
// (StreamingExecutor::SetWeightGate) enforces the order; the update stays
// exact AdamW (no staleness). Decoder layers kept on the device
// (TrainerOptions::resident_layers, Note [Resident layers] in executor.h)
// are not in this queue: their update runs on the GPU at the start of the
// next pass. Step() can return
// while updates are still running: WaitForOptimizer() (called by Evaluate,
// and by anything that reads the store) waits for them.
//
// Note [Embedding rows on demand]
// The embedding's gradient is final last of all (its scatter-add ends
// backward) while the next forward needs the embedding first, for the
// gather of its input rows. A whole-table update there (V*C parameters)
// would leave the GPU idle, so the embedding update is row by row
// (EmbeddingUpdater, optim/embedding_updater.h): the optimizer thread
// updates the rows in the background, last in its priority order, and the
// executor's row gate
// (StreamingExecutor::SetEmbeddingRowGate) first updates, on the pool, just
// the rows the next micro-batch gathers, claiming each row with an atomic
// state (pending -> in progress -> done) so that every row is updated
// exactly once by whichever thread gets there first. AdamW is elementwise,
// so the result is bit for bit that of the whole-table update. Each row's
// gradient is zeroed once it has been used, so the next step's scatter-add
// needs no memset of the whole table on the critical path
// (StreamingExecutor::AssumeEmbeddingGradZero). Readers of
// the whole table (tied lm_head, the next scatter into its gradient, the
// checkpoint) wait for the whole update through the weight gate.
//
// Note [Embedding lookahead]
// The row gate's work is memory-bound AdamW on every distinct row the next
// micro-batch reads (up to B*T rows x C), on the
// GPU's critical path between two passes. Most of those rows have a zero
// gradient in the step that just ended (untied embeddings: only the rows
// of the step's own tokens get one), and the AdamW update of a row with a
// zero gradient depends only on the previous state, the step number and
// the learning rate, all known when the step begins. So when the caller
// passes Step() the input ids of the next step's first micro-batch, the
// step queues, on the optimizer thread (ahead of its own updates, after
// the previous step's), the update of the next batch's rows that this
// step does not touch, computed into a side buffer: the store is not
// written, so a skipped step (Note [Non-finite steps]) still leaves it
// exactly as it was. If this step's embedding update is then scheduled
// with the same step number and learning rate, the next pass's first row
// gate leaves those rows to the background update and points the gather
// at the side buffer; it only updates the rows this step touched. The
// values are bit for bit those of the store update: the same AdamW kernel
// on the same inputs (elementwise, so the split is immaterial; a zero
// gradient times any finite clip coefficient is zero). Two buffers
// alternate by step parity, so a step's lookahead never overwrites the
// one its own first gather reads. Off for tied embeddings (every row has
// a gradient) and when the caller does not know the next batch. A resume
// (set_step) drops it. The trainer assumes nothing else writes the store
// between two Step() calls.
//
// Note [Optimizer slices]
// A queued block update runs as slices of at most
// TrainerOptions::optimizer_slice_elements parameters (default 16 M;
// docs/performance.md has its time), each a separate entry of the
// priority queue (OptimizerQueue, optim/optimizer_queue.h), so that the
// update the next forward needs first (layer 0's, queued last of all when
// backward ends) waits for at most one slice of a later layer, not for
// that layer's whole update. The split does not change the result (AdamW
// is elementwise).
//
// Note [Non-finite steps]
// A step whose loss or global gradient norm is NaN or inf is handled by
// TrainerOptions::nan_policy (engine/optim/nan_policy.h); master weights and
// AdamW moments never receive a non-finite value.
//   * With clipping (max_grad_norm > 0, the default) no update is queued
//     before the norm is known, so a skipped step leaves the weights, the
//     moments and step() exactly as they were (bit for bit).
//   * Without clipping a block's update is queued as soon as its gradient is
//     final, before the rest of the step is known. The first non-finite
//     block gradient stops the step: neither it nor any later block is
//     updated. A NaN/inf loss makes the first final gradient (the head's, or
//     the last layer's with tied embeddings) non-finite, so nothing is
//     updated and the skip is exact as with clipping. An overflow found
//     only in an earlier layer's gradient leaves the blocks updated before
//     it with their update (StepResult::partial); step() then advances,
//     because those blocks' AdamW state has used the step number. (So does
//     an inf loss whose gradients are all finite, which stable
//     cross-entropy only gives for logits near the fp32 limit.)
// Gradients of a skipped step are not cleared: the next step's first
// micro-batch overwrites them.
//
// Note [Tiered trainer]
// With TrainerOptions::nvme_dir the store keeps no AdamW moments: every
// queued update (one slice of a block, Note [Optimizer slices]) reads its
// moments from the tier's files ahead of the arithmetic and writes them
// behind it (TieredAdamWSliceStep, optim/tiered_adamw.h; Note [NVMe tier]
// in store/nvme_tier.h), on the optimizer thread, one slice at a time (the
// files have one user). The arithmetic is CpuAdamW's on the same values,
// so weights and moments are bit for bit those of the all-in-RAM run. What
// needs the moments at random rows or on the device is off: the embedding
// updates as one block (no row gate, no lookahead: Notes [Embedding rows on
// demand] and [Embedding lookahead]) and nothing is resident on the device
// (auto resolves resident_layers and resident_embedding to 0; asking for
// them is INVALID_ARGUMENT). Slices are rounded up to a multiple of 1024
// elements (the tier's 4 KiB alignment). An I/O error (a truncated file:
// DATA_LOSS; a full or failing disk: RESOURCE_EXHAUSTED / INTERNAL; each
// naming the file) is the queue's error: the next Step or
// WaitForOptimizer returns it, and the moment files are then undefined
// (the job fails and resumes from its last checkpoint, which holds its own
// copy). Checkpoints read the moments back from the files
// (nvme_shard(), NvmeMomentTier, WriteCheckpoint) after WaitForOptimizer.
// With data parallelism (TrainerOptions::shared_store) each rank's files
// hold only the moments of its optimizer shard (Note [Sharded optimizer]
// in gradient_reducer.h), in files of its own (Note [Tier shards] in
// store/nvme_tier.h); its updates read the shared store's weights, reduced
// gradient and streaming copy, as without the tier. A rank whose queue
// failed still meets the other ranks in its next step's BeginStep
// (GradientReducer), so that they fail that step at once (UNAVAILABLE)
// instead of waiting in a collective until its timeout.
//
// Thread-safety: a Trainer is driven by one thread at a time; it owns an
// optimizer thread internally.
#ifndef MEGATRAIN_ENGINE_TRAINER_H_
#define MEGATRAIN_ENGINE_TRAINER_H_

#include <atomic>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/optim/adamw.h"
#include "engine/data/batch.h"
#include "engine/store/host_store.h"
#include "engine/optim/lr_schedule.h"
#include "engine/model/model_config.h"
#include "engine/optim/nan_policy.h"
#include "engine/model/precision.h"
#include "engine/spec/memory_modes.h"
#include "engine/runtime/stats.h"
#include "engine/step/schedule_choice.h"
#include "engine/store/nvme_tier.h"

namespace megatrain::engine {

class DeviceRuntime;
class EmbeddingUpdater;
class GradientReducer;
class OptimizerQueue;
class StreamingExecutor;
class Trainer;
class ThreadPool;
class TrainerTestHooks;
struct FinalGradient;
struct ForwardBackwardResult;

// Testing only: makes one step non-finite, to exercise Note [Non-finite
// steps] without a diverging model, through the trainer's test hooks
// (MakeNonFiniteInjector, trainer_test_hooks.h), never through branches in
// the step. Never set from a job file or an RPC; TrainingJob sets it from
// the debug environment variable MEGATRAIN_DEBUG_POISON_STEP
// (training_job.h).
struct NonFiniteInjection {
  enum class Kind {
    kLoss,      // every block's gradient and the loss become NaN, as a NaN
                // in the forward pass makes them
    kGradient,  // the embedding block's gradient becomes +inf (an overflow
                // in backward; the embedding's gradient is final last)
  };
  int64_t step = 0;  // step number to poison, first attempt only; 0 = off
  Kind kind = Kind::kLoss;
};

struct TrainerOptions {
  std::string device = "cpu";  // "cpu", "cuda", "cuda:N"
  ComputeDtype compute_dtype = ComputeDtype::kFp32;
  int64_t micro_batch = 1;                  // B, sequences per forward/backward
  int64_t seq_len = 128;                    // T, tokens per sequence
  AdamWOptions adamw;                       // lr is the schedule's peak
  LrScheduleOptions schedule;               // peak_lr is overwritten with adamw.lr
  double max_grad_norm = 1.0;               // global-norm clipping; <= 0 disables
  NanPolicy nan_policy = NanPolicy::kSkip;  // NaN/inf loss or norm (Note [Non-finite steps])
  NonFiniteInjection debug_nonfinite;       // testing only
  // Testing only: a lookahead still queued when its step's embedding update
  // is scheduled is waited for instead of dropped (Note [Embedding
  // lookahead]), so that tests see it used whatever the thread timing.
  bool debug_keep_lookahead = false;
  int threads = 0;           // CPU optimizer threads; 0 = all cores
  int critical_threads = 0;  // threads for host work on the GPU's critical path
                             // (gather, scatter, embedding row gate); 0 = all
                             // cores, at most 16 (they preempt the niced AdamW)
  // Nice value of the optimizer's threads (> 0: lower priority, so that
  // host work on the GPU's critical path preempts AdamW chunks when the
  // cores are oversubscribed; ThreadPool::Create). 10 measured best on an
  // H200 host (docs/performance.md); 0 keeps the process's priority.
  int optimizer_nice = 10;
  int num_weight_slots = 3;  // device weight buffers
  // bf16 compute: stream a bf16 copy kept in host memory, the fp32 master
  // cast on the device, or the fp32 master cast by host threads into pinned
  // staging (memory.weight_stream; Note [Weight streaming] in
  // step/weight_slots.h, Note [Host cast] in step/host_cast.h). Ignored for
  // fp32/tf32.
  WeightStream weight_stream = WeightStream::kBf16;
  // Where block gradients land in host memory (memory.gradient_landing;
  // Note [Gradient ring] in step/grad_lander.h): the arena, the ring
  // (INVALID_ARGUMENT where not allowed: clipping on, accumulation without
  // device sums, a gradient_reducer that does not reduce-scatter on the
  // device), or auto (the ring where allowed). With shared_store the
  // store's choice (HostStoreOptions::gradient_ring; Note [Ring shards]
  // in gradient_reducer.h): auto follows it, the other must match it
  // (INVALID_ARGUMENT).
  GradientLanding gradient_landing = GradientLanding::kArena;
  // Parameters per queued AdamW task (Note [Optimizer slices]); >= 1.
  int64_t optimizer_slice_elements = int64_t{1} << 24;
  int64_t loss_chunk_tokens = 0;     // 0 = auto
  bool fused_kernels = false;        // ExecutorOptions::fused_kernels
  bool offload_activations = false;  // saved layer inputs in pinned host memory
                                     // (Note [Activation offload] in executor.h)
  // Set by another thread to abandon the running step (Note [Abandoned
  // steps] in executor.h): Step() then returns CANCELLED. Not owned.
  const std::atomic<bool>* abandon_step = nullptr;
  // Decoder layers kept on the device with their AdamW state, updated there
  // (Note [Resident layers] in executor.h); -1 = auto: on CUDA with
  // clipping as many as fit the device, without clipping at most 2 (Note
  // [Auto resident layers] in schedule_choice.h), on the CPU 0. Otherwise
  // in [0, num_hidden_layers] (a job's train.resident_layers); on CUDA a
  // count whose executor buffers alone exceed the device is refused by
  // Create (CheckForcedResidentLayersFit).
  int resident_layers = -1;
  // The embedding table on the device with its AdamW state, updated there
  // (Note [Resident embedding] in executor.h; V * C * 16 bytes of device
  // memory, 18 for a tied table under bf16). -1 = auto: on CUDA when it
  // fits (Note [Auto resident layers]), on the CPU never; 0 = off; 1 = on.
  int resident_embedding = -1;
  // Streamed blocks' gradients summed over a step's micro-batches on the
  // device (Note [Device gradient accumulation] in executor.h; 4 bytes per
  // streamed decoder-layer and head parameter of device memory when a step
  // has several micro-batches). -1 = auto: on CUDA when a step of
  // gradient_accumulation_steps would use them and those bytes are at
  // most kDeviceGradAccumulationMaxFraction of the device's memory (Note
  // [Schedule choice]); 0 = off; 1 = on.
  int device_grad_accumulation = -1;
  // Dense decoder layers replayed from CUDA graphs (Note [Layer graphs] in
  // step/layer_graphs.h; LayerGraphBytes of device memory). -1 = auto: on
  // CUDA when a micro-batch has at most kCudaGraphMaxTokens tokens; 0 =
  // off; 1 = on (the CPU runtime then re-runs the captured work, as the
  // tests do).
  int cuda_graphs = -1;
  // Resident decoder layers whose forward keeps its autograd graph for
  // backward, with no recompute (Note [Kept layer graphs] in
  // step/executor.h). -1 = auto: on a GPU, the most that fit the device
  // after everything else (Note [Auto resident layers]); 0 = activation
  // checkpointing in every layer (train.activation_checkpointing: all);
  // N = at most N.
  int kept_graph_layers = -1;
  // The step schedule (issue 16; Note [Schedule choice] in
  // schedule_choice.h): order (empty = auto), layer-major wave (0 = auto)
  // and where the saved layer inputs live (offload_activations true
  // forces kHost), chosen for `gradient_accumulation_steps` micro-batches
  // per Step (the number the caller passes; Step accepts others, in waves
  // of the chosen size).
  std::optional<StepSchedule> step_schedule;
  int wave = 0;
  ActivationPlacement activation_placement = ActivationPlacement::kAuto;
  int64_t gradient_accumulation_steps = 1;
  // Note [Tiered trainer]: non-empty: the AdamW moments live in exp_avg.bin and
  // exp_avg_sq.bin in this directory (with optimizer_shard_world > 1 this rank's shard,
  // in files of its own: Note [Tier shards] in store/nvme_tier.h) instead of host
  // memory; it must exist, the caller owns and removes it. `nvme_dir_io` is how to reach
  // it (DirFd::IoPath(), "/proc/self/fd/N"; empty: nvme_dir); nvme_dir names the files.
  std::string nvme_dir;
  std::string nvme_dir_io;
  // fp32 elements of one moment per tier read/write (a multiple of 1024;
  // kNvmeTierChunkElements; tests use small ones).
  int64_t nvme_chunk_elements = kNvmeTierChunkElements;
  // Data parallelism (Note [Data-parallel step] in gradient_reducer.h):
  // combines each block's gradient and the loss with the other ranks'. Not
  // owned; null: one device. Needs a dense model and no resident layers or
  // embedding (their gradients never reach the store); turns the embedding
  // lookahead off (other ranks' rows get gradients too).
  GradientReducer* gradient_reducer = nullptr;
  // Note [Shared host store] in gradient_reducer.h (with gradient_reducer):
  // the store of the weights, moments, streaming copy and reduced gradient
  // that every rank of this host shares; not owned, outlives the trainer,
  // built with the options this trainer would give its own store
  // (INVALID_ARGUMENT otherwise; its weights are not initialised by
  // Create). This trainer's store() is then a view holding its landing
  // gradients. With the gradient ring the shared store keeps no gradient
  // (Note [Ring shards]).
  HostStore* shared_store = nullptr;
  // Note [Sharded optimizer] in gradient_reducer.h (with shared_store):
  // this trainer's CPU AdamW updates shard `optimizer_shard_rank` of
  // `optimizer_shard_world` (c10d's layout, Note [Shard layout] in
  // store/shard_layout.h) of every host block, and `shared_weight_gate`
  // (required then) blocks until every rank's update of a block ran: the
  // executor's weight gate. Rank 0 writes the resident blocks back.
  int optimizer_shard_rank = 0;
  int optimizer_shard_world = 1;
  std::function<void(int64_t block)> shared_weight_gate;
  // Note [Replica processes] in dist/data_parallel.h: this trainer's process
  // among the job's `num_processes` (in [0, num_processes)), each with
  // optimizer_shard_world ranks. With nvme_dir its global rank,
  // process_rank x optimizer_shard_world + optimizer_shard_rank of
  // num_processes x optimizer_shard_world, names its moment files (Note
  // [Tier shards] in store/nvme_tier.h), so that the processes of one host
  // never open the same file.
  int process_rank = 0;
  int num_processes = 1;
};

// What `options` ask of the step's schedule (Note [Schedule choice] in
// schedule_choice.h): order, wave, where the saved layer inputs live
// (RequestedActivations: offload_activations means the host), the
// micro-batches per step, residency, device gradient accumulation and CUDA
// graphs. Trainer::Create and `megatrain plan` (engine/job/plan.cc) pass
// it to ChooseSchedule; the footprint reads its order.
ScheduleRequest ScheduleRequestOf(const TrainerOptions& options);

// The executor's options that `options` fix before the schedule choice
// (compute dtype, [micro_batch, seq_len], weight slots, loss chunk,
// weight stream); the choice (WithChoice), the gradient ring and the
// data-parallel doors come on top. Create, the plan and the footprint
// start from it.
ExecutorOptions ExecutorOptionsOf(const TrainerOptions& options);

// The decoder layers TrainerOptions::resident_layers `option` keeps on a
// device of unknown size: `option`, or for auto the floor of Note [Auto
// resident layers] (min(2, num_hidden_layers - 1) on CUDA; none on the CPU
// nor for a mixture-of-experts model). The trainer and `megatrain plan`,
// which know the device, use ChooseSchedule; the device-agnostic footprint
// (EstimateFootprint) uses this.
int ResolveResidentLayers(const ModelConfig& config, int option, bool cuda);

struct StepResult {
  int64_t step = 0;     // step() after this step: its number (from 1), or
                        // the previous one's if skipped (unless partial)
  double loss = 0;      // mean over counted tokens of the global batch (for a MoE
                        // model with the aux loss on, plus router_aux_loss_coef x
                        // aux_loss summed over micro-batches: Note
                        // [Load-balancing loss across micro-batches] in moe_block.h)
  double aux_loss = 0;  // MoE: mean load-balancing loss of a micro-batch; 0 otherwise
  int64_t counted_tokens = 0;
  double grad_norm = 0;  // global L2 norm before clipping
  double lr = 0;         // learning rate used
  bool skipped = false;  // non-finite loss or norm: not applied (Note
                         // [Non-finite steps]); weights untouched unless partial
  bool partial = false;  // skipped, but (clipping off) blocks updated before
                         // the non-finite one kept their update
  StepStats stats;
  // Data parallelism (DataParallelTrainer::Step): each of this process's
  // ranks' stats, in device order (rank_stats[0] == stats but for the NVMe
  // tier's bytes, which stats sums over the ranks); empty for one device.
  std::vector<StepStats> rank_stats;
};

class Trainer {
 public:
  // Allocates the store (fp32 master + grads + AdamW moments, plus a bf16
  // streaming copy for bf16 compute; pinned on CUDA), initialises weights
  // from `seed` (HF init, std 0.02), and builds the pipeline. `seed` also
  // keys train-time noise (mixtral's router jitter: Note [Router jitter]
  // in model/moe_layers.h), with the step number, so a job resumed with
  // its own seed draws the noise the uninterrupted run would have.
  // Errors: INVALID_ARGUMENT / UNIMPLEMENTED for a bad config or option
  // (naming the field); UNAVAILABLE for a missing device;
  // RESOURCE_EXHAUSTED when host, pinned or device memory runs out, or
  // for resident_layers that can never fit the device.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const ModelConfig& config,
                                                         const TrainerOptions& options,
                                                         uint64_t seed);
  ~Trainer();

  // One optimizer step over `micro_batches` ([B*T] tokens each). A
  // non-finite loss or gradient norm is skipped (result.skipped) or fails,
  // per options().nan_policy (Note [Non-finite steps]). Errors as
  // StreamingExecutor::ForwardBackward; FAILED_PRECONDITION naming the step
  // number and the non-finite values under NanPolicy::kFail.
  //
  // `next_input_ids` ([B*T], optional): the input ids of the next step's
  // first micro-batch, when the caller already knows them; they let this
  // step prepare that micro-batch's embedding rows off the critical path
  // (Note [Embedding lookahead]). Any value is safe: rows are only used if
  // the next gather reads them.
  absl::StatusOr<StepResult> Step(absl::Span<const MicroBatch> micro_batches,
                                  absl::Span<const int32_t> next_input_ids = {});

  // Mean loss over `micro_batches` without training. Waits for pending
  // optimizer work first.
  absl::StatusOr<double> Evaluate(absl::Span<const MicroBatch> micro_batches);

  // Logits [B, T, V] fp32 of one micro-batch (see
  // StreamingExecutor::Logits). Waits for pending optimizer work first.
  absl::StatusOr<std::vector<float>> Logits(const MicroBatch& micro_batch);

  // Blocks until no update of `block` is queued or running (Note [Shared
  // host store]: the other ranks' weight gate). Thread-safe.
  void WaitBlockUpdated(int64_t block) const;

  // Blocks until every queued optimizer update has been applied and the
  // resident layers (Note [Resident layers] in executor.h) are copied back,
  // so that store() holds the weights and AdamW state of step(). Returns
  // the first error an asynchronous update or the copy hit, if any.
  absl::Status WaitForOptimizer();

  // The host store. Call WaitForOptimizer() before reading weights. The
  // caller may write it (loading weights or a checkpoint) until the next
  // Step, Evaluate or Logits, which then reload the resident layers from it.
  // With TrainerOptions::shared_store: this rank's view of it (Note
  // [Shared host store]).
  HostStore& store();
  // Decoder layers resident on the device (the resolved
  // TrainerOptions::resident_layers).
  int resident_layers() const { return resident_layers_; }
  // Whether the embedding is resident on the device (the resolved
  // TrainerOptions::resident_embedding).
  bool resident_embedding() const { return resident_embedding_; }
  // Whether steps with several micro-batches sum the streamed gradients on
  // the device (the resolved TrainerOptions::device_grad_accumulation; the
  // executor may still fall back to the host if the buffers do not fit).
  bool device_grad_accumulation() const { return device_grad_accumulation_; }
  // Whether gradients land in the ring (the resolved
  // TrainerOptions::gradient_landing).
  bool gradient_ring() const { return store_->options().gradient_ring; }
  // The resolved step schedule (TrainerOptions::step_schedule, wave,
  // activation_placement; Note [Schedule choice] in schedule_choice.h).
  const ScheduleChoice& schedule_choice() const { return schedule_choice_; }
  const ModelConfig& config() const { return store_->config(); }
  const TrainerOptions& options() const { return options_; }
  // Optimizer steps taken (the next step is step() + 1).
  int64_t step() const { return step_; }
  // Settable on resume; drops the embedding lookahead.
  void set_step(int64_t step);
  // Testing only: replaces the test hooks (TrainerTestHooks; null: none).
  // Call between steps.
  void SetTestHooks(std::unique_ptr<TrainerTestHooks> hooks);
  std::string device_name() const;
  bool is_cuda() const;
  // The device runtime (streams, events) this trainer's steps run on;
  // owned by the trainer (Note [Serial first use] in dist/first_use.h).
  DeviceRuntime& runtime() const { return *runtime_; }
  // Device bytes of the weight/gradient slots; pinned staging bytes.
  int64_t slot_device_bytes() const;
  int64_t staging_host_bytes() const;
  // The AdamW moments' files (Note [Tiered trainer]); null without
  // TrainerOptions::nvme_dir. Use only after WaitForOptimizer() and before
  // the next Step (the optimizer thread owns them in between).
  NvmeMomentFiles* nvme_moments() const { return nvme_moments_.get(); }
  // Those files with the layout of the moments in them (this rank's shard
  // with data parallelism: Note [Tier shards] in store/nvme_tier.h), for
  // NvmeMomentTier::Create; files null without the tier. Same rules.
  NvmeMomentTier::Shard nvme_shard() const { return {nvme_moments_.get(), &nvme_layout_}; }

 private:
  // What one step's callbacks share (Step, OnBlockFinal, FinishStep).
  struct StepState;

  Trainer() = default;
  // The store's AdamW buffers for elements [offset, offset + count) of
  // `block` (bf16_params null without a streaming copy).
  AdamWBuffers StoreBuffers(int64_t block, int64_t offset, int64_t count) const;
  // Queues AdamW of `block` for update number `step` on the optimizer
  // queue, in slices (Note [Optimizer slices]): the whole block from the
  // store's gradient, or with `piece` (a ring piece, Note [Gradient ring]
  // in step/grad_lander.h) its elements from its buffer, released after
  // the last slice ran.
  void ScheduleUpdate(int64_t block, int64_t step, double lr, float grad_scale,
                      const FinalGradient* piece = nullptr);
  // The embedding's update: row by row when the updater exists (Note
  // [Embedding rows on demand]), else as one block.
  void ScheduleEmbeddingUpdate(int64_t step, double lr, float grad_scale);
  // The executor's callback: `g.block`'s gradient (or a piece of it) is
  // final (accumulator thread). Records its norm at the first piece;
  // without clipping queues the update of what `g` hands on, or releases
  // it.
  void OnBlockFinal(StepState& s, const FinalGradient& g);
  // After ForwardBackward: norm, finiteness, the updates (or the skip).
  absl::StatusOr<StepResult> FinishStep(StepState& s, const ForwardBackwardResult& fb);
  // Schedules the resident blocks' update approved in `s` on the device.
  absl::Status ScheduleResident(StepState& s, float grad_scale);
  // Copies the resident layers back to the store if an update since the
  // last copy made the device's state newer.
  absl::Status SyncResidentIfNewer();
  // Reloads the resident layers if store() was handed out since.
  absl::Status ReloadResidentIfStoreChanged();
  // Index of `block` in the executor's resident_blocks(), else -1.
  int64_t ResidentIndexOf(int64_t block) const;

  TrainerOptions options_;
  std::unique_ptr<ThreadPool> pool_;  // the optimizer's
  // Host work on the GPU's critical path (gather, gradient scatter and
  // accumulation, the rows of the embedding gate) gets its own threads, so
  // that it never queues behind optimizer chunks.
  std::unique_ptr<ThreadPool> critical_pool_;
  std::unique_ptr<HostStore> store_;
  std::unique_ptr<DeviceRuntime> runtime_;
  std::unique_ptr<StreamingExecutor> executor_;
  std::unique_ptr<CpuAdamW> adamw_;
  std::unique_ptr<LrSchedule> schedule_;
  // Note [Tiered trainer]: the moments' files (null: in the store), and
  // their byte counters at the last report (StepStats::nvme_*_bytes).
  std::unique_ptr<NvmeMomentFiles> nvme_moments_;
  NvmeShardLayout nvme_layout_;  // where the files keep which moments
  int64_t nvme_read_reported_ = 0;
  int64_t nvme_written_reported_ = 0;
  // Destroyed (drained) first by ~Trainer: its tasks use the updater, the
  // AdamW kernel and the store.
  std::unique_ptr<OptimizerQueue> queue_;
  // Row-wise embedding updates (Notes [Embedding rows on demand] and
  // [Embedding lookahead]); null when the embedding updates as one block
  // (resident, or not one [V, C] table).
  std::unique_ptr<EmbeddingUpdater> embedding_;
  std::unique_ptr<TrainerTestHooks> hooks_;  // null but in tests
  int64_t step_ = 0;
  // Note [Resident layers] in executor.h: the number of them; whether the
  // device holds updates the store lacks; whether store() was handed out
  // since the last reload (the caller may have written it).
  int resident_layers_ = 0;
  bool resident_embedding_ = false;
  bool device_grad_accumulation_ = false;
  ScheduleChoice schedule_choice_;
  bool resident_device_newer_ = false;
  bool resident_store_changed_ = false;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_TRAINER_H_
