// The streaming executor (Note [Streaming pipeline] in executor.h): the
// plan of a pass (engine/step/step_plan.h) run by a short loop over the
// executor's parts (engine/step/: weight slots, input staging, activation
// offload, gradient landing, device gradient accumulation, resident
// blocks). docs/architecture.md draws them.
#include "engine/step/executor.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <array>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/model/fused_ops.h"
#include "engine/model/layers.h"
#include "engine/runtime/status_macros.h"
#include "engine/spec/job_spec.h"
#include "engine/step/activation_offload.h"
#include "engine/step/device_grad_accumulator.h"
#include "engine/step/grad_lander.h"
#include "engine/step/host_cast.h"
#include "engine/step/input_stager.h"
#include "engine/step/layer_graphs.h"
#include "engine/step/moe_block.h"
#include "engine/step/resident_blocks.h"
#include "engine/step/step_env.h"
#include "engine/step/step_plan.h"
#include "engine/step/weight_slots.h"
#include "engine/runtime/torch_compat.h"

namespace megatrain::engine {
namespace {

// Pinned staging per gradient slot: the embedding's d hidden_0, fp32 (Note
// [Bounded gradient staging] in grad_lander.h; Note [Executor memory plan]
// in executor.h counts the same); none when the embedding is resident (its
// d hidden_0 stays on the device, Note [Resident embedding]).
size_t GradStagingBytes(const ExecutorOptions& o, int64_t hidden_size) {
  if (o.resident_embedding) return 0;
  return static_cast<size_t>(o.micro_batch * o.seq_len * hidden_size) * 4;
}

// What one micro-batch's actions hand to each other (several are in
// flight under the layer-major schedule, Note [Layer-major schedule]).
// Note [Kept layer graphs] in executor.h: a layer's forward output with
// its autograd graph, and the leaves its backward differentiates by (the
// layer's parameters in BindBlockParams order, then its input).
struct KeptGraph {
  at::Tensor output;
  std::vector<at::Tensor> inputs;
};

struct MicroBatchState {
  UploadedInput input;            // x moved out into `x`; labels, ids
  at::Tensor x;                   // [B, T, C] fp32: the hidden state
  at::Tensor grad_y;              // [B, T, C]: d loss / d (current layer's output)
  std::vector<at::Tensor> saved;  // [L] layer inputs kept for backward (or undefined)
  // [L] Note [Kept layer graphs]: a kept layer's graph until its backward
  // (empty for the others).
  std::vector<KeptGraph> graphs;
};

// The state of one pass that actions hand to each other.
struct PassState {
  absl::Span<const MicroBatch> micro_batches;
  double loss_scale = 0;  // 1 / counted tokens of the global batch
  std::vector<float>* logits = nullptr;
  at::Tensor loss_total;                     // [] fp64, device
  std::vector<MicroBatchState> micro_batch;  // [M]; reset when its last action is done
  std::vector<int> open_grad_slot;           // per block: its GradTo::kSlotSum slot, or -1

  MicroBatchState& at(int m) { return micro_batch[m]; }
  void EndMicroBatch(int m) { micro_batch[m] = MicroBatchState(); }
};

// Micro-batch `m`'s position ids (MicroBatch::position_ids): none, or
// [n] with every row of `seq_len` starting at 0 and each next id 0 or the
// previous plus one. INVALID_ARGUMENT naming the first bad one otherwise.
absl::Status CheckPositionIds(const MicroBatch& mb, size_t m, size_t n, size_t seq_len) {
  const std::vector<int32_t>& positions = mb.position_ids;
  if (positions.empty()) return absl::OkStatus();
  if (positions.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch ", m, ": expected ", n,
                                                   " position_ids (micro_batch x seq_len) or none, "
                                                   "got ",
                                                   positions.size()));
  }
  for (size_t i = 0; i < n; ++i) {
    const int32_t expected_next = i % seq_len == 0 ? 0 : positions[i - 1] + 1;
    if (positions[i] != 0 && positions[i] != expected_next) {
      return absl::InvalidArgumentError(absl::StrCat(
          "micro-batch ", m, ": position_ids[", i, "] = ", positions[i], " must be 0 (a document ",
          "begins) or ", expected_next, " (the previous plus one; rows begin at 0)"));
    }
  }
  return absl::OkStatus();
}

// Note [Kept layer graphs] in executor.h: resident dense layers only.
absl::Status CheckKeptGraphLayers(const ModelConfig& config, const ExecutorOptions& options) {
  const int kept = options.kept_graph_layers;
  if (kept < 0 || kept > options.resident_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "executor.kept_graph_layers: must be in [0, resident_layers=", options.resident_layers,
        "], got ", kept));
  }
  if (kept > 0 && options.offload_activations) {
    return absl::InvalidArgumentError(
        "executor.kept_graph_layers: not with offload_activations (a kept graph holds its "
        "layer's activations on the device)");
  }
  if (kept > 0 && config.moe != nullptr) {
    return absl::InvalidArgumentError(
        "executor.kept_graph_layers: not for mixture-of-experts models (their layers are "
        "recomputed in backward)");
  }
  return absl::OkStatus();
}

// ExecutorOptions' bounds. INVALID_ARGUMENT naming the first field out of
// range.
absl::Status CheckExecutorBounds(const HostStore* store, const ExecutorOptions& options) {
  // The job spec's bounds (Note [One place per bound] in engine/spec/job_spec.h).
  MEGATRAIN_RETURN_IF_ERROR(
      CheckIntInRange("train.micro_batch", options.micro_batch, kMicroBatchRange));
  MEGATRAIN_RETURN_IF_ERROR(CheckIntInRange("train.seq_len", options.seq_len, kSeqLenRange));
  if (options.num_weight_slots < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("executor.num_weight_slots: must be >= 3, got ", options.num_weight_slots));
  }
  if (options.weight_shard_world < 1 || options.weight_shard_rank < 0 ||
      options.weight_shard_rank >= options.weight_shard_world) {
    return absl::InvalidArgumentError(
        absl::StrCat("executor.weight_shard_rank: must be in [0, weight_shard_world=",
                     options.weight_shard_world, "), got ", options.weight_shard_rank));
  }
  if (options.grad_shard_world < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("executor.grad_shard_world: must be >= 1, got ", options.grad_shard_world));
  }
  if (options.num_grad_slots < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("executor.num_grad_slots: must be >= 2, got ", options.num_grad_slots));
  }
  if (options.resident_layers < 0 || options.resident_layers > store->layout().num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "executor.resident_layers: must be in [0, num_hidden_layers=", store->layout().num_layers(),
        "], got ", options.resident_layers));
  }
  MEGATRAIN_RETURN_IF_ERROR(CheckKeptGraphLayers(store->config(), options));
  if (options.resident_embedding) {
    const ModelLayout& layout = store->layout();
    const BlockLayout& emb = layout.blocks[layout.embedding_block()];
    if (emb.params.size() != 1 || emb.params[0].shape.size() != 2 || emb.params[0].offset != 0) {
      return absl::InvalidArgumentError(
          "executor.resident_embedding: the embedding block is not one [vocab_size, hidden_size] "
          "table");
    }
  }
  // A layer-major pass needs a wave of at least one micro-batch (no auto
  // here); the upper bound is the spec's.
  if (options.schedule == StepSchedule::kLayerMajor &&
      (options.wave < 1 || options.wave > kWaveRange.max)) {
    return absl::InvalidArgumentError(absl::StrCat("executor.wave: must be in [1, ", kWaveRange.max,
                                                   "] with the layer-major schedule, got ",
                                                   options.wave));
  }
  return absl::OkStatus();
}

