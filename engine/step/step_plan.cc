// The step schedules (Notes [Step plan] and [Layer-major schedule] in
// step_plan.h).
#include "engine/step/step_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {
namespace {

// Builds the actions of a pass and appends their weight uses: Plan(m) is
// one micro-batch of the micro-batch-major schedule, PlanWave the
// layer-major one (Note [Layer-major schedule] in step_plan.h).
class Planner {
 public:
  Planner(const ModelLayout& layout, const StepPlanOptions& options, StepPlan* plan)
      : layout_(layout), options_(options), plan_(plan) {}

  void Plan(int m) {
    Add(Upload(m));
    const int64_t num_layers = layout_.num_layers();
    for (int64_t l = 0; l < num_layers; ++l) Add(Forward(m, l));
    // The input of the first offloaded layer backward needs comes back
    // during the head.
    if (options_.backward && Offloaded(num_layers - 2)) {
      StepAction a = Action(ActionKind::kPrefetchInput, m);
      a.layer = num_layers - 2;
      Add(a);
    }
    Add(Head(m, /*slot_sum=*/false));
    if (!options_.backward) return;
    for (int64_t l = num_layers - 1; l >= 0; --l) {
      StepAction a = Backward(m, l, /*slot_sum=*/false);
      // One layer ahead: the next layer's offloaded input comes back while
      // this layer's backward runs (layer L-2's came back during the head).
      if (l < num_layers - 1 && Offloaded(l - 1)) {
        a.prefetch_layer = l - 1;
        a.prefetch_micro_batch = m;
      }
      Add(a);
    }
    Add(EmbeddingBackward(m));
  }

  // Micro-batches [begin, end) layer by layer. `slot_sum`: the wave is the
  // whole pass, so a block's contributions are consecutive (GradTo::kSlotSum).
  void PlanWave(int begin, int end, bool slot_sum) {
    const int64_t num_layers = layout_.num_layers();
    for (int m = begin; m < end; ++m) Add(Upload(m));
    for (int64_t l = 0; l < num_layers; ++l) {
      for (int m = begin; m < end; ++m) Add(Forward(m, l));
    }
    for (int m = begin; m < end; ++m) Add(Head(m, slot_sum));
    if (!options_.backward) return;
    // Each backward brings back the next backward's offloaded input (one
    // action ahead; the ring of two alternates).
    std::vector<StepAction> backward;
    for (int64_t l = num_layers - 1; l >= 0; --l) {
      for (int m = begin; m < end; ++m) backward.push_back(Backward(m, l, slot_sum));
    }
    for (size_t i = 0; i + 1 < backward.size(); ++i) {
      const StepAction& next = backward[i + 1];
      if (!next.input_offloaded) continue;
      backward[i].prefetch_layer = next.layer;
      backward[i].prefetch_micro_batch = next.micro_batch;
    }
    for (const StepAction& a : backward) Add(a);
    for (int m = begin; m < end; ++m) Add(EmbeddingBackward(m));
  }

 private:
  StepAction Upload(int m) {
    StepAction a = Action(ActionKind::kUpload, m);
    a.block = layout_.embedding_block();
    a.weights = options_.resident_embedding ? WeightsFrom::kResident : WeightsFrom::kHostStore;
    return a;
  }
  StepAction Forward(int m, int64_t l) {
    StepAction a = LayerAction(ActionKind::kForward, m, l);
    a.save = !options_.backward ? SaveInput::kNone
             : KeptGraph(l)     ? SaveInput::kGraph
             : Offloaded(l)     ? SaveInput::kOffload
                                : SaveInput::kKeep;
    a.last_layer = l + 1 == layout_.num_layers();
    return a;
  }
  StepAction Head(int m, bool slot_sum) {
    StepAction head = Action(ActionKind::kHead, m);
    head.block = layout_.head_block();
    // A resident tied table is read on the device (Note [Resident embedding]).
    if (options_.tied_embeddings && !options_.resident_embedding) {
      head.tied_use = Use(layout_.embedding_block());
    }
    head.use = Use(head.block);
    // Tied: the lm_head landings between the heads need the other gradient
    // slot, so the head block does not hold one across them.
    head.grad_to = !options_.backward                      ? GradTo::kNone
                   : slot_sum && !options_.tied_embeddings ? GradTo::kSlotSum
                                                           : StreamedGradTo();
    return head;
  }
  StepAction Backward(int m, int64_t l, bool slot_sum) {
    StepAction a = LayerAction(ActionKind::kBackward, m, l);
    a.grad_to = a.weights == WeightsFrom::kResident ? GradTo::kResident
                : slot_sum                          ? GradTo::kSlotSum
                                                    : StreamedGradTo();
    a.input_offloaded = Offloaded(l);
    a.from_graph = KeptGraph(l);
    return a;
  }
  StepAction EmbeddingBackward(int m) {
    StepAction emb = Action(ActionKind::kEmbeddingBackward, m);
    emb.block = layout_.embedding_block();
    emb.weights = options_.resident_embedding ? WeightsFrom::kResident : WeightsFrom::kHostStore;
    emb.grad_to = options_.resident_embedding ? GradTo::kResident : GradTo::kHost;
    return emb;
  }
  GradTo StreamedGradTo() const {
    return options_.device_grad_accumulation ? GradTo::kDeviceAccumulator : GradTo::kHost;
  }
  bool KeptGraph(int64_t layer) const {
    return options_.backward &&
           layer < std::min(options_.kept_graph_layers, options_.resident_layers);
  }
  bool Offloaded(int64_t layer) const {
    return options_.offload_activations && layer >= 0 && layer < layout_.num_layers() - 1;
  }
  static StepAction Action(ActionKind kind, int m) {
    StepAction a;
    a.kind = kind;
    a.micro_batch = m;
    return a;
  }
  // A decoder layer's action: resident layers read their own weights.
  StepAction LayerAction(ActionKind kind, int m, int64_t layer) {
    StepAction a = Action(kind, m);
    a.layer = layer;
    a.block = layout_.layer_block(layer);
    if (layer < options_.resident_layers) {
      a.weights = WeightsFrom::kResident;
    } else {
      a.use = Use(a.block);
    }
    return a;
  }
  int Use(int64_t block) {
    plan_->weight_uses.push_back(block);
    return static_cast<int>(plan_->weight_uses.size()) - 1;
  }
  void Add(const StepAction& a) { plan_->actions.push_back(a); }

