// The order of work of one executor pass, as data: a list of per-block
// actions built by PlanStep from the pass's options and run, one by one,
// by StreamingExecutor (executor.cc). A new order of work (for example
// layer-major, every micro-batch through one layer before the next) is a
// new planner, not a new branch in the executor's loop.
//
// Note [Step plan]
// A plan is a pure function of the model layout and the pass options: it
// allocates nothing and touches no device. It fixes
//   * the actions, in enqueue order (kUpload, kForward per layer,
//     kPrefetchInput, kHead, kBackward per layer, kEmbeddingBackward, per
//     micro-batch in the default layer-major-per-micro-batch schedule);
//   * where each action reads its weights (a device weight slot, by its
//     index in `weight_uses`, or a resident block) and where its gradient
//     goes (a host landing through a gradient slot, the device
//     accumulator, or a resident block's gradient);
//   * the number of gradient contributions every block receives, so that
//     the executor knows a block's first and last contribution of the pass.
// The executor must issue device work in exactly the plan's order: stream
// order on kH2D (weight loads interleaved with activation prefetches) and
// the ring of gradient slots follow it.
//
// Note [Layer-major schedule]
// StepSchedule::kLayerMajor (issue 16) runs the micro-batches of a step in
// waves of W (StepPlanOptions::wave): upload every micro-batch of the
// wave, then each layer forward for all of them before the next layer,
// the head for each, each layer backward (L-1 down to 0) for all of them,
// and the embedding backward for each. A streamed layer is then fetched
// once per wave for forward and once for backward (consecutive uses of a
// block share one load, AssignWeightSlots), instead of once per
// micro-batch: with W = A the H2D bytes of a step are those of one
// micro-batch-major pass. Every block still receives its contributions in
// micro-batch order (m0, m1, ... within a wave, waves in order), so the
// fp32 sums are those of micro-batch-major bit for bit, with one exception:
// a tied embedding sums its lm_head parts (in the head) and its row parts
// (after layer 0) in a different order (equal to rounding). With one wave
// (W >= micro_batches > 1) a streamed block's W contributions are
// consecutive and are summed in one gradient slot (GradTo::kSlotSum, the
// device accumulator's adds) before landing once: the device holds a
// gradient buffer only for the block in flight. The saved layer inputs of
// the wave ([W, L] x [B, T, C] fp32) stay on the device, or with
// offload_activations go to pinned host memory ((L-1) x W host slots; the
// backward brings each back one action ahead into the ring of two).
//
// Thread-safety: plain values; PlanStep is thread-compatible.
#ifndef MEGATRAIN_ENGINE_STEP_STEP_PLAN_H_
#define MEGATRAIN_ENGINE_STEP_STEP_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/param_layout.h"
#include "engine/spec/step_schedule.h"  // StepSchedule, StepScheduleName