// Whether `store` was built for these options (weight stream, gradient
// ring, embedding gradient) and the options agree with each other.
// FAILED_PRECONDITION or INVALID_ARGUMENT naming the field.
absl::Status CheckStoreMatchesOptions(const HostStore* store, const ExecutorOptions& options) {
  if (options.compute_dtype == ComputeDtype::kBf16 &&
      store->options().streaming_bf16 == options.stream_fp32_master) {
    return absl::FailedPreconditionError(
        "executor: bf16 compute streams the store's bf16 copy or (stream_fp32_master) the fp32 "
        "master; the store and the options disagree");
  }
  if (options.grad_chunk_elements < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "executor.grad_chunk_elements: must be >= 1, got ", options.grad_chunk_elements));
  }
  if (options.mlp_chunk_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("executor.mlp_chunk_bytes: must be >= 1, got ", options.mlp_chunk_bytes));
  }
  if (options.fused_kernels && !FusedKernelsCompiled()) {
    return absl::UnimplementedError(
        "executor.fused_kernels: this build has no fused kernels (a CUDA build configured "
        "with -DMEGATRAIN_FUSED_KERNELS=ON has them; --fused_kernels)");
  }
  if (options.stream_fp32_master && options.cast_chunk_elements < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "executor.cast_chunk_elements: must be >= 1, got ", options.cast_chunk_elements));
  }
  if (options.host_cast && !options.stream_fp32_master) {
    return absl::InvalidArgumentError(
        "executor.host_cast: casts the fp32 master, so it needs stream_fp32_master");
  }
  if (options.host_cast && options.host_cast_chunk_elements < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "executor.host_cast_chunk_elements: must be >= 1, got ", options.host_cast_chunk_elements));
  }
  if (options.compute_dtype != ComputeDtype::kBf16 && options.stream_fp32_master) {
    return absl::InvalidArgumentError(
        "executor.stream_fp32_master: bf16 compute only (fp32/tf32 always stream the master)");
  }
  if (options.compute_dtype != ComputeDtype::kBf16 && store->options().streaming_bf16) {
    return absl::FailedPreconditionError(
        "executor: fp32/tf32 compute streams the fp32 master; the store has a bf16 copy");
  }
  if (store->options().gradient_ring != options.gradient_ring) {
    return absl::FailedPreconditionError(
        "executor.gradient_ring: the store and the options disagree (HostStoreOptions::"
        "gradient_ring)");
  }
  if (options.gradient_ring && !options.resident_embedding &&
      !store->options().embedding_grad_in_host) {
    return absl::FailedPreconditionError(
        "executor.resident_embedding: the embedding lands on the host but the store keeps no "
        "gradient for it (HostStoreOptions::embedding_grad_in_host)");
  }
  return absl::OkStatus();
}

// Thrown between plan actions when ExecutorOptions::abandon_step is set
// (Note [Abandoned steps] in executor.h); caught in Run only.
struct StepAbandoned {};

}  // namespace

class StreamingExecutor::Impl {
 public:
  Impl(HostStore* store, DeviceRuntime* runtime, ThreadPool* pool, const ExecutorOptions& options)
      : env_(store, runtime, pool, options.compute_dtype),
        options_(options),
        accumulator_(&env_, options.device_grad_accumulation, options.resident_layers) {}

