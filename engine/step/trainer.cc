// Optimizer steps over the streaming executor.
#include "engine/step/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"
#include "engine/model/fused_ops.h"
#include "engine/runtime/device_runtime.h"
#include "engine/step/executor.h"
#include "engine/step/gradient_reducer.h"
#include "engine/optim/embedding_updater.h"
#include "engine/optim/optimizer_queue.h"
#include "engine/optim/tiered_adamw.h"
#include "engine/runtime/status_macros.h"
#include "engine/runtime/thread_pool.h"
#include "engine/step/trainer_test_hooks.h"

namespace megatrain::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The trainer's own preconditions: INVALID_ARGUMENT (UNIMPLEMENTED for
// what is not built) naming the first option out of range. The schedule's
// and residency's options are ChooseSchedule's to check (Create calls it
// through ResolveExecutorOptions), a job's fields ValidateJobSpec's.
absl::Status ValidateOptions(const TrainerOptions& options) {
  if (options.optimizer_nice < 0 || options.optimizer_nice > 19) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer_nice: must be in [0, 19] (only lowering the priority needs no privilege), got ",
        options.optimizer_nice));
  }
  if (options.critical_threads < 0 || options.critical_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("critical_threads: must be in [0, 1024], got ", options.critical_threads));
  }
  if (!options.nvme_dir.empty() &&
      (options.resident_layers > 0 || options.resident_embedding == 1)) {
    return absl::InvalidArgumentError(
        "resident_layers / resident_embedding: nothing can be resident on the device with the "
        "AdamW moments on the NVMe tier (memory.nvme_tier; Note [Tiered trainer])");
  }
  if (options.optimizer_shard_world < 1 || options.optimizer_shard_rank < 0 ||
      options.optimizer_shard_rank >= options.optimizer_shard_world) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer_shard_rank: must be in [0, optimizer_shard_world=",
                     options.optimizer_shard_world, "), got ", options.optimizer_shard_rank));
  }
  if (options.num_processes < 1 || options.process_rank < 0 ||
      options.process_rank >= options.num_processes) {
    return absl::InvalidArgumentError(
        absl::StrCat("process_rank: must be in [0, num_processes=", options.num_processes,
                     "), got ", options.process_rank));
  }
  if (options.optimizer_shard_world > 1 &&
      (options.shared_store == nullptr || !options.shared_weight_gate)) {
    return absl::InvalidArgumentError(
        "optimizer_shard_world: only with a shared_store and its shared_weight_gate (Note "
        "[Sharded optimizer])");
  }
  if (options.shared_store != nullptr) {  // Note [Shared host store]
    if (options.gradient_reducer == nullptr) {
      return absl::InvalidArgumentError(
          "shared_store: needs a gradient_reducer (data parallelism)");
    }
    if (options.gradient_landing != GradientLanding::kAuto &&
        (options.gradient_landing == GradientLanding::kRing) !=
            options.shared_store->options().gradient_ring) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient_landing ", GradientLandingName(options.gradient_landing),
                       ": the shared store was built for the other landing (Note [Ring shards])"));
    }
  }
  if (options.optimizer_slice_elements < 1) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer_slice_elements: must be >= 1, got ",
                                                   options.optimizer_slice_elements));
  }
  if (options.fused_kernels && !FusedKernelsCompiled()) {  // Note [Fused kernels]
    return absl::UnimplementedError(
        "fused_kernels: this build has no fused kernels (a CUDA build configured with "
        "-DMEGATRAIN_FUSED_KERNELS=ON has them; train.fused_kernels / --fused_kernels: auto or "
        "off)");
  }
  return absl::OkStatus();
}

// Whether a pass of `accumulation` micro-batches with `exec` sums each
// block's gradient on the device, so that it lands once, whole (Note
// [Device gradient accumulation] in executor.h, or a layer-major schedule
// in one wave summing in the gradient slots).
bool SumsMicroBatchesOnDevice(const ExecutorOptions& exec, int64_t accumulation) {
  return exec.device_grad_accumulation ||
         (exec.schedule == StepSchedule::kLayerMajor && exec.wave >= accumulation);
}