namespace megatrain::engine {

// What the options of one pass ask for (ExecutorOptions plus the pass).
struct StepPlanOptions {
  int micro_batches = 1;         // M >= 1
  bool backward = true;          // false: forward and loss only
  bool tied_embeddings = false;  // lm_head is the embedding table
  int64_t resident_layers = 0;   // decoder layers 0..N-1 on the device
  // Resident decoder layers 0..K-1 (K <= resident_layers) whose forward
  // keeps its autograd graph for backward (Note [Kept layer graphs] in
  // executor.h); not with offload_activations.
  int64_t kept_graph_layers = 0;
  bool resident_embedding = false;        // embedding table on the device
  bool offload_activations = false;       // Note [Activation offload] in executor.h
  bool device_grad_accumulation = false;  // in this pass (M > 1 and buffers allocated)
  StepSchedule schedule = StepSchedule::kMicroBatchMajor;
  int wave = 0;  // layer-major: micro-batches per wave, <= 0 = all M of the pass
};

enum class ActionKind {
  kUpload,             // gather (or upload ids of) micro-batch m's input rows
  kForward,            // layer forward, no autograd; may save or offload its input
  kPrefetchInput,      // bring an offloaded layer input back (before the head)
  kHead,               // final norm, lm_head, loss (and its backward)
  kBackward,           // recompute a layer with local autograd (or take its kept
                       // graph), then backward
  kEmbeddingBackward,  // d hidden_0 into the embedding's gradient
};

// Where an action reads a block's weights.
enum class WeightsFrom {
  kSlot,       // a device weight slot (streamed)
  kResident,   // the resident block's device copy
  kHostStore,  // the store's fp32 master on the host (the embedding gather)
};

// Where a block's gradient contribution goes (Notes [Gradient landing] in
// executor.cc, [Device gradient accumulation] and [Resident layers] in
// executor.h).
enum class GradTo {
  kNone,               // no backward
  kHost,               // a gradient slot, D2H, into the store (added on the host)
  kDeviceAccumulator,  // summed on the device; lands once, at the last contribution
  kResident,           // a resident block's device gradient
  kSlotSum,            // layer-major, one wave: summed in one gradient slot over the
                       // block's consecutive contributions; lands once, at the last
};

// What a forward does with its layer input (activation checkpointing), or
// kGraph: it runs under autograd and keeps the whole graph for backward
// (Note [Kept layer graphs] in executor.h).
enum class SaveInput { kNone, kKeep, kOffload, kGraph };

struct StepAction {
  ActionKind kind = ActionKind::kUpload;
  int micro_batch = 0;  // index into the pass's micro-batches
  int64_t layer = -1;   // decoder layer (kForward, kBackward, kPrefetchInput)
  int64_t block = -1;   // the block whose weights / gradient it uses
  WeightsFrom weights = WeightsFrom::kSlot;
  int use = -1;                       // index into StepPlan::weight_uses (kSlot), else -1
  int tied_use = -1;                  // kHead, tied embeddings: the embedding table's use
  SaveInput save = SaveInput::kNone;  // kForward
  GradTo grad_to = GradTo::kNone;     // kHead (head block), kBackward, kEmbeddingBackward
  int64_t prefetch_layer = -1;        // kBackward: offloaded input brought back meanwhile
  int prefetch_micro_batch = -1;      // kBackward: the micro-batch of prefetch_layer's input
  bool input_offloaded = false;       // kBackward: its input comes back from host memory
  bool from_graph = false;            // kBackward: through the forward's kept graph
  bool last_layer = false;            // kForward: the last decoder layer
};

struct StepPlan {
  std::vector<StepAction> actions;
  // Blocks read from device weight slots, in the order of their uses (an
  // action's `use` indexes this); see AssignWeightSlots.
  std::vector<int64_t> weight_uses;
  // Per block: gradient contributions in the pass (micro_batches, twice
  // that for a tied embedding; meaningful only with backward).
  std::vector<int64_t> contributions;
};

// The plan of `options.schedule`. Micro-batch-major (the default): for each
// micro-batch, upload, forward through the layers, the head, backward
// through the layers in reverse, the embedding backward (Note [Streaming
// pipeline] in executor.h). Layer-major: Note [Layer-major schedule].
// Resident layers have no weight uses. kPrefetchInput and prefetch_layer
// name an offloaded input by (layer, micro-batch); its host slot is
// (micro_batch % wave, layer). Preconditions (checked by
// StreamingExecutor::Create): resident_layers in [0, L]; resident_embedding
// only untied.
StepPlan PlanStep(const ModelLayout& layout, const StepPlanOptions& options);

// One use of a block's weights on the device.
struct WeightSlotUse {
  int64_t block = 0;
  int slot = 0;        // device weight slot
  bool load = false;   // copy host -> slot before the use
  int prev_user = -1;  // previous use of the same slot, -1 if none
};

// Assigns `num_slots` device slots to the uses `blocks` (in use order): a
// block still in a slot is reused, otherwise the next slot of the ring is
// loaded.
std::vector<WeightSlotUse> AssignWeightSlots(const std::vector<int64_t>& blocks, int num_slots);

// A one-line-per-action rendering, for tests and debugging
// ("m0 forward L1 slot use 0 keep").
std::string DescribePlan(const StepPlan& plan);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_STEP_PLAN_H_