  ~Impl() {
    // The parts' destructors (the gradient lander's joins its thread after
    // running what is queued) need idle streams.
    try {
      env_.runtime->Synchronize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "megatrain: executor shutdown: %s\n", e.what());
    }
  }

  absl::Status Init();
  // `step`: the optimizer step of a training pass (backward), which keys
  // its train-time noise (Note [Router jitter] in model/moe_layers.h).
  absl::StatusOr<ForwardBackwardResult> Run(absl::Span<const MicroBatch> micro_batches,
                                            bool backward, int64_t step, const BatchShare& share,
                                            const BlockFinalCallback& on_block_final,
                                            std::vector<float>* logits = nullptr);
  int64_t slot_device_bytes() const {
    return slots_->device_bytes() + lander_->device_bytes() +
           (offload_ ? offload_->device_bytes() : 0) + resident_->device_bytes() +
           accumulator_.device_bytes();
  }
  int64_t staging_host_bytes() const {
    return lander_->pinned_bytes() + inputs_->pinned_bytes() +
           (offload_ ? offload_->pinned_bytes() : 0) + slots_->pinned_bytes();
  }
  void SetWeightGate(std::function<void(int64_t)> gate) { env_.weight_gate = std::move(gate); }
  void SetDeviceReduction(decltype(StepEnv::reduce_on_device) reduce) {
    env_.reduce_on_device = std::move(reduce);
  }
  void SetResidentReduction(decltype(StepEnv::all_reduce_on_device) reduce) {
    env_.all_reduce_on_device = std::move(reduce);
  }
  void SetWeightGather(decltype(StepEnv::WeightSharding::all_gather) gather) {
    env_.weight_sharding.all_gather = std::move(gather);
  }
  void SetEmbeddingRowGate(EmbeddingRowGate gate) { inputs_->SetRowGate(std::move(gate)); }
  void AssumeEmbeddingGradZero(bool zero) { assume_embedding_grad_zero_ = zero; }
  ResidentBlocks& resident() { return *resident_; }

 private:
  absl::Status ValidateBatches(absl::Span<const MicroBatch> mbs, int64_t* counted) const;
  StepPlanOptions PlanOptions(size_t micro_batches, bool backward);
  // FAILED_PRECONDITION when the gradient ring is on and a pass planned
  // with `o` would land partial gradients (Note [Gradient ring]).
  absl::Status CheckGradientRing(const StepPlanOptions& o) const;
  // Layer-major: micro-batches per wave in a pass of `micro_batches`.
  int Wave(size_t micro_batches) const;
  void Execute(const StepAction& a, PassState& p);
  void Upload(const StepAction& a, PassState& p);
  void ForwardLayer(const StepAction& a, PassState& p);
  // Note [Kept layer graphs] in executor.h: resident layer `a.layer`'s
  // forward under autograd; its graph goes to the micro-batch's `graphs`.
  void ForwardKeepingGraph(const StepAction& a, PassState& p);
  // What a layer's backward differentiates by: `flat`'s parameters (in
  // BindBlockParams order), then `input`, each a fresh leaf that requires
  // its gradient.
  static std::vector<at::Tensor> LayerGraphInputs(const BlockLayout& bl, const at::Tensor& flat,
                                                  const at::Tensor& input);
  // The layer's forward under autograd from LayerGraphInputs' `inputs`.
  at::Tensor LayerWithGraph(const BlockLayout& bl, const std::vector<at::Tensor>& inputs,
                            const PackedDocuments* docs);
  // The gradients of `graph`'s inputs (RecomputeAndBackward's order) for
  // d loss / d output = `grad_y`; frees the graph.
  static std::vector<at::Tensor> BackwardThroughKeptGraph(KeptGraph& graph,
                                                          const at::Tensor& grad_y);
  // GradTo::kSlotSum: `grads` of `a.block` into its open gradient slot
  // (the first contribution opens it). Returns whether it was the last:
  // the caller then lands the sum with LandSlotSum, outside its compute
  // interval (as the other landings).
  bool SlotSum(const StepAction& a, PassState& p, BlockKind kind,
               const std::vector<at::Tensor>& grads);
  void LandSlotSum(const StepAction& a, PassState& p);
  void Head(const StepAction& a, PassState& p);
  // The head's loss and backward; lands the head's (and a tied
  // embedding's lm_head) gradient.
  void HeadBackward(const StepAction& a, PassState& p, const std::vector<at::Tensor>& head_params,
                    const at::Tensor& lm_head);
  void BackwardLayer(const StepAction& a, PassState& p);
  // Activation checkpointing: recomputes the layer's forward from `input`
  // with autograd local to the layer; returns the gradients of its
  // parameters (in BindBlockParams order) and, last, of `input`. `docs`:
  // the micro-batch's documents or null (Note [Document attention] in
  // model/layers.h).
  std::vector<at::Tensor> RecomputeAndBackward(const BlockLayout& bl, const at::Tensor& flat,
                                               const at::Tensor& input, const at::Tensor& grad_y,
                                               const PackedDocuments* docs);
  // A dense decoder layer's forward, and its recompute and backward (as
  // RecomputeAndBackward), from CUDA graphs when they are on (Note [Layer
  // graphs] in step/layer_graphs.h) and the micro-batch has no documents.
  at::Tensor DenseForward(const BlockLayout& bl, const at::Tensor& flat, const at::Tensor& x,
                          const PackedDocuments* docs);
  std::vector<at::Tensor> DenseRecomputeAndBackward(const BlockLayout& bl, const at::Tensor& flat,
                                                    const at::Tensor& input,
                                                    const at::Tensor& grad_y,
                                                    const PackedDocuments* docs);
  void EmbeddingBackward(const StepAction& a, PassState& p);
  // A contribution to `block`'s device sum is in place; on the last one
  // of the pass the sum lands in the store.
  void AccumulatedGradDone(int64_t block);
  // Resident block `index`'s contribution is in place; on the last one its
  // squared norm goes to the host.
  void ResidentGradDone(size_t index);
  bool FirstContribution(int64_t block) { return !lander_->contributions().seen(block); }
  void FillStats(size_t micro_batches, StepClock::time_point start, StepStats* stats);
  void ResetAfterError();

  StepEnv env_;  // first: every part points to it
  ExecutorOptions options_;
  int64_t chunk_tokens_ = 0;
  RopeCache rope_;
  at::Tensor attention_mask_;
  std::unique_ptr<WeightSlots> slots_;
  std::unique_ptr<GradLander> lander_;
  std::unique_ptr<InputStager> inputs_;
  std::unique_ptr<ActivationOffload> offload_;  // null without activation offload
  std::unique_ptr<ResidentBlocks> resident_;
  std::unique_ptr<MoeLayerRunner> moe_;  // MoE models only (engine/step/moe_block.h)
  DeviceGradAccumulator accumulator_;
  bool assume_embedding_grad_zero_ = false;  // for the current/next Run only
  // Last: its graphs go before the buffers their kernels address.
  std::unique_ptr<LayerGraphs> graphs_;
  int64_t graph_replays_at_pass_start_ = 0;
};