// Whether TrainerOptions::gradient_landing puts the gradients in the ring
// with `exec` resolved (Note [Gradient ring] in grad_lander.h).
// INVALID_ARGUMENT naming the reason when kRing is asked for where it is
// not allowed.
absl::StatusOr<bool> ResolveGradientRing(const TrainerOptions& options, const ModelConfig& config,
                                         const ExecutorOptions& exec) {
  if (options.gradient_landing == GradientLanding::kArena) return false;
  const int64_t accumulation = options.gradient_accumulation_steps;
  const bool device_sums = SumsMicroBatchesOnDevice(exec, accumulation);
  const char* refusal = nullptr;
  std::string clipping;
  if (ClippingForbidsGradientRing(options.max_grad_norm)) {
    clipping = absl::StrCat("needs max_grad_norm 0 (", kGradientRingClippingReason, ")");
    refusal = clipping.c_str();
  } else if (options.gradient_reducer != nullptr &&
             !options.gradient_reducer->reduce_scatters_on_device()) {
    // Note [Ring shards] in gradient_reducer.h: each rank's ring takes
    // its shard of a block reduce-scattered on the device.
    refusal =
        "with train.devices > 1 needs the device reduce-scatter (gradient_reduction "
        "device_reduce_scatter or auto): the host all-reduce reduces whole landed blocks";
  } else if (!options.nvme_dir.empty()) {
    refusal = "not with the NVMe tier (memory.nvme_tier): its optimizer reads the gradient arena";
  } else if (accumulation > 1 && config.tie_word_embeddings && !exec.resident_embedding) {
    // The executor's CheckGradientRing: lm_head's gradient of a tied table
    // on the host lands once per micro-batch and is added there.
    refusal =
        "with gradient accumulation a tied embedding table on the host adds its lm_head "
        "gradients on the host";
  } else if (accumulation > 1 && !device_sums) {
    refusal =
        "with gradient accumulation the micro-batches' gradients must be summed on the device "
        "(device_grad_accumulation, or a layer-major schedule in one wave)";
  }
  if (refusal == nullptr) return true;
  if (options.gradient_landing == GradientLanding::kAuto) return false;
  return absl::InvalidArgumentError(absl::StrCat("gradient_landing ring: ", refusal));
}

// The executor's options for `options` on `runtime` with `config`'s model,
// the auto choices resolved (Notes [Resident layers], [Resident embedding]
// and [Device gradient accumulation] in executor.h, [Schedule choice] in
// schedule_choice.h, [Gradient ring] in grad_lander.h); the schedule goes
// to `*choice`. INVALID_ARGUMENT for bad schedule or landing options.
absl::StatusOr<ExecutorOptions> ResolveExecutorOptions(const TrainerOptions& options,
                                                       const ModelConfig& config,
                                                       const DeviceRuntime& runtime,
                                                       ScheduleChoice* choice) {
  ExecutorOptions exec = ExecutorOptionsOf(options);
  exec.abandon_step = options.abandon_step;
  if (const GradientReducer* reducer = options.gradient_reducer; reducer != nullptr) {
    // Note [Sharded weight streaming] in weight_slots.h.
    exec.weight_shard_world = reducer->weight_shard_world();
    exec.weight_shard_rank = reducer->weight_shard_rank();
    exec.grad_shard_world = reducer->gradient_shard_world();  // Note [Ring shards]
  }
  const ScheduleRequest request = ScheduleRequestOf(options);
  // Notes [Schedule choice] and [Auto resident layers] in schedule_choice.h.
  MEGATRAIN_ASSIGN_OR_RETURN(
      *choice, ChooseSchedule(config, request, exec, runtime.is_cuda() ? runtime.TotalBytes() : 0));
  MEGATRAIN_RETURN_IF_ERROR(
      CheckForcedResidentLayersFit(config, request, exec, *choice, "resident_layers"));
  exec = WithChoice(exec, *choice);
  MEGATRAIN_ASSIGN_OR_RETURN(exec.gradient_ring, ResolveGradientRing(options, config, exec));
  return exec;
}

// `options` with the NVMe tier's constraints applied (Note [Tiered
// trainer]): nothing resident on the device, slices of whole 4 KiB. (With
// a gradient reducer resident blocks are summed over the ranks on the
// devices: Note [Resident blocks on every rank] in gradient_reducer.h.)
TrainerOptions WithTierDefaults(TrainerOptions options) {
  if (options.shared_store != nullptr) {  // Note [Ring shards]: the shared store's landing
    options.gradient_landing = options.shared_store->options().gradient_ring
                                   ? GradientLanding::kRing
                                   : GradientLanding::kArena;
  }
  if (options.nvme_dir.empty()) return options;
  options.resident_layers = 0;
  options.resident_embedding = 0;
  options.optimizer_slice_elements = (options.optimizer_slice_elements + 1023) / 1024 * 1024;
  return options;
}