  const ModelLayout& layout_;
  const StepPlanOptions& options_;
  StepPlan* plan_;
};

const char* KindName(ActionKind kind) {
  switch (kind) {
    case ActionKind::kUpload:
      return "upload";
    case ActionKind::kForward:
      return "forward";
    case ActionKind::kPrefetchInput:
      return "prefetch";
    case ActionKind::kHead:
      return "head";
    case ActionKind::kBackward:
      return "backward";
    case ActionKind::kEmbeddingBackward:
      return "embedding-backward";
  }
  return "?";
}

const char* GradName(GradTo to) {
  switch (to) {
    case GradTo::kNone:
      return "";
    case GradTo::kHost:
      return " grad:host";
    case GradTo::kDeviceAccumulator:
      return " grad:device-acc";
    case GradTo::kResident:
      return " grad:resident";
    case GradTo::kSlotSum:
      return " grad:slot-sum";
  }
  return "?";
}

}  // namespace

StepPlan PlanStep(const ModelLayout& layout, const StepPlanOptions& options) {
  StepPlan plan;
  Planner planner(layout, options, &plan);
  const int m_count = options.micro_batches;
  if (options.schedule == StepSchedule::kLayerMajor) {
    const int wave = options.wave <= 0 ? m_count : std::min(options.wave, m_count);
    const bool slot_sum = options.backward && wave == m_count && m_count > 1;
    for (int begin = 0; begin < m_count; begin += wave) {
      planner.PlanWave(begin, std::min(begin + wave, m_count), slot_sum);
    }
  } else {
    for (int m = 0; m < m_count; ++m) planner.Plan(m);
  }
  plan.contributions.assign(layout.blocks.size(), options.micro_batches);
  if (options.tied_embeddings) plan.contributions[layout.embedding_block()] *= 2;
  return plan;
}

std::vector<WeightSlotUse> AssignWeightSlots(const std::vector<int64_t>& blocks, int num_slots) {
  std::vector<int64_t> content(num_slots, -1);
  std::vector<int> last_user(num_slots, -1);
  std::vector<WeightSlotUse> uses;
  int ring = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    WeightSlotUse use;
    use.block = blocks[i];
    int slot = -1;
    for (int s = 0; s < num_slots; ++s) {
      if (content[s] == use.block) slot = s;
    }
    if (slot < 0) {
      slot = ring;
      ring = (ring + 1) % num_slots;
      use.load = true;
      content[slot] = use.block;
    }
    use.slot = slot;
    use.prev_user = last_user[slot];
    last_user[slot] = static_cast<int>(i);
    uses.push_back(use);
  }
  return uses;
}

std::string DescribePlan(const StepPlan& plan) {
  std::string out;
  for (const StepAction& a : plan.actions) {
    absl::StrAppend(&out, "m", a.micro_batch, " ", KindName(a.kind));
    if (a.layer >= 0) absl::StrAppend(&out, " L", a.layer);
    if (a.kind == ActionKind::kHead || a.kind == ActionKind::kEmbeddingBackward ||
        a.kind == ActionKind::kUpload) {
      absl::StrAppend(&out, " B", a.block);
    }
    if (a.tied_use >= 0) absl::StrAppend(&out, " tied-use", a.tied_use);
    if (a.use >= 0) absl::StrAppend(&out, " use", a.use);
    if (a.weights == WeightsFrom::kResident) absl::StrAppend(&out, " resident");
    if (a.weights == WeightsFrom::kHostStore) absl::StrAppend(&out, " host");
    if (a.save == SaveInput::kKeep) absl::StrAppend(&out, " keep");
    if (a.save == SaveInput::kOffload) absl::StrAppend(&out, " offload");
    if (a.save == SaveInput::kGraph || a.from_graph) absl::StrAppend(&out, " graph");
    absl::StrAppend(&out, GradName(a.grad_to));
    if (a.prefetch_layer >= 0) {
      absl::StrAppend(&out, " prefetch L", a.prefetch_layer);
      if (a.prefetch_micro_batch != a.micro_batch) {
        absl::StrAppend(&out, " m", a.prefetch_micro_batch);
      }
    }
    if (a.input_offloaded) absl::StrAppend(&out, " from-host");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace megatrain::engine