absl::Status StreamingExecutor::Impl::Init() {
  const ModelConfig& config = env_.config;
  const ExecutorMemoryPlan plan = PlanExecutorMemory(config, options_);
  const int64_t max_numel = plan.max_slot_numel;
  chunk_tokens_ = options_.loss_chunk_tokens > 0
                      ? options_.loss_chunk_tokens
                      : std::max<int64_t>(64, kLossChunkLogitBytes / (4 * config.vocab_size));
  try {
    const at::Device device = env_.runtime->device();
    auto scope = env_.runtime->Use(StreamKind::kCompute);
    compat::SetAllowTf32(options_.compute_dtype == ComputeDtype::kTf32);
    rope_ = BuildRopeCache(config, options_.seq_len, device);
    attention_mask_ = BuildAttentionMask(config, options_.seq_len, device);
    env_.weight_sharding.rank = options_.weight_shard_rank;
    env_.weight_sharding.world = options_.weight_shard_world;
    std::unique_ptr<HostCastStager> host_cast;  // Note [Host cast] in step/host_cast.h
    if (options_.host_cast && max_numel > 0) {
      MEGATRAIN_ASSIGN_OR_RETURN(
          host_cast, HostCastStager::Create(&env_, max_numel, options_.host_cast_chunk_elements));
    }
    slots_ = std::make_unique<WeightSlots>(
        &env_, options_.num_weight_slots, max_numel,
        options_.stream_fp32_master && !options_.host_cast ? options_.cast_chunk_elements : 0,
        std::move(host_cast));
    MEGATRAIN_ASSIGN_OR_RETURN(
        lander_, GradLander::Create(&env_, options_.num_grad_slots, max_numel,
                                    GradStagingBytes(options_, config.hidden_size),
                                    options_.grad_chunk_elements, plan.grad_ring_numels));
    MEGATRAIN_ASSIGN_OR_RETURN(inputs_,
                               InputStager::Create(&env_, options_.micro_batch, options_.seq_len,
                                                   /*rows_on_host=*/!options_.resident_embedding));
    if (options_.offload_activations) {
      const int wave = options_.schedule == StepSchedule::kLayerMajor ? options_.wave : 1;
      MEGATRAIN_ASSIGN_OR_RETURN(
          offload_, ActivationOffload::Create(&env_, options_.micro_batch, options_.seq_len, wave));
    }
    resident_ = std::make_unique<ResidentBlocks>(&env_, options_.resident_layers,
                                                 options_.resident_embedding);
    if (config.moe != nullptr) {
      moe_ =
          std::make_unique<MoeLayerRunner>(config, options_.seq_len, device, options_.noise_seed);
    }
    graphs_ = std::make_unique<LayerGraphs>(
        env_.runtime, options_.cuda_graphs && config.moe == nullptr,
        LayerGraphCount(config, options_.num_weight_slots, options_.resident_layers));
  } catch (const std::exception& e) {
    return StatusFromException(e);
  }
  return resident_->LoadFromStore();
}

absl::Status StreamingExecutor::Impl::ValidateBatches(absl::Span<const MicroBatch> mbs,
                                                      int64_t* counted) const {
  if (mbs.empty()) return absl::InvalidArgumentError("batch: no micro-batches");
  const size_t n = static_cast<size_t>(options_.micro_batch * options_.seq_len);
  const int32_t vocab = static_cast<int32_t>(env_.config.vocab_size);
  *counted = 0;
  for (size_t m = 0; m < mbs.size(); ++m) {
    const MicroBatch& mb = mbs[m];
    if (mb.input_ids.size() != n || mb.labels.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("micro-batch ", m, ": expected ", n,
                       " input_ids and labels (micro_batch x seq_len), got ", mb.input_ids.size(),
                       " and ", mb.labels.size()));
    }
    for (size_t i = 0; i < n; ++i) {
      if (mb.input_ids[i] < 0 || mb.input_ids[i] >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("micro-batch ", m, ": input_ids[", i,
                                                       "] = ", mb.input_ids[i],
                                                       " is outside [0, vocab_size=", vocab, ")"));
      }
      const int32_t label = mb.labels[i];
      if (label == kIgnoreLabel) continue;
      if (label < 0 || label >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("micro-batch ", m, ": labels[", i, "] = ", label,
                         " is outside [0, vocab_size=", vocab, ") and is not -100"));
      }
      ++*counted;
    }
    MEGATRAIN_RETURN_IF_ERROR(CheckPositionIds(mb, m, n, static_cast<size_t>(options_.seq_len)));
  }
  return absl::OkStatus();
}

StepPlanOptions StreamingExecutor::Impl::PlanOptions(size_t micro_batches, bool backward) {
  StepPlanOptions o;
  o.micro_batches = static_cast<int>(micro_batches);
  o.backward = backward;
  o.tied_embeddings = env_.config.tie_word_embeddings;
  o.resident_layers = options_.resident_layers;
  o.kept_graph_layers = options_.kept_graph_layers;
  o.resident_embedding = options_.resident_embedding;
  o.offload_activations = options_.offload_activations;
  o.schedule = options_.schedule;
  o.wave = Wave(micro_batches);
  // Layer-major with one wave sums in the gradient slots (GradTo::kSlotSum):
  // no accumulation buffers.
  const bool slot_sum = o.schedule == StepSchedule::kLayerMajor &&
                        o.wave == static_cast<int>(micro_batches) && micro_batches > 1;
  // Note [Device gradient accumulation] in executor.h (allocates the
  // buffers at the first pass that uses them).
  o.device_grad_accumulation = backward && !slot_sum && accumulator_.Prepare(micro_batches);
  return o;
}

absl::Status StreamingExecutor::Impl::CheckGradientRing(const StepPlanOptions& o) const {
  // Note [Gradient ring] in grad_lander.h: every landing a whole gradient.
  if (!options_.gradient_ring || !o.backward || o.micro_batches == 1) return absl::OkStatus();
  if (env_.config.tie_word_embeddings && resident_->embedding_index() < 0) {
    // A tied table on the host takes lm_head's gradient once per
    // micro-batch (HeadBackward), summed in its arena on the host.
    return absl::FailedPreconditionError(absl::StrCat(
        "memory.gradient_landing ring: a pass of ", o.micro_batches,
        " micro-batches would add a tied embedding table's lm_head gradients on the host; use "
        "the gradient arena or one micro-batch per step"));
  }
  const bool slot_sum = o.schedule == StepSchedule::kLayerMajor && o.wave == o.micro_batches;
  if (slot_sum || o.device_grad_accumulation) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "memory.gradient_landing ring: a pass of ", o.micro_batches,
      " micro-batches would add gradients on the host (no device gradient accumulation, no "
      "one-wave layer-major schedule); use the gradient arena"));
}

int StreamingExecutor::Impl::Wave(size_t micro_batches) const {
  if (options_.schedule != StepSchedule::kLayerMajor) return 1;
  return static_cast<int>(std::min<size_t>(options_.wave, micro_batches));
}