// INVALID_ARGUMENT unless `shared` is a store this trainer could have
// built for `config` with `options` (Note [Shared host store]).
absl::Status CheckSharedStore(const HostStore& shared, const ModelConfig& config,
                              const HostStoreOptions& options) {
  const HostStoreOptions& have = shared.options();
  if (shared.arena_numel() != HostStore::EstimateBytes(config, {}).master / 4 ||
      have.streaming_bf16 != options.streaming_bf16 || have.pin != options.pin ||
      !have.optimizer_state || have.moments_in_host != options.moments_in_host ||
      have.gradient_ring != options.gradient_ring) {
    return absl::InvalidArgumentError(
        "shared_store: built for another model or other options (streaming copy, pinning, "
        "moments in host memory, gradient arena) than this trainer's");
  }
  return absl::OkStatus();
}

// Note [Shard-only landing] in store/host_store.h: the blocks this rank
// lands whole in a buffer of its own (every block, but where the reducer
// reduce-scatters on the device and each block's gradient of a pass is
// one contribution, whole on the device: one micro-batch per rank, or
// several summed on the device (Note [Device gradient accumulation] in
// executor.h, or a layer-major schedule in one wave); then only the
// embedding's rows, summed on the host, unless it is resident).
std::vector<bool> PrivateLandingBlocks(const ModelLayout& layout, const ExecutorOptions& exec,
                                       const TrainerOptions& options) {
  std::vector<bool> whole(layout.blocks.size(), true);
  const GradientReducer* reducer = options.gradient_reducer;
  const int64_t accumulation = options.gradient_accumulation_steps;
  const bool device_sums = SumsMicroBatchesOnDevice(exec, accumulation);
  if (reducer == nullptr || !reducer->reduce_scatters_on_device() ||
      (accumulation != 1 && !device_sums)) {
    return whole;
  }
  std::fill(whole.begin(), whole.end(), false);
  whole[static_cast<size_t>(layout.embedding_block())] = !exec.resident_embedding;
  return whole;
}

// The executor's doors to data parallelism (Note [Data-parallel step] in
// gradient_reducer.h): the device reduce-scatter of streamed blocks, the
// gather of sharded weight loads and the sum of resident gradients.
void ConnectReducer(GradientReducer* reducer, StreamingExecutor& executor) {
  executor.SetDeviceReduction(
      [reducer](int64_t block, float* grad, int64_t numel, int64_t* begin, int64_t* end) {
        return reducer->ReduceScatterOnDevice(block, grad, numel, begin, end);
      });
  executor.SetWeightGather(
      [reducer](int64_t block, void* slot, int64_t shard_numel, int element_bytes) {
        reducer->AllGatherWeights(block, slot, shard_numel, element_bytes);
      });
  // Note [Resident blocks on every rank]: a reducer that cannot sum on the
  // devices would leave a resident gradient this rank's own, silently
  // training each replica apart.
  executor.SetResidentReduction([reducer](int64_t block, float* grad, int64_t numel) {
    const bool summed = reducer->AllReduceOnDevice(block, grad, numel);
    ABSL_RAW_CHECK(summed, "trainer: resident blocks with a reducer that cannot sum on devices");
    return summed;
  });
}

// Note [Tiered trainer]: the moment files of `layout` under
// options.nvme_dir, this rank's shard of every block in files of its own
// with data parallelism, named by its global rank (Note [Tier shards] in
// store/nvme_tier.h).
absl::StatusOr<std::unique_ptr<NvmeMomentFiles>> CreateTierFiles(const TrainerOptions& options,
                                                                 const NvmeShardLayout& layout) {
  return NvmeMomentFiles::Create(
      options.nvme_dir_io.empty() ? options.nvme_dir : options.nvme_dir_io, layout.numel,
      /*pin_staging=*/false, options.nvme_chunk_elements, options.nvme_dir,
      NvmeShardFileSuffix(options.process_rank * layout.world + layout.rank,
                          options.num_processes * layout.world));
}

// Note [Gradient ring] in grad_lander.h: releases a ring piece once the
// last of its update's slices has run (whichever thread runs it).
class PieceRelease {
 public:
  PieceRelease(int64_t slices, std::function<void()> release)
      : remaining_(slices), release_(std::move(release)) {}
  void SliceDone() {
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) release_();
  }

 private:
  std::atomic<int64_t> remaining_;
  std::function<void()> release_;
};

}  // namespace

// What one step's callbacks share. The executor's callback writes it on
// the accumulator thread; ForwardBackward returns after its last call, so
// the step thread reads it afterwards without a lock.
struct Trainer::StepState {
  int64_t step = 0;  // the step's number
  double lr = 0;
  bool overlap = false;             // clipping off: updates queued as gradients become final
  std::vector<double> block_sq;     // per block: squared gradient norm
  bool stopped = false;             // a non-finite block gradient was seen (overlap)
  std::vector<bool> block_applied;  // per block: its update is queued (overlap)
  int64_t blocks_updated = 0;       // updates queued during backward (overlap)
  // Resident blocks whose update this step applies (overlap: those final
  // before any non-finite block), enqueued on the device after the pass.
  std::vector<bool> resident_apply;
};

