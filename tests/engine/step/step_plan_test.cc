// The step planner (engine/step/step_plan.h): the exact plan of the
// default schedule in a few modes, and for every option combination the
// invariants the executor relies on, checked against an independent
// statement of the legacy block-use order.
#include "engine/step/step_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/parity.h"

namespace megatrain::engine {
namespace {

ModelLayout Layout(int64_t layers, bool tied) {
  ModelConfig config = testing::SmallLlama();
  config.num_hidden_layers = layers;
  config.tie_word_embeddings = tied;
  return ModelLayout::Create(config);
}

TEST(StepPlanTest, PlainPassIsForwardHeadBackwardEmbeddingPerMicroBatch) {
  const ModelLayout layout = Layout(2, /*tied=*/false);
  StepPlanOptions o;
  const StepPlan plan = PlanStep(layout, o);
  EXPECT_EQ(DescribePlan(plan),
            "m0 upload B0 host\n"
            "m0 forward L0 use0 keep\n"
            "m0 forward L1 use1 keep\n"
            "m0 head B3 use2 grad:host\n"
            "m0 backward L1 use3 grad:host\n"
            "m0 backward L0 use4 grad:host\n"
            "m0 embedding-backward B0 host grad:host\n");
  EXPECT_THAT(plan.weight_uses, ::testing::ElementsAre(1, 2, 3, 2, 1));
  EXPECT_THAT(plan.contributions, ::testing::ElementsAre(1, 1, 1, 1));
}

TEST(StepPlanTest, EvaluationHasNoBackwardAndSavesNothing) {
  const ModelLayout layout = Layout(2, /*tied=*/true);
  StepPlanOptions o;
  o.backward = false;
  o.tied_embeddings = true;
  o.micro_batches = 2;
  EXPECT_EQ(DescribePlan(PlanStep(layout, o)),
            "m0 upload B0 host\n"
            "m0 forward L0 use0\n"
            "m0 forward L1 use1\n"
            "m0 head B3 tied-use2 use3\n"
            "m1 upload B0 host\n"
            "m1 forward L0 use4\n"
            "m1 forward L1 use5\n"
            "m1 head B3 tied-use6 use7\n");
}

TEST(StepPlanTest, OffloadPrefetchesOneLayerAheadAndResidentLayersHaveNoUses) {
  const ModelLayout layout = Layout(4, /*tied=*/false);
  StepPlanOptions o;
  o.offload_activations = true;
  o.resident_layers = 1;
  o.resident_embedding = true;
  o.device_grad_accumulation = true;
  o.micro_batches = 2;
  const StepPlan plan = PlanStep(layout, o);
  const std::string m0 =
      "m0 upload B0 resident\n"
      "m0 forward L0 resident offload\n"
      "m0 forward L1 use0 offload\n"
      "m0 forward L2 use1 offload\n"
      "m0 forward L3 use2 keep\n"
      "m0 prefetch L2\n"
      "m0 head B5 use3 grad:device-acc\n"
      "m0 backward L3 use4 grad:device-acc\n"
      "m0 backward L2 use5 grad:device-acc prefetch L1 from-host\n"
      "m0 backward L1 use6 grad:device-acc prefetch L0 from-host\n"
      "m0 backward L0 resident grad:resident from-host\n"
      "m0 embedding-backward B0 resident grad:resident\n";
  EXPECT_EQ(DescribePlan(plan).substr(0, m0.size()), m0);
  EXPECT_EQ(plan.weight_uses.size(), 14u);  // 7 per micro-batch
  EXPECT_THAT(plan.contributions, ::testing::Each(2));
}

// Note [Kept layer graphs] in executor.h: the kept resident layers run
// their forward under autograd and their backward through it; the others
// save their input as before, and evaluation keeps nothing.
TEST(StepPlanTest, KeptGraphLayersForwardWithGraphAndBackwardThroughIt) {
  const ModelLayout layout = Layout(3, /*tied=*/false);
  StepPlanOptions o;
  o.resident_layers = 2;
  o.kept_graph_layers = 1;
  EXPECT_EQ(DescribePlan(PlanStep(layout, o)),
            "m0 upload B0 host\n"
            "m0 forward L0 resident graph\n"
            "m0 forward L1 resident keep\n"
            "m0 forward L2 use0 keep\n"
            "m0 head B4 use1 grad:host\n"
            "m0 backward L2 use2 grad:host\n"
            "m0 backward L1 resident grad:resident\n"
            "m0 backward L0 resident graph grad:resident\n"
            "m0 embedding-backward B0 host grad:host\n");
  o.kept_graph_layers = 3;  // capped at the resident layers
  const std::string plan = DescribePlan(PlanStep(layout, o));
  EXPECT_THAT(plan, ::testing::HasSubstr("m0 forward L1 resident graph\n"));
  EXPECT_THAT(plan, ::testing::HasSubstr("m0 forward L2 use0 keep\n"));
  o.backward = false;
  EXPECT_THAT(DescribePlan(PlanStep(layout, o)), ::testing::Not(::testing::HasSubstr("graph")));
}

TEST(StepPlanTest, TiedEmbeddingCountsTwoContributionsPerMicroBatch) {
  const ModelLayout layout = Layout(2, /*tied=*/true);
  StepPlanOptions o;
  o.tied_embeddings = true;
  o.micro_batches = 3;
  const StepPlan plan = PlanStep(layout, o);
  EXPECT_THAT(plan.contributions, ::testing::ElementsAre(6, 3, 3, 3));
}

// The block uses of the executor before the plan existed (Note [Streaming
// pipeline]): per micro-batch the streamed layers forward, the embedding
// when tied, the head, and with backward the streamed layers in reverse.
std::vector<int64_t> LegacyUses(const ModelLayout& layout, const StepPlanOptions& o) {
  std::vector<int64_t> blocks;
  const int64_t layers = layout.num_layers();
  for (int m = 0; m < o.micro_batches; ++m) {
    for (int64_t l = o.resident_layers; l < layers; ++l) blocks.push_back(layout.layer_block(l));
    if (o.tied_embeddings) blocks.push_back(layout.embedding_block());
    blocks.push_back(layout.head_block());
    if (!o.backward) continue;
    for (int64_t l = layers - 1; l >= o.resident_layers; --l)
      blocks.push_back(layout.layer_block(l));
  }
  return blocks;
}

// Checks the invariants of one plan; returns "" or the first violation.
std::string CheckInvariants(const ModelLayout& layout, const StepPlanOptions& o,
                            const StepPlan& plan) {
  if (plan.weight_uses != LegacyUses(layout, o)) return "weight uses differ from the legacy order";
  int next_use = 0;  // uses appear in order, each once (tied_use before use)
  std::vector<std::vector<int>> prefetched(o.micro_batches,
                                           std::vector<int>(layout.num_layers(), 0));
  for (const StepAction& a : plan.actions) {
    const std::string where = absl::StrCat("m", a.micro_batch, " L", a.layer, ": ");
    if (a.tied_use >= 0 && a.tied_use != next_use++) return where + "tied use out of order";
    if (a.use >= 0 && a.use != next_use++) return where + "use out of order";
    const bool resident_layer = a.layer >= 0 && a.layer < o.resident_layers;
    if ((a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward) &&
        resident_layer != (a.weights == WeightsFrom::kResident)) {
      return where + "weights source";
    }
    if (a.kind == ActionKind::kBackward) {
      const GradTo want = resident_layer               ? GradTo::kResident
                          : o.device_grad_accumulation ? GradTo::kDeviceAccumulator
                                                       : GradTo::kHost;
      if (a.grad_to != want) return where + "gradient sink";
      const bool offloaded = o.offload_activations && a.layer < layout.num_layers() - 1;
      if (a.input_offloaded != offloaded) return where + "input_offloaded";
      if (offloaded && prefetched[a.micro_batch][a.layer] != 1) return where + "not prefetched";
    }
    const int64_t p = a.kind == ActionKind::kPrefetchInput ? a.layer : a.prefetch_layer;
    if (p >= 0 && ++prefetched[a.micro_batch][p] > 1) return where + "prefetched twice";
    if (a.kind == ActionKind::kForward && o.backward &&
        (a.save == SaveInput::kOffload) !=
            (o.offload_activations && a.layer < layout.num_layers() - 1)) {
      return where + "offload choice";
    }
    if (a.kind == ActionKind::kForward && !o.backward && a.save != SaveInput::kNone) {
      return where + "saves without backward";
    }
  }
  if (next_use != static_cast<int>(plan.weight_uses.size())) return "unused weight uses";
  return "";
}

TEST(StepPlanTest, EveryOptionCombinationKeepsTheInvariants) {
  int plans = 0;
  for (const int64_t layers : {1, 2, 4}) {
    for (const bool tied : {false, true}) {
      const ModelLayout layout = Layout(layers, tied);
      for (int bits = 0; bits < 32; ++bits) {
        StepPlanOptions o;
        o.tied_embeddings = tied;
        o.backward = bits & 1;
        o.offload_activations = bits & 2;
        o.resident_embedding = (bits & 4) && !tied;
        o.device_grad_accumulation = (bits & 8) && o.backward;
        o.micro_batches = bits & 16 ? 3 : 1;
        for (const int64_t resident : {int64_t{0}, int64_t{1}, layers}) {
          o.resident_layers = resident;
          SCOPED_TRACE(absl::StrCat("layers ", layers, " tied ", tied, " bits ", bits, " resident ",
                                    resident));
          const StepPlan plan = PlanStep(layout, o);
          EXPECT_EQ(CheckInvariants(layout, o, plan), "");
          ++plans;
        }
      }
    }
  }
  EXPECT_EQ(plans, 3 * 2 * 32 * 3);
}

// Device weight loads of a plan with three slots.
int Loads(const StepPlan& plan) {
  int loads = 0;
  for (const WeightSlotUse& u : AssignWeightSlots(plan.weight_uses, 3)) loads += u.load;
  return loads;
}

// Note [Layer-major schedule]: every micro-batch through a layer before
// the next; consecutive uses of a block share one load.
TEST(StepPlanTest, LayerMajorRunsEveryMicroBatchThroughALayerBeforeTheNext) {
  const ModelLayout layout = Layout(2, /*tied=*/false);
  StepPlanOptions o;
  o.schedule = StepSchedule::kLayerMajor;
  o.micro_batches = 2;
  const StepPlan plan = PlanStep(layout, o);
  EXPECT_EQ(DescribePlan(plan),
            "m0 upload B0 host\n"
            "m1 upload B0 host\n"
            "m0 forward L0 use0 keep\n"
            "m1 forward L0 use1 keep\n"
            "m0 forward L1 use2 keep\n"
            "m1 forward L1 use3 keep\n"
            "m0 head B3 use4 grad:slot-sum\n"
            "m1 head B3 use5 grad:slot-sum\n"
            "m0 backward L1 use6 grad:slot-sum\n"
            "m1 backward L1 use7 grad:slot-sum\n"
            "m0 backward L0 use8 grad:slot-sum\n"
            "m1 backward L0 use9 grad:slot-sum\n"
            "m0 embedding-backward B0 host grad:host\n"
            "m1 embedding-backward B0 host grad:host\n");
  EXPECT_THAT(plan.contributions, ::testing::ElementsAre(2, 2, 2, 2));
  // L0, L1 and the head, once each (both layers are still in their slots
  // for backward): the loads of one micro-batch-major micro-batch.
  EXPECT_EQ(Loads(plan), 3);
}

TEST(StepPlanTest, LayerMajorWavesOffloadAndPrefetchOneActionAhead) {
  const ModelLayout layout = Layout(3, /*tied=*/false);
  StepPlanOptions o;
  o.schedule = StepSchedule::kLayerMajor;
  o.micro_batches = 3;
  o.wave = 2;
  o.offload_activations = true;
  o.device_grad_accumulation = true;
  const StepPlan plan = PlanStep(layout, o);
  const std::string wave0 =
      "m0 upload B0 host\n"
      "m1 upload B0 host\n"
      "m0 forward L0 use0 offload\n"
      "m1 forward L0 use1 offload\n"
      "m0 forward L1 use2 offload\n"
      "m1 forward L1 use3 offload\n"
      "m0 forward L2 use4 keep\n"
      "m1 forward L2 use5 keep\n"
      "m0 head B4 use6 grad:device-acc\n"
      "m1 head B4 use7 grad:device-acc\n"
      "m0 backward L2 use8 grad:device-acc\n"
      "m1 backward L2 use9 grad:device-acc prefetch L1 m0\n"
      "m0 backward L1 use10 grad:device-acc prefetch L1 m1 from-host\n"
      "m1 backward L1 use11 grad:device-acc prefetch L0 m0 from-host\n"
      "m0 backward L0 use12 grad:device-acc prefetch L0 m1 from-host\n"
      "m1 backward L0 use13 grad:device-acc from-host\n"
      "m0 embedding-backward B0 host grad:host\n"
      "m1 embedding-backward B0 host grad:host\n"
      "m2 upload B0 host\n";
  EXPECT_EQ(DescribePlan(plan).substr(0, wave0.size()), wave0);
  EXPECT_THAT(plan.contributions, ::testing::Each(3));
}

// Invariants of a layer-major plan: the legacy plan's actions per
// micro-batch in some order, every block's gradient contributions in
// micro-batch order (what makes the sums bit-identical), offloaded inputs
// prefetched exactly once before their backward, slot sums only with one
// wave, and the weights loaded once per wave.
std::string CheckLayerMajor(const ModelLayout& layout, const StepPlanOptions& o,
                            const StepPlan& plan) {
  StepPlanOptions legacy_options = o;
  legacy_options.schedule = StepSchedule::kMicroBatchMajor;
  const StepPlan legacy = PlanStep(layout, legacy_options);
  // The same actions but the prefetches (layer-major issues them all from
  // backward actions).
  auto count = [](const StepPlan& p) {
    return std::count_if(p.actions.begin(), p.actions.end(),
                         [](const StepAction& a) { return a.kind != ActionKind::kPrefetchInput; });
  };
  if (count(plan) != count(legacy)) return "action count";
  if (plan.contributions != legacy.contributions) return "contributions";
  const int wave = o.wave <= 0 ? o.micro_batches : std::min(o.wave, o.micro_batches);
  const bool one_wave = wave == o.micro_batches && o.micro_batches > 1 && o.backward;
  std::vector<int> last_m(layout.blocks.size(), -1);
  std::vector<std::vector<int>> prefetched(o.micro_batches,
                                           std::vector<int>(layout.num_layers(), 0));
  int next_use = 0;
  for (const StepAction& a : plan.actions) {
    const std::string where = absl::StrCat("m", a.micro_batch, " L", a.layer, ": ");
    if (a.tied_use >= 0 && a.tied_use != next_use++) return where + "tied use out of order";
    if (a.use >= 0 && a.use != next_use++) return where + "use out of order";
    if (a.grad_to != GradTo::kNone && a.kind != ActionKind::kEmbeddingBackward) {
      if (a.micro_batch < last_m[a.block]) return where + "contribution out of micro-batch order";
      last_m[a.block] = a.micro_batch;
    }
    if ((a.grad_to == GradTo::kSlotSum) && (!one_wave || a.weights == WeightsFrom::kResident ||
                                            (o.tied_embeddings && a.kind == ActionKind::kHead))) {
      return where + "slot sum";
    }
    if (one_wave && a.kind == ActionKind::kBackward && a.weights == WeightsFrom::kSlot &&
        a.grad_to != GradTo::kSlotSum) {
      return where + "streamed layer without a slot sum in one wave";
    }
    if (a.kind == ActionKind::kBackward && a.input_offloaded &&
        prefetched[a.micro_batch][a.layer] != 1) {
      return where + "not prefetched";
    }
    const int64_t p = a.kind == ActionKind::kPrefetchInput ? a.layer : a.prefetch_layer;
    const int pm = a.kind == ActionKind::kPrefetchInput ? a.micro_batch : a.prefetch_micro_batch;
    if (p >= 0 && ++prefetched[pm][p] > 1) return where + "prefetched twice";
    if (p >= 0 && pm / wave != a.micro_batch / wave) return where + "prefetch across waves";
  }
  if (next_use != static_cast<int>(plan.weight_uses.size())) return "unused weight uses";
  // The weights cross the link once per wave: as many loads as a
  // micro-batch-major pass of one micro-batch per wave.
  StepPlanOptions per_wave = legacy_options;
  per_wave.micro_batches = (o.micro_batches + wave - 1) / wave;
  if (Loads(plan) != Loads(PlanStep(layout, per_wave))) {
    return absl::StrCat("loads ", Loads(plan), ", want ", Loads(PlanStep(layout, per_wave)));
  }
  return "";
}

TEST(StepPlanTest, LayerMajorKeepsTheInvariantsInEveryCombination) {
  int plans = 0;
  for (const int64_t layers : {1, 2, 4}) {
    for (const bool tied : {false, true}) {
      const ModelLayout layout = Layout(layers, tied);
      for (int bits = 0; bits < 16; ++bits) {
        for (const int micro_batches : {1, 3, 4}) {
          for (const int wave : {0, 1, 2, 3}) {
            StepPlanOptions o;
            o.schedule = StepSchedule::kLayerMajor;
            o.tied_embeddings = tied;
            o.backward = bits & 1;
            o.offload_activations = bits & 2;
            o.resident_embedding = (bits & 4) && !tied;
            o.device_grad_accumulation = (bits & 8) && o.backward;
            o.micro_batches = micro_batches;
            o.wave = wave;
            o.resident_layers = layers > 1 ? 1 : 0;
            SCOPED_TRACE(absl::StrCat("layers ", layers, " tied ", tied, " bits ", bits, " M ",
                                      micro_batches, " wave ", wave));
            EXPECT_EQ(CheckLayerMajor(layout, o, PlanStep(layout, o)), "");
            ++plans;
          }
        }
      }
    }
  }
  EXPECT_EQ(plans, 3 * 2 * 16 * 3 * 4);
}

TEST(AssignWeightSlotsTest, ReusesABlockStillInItsSlot) {
  // Layers 1, 2, head 3, then backward 2, 1 with three slots: the last
  // layer stays loaded across forward, head and backward.
  const std::vector<WeightSlotUse> uses = AssignWeightSlots({1, 2, 3, 2, 1}, 3);
  ASSERT_EQ(uses.size(), 5u);
  EXPECT_TRUE(uses[0].load && uses[1].load && uses[2].load);
  EXPECT_FALSE(uses[3].load);  // block 2 still in slot 1
  EXPECT_EQ(uses[3].slot, 1);
  EXPECT_EQ(uses[3].prev_user, 1);
  EXPECT_FALSE(uses[4].load);  // block 1 still in slot 0
  EXPECT_EQ(uses[4].prev_user, 0);
}

TEST(AssignWeightSlotsTest, LoadsRoundTheRingWhenBlocksDiffer) {
  const std::vector<WeightSlotUse> uses = AssignWeightSlots({1, 2, 3, 4, 5}, 3);
  ASSERT_EQ(uses.size(), 5u);
  for (const WeightSlotUse& u : uses) EXPECT_TRUE(u.load);
  EXPECT_EQ(uses[3].slot, 0);
  EXPECT_EQ(uses[3].prev_user, 0);
  EXPECT_EQ(uses[4].slot, 1);
  EXPECT_EQ(uses[4].prev_user, 1);
}

}  // namespace
}  // namespace megatrain::engine