// The pass: validate, plan, run the plan's actions in order, read the
// loss, drain. The plan fixes the order of work (Note [Step plan]).
absl::StatusOr<ForwardBackwardResult> StreamingExecutor::Impl::Run(
    absl::Span<const MicroBatch> mbs, bool backward, int64_t step, const BatchShare& share,
    const BlockFinalCallback& on_block_final, std::vector<float>* logits) {
  ForwardBackwardResult result;
  MEGATRAIN_RETURN_IF_ERROR(ValidateBatches(mbs, &result.counted_tokens));
  const StepClock::time_point start = StepClock::now();
  env_.BeginPass();
  graph_replays_at_pass_start_ = graphs_->replays();
  PassState pass;
  pass.micro_batches = mbs;
  // Note [Data-parallel step]: a rank divides by the global batch's count.
  const int64_t loss_tokens =
      share.global_counted_tokens > 0 ? share.global_counted_tokens : result.counted_tokens;
  pass.loss_scale = loss_tokens > 0 ? 1.0 / static_cast<double>(loss_tokens) : 0.0;
  pass.logits = logits;
  pass.micro_batch.resize(mbs.size());
  pass.open_grad_slot.assign(env_.layout.blocks.size(), -1);
  try {
    env_.runtime->ResetPeak();
    auto compute = env_.runtime->Use(StreamKind::kCompute);
    const StepPlanOptions plan_options = PlanOptions(mbs.size(), backward);
    MEGATRAIN_RETURN_IF_ERROR(CheckGradientRing(plan_options));  // before any work
    env_.timer.MarkStart();
    resident_->ApplyPending();  // the update the trainer asked for after the last pass
    const StepPlan plan = PlanStep(env_.layout, plan_options);
    if (moe_) {
      moe_->BeginPass(static_cast<int>(mbs.size()), /*train=*/backward, step,
                      share.first_micro_batch);
    }
    lander_->BeginPass(plan.contributions, on_block_final, assume_embedding_grad_zero_);
    // Note [Sharded weight streaming]: training passes only (every rank
    // runs them; evaluation runs on one).
    slots_->BeginPass(plan.weight_uses, /*sharded=*/backward);
    pass.loss_total =
        at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(env_.runtime->device()));
    for (const StepAction& action : plan.actions) {
      // Note [Abandoned steps] in executor.h: the one place a pass checks.
      if (options_.abandon_step != nullptr &&
          options_.abandon_step->load(std::memory_order_relaxed)) {
        throw StepAbandoned();
      }
      Execute(action, pass);
    }
    pass.micro_batch.clear();
    const StepClock::time_point drain_start = StepClock::now();
    result.loss_sum = pass.loss_total.item<double>();  // host sync: end of the pass
    if (moe_ && moe_->aux_loss_enabled()) {  // Note [Load-balancing loss across micro-batches]
      result.aux_loss_sum = moe_->AuxLossSum().item<double>();
      result.aux_loss_terms = static_cast<int64_t>(mbs.size());
      result.router_aux_loss_coef = moe_->router_aux_loss_coef();
    }
    env_.runtime->Synchronize();
    MEGATRAIN_RETURN_IF_ERROR(lander_->Drain());
    result.stats.drain_seconds = SecondsSince(drain_start);
  } catch (const StepAbandoned&) {
    assume_embedding_grad_zero_ = false;
    ResetAfterError();
    return absl::CancelledError("step abandoned (forced cancel)");
  } catch (const std::exception& e) {
    assume_embedding_grad_zero_ = false;
    ResetAfterError();
    return StatusFromException(e);
  }
  inputs_->EndPass();
  assume_embedding_grad_zero_ = false;
  FillStats(mbs.size(), start, &result.stats);
  return result;
}

void StreamingExecutor::Impl::Execute(const StepAction& a, PassState& p) {
  switch (a.kind) {
    case ActionKind::kUpload:
      return Upload(a, p);
    case ActionKind::kForward:
      return ForwardLayer(a, p);
    case ActionKind::kPrefetchInput:
      p.at(a.micro_batch).saved[a.layer] = offload_->Prefetch(a.layer, a.micro_batch);
      return;
    case ActionKind::kHead:
      return Head(a, p);
    case ActionKind::kBackward:
      return BackwardLayer(a, p);
    case ActionKind::kEmbeddingBackward:
      return EmbeddingBackward(a, p);
  }
}

void StreamingExecutor::Impl::Upload(const StepAction& a, PassState& p) {
  const at::Tensor table =
      a.weights == WeightsFrom::kResident ? resident_->EmbeddingTable() : at::Tensor();
  MicroBatchState& mb = p.at(a.micro_batch);
  mb.input = inputs_->Upload(p.micro_batches[a.micro_batch], table);
  mb.x = std::move(mb.input.x);
  mb.saved.assign(env_.layout.num_layers(), at::Tensor());
  mb.graphs.assign(env_.layout.num_layers(), {});
}

void StreamingExecutor::Impl::ForwardLayer(const StepAction& a, PassState& p) {
  if (a.save == SaveInput::kGraph) return ForwardKeepingGraph(a, p);
  at::NoGradGuard no_grad;
  const bool resident = a.weights == WeightsFrom::kResident;
  at::Tensor flat = resident ? resident_->weights(a.layer) : slots_->Acquire(a.use);
  MicroBatchState& mb = p.at(a.micro_batch);
  if (a.save == SaveInput::kOffload) {
    offload_->Save(a.layer, a.micro_batch, mb.x);
  } else if (a.save == SaveInput::kKeep) {
    mb.saved[a.layer] = mb.x;
  }
  const int token = env_.timer.Begin(StreamKind::kCompute);
  const PackedDocuments* docs = mb.input.documents ? &*mb.input.documents : nullptr;
  mb.x = moe_ ? moe_->Forward(a.micro_batch, env_.layout.blocks[a.block], flat, mb.x,
                              env_.compute_dtype, docs)
              : DenseForward(env_.layout.blocks[a.block], flat, mb.x, docs);
  env_.timer.End(StreamKind::kCompute, token, PhaseTimer::kForward);
  if (!resident) slots_->Release(a.use);
  // Free offloaded inputs once their copy is done: the compute stream
  // waits for the copy issued one layer earlier (long done).
  if (offload_) offload_->RetireCopies(a.last_layer);
}

void StreamingExecutor::Impl::Head(const StepAction& a, PassState& p) {
  const ModelLayout& layout = env_.layout;
  const bool tied = a.tied_use >= 0;
  at::Tensor emb_flat = tied ? slots_->Acquire(a.tied_use) : at::Tensor();
  at::Tensor head_flat = slots_->Acquire(a.use);
  std::vector<at::Tensor> head_params = BindBlockParams(layout.blocks[a.block], head_flat);
  at::Tensor lm_head = tied ? BindBlockParams(layout.blocks[layout.embedding_block()],
                                              emb_flat)[0]
                       : env_.config.tie_word_embeddings
                           ? resident_->TiedLmHead()  // Note [Resident embedding]
                           : head_params[1];
  MicroBatchState& mb = p.at(a.micro_batch);
  if (a.grad_to != GradTo::kNone) {
    HeadBackward(a, p, head_params, lm_head);
  } else {
    const int token = env_.timer.Begin(StreamKind::kCompute);
    at::NoGradGuard no_grad;
    p.loss_total.add_(HeadLoss(env_.config, mb.x, mb.input.labels, head_params[0], lm_head,
                               chunk_tokens_, env_.compute_dtype));
    if (p.logits != nullptr) {
      at::Tensor l = HeadLogits(env_.config, mb.x, head_params[0], lm_head, env_.compute_dtype)
                         .to(at::kCPU)
                         .contiguous();
      p.logits->assign(l.data_ptr<float>(), l.data_ptr<float>() + l.numel());
    }
    env_.timer.End(StreamKind::kCompute, token);
  }
  slots_->Release(a.use);
  if (tied) slots_->Release(a.tied_use);
  mb.x.reset();
  if (a.grad_to == GradTo::kNone) p.EndMicroBatch(a.micro_batch);
}