Trainer::~Trainer() {
  queue_.reset();     // runs every queued update first
  executor_.reset();  // drains the device before the store goes away
}

AdamWBuffers Trainer::StoreBuffers(int64_t block, int64_t offset, int64_t count) const {
  // Note [Shared host store]: the owner updates the shared store from the
  // shards the ranks landed there.
  const HostStore& store = options_.shared_store != nullptr ? *options_.shared_store : *store_;
  AdamWBuffers buffers;
  buffers.params = store.master(block) + offset;
  buffers.exp_avg = store.exp_avg(block) + offset;
  buffers.exp_avg_sq = store.exp_avg_sq(block) + offset;
  // Note [Ring shards]: a shared store with the ring keeps no gradient;
  // the embedding's reduced gradient is then in this rank's view.
  const float* grads = store.grad(block) != nullptr ? store.grad(block) : store_->grad(block);
  if (grads != nullptr) buffers.grads = grads + offset;
  bf16_bits* bf16 = store.streaming_bf16(block);
  buffers.bf16_params = bf16 != nullptr ? bf16 + offset : nullptr;
  buffers.num_elements = count;
  return buffers;
}

void Trainer::ScheduleUpdate(int64_t block, int64_t step, double lr, float grad_scale,
                             const FinalGradient* piece) {
  // Note [Optimizer slices]: one task per slice, each accounted separately;
  // a ring piece (Note [Gradient ring] in grad_lander.h) is updated from
  // its buffer, which the last of its slices to finish releases.
  int64_t first = piece != nullptr ? piece->begin : 0;
  int64_t numel = piece != nullptr ? piece->count : store_->block_numel(block);
  if (piece == nullptr && options_.optimizer_shard_world > 1) {
    // Note [Sharded optimizer] in gradient_reducer.h: this rank's shard.
    const int64_t shard =
        (numel + options_.optimizer_shard_world - 1) / options_.optimizer_shard_world;
    first = std::min(numel, options_.optimizer_shard_rank * shard);
    numel = std::min(numel, first + shard) - first;
    if (numel == 0) return;
  }
  const int64_t slice = options_.optimizer_slice_elements;
  const int64_t slices = std::max<int64_t>(1, (numel + slice - 1) / slice);
  std::shared_ptr<PieceRelease> release;
  if (piece != nullptr && piece->release) {
    release = std::make_shared<PieceRelease>(slices, piece->release);
  }
  for (int64_t k = 0; k < slices; ++k) {
    const int64_t begin = first + k * slice;
    const int64_t count = std::min(numel - k * slice, slice);
    const float* grads = piece != nullptr ? piece->data + k * slice : nullptr;
    queue_->Push({step, block, begin}, block,
                 [this, block, step, lr, grad_scale, begin, count, grads, release] {
                   absl::Status status;
                   if (nvme_moments_ != nullptr) {  // Note [Tiered trainer]
                     // Note [Shared host store]: the shared weights and gradient.
                     const HostStore& store =
                         options_.shared_store != nullptr ? *options_.shared_store : *store_;
                     status = TieredAdamWSliceStep(*adamw_, store, *nvme_moments_, nvme_layout_,
                                                   block, begin, count, step, lr, grad_scale);
                   } else {
                     AdamWBuffers buffers = StoreBuffers(block, begin, count);
                     if (grads != nullptr) buffers.grads = grads;
                     status = adamw_->Step(buffers, step, lr, grad_scale);
                   }
                   if (release != nullptr) release->SliceDone();
                   return status;
                 });
  }
}

void Trainer::ScheduleEmbeddingUpdate(int64_t step, double lr, float grad_scale) {
  if (embedding_ == nullptr) {
    ScheduleUpdate(store_->layout().embedding_block(), step, lr, grad_scale);
  } else {
    embedding_->ScheduleUpdate(step, lr, grad_scale);
  }
}

absl::Status Trainer::SyncResidentIfNewer() {
  if (!resident_device_newer_) return absl::OkStatus();
  // Note [Resident blocks on every rank] in gradient_reducer.h: every rank
  // holds the same bits; rank 0 alone writes them to the shared store.
  if (options_.optimizer_shard_rank != 0) {
    resident_device_newer_ = false;
    return absl::OkStatus();
  }
  MEGATRAIN_RETURN_IF_ERROR(executor_->SyncResidentToStore(/*grads=*/false));
  resident_device_newer_ = false;
  return absl::OkStatus();
}