void StreamingExecutor::Impl::HeadBackward(const StepAction& a, PassState& p,
                                           const std::vector<at::Tensor>& head_params,
                                           const at::Tensor& lm_head) {
  const ModelLayout& layout = env_.layout;
  const int64_t head = a.block, emb = layout.embedding_block();
  const bool tied = env_.config.tie_word_embeddings;
  const BlockLayout& bl = layout.blocks[head];
  MicroBatchState& mb = p.at(a.micro_batch);
  const int token = env_.timer.Begin(StreamKind::kCompute);
  HeadResult hr =
      HeadForwardBackward(env_.config, mb.x, mb.input.labels, head_params[0], lm_head, p.loss_scale,
                          chunk_tokens_, env_.compute_dtype, options_.fused_kernels);
  p.loss_total.add_(hr.loss_sum);
  mb.grad_y = hr.grad_hidden;
  // Head block gradient: final norm (+ lm_head when untied).
  const std::vector<at::Tensor> grads = {hr.grad_norm, tied ? at::Tensor() : hr.grad_lm_head};
  if (a.grad_to == GradTo::kSlotSum) {
    const bool last = SlotSum(a, p, BlockKind::kHead, grads);
    env_.timer.End(StreamKind::kCompute, token, PhaseTimer::kHead);
    if (last) LandSlotSum(a, p);
  } else if (a.grad_to == GradTo::kDeviceAccumulator) {
    AccumulateInto(bl, accumulator_.buffer(head), grads, FirstContribution(head));
    env_.timer.End(StreamKind::kCompute, token, PhaseTimer::kHead);
    AccumulatedGradDone(head);
  } else {
    const int r = lander_->AcquireSlot();
    lander_->FillSlot(r, bl, BlockKind::kHead, grads);
    env_.timer.End(StreamKind::kCompute, token, PhaseTimer::kHead);
    lander_->LandSlot(r, head);
  }
  if (tied && resident_->embedding_index() >= 0) {
    // lm_head's gradient belongs to the embedding block, here resident
    // (Note [Resident embedding]): summed on the device like its rows'.
    const int index = resident_->embedding_index();
    const int t = env_.timer.Begin(StreamKind::kCompute);
    AccumulateInto(layout.blocks[emb], resident_->grad(index), {hr.grad_lm_head},
                   FirstContribution(emb));
    env_.timer.End(StreamKind::kCompute, t, PhaseTimer::kHead);
    ResidentGradDone(static_cast<size_t>(index));
  } else if (tied) {  // lm_head's gradient belongs to the embedding block
    const int r = lander_->AcquireSlot();
    lander_->FillSlot(r, layout.blocks[emb], BlockKind::kEmbedding, {hr.grad_lm_head});
    lander_->LandSlot(r, emb);
  }
  // An empty compute interval after the landings, so that the idle-gap
  // breakdown (PhaseTimer::ComputeGaps) counts their waits as "other".
  env_.timer.End(StreamKind::kCompute, env_.timer.Begin(StreamKind::kCompute));
}

void StreamingExecutor::Impl::ForwardKeepingGraph(const StepAction& a, PassState& p) {
  at::AutoGradMode with_graph(true);  // whatever the caller's mode
  MicroBatchState& mb = p.at(a.micro_batch);
  const int token = env_.timer.Begin(StreamKind::kCompute);
  const PackedDocuments* docs = mb.input.documents ? &*mb.input.documents : nullptr;
  KeptGraph& graph = mb.graphs[a.layer];
  graph.inputs = LayerGraphInputs(env_.layout.blocks[a.block], resident_->weights(a.layer), mb.x);
  graph.output = LayerWithGraph(env_.layout.blocks[a.block], graph.inputs, docs);
  mb.x = graph.output.detach();
  env_.timer.End(StreamKind::kCompute, token, PhaseTimer::kForward);
}

std::vector<at::Tensor> StreamingExecutor::Impl::LayerGraphInputs(const BlockLayout& bl,
                                                                  const at::Tensor& flat,
                                                                  const at::Tensor& input) {
  std::vector<at::Tensor> inputs;
  for (const at::Tensor& p : BindBlockParams(bl, flat)) {
    inputs.push_back(p.detach().requires_grad_(true));
  }
  inputs.push_back(input.detach().requires_grad_(true));
  return inputs;
}

at::Tensor StreamingExecutor::Impl::LayerWithGraph(const BlockLayout& bl,
                                                   const std::vector<at::Tensor>& inputs,
                                                   const PackedDocuments* docs) {
  const std::vector<at::Tensor> leaves(inputs.begin(), inputs.end() - 1);
  return DecoderLayerForward(env_.config, DecoderLayerWeightsFromParams(bl, leaves), inputs.back(),
                             rope_, attention_mask_, env_.compute_dtype, options_.mlp_chunk_bytes,
                             docs, options_.fused_kernels);
}

std::vector<at::Tensor> StreamingExecutor::Impl::RecomputeAndBackward(const BlockLayout& bl,
                                                                      const at::Tensor& flat,
                                                                      const at::Tensor& input,
                                                                      const at::Tensor& grad_y,
                                                                      const PackedDocuments* docs) {
  const std::vector<at::Tensor> inputs = LayerGraphInputs(bl, flat, input);
  const at::Tensor y = LayerWithGraph(bl, inputs, docs);
  return torch::autograd::grad({y}, inputs, {grad_y});
}

at::Tensor StreamingExecutor::Impl::DenseForward(const BlockLayout& bl, const at::Tensor& flat,
                                                 const at::Tensor& x, const PackedDocuments* docs) {
  if (docs != nullptr) {  // each micro-batch its own documents: no graph
    at::NoGradGuard no_grad;
    return DecoderLayerForward(env_.config, BindDecoderLayerWeights(bl, flat), x, rope_,
                               attention_mask_, env_.compute_dtype, options_.mlp_chunk_bytes, docs,
                               options_.fused_kernels);
  }
  const BlockLayout* block = &bl;
  return graphs_
      ->Run(LayerWork::kForward, flat.data_ptr(), LayerGraphVariant(env_.config, bl.layer_idx), {x},
            /*kept_last=*/1,
            [this, block, flat](const std::vector<at::Tensor>& in) {
              at::NoGradGuard no_grad;
              return std::vector<at::Tensor>{DecoderLayerForward(
                  env_.config, BindDecoderLayerWeights(*block, flat), in[0], rope_, attention_mask_,
                  env_.compute_dtype, options_.mlp_chunk_bytes, /*documents=*/nullptr,
                  options_.fused_kernels)};
            })
      .front();
}

std::vector<at::Tensor> StreamingExecutor::Impl::DenseRecomputeAndBackward(
    const BlockLayout& bl, const at::Tensor& flat, const at::Tensor& input,
    const at::Tensor& grad_y, const PackedDocuments* docs) {
  if (docs != nullptr) return RecomputeAndBackward(bl, flat, input, grad_y, docs);
  const BlockLayout* block = &bl;
  return graphs_->Run(LayerWork::kRecomputeBackward, flat.data_ptr(),
                      LayerGraphVariant(env_.config, bl.layer_idx), {input, grad_y},
                      /*kept_last=*/1, [this, block, flat](const std::vector<at::Tensor>& in) {
                        return RecomputeAndBackward(*block, flat, in[0], in[1], nullptr);
                      });
}

void StreamingExecutor::Impl::BackwardLayer(const StepAction& a, PassState& p) {
  const BlockLayout& bl = env_.layout.blocks[a.block];
  const bool resident = a.weights == WeightsFrom::kResident;
  at::Tensor flat = resident ? resident_->weights(a.layer) : slots_->Acquire(a.use);
  const int r = a.grad_to == GradTo::kHost ? lander_->AcquireSlot() : -1;
  // The next action's offloaded input comes back while this one runs.
  if (a.prefetch_layer >= 0) {
    p.at(a.prefetch_micro_batch).saved[a.prefetch_layer] =
        offload_->Prefetch(a.prefetch_layer, a.prefetch_micro_batch);
  }
  if (a.input_offloaded) offload_->WaitLoaded(a.layer, a.micro_batch);
  MicroBatchState& mb = p.at(a.micro_batch);
  const int token = env_.timer.Begin(StreamKind::kCompute);
  const PackedDocuments* docs = mb.input.documents ? &*mb.input.documents : nullptr;
  std::vector<at::Tensor> grads =
      a.from_graph ? BackwardThroughKeptGraph(mb.graphs[a.layer], mb.grad_y)
      : moe_ ? moe_->RecomputeAndBackward(a.micro_batch, bl, flat, mb.saved[a.layer], mb.grad_y,
                                          env_.compute_dtype, docs)
             : DenseRecomputeAndBackward(bl, flat, mb.saved[a.layer], mb.grad_y, docs);
  bool slot_sum_last = false;
  if (a.grad_to == GradTo::kSlotSum) {
    slot_sum_last = SlotSum(a, p, BlockKind::kDecoderLayer, grads);
  } else if (a.grad_to == GradTo::kResident) {
    // Accumulated in place, fp32, in micro-batch order: the host's adds.
    AccumulateInto(bl, resident_->grad(a.layer), grads, FirstContribution(a.block));
  } else if (a.grad_to == GradTo::kDeviceAccumulator) {
    AccumulateInto(bl, accumulator_.buffer(a.block), grads, FirstContribution(a.block));
  } else {
    lander_->FillSlot(r, bl, BlockKind::kDecoderLayer, grads);
  }
  mb.grad_y = grads.back();
  mb.saved[a.layer].reset();
  if (a.input_offloaded) offload_->MarkFree(a.layer, a.micro_batch);
  env_.timer.End(StreamKind::kCompute, token, PhaseTimer::kBackward);
  if (a.grad_to == GradTo::kResident) return ResidentGradDone(static_cast<size_t>(a.layer));
  slots_->Release(a.use);
  if (a.grad_to == GradTo::kSlotSum) {
    if (slot_sum_last) LandSlotSum(a, p);
    return;
  }
  if (a.grad_to == GradTo::kDeviceAccumulator) return AccumulatedGradDone(a.block);
  lander_->LandSlot(r, a.block);
}

std::vector<at::Tensor> StreamingExecutor::Impl::BackwardThroughKeptGraph(
    KeptGraph& graph, const at::Tensor& grad_y) {
  // Moved out: the graph's saved tensors go with the last reference.
  const KeptGraph kept = std::move(graph);
  graph = KeptGraph();
  return torch::autograd::grad({kept.output}, kept.inputs, {grad_y});
}

bool StreamingExecutor::Impl::SlotSum(const StepAction& a, PassState& p, BlockKind kind,
                                      const std::vector<at::Tensor>& grads) {
  const BlockLayout& bl = env_.layout.blocks[a.block];
  int& slot = p.open_grad_slot[a.block];
  const GradContributions::Mark mark = lander_->contributions().Count(a.block);
  if (mark.first) {
    slot = lander_->AcquireSlot();
    lander_->FillSlot(slot, bl, kind, grads);
  } else {
    lander_->AddToSlot(slot, bl, grads);
  }
  return mark.final;
}

void StreamingExecutor::Impl::LandSlotSum(const StepAction& a, PassState& p) {
  int& slot = p.open_grad_slot[a.block];
  lander_->LandSlotWhole(slot, a.block);
  slot = -1;
}

void StreamingExecutor::Impl::EmbeddingBackward(const StepAction& a, PassState& p) {
  if (a.grad_to != GradTo::kResident) {
    // On the host: scatter-add of d hidden_0 by token.
    lander_->LandEmbeddingRows(a.block, p.at(a.micro_batch).grad_y,
                               p.micro_batches[a.micro_batch].input_ids);
    p.EndMicroBatch(a.micro_batch);
    return;
  }
  // On the device (Note [Resident embedding]): the rows of d hidden_0
  // summed by token into the table's gradient, [V, C] fp32, accumulated
  // like a layer's.
  const int index = resident_->embedding_index();
  const int token = env_.timer.Begin(StreamKind::kCompute);
  const int64_t c = env_.config.hidden_size;
  AccumulateInto(
      env_.layout.blocks[a.block], resident_->grad(index),
      {at::embedding_dense_backward(p.at(a.micro_batch).grad_y.to(at::kFloat).reshape({-1, c}),
                                    p.at(a.micro_batch).input.ids, env_.config.vocab_size,
                                    env_.config.EmbeddingPaddingIdx(),
                                    /*scale_grad_by_freq=*/false)},
      FirstContribution(a.block));
  env_.timer.End(StreamKind::kCompute, token, PhaseTimer::kBackward);
  p.EndMicroBatch(a.micro_batch);
  ResidentGradDone(static_cast<size_t>(index));
}