void Trainer::WaitBlockUpdated(int64_t block) const { queue_->WaitBlock(block); }

absl::Status Trainer::WaitForOptimizer() {
  MEGATRAIN_RETURN_IF_ERROR(queue_->WaitAll());
  return SyncResidentIfNewer();
}

HostStore& Trainer::store() {
  if (!executor_->resident_blocks().empty()) {
    // Hand out current values even to a caller that skipped
    // WaitForOptimizer (the resident blocks never wait on the CPU queue);
    // an error surfaces at the next Step.
    queue_->RecordError(SyncResidentIfNewer());
    resident_store_changed_ = true;
  }
  return *store_;
}

absl::Status Trainer::ReloadResidentIfStoreChanged() {
  if (!resident_store_changed_) return absl::OkStatus();
  MEGATRAIN_RETURN_IF_ERROR(executor_->LoadResidentFromStore());
  resident_store_changed_ = false;
  return absl::OkStatus();
}

int64_t Trainer::ResidentIndexOf(int64_t block) const {
  const std::vector<int64_t>& blocks = executor_->resident_blocks();
  const auto it = std::find(blocks.begin(), blocks.end(), block);
  return it == blocks.end() ? -1 : it - blocks.begin();
}

void Trainer::set_step(int64_t step) {
  step_ = step;
  if (embedding_ != nullptr) embedding_->DropLookahead();
}

void Trainer::SetTestHooks(std::unique_ptr<TrainerTestHooks> hooks) { hooks_ = std::move(hooks); }

ScheduleRequest ScheduleRequestOf(const TrainerOptions& options) {
  ScheduleRequest request;
  request.schedule = options.step_schedule;
  request.wave = options.wave;
  request.activations =
      RequestedActivations(options.offload_activations, options.activation_placement);
  request.gradient_accumulation_steps = options.gradient_accumulation_steps;
  request.resident_layers = options.resident_layers;
  request.resident_embedding = options.resident_embedding;
  request.device_grad_accumulation = options.device_grad_accumulation;
  request.cuda_graphs = options.cuda_graphs;
  request.kept_graph_layers = options.kept_graph_layers;
  return request;
}

ExecutorOptions ExecutorOptionsOf(const TrainerOptions& options) {
  ExecutorOptions exec;
  exec.compute_dtype = options.compute_dtype;
  exec.micro_batch = options.micro_batch;
  exec.seq_len = options.seq_len;
  exec.num_weight_slots = options.num_weight_slots;
  exec.loss_chunk_tokens = options.loss_chunk_tokens;
  exec.fused_kernels = options.fused_kernels;
  exec.offload_activations = options.offload_activations;
  exec.stream_fp32_master =
      options.compute_dtype == ComputeDtype::kBf16 && !KeepsBf16Copy(options.weight_stream);
  exec.host_cast = options.compute_dtype == ComputeDtype::kBf16 &&
                   options.weight_stream == WeightStream::kHostCast;
  return exec;
}

int ResolveResidentLayers(const ModelConfig& config, int option, bool cuda) {
  if (option >= 0) return option;
  // A MoE layer holds every expert (gigabytes at 18 bytes per parameter
  // on the device): no floor; on a GPU auto keeps as many as fit (Note
  // [Auto resident layers]), which may be none.
  if (config.moe != nullptr) return 0;
  // The floor of Note [Auto resident layers]: layers 0 and 1, whose
  // updates would otherwise start every step on the critical path.
  return cuda ? static_cast<int>(std::clamp<int64_t>(config.num_hidden_layers - 1, 0, 2)) : 0;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const ModelConfig& config,
                                                         const TrainerOptions& options,
                                                         uint64_t seed) {
  MEGATRAIN_RETURN_IF_ERROR(config.Validate());
  MEGATRAIN_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<Trainer> t(new Trainer());
  t->options_ = WithTierDefaults(options);
  t->pool_ = ThreadPool::Create(options.threads, options.optimizer_nice);
  t->critical_pool_ = ThreadPool::Create(
      options.critical_threads > 0
          ? options.critical_threads
          : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16));
  MEGATRAIN_ASSIGN_OR_RETURN(t->runtime_, DeviceRuntime::Create(options.device));
  MEGATRAIN_ASSIGN_OR_RETURN(
      ExecutorOptions exec,
      ResolveExecutorOptions(t->options_, config, *t->runtime_, &t->schedule_choice_));
  exec.noise_seed = seed;  // Note [Router jitter] in model/moe_layers.h
  HostStoreOptions store_options;
  store_options.streaming_bf16 =
      options.compute_dtype == ComputeDtype::kBf16 && !exec.stream_fp32_master;
  store_options.pin = t->runtime_->is_cuda();
  store_options.moments_in_host = options.nvme_dir.empty();
  store_options.gradient_ring = exec.gradient_ring;
  store_options.embedding_grad_in_host = !exec.resident_embedding;
  if (options.shared_store != nullptr) {  // Note [Shared host store]
    MEGATRAIN_RETURN_IF_ERROR(CheckSharedStore(*options.shared_store, config, store_options));
    MEGATRAIN_ASSIGN_OR_RETURN(
        t->store_, HostStore::CreateGradientView(
                       *options.shared_store,
                       PrivateLandingBlocks(options.shared_store->layout(), exec, t->options_)));
  } else {
    MEGATRAIN_ASSIGN_OR_RETURN(t->store_, HostStore::Create(config, store_options));
    t->store_->InitializeWeights(seed);
  }
  if (!options.nvme_dir.empty()) {
    t->nvme_layout_ = NvmeShardLayout::Create(t->store_->layout(), options.optimizer_shard_rank,
                                              options.optimizer_shard_world);
    MEGATRAIN_ASSIGN_OR_RETURN(t->nvme_moments_, CreateTierFiles(options, t->nvme_layout_));
  }
  t->resident_layers_ = exec.resident_layers;
  t->resident_embedding_ = exec.resident_embedding;
  t->device_grad_accumulation_ = exec.device_grad_accumulation;
  MEGATRAIN_ASSIGN_OR_RETURN(
      t->executor_,
      StreamingExecutor::Create(t->store_.get(), t->runtime_.get(), t->critical_pool_.get(), exec));
  MEGATRAIN_ASSIGN_OR_RETURN(CpuAdamW adamw, CpuAdamW::Create(options.adamw, t->pool_.get()));
  t->adamw_ = std::make_unique<CpuAdamW>(std::move(adamw));
  LrScheduleOptions schedule = options.schedule;
  schedule.peak_lr = options.adamw.lr;
  MEGATRAIN_ASSIGN_OR_RETURN(LrSchedule lr, LrSchedule::Create(schedule));
  t->schedule_ = std::make_unique<LrSchedule>(std::move(lr));
  t->queue_ = std::make_unique<OptimizerQueue>(t->store_->num_blocks(), options.optimizer_nice);
  t->hooks_ = MakeNonFiniteInjector(options.debug_nonfinite, t->store_.get(), t->pool_.get());
  OptimizerQueue* queue = t->queue_.get();
  if (options.shared_weight_gate) {  // Note [Sharded optimizer] in gradient_reducer.h
    t->executor_->SetWeightGate(options.shared_weight_gate);
  } else {
    t->executor_->SetWeightGate([queue](int64_t block) { queue->WaitBlock(block); });
  }
  if (options.gradient_reducer != nullptr) {
    ConnectReducer(options.gradient_reducer, *t->executor_);
  }
  // A resident embedding is updated on the device instead; with the tier
  // (Note [Tiered trainer]) or a shared store (Note [Shared host store]),
  // as one block.
  if (!t->resident_embedding_ && t->nvme_moments_ == nullptr && options.shared_store == nullptr) {
    t->embedding_ =
        EmbeddingUpdater::Create(t->store_.get(), t->adamw_.get(), queue, t->pool_.get(),
                                 t->critical_pool_.get(), options.debug_keep_lookahead);
  }
  if (EmbeddingUpdater* emb = t->embedding_.get(); emb != nullptr) {
    t->executor_->SetEmbeddingRowGate(
        [emb](absl::Span<const int32_t> ids, absl::Span<const float*> sources) {
          emb->GateRows(ids, sources);
        });
  }
  return t;
}