void StreamingExecutor::Impl::AccumulatedGradDone(int64_t block) {
  if (lander_->contributions().Count(block).final) {
    lander_->LandWhole(block, accumulator_.buffer(block));
  }
}

void StreamingExecutor::Impl::ResidentGradDone(size_t index) {
  const int64_t block = resident_->blocks()[index];
  if (lander_->contributions().Count(block).final) {
    lander_->LandResidentNorm(block, resident_->grad(index));
  }
}

void StreamingExecutor::Impl::FillStats(size_t micro_batches, StepClock::time_point start,
                                        StepStats* stats) {
  PhaseTimer& timer = env_.timer;
  const auto seconds = timer.Seconds();
  stats->step_seconds = SecondsSince(start);
  stats->compute_seconds = seconds[static_cast<int>(StreamKind::kCompute)];
  stats->h2d_seconds = seconds[static_cast<int>(StreamKind::kH2D)];
  stats->d2h_seconds = seconds[static_cast<int>(StreamKind::kD2H)];
  stats->gpu_idle_seconds = std::max(0.0, stats->step_seconds - stats->compute_seconds);
  stats->optimizer_exposed_seconds = timer.WaitIdleSeconds();
  stats->gate_wait_seconds = env_.gate_wait_seconds;
  stats->grad_wait_seconds = env_.grad_wait_seconds;
  const std::array<double, 4> gaps = timer.ComputeGaps();
  stats->gap_start_seconds = gaps[0];
  stats->gap_forward_seconds = gaps[1];
  stats->gap_head_seconds = gaps[2];
  stats->gap_backward_seconds = gaps[3];
  stats->h2d_bytes = env_.h2d_bytes;
  stats->h2d_weight_bytes = env_.h2d_weight_bytes;
  stats->d2h_bytes = env_.d2h_bytes;
  stats->tokens = static_cast<int64_t>(micro_batches) * options_.micro_batch * options_.seq_len;
  stats->peak_device_bytes = env_.runtime->PeakAllocatedBytes();
  stats->cuda_graph_replays = graphs_->replays() - graph_replays_at_pass_start_;
}

void StreamingExecutor::Impl::ResetAfterError() {
  try {
    env_.runtime->Synchronize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain: executor reset: %s\n", e.what());
  }
  lander_->Reset();
  inputs_->EndPass();
}

StreamingExecutor::StreamingExecutor(std::unique_ptr<Impl> impl, const ExecutorOptions& options)
    : impl_(std::move(impl)), options_(options) {}

StreamingExecutor::~StreamingExecutor() = default;

absl::StatusOr<std::unique_ptr<StreamingExecutor>> StreamingExecutor::Create(
    HostStore* store, DeviceRuntime* runtime, ThreadPool* pool, const ExecutorOptions& options) {
  MEGATRAIN_RETURN_IF_ERROR(CheckExecutorBounds(store, options));
  MEGATRAIN_RETURN_IF_ERROR(CheckStoreMatchesOptions(store, options));
  auto impl = std::make_unique<Impl>(store, runtime, pool, options);
  MEGATRAIN_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<StreamingExecutor>(new StreamingExecutor(std::move(impl), options));
}

absl::StatusOr<ForwardBackwardResult> StreamingExecutor::ForwardBackward(
    absl::Span<const MicroBatch> micro_batches, const BlockFinalCallback& on_block_final,
    int64_t step, const BatchShare& share) {
  return impl_->Run(micro_batches, /*backward=*/true, step, share, on_block_final);
}

absl::StatusOr<ForwardBackwardResult> StreamingExecutor::Evaluate(
    absl::Span<const MicroBatch> micro_batches) {
  return impl_->Run(micro_batches, /*backward=*/false, /*step=*/0, {}, {});
}

void StreamingExecutor::SetWeightGate(std::function<void(int64_t)> gate) {
  impl_->SetWeightGate(std::move(gate));
}

void StreamingExecutor::SetDeviceReduction(
    std::function<bool(int64_t, float*, int64_t, int64_t*, int64_t*)> reduce) {
  impl_->SetDeviceReduction(std::move(reduce));
}

void StreamingExecutor::SetWeightGather(std::function<void(int64_t, void*, int64_t, int)> gather) {
  impl_->SetWeightGather(std::move(gather));
}

void StreamingExecutor::SetResidentReduction(std::function<bool(int64_t, float*, int64_t)> reduce) {
  impl_->SetResidentReduction(std::move(reduce));
}

void StreamingExecutor::AssumeEmbeddingGradZero(bool zero) { impl_->AssumeEmbeddingGradZero(zero); }

void StreamingExecutor::SetEmbeddingRowGate(EmbeddingRowGate gate) {
  impl_->SetEmbeddingRowGate(std::move(gate));
}

absl::StatusOr<std::vector<float>> StreamingExecutor::Logits(const MicroBatch& micro_batch) {
  std::vector<float> logits;
  MEGATRAIN_RETURN_IF_ERROR(impl_
                                ->Run(absl::MakeConstSpan(&micro_batch, 1), /*backward=*/false,
                                      /*step=*/0, {}, {}, &logits)
                                .status());
  return logits;
}

absl::Status StreamingExecutor::ScheduleResidentUpdate(const AdamWStepParams& hp,
                                                       std::vector<bool> apply) {
  return impl_->resident().Schedule(hp, std::move(apply));
}

absl::Status StreamingExecutor::SyncResidentToStore(bool grads) {
  return impl_->resident().SyncToStore(grads);
}

absl::Status StreamingExecutor::LoadResidentFromStore() {
  return impl_->resident().LoadFromStore();
}

const std::vector<int64_t>& StreamingExecutor::resident_blocks() const {
  return impl_->resident().blocks();
}

int64_t StreamingExecutor::slot_device_bytes() const { return impl_->slot_device_bytes(); }
int64_t StreamingExecutor::staging_host_bytes() const { return impl_->staging_host_bytes(); }

}  // namespace megatrain::engine