absl::StatusOr<StepResult> Trainer::Step(absl::Span<const MicroBatch> micro_batches,
                                         absl::Span<const int32_t> next_input_ids) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status ready = queue_->error();
  if (ready.ok()) ready = ReloadResidentIfStoreChanged();
  GradientReducer* reducer = options_.gradient_reducer;
  if (reducer != nullptr) {
    // A rank that cannot run the step still meets the others in
    // BeginStep, so that they fail now, not at the collective timeout.
    const absl::Status begun = reducer->BeginStep(micro_batches, !ready.ok());
    if (ready.ok()) MEGATRAIN_RETURN_IF_ERROR(begun);  // else ready's error, below
    next_input_ids = {};                               // other ranks' rows get gradients too
  }
  MEGATRAIN_RETURN_IF_ERROR(ready);
  StepState s;
  s.step = step_ + 1;
  s.lr = schedule_->LrAt(s.step);
  s.overlap = options_.max_grad_norm <= 0;
  s.block_sq.assign(store_->num_blocks(), 0.0);
  s.block_applied.assign(store_->num_blocks(), false);
  s.resident_apply.assign(executor_->resident_blocks().size(), false);
  if (hooks_ != nullptr) hooks_->BeginStep(s.step);
  // The previous step's row-wise embedding update leaves the table's
  // gradient zero (it completes before this step's scatter, which waits).
  executor_->AssumeEmbeddingGradZero(embedding_ != nullptr && embedding_->TakeGradZero());
  if (embedding_ != nullptr) {
    embedding_->ResetCounters();
    if (!next_input_ids.empty() && !config().tie_word_embeddings) {
      embedding_->QueueLookahead(s.step, s.lr, micro_batches, next_input_ids);
    }
  }
  BatchShare share;  // Note [Data-parallel step]
  if (reducer != nullptr) {
    share.global_counted_tokens = reducer->global_counted_tokens();
    share.first_micro_batch = reducer->first_micro_batch();
  }
  absl::StatusOr<ForwardBackwardResult> fb = executor_->ForwardBackward(
      micro_batches, [this, &s](const FinalGradient& g) { OnBlockFinal(s, g); }, s.step, share);
  // The lookahead this step's gathers could use is spent (Note [Embedding
  // lookahead]).
  if (embedding_ != nullptr) embedding_->EndGather();
  if (fb.ok() && reducer != nullptr) {
    // The global batch's loss (Note [Data-parallel step]); a failed
    // collective fails the step.
    absl::StatusOr<PassSums> sums =
        reducer->EndStep({fb->loss_sum, fb->aux_loss_sum, fb->aux_loss_terms});
    if (sums.ok()) {
      fb->loss_sum = sums->loss_sum;
      fb->aux_loss_sum = sums->aux_loss_sum;
      fb->aux_loss_terms = sums->aux_loss_terms;
      fb->counted_tokens = reducer->global_counted_tokens();
    } else {
      fb = sums.status();
    }
  }
  if (!fb.ok()) {
    if (embedding_ != nullptr) embedding_->AfterStep(s.step, /*applied=*/false);
    return fb.status();
  }
  MEGATRAIN_ASSIGN_OR_RETURN(StepResult result, FinishStep(s, *fb));
  result.stats = fb->stats;
  if (embedding_ != nullptr) {
    result.stats.gate_rows = embedding_->gate_rows();
    result.stats.lookahead_rows = embedding_->lookahead_rows();
  }
  // CPU time of the updates that finished since the previous Step().
  result.stats.optimizer_seconds = queue_->TakeBusySeconds();
  if (nvme_moments_ != nullptr) {
    // Likewise the tier's bytes (Note [Tiered trainer]).
    const int64_t read = nvme_moments_->bytes_read(), written = nvme_moments_->bytes_written();
    result.stats.nvme_read_bytes = read - std::exchange(nvme_read_reported_, read);
    result.stats.nvme_written_bytes = written - std::exchange(nvme_written_reported_, written);
  }
  result.stats.step_seconds = SecondsSince(start);
  result.stats.gpu_idle_seconds =
      std::max(0.0, result.stats.step_seconds - result.stats.compute_seconds);
  return result;
}

void Trainer::OnBlockFinal(StepState& s, const FinalGradient& g) {
  const int64_t block = g.block;
  if (g.first) {
    double grad_sq = g.grad_squared_norm;
    // Note [Data-parallel step]; a resident block was summed on the
    // devices before its norm (Note [Resident blocks on every rank]).
    if (options_.gradient_reducer != nullptr && ResidentIndexOf(block) < 0) {
      grad_sq = g.release ? options_.gradient_reducer->ReduceRingShard(block, grad_sq)
                          : options_.gradient_reducer->ReduceBlock(block, store_->grad(block),
                                                                   store_->block_numel(block));
    }
    // The hooks may rewrite a gradient that is whole in host memory (not
    // a resident block's, nor one in ring pieces).
    float* whole = g.first && g.last && g.count == store_->block_numel(block)
                       ? const_cast<float*>(g.data)
                       : nullptr;
    const double sq = hooks_ != nullptr ? hooks_->BlockFinal(block, whole, grad_sq) : grad_sq;
    s.block_sq[block] = sq;
    // Note [Non-finite steps]: the first non-finite block stops the step;
    // the decision is the block's, for all its pieces.
    if (s.overlap && !std::isfinite(sq)) s.stopped = true;
    s.block_applied[block] = s.overlap && !s.stopped;
    if (s.block_applied[block]) ++s.blocks_updated;
  }
  // An empty ring piece (Note [Ring shards]: a shard with no element)
  // has nothing to update.
  if (!s.block_applied[block] || (g.release && g.count == 0)) {
    if (g.release) g.release();
    return;
  }
  const int64_t resident = ResidentIndexOf(block);
  if (resident >= 0) {
    s.resident_apply[resident] = true;
  } else if (block == store_->layout().embedding_block()) {
    ScheduleEmbeddingUpdate(s.step, s.lr, 1.0f);
  } else {
    ScheduleUpdate(block, s.step, s.lr, 1.0f, g.release ? &g : nullptr);
  }
}

absl::Status Trainer::ScheduleResident(StepState& s, float grad_scale) {
  if (std::find(s.resident_apply.begin(), s.resident_apply.end(), true) == s.resident_apply.end()) {
    return absl::OkStatus();
  }
  MEGATRAIN_RETURN_IF_ERROR(executor_->ScheduleResidentUpdate(
      MakeAdamWStepParams(options_.adamw, s.step, s.lr, grad_scale), s.resident_apply));
  resident_device_newer_ = true;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Trainer::FinishStep(StepState& s, const ForwardBackwardResult& fb) {
  // Overlap: the resident layers approved during backward are updated even
  // if a later block turns out non-finite (as the CPU blocks queued before
  // it are; Note [Non-finite steps]).
  if (s.overlap) MEGATRAIN_RETURN_IF_ERROR(ScheduleResident(s, 1.0f));
  StepResult result;
  result.loss = hooks_ != nullptr ? hooks_->Loss(fb.objective()) : fb.objective();
  result.aux_loss = fb.aux_loss();
  result.counted_tokens = fb.counted_tokens;
  result.lr = s.lr;
  double total_sq = 0;
  for (const double sq : s.block_sq) total_sq += sq;
  result.grad_norm = std::sqrt(total_sq);
  const bool finite = std::isfinite(result.loss) && std::isfinite(result.grad_norm) && !s.stopped;
  if (finite && !s.overlap) {
    const float grad_scale = ClipCoefficient(result.grad_norm, options_.max_grad_norm);
    s.resident_apply.assign(s.resident_apply.size(), true);
    MEGATRAIN_RETURN_IF_ERROR(ScheduleResident(s, grad_scale));
    // Forward order, so that the next step's first layers are ready first.
    if (!resident_embedding_) ScheduleEmbeddingUpdate(s.step, s.lr, grad_scale);
    for (int64_t l = resident_layers_; l < store_->layout().num_layers(); ++l) {
      ScheduleUpdate(store_->layout().layer_block(l), s.step, s.lr, grad_scale);
    }
    ScheduleUpdate(store_->layout().head_block(), s.step, s.lr, grad_scale);
  }
  // Blocks updated before a non-finite one (clipping off) have used the
  // step number in their AdamW bias correction: the step counts.
  result.skipped = !finite;
  result.partial = !finite && s.blocks_updated > 0;
  if (finite || result.partial) ++step_;
  if (embedding_ != nullptr) embedding_->AfterStep(s.step, finite);
  result.step = step_;
  if (!finite && options_.nan_policy == NanPolicy::kFail) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", s.step, ": loss ", result.loss, ", gradient norm ", result.grad_norm,
        ": not finite (train.nan_policy: fail)",
        result.partial ? absl::StrCat("; ", s.blocks_updated, " of ", store_->num_blocks(),
                                      " blocks were updated before the non-finite gradient")
                       : "; the update was not applied",
        ". Master weights hold no non-finite value"));
  }
  return result;
}

absl::StatusOr<double> Trainer::Evaluate(absl::Span<const MicroBatch> micro_batches) {
  MEGATRAIN_RETURN_IF_ERROR(queue_->WaitAll());
  MEGATRAIN_RETURN_IF_ERROR(ReloadResidentIfStoreChanged());
  MEGATRAIN_ASSIGN_OR_RETURN(ForwardBackwardResult r, executor_->Evaluate(micro_batches));
  return r.loss();
}

absl::StatusOr<std::vector<float>> Trainer::Logits(const MicroBatch& micro_batch) {
  MEGATRAIN_RETURN_IF_ERROR(queue_->WaitAll());
  MEGATRAIN_RETURN_IF_ERROR(ReloadResidentIfStoreChanged());
  return executor_->Logits(micro_batch);
}

std::string Trainer::device_name() const { return runtime_->name(); }
bool Trainer::is_cuda() const { return runtime_->is_cuda(); }
int64_t Trainer::slot_device_bytes() const { return executor_->slot_device_bytes(); }
int64_t Trainer::staging_host_bytes() const { return executor_->staging_host_bytes(); }

}  // namespace megatrain::engine
