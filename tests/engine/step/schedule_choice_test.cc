// Tests of the schedule choice's resident blocks (Note [Auto resident
// layers] in engine/step/schedule_choice.h): on 80 GB (H100) and 141 GB
// (H200) devices, llama-1b/3b/8b keep as many resident layers as fit with
// clipping (and the floor of two without), the plan behind the choice is
// exactly the executor's memory plan, and everything planned plus the
// margin stays under the device's memory; forced options stand; bad
// options are INVALID_ARGUMENT naming the option. The order, wave and
// activation placement are tested in layer_major_trainer_test.cc.
#include "engine/step/schedule_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "engine/model/param_layout.h"
#include "engine/step/executor.h"
#include "engine/step/layer_graphs.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The devices' memory as sold (cudaMemGetInfo reports a little more: 85.5e9
// bytes on an H100 80GB HBM3), so that the tests' choices are conservative.
constexpr int64_t kH100Bytes = int64_t{80} * 1000 * 1000 * 1000;
constexpr int64_t kH200Bytes = int64_t{141} * 1000 * 1000 * 1000;

ExecutorOptions Bf16(int64_t micro_batch, int64_t seq_len) {
  ExecutorOptions o;
  o.compute_dtype = ComputeDtype::kBf16;
  o.micro_batch = micro_batch;
  o.seq_len = seq_len;
  return o;
}

ScheduleRequest Accumulating(int64_t accumulation) {
  ScheduleRequest r;
  r.gradient_accumulation_steps = accumulation;
  return r;
}

ModelConfig Preset(const std::string& name) {
  absl::StatusOr<ModelConfig> config = PresetConfig(name);
  EXPECT_THAT(config, IsOk());
  return *config;
}

// The plan behind `choice` is the executor's, and what it plans fits
// `device` with the margin.
void ExpectPlanFits(const ModelConfig& config, const ExecutorOptions& executor,
                    const ScheduleChoice& choice, int64_t device) {
  const ExecutorMemoryPlan plan = PlanExecutorMemory(config, WithChoice(executor, choice));
  EXPECT_EQ(choice.executor_device_bytes, plan.device_bytes());
  EXPECT_EQ(choice.resident_bytes, plan.resident_bytes);
  EXPECT_EQ(choice.grad_accumulation_bytes, plan.grad_accumulation_bytes);
  const int64_t saved_outside = choice.activation_device_bytes - plan.activation_ring_bytes;
  EXPECT_EQ(choice.planned_device_bytes(),
            plan.device_bytes() + saved_outside + choice.working_bytes + choice.kept_graph_bytes);
  EXPECT_LE(choice.planned_device_bytes() + choice.margin_bytes, device);
  EXPECT_EQ(choice.margin_bytes,
            kResidentMarginBytes + static_cast<int64_t>(kResidentMarginFraction * device));
}

// (preset, device bytes, accumulation, resident layers expected).
struct FillCase {
  const char* preset;
  int64_t device;
  int64_t accumulation;
  int resident_layers;
};

class AutoResidentLayersTest : public ::testing::TestWithParam<FillCase> {};

// The expected counts are the largest R with
//   slots + resident(R) + embedding + saved inputs + working + margin <= device,
// e.g. llama-3b, 8 x 2048, accumulation 4 on 80 GB: 5.5 GB of slots for
// the 394 M lm_head, 6.3 GB of resident embedding, 24.2 GB of saved inputs
// (4 x 30 x [8, 2048, 3072] fp32), 8.1 GB working (4.3 GB of it the loss
// chunk's, kLossChunkLogitBytes) and 6.1 GB margin leave 29.8 GB for 1.81 GB
// layers: 16 of 28.
TEST_P(AutoResidentLayersTest, KeepsTheLargestCountThatFits) {
  const FillCase c = GetParam();
  const ModelConfig config = Preset(c.preset);
  const ExecutorOptions executor = Bf16(8, 2048);
  const absl::StatusOr<ScheduleChoice> choice =
      ChooseSchedule(config, Accumulating(c.accumulation), executor, c.device);
  ASSERT_THAT(choice, IsOk());
  EXPECT_EQ(choice->resident_layers, c.resident_layers) << choice->Describe();
  EXPECT_TRUE(choice->resident_embedding);  // the presets' tables are untied
  EXPECT_FALSE(choice->offload_activations);
  ExpectPlanFits(config, executor, *choice, c.device);
  // One more layer would not fit (unless all are resident already).
  if (choice->resident_layers < config.num_hidden_layers) {
    ScheduleChoice more = *choice;
    ++more.resident_layers;
    more.executor_device_bytes =
        PlanExecutorMemory(config, WithChoice(executor, more)).device_bytes();
    EXPECT_GT(more.planned_device_bytes() + more.margin_bytes, c.device);
  }
  EXPECT_FALSE(choice->resident_layers_forced);
  EXPECT_THAT(choice->Describe(), HasSubstr(absl::StrCat("resident: ", c.resident_layers,
                                                         " layers (auto) and the embedding")));
}

INSTANTIATE_TEST_SUITE_P(Presets, AutoResidentLayersTest,
                         ::testing::Values(FillCase{"llama-1b", kH100Bytes, 1, 16},
                                           FillCase{"llama-1b", kH100Bytes, 4, 16},
                                           FillCase{"llama-1b", kH200Bytes, 1, 16},
                                           FillCase{"llama-3b", kH100Bytes, 1, 26},
                                           FillCase{"llama-3b", kH100Bytes, 4, 16},
                                           FillCase{"llama-3b", kH200Bytes, 4, 28},
                                           FillCase{"llama-8b", kH100Bytes, 1, 9},
                                           FillCase{"llama-8b", kH200Bytes, 1, 24}),
                         [](const auto& info) {
                           return absl::StrCat(std::string(info.param.preset).replace(5, 1, "_"),
                                               "On", info.param.device / 1000000000,
                                               "GBAccumulation", info.param.accumulation);
                         });

// Mixture-of-experts layers fill the device like dense ones (Note [Auto
// resident layers]): qwen3-moe-7b's 16 layers of 64 experts on an H200.
TEST(AutoResidentLayersTest, KeepsMixtureOfExpertsLayersResidentToo) {
  const ModelConfig config = Preset("qwen3-moe-7b");
  ASSERT_NE(config.moe, nullptr);
  const ExecutorOptions executor = Bf16(8, 2048);
  const absl::StatusOr<ScheduleChoice> choice =
      ChooseSchedule(config, Accumulating(4), executor, kH200Bytes);
  ASSERT_THAT(choice, IsOk());
  EXPECT_GT(choice->resident_layers, 0) << choice->Describe();
  EXPECT_LT(choice->resident_layers, config.num_hidden_layers) << choice->Describe();
  EXPECT_FALSE(choice->offload_activations);
  ExpectPlanFits(config, executor, *choice, kH200Bytes);
  ScheduleChoice more = *choice;
  ++more.resident_layers;
  more.executor_device_bytes =
      PlanExecutorMemory(config, WithChoice(executor, more)).device_bytes();
  EXPECT_GT(more.planned_device_bytes() + more.margin_bytes, kH200Bytes);
  // On the CPU nothing is resident.
  EXPECT_EQ(ChooseSchedule(config, Accumulating(4), executor, 0)->resident_layers, 0);
}

// llama-3.2-1b/3b tie the table to lm_head: resident too (Note [Resident
// embedding]), 18 bytes per parameter under bf16, and the slots then only
// hold the largest streamed block (a decoder layer or the head's norm).
TEST(AutoResidentLayersTest, KeepsATiedTableResident) {
  ModelConfig config = Preset("llama-3b");
  config.tie_word_embeddings = true;
  const ExecutorOptions executor = Bf16(8, 2048);
  const absl::StatusOr<ScheduleChoice> choice =
      ChooseSchedule(config, Accumulating(1), executor, kH100Bytes);
  ASSERT_THAT(choice, IsOk());
  EXPECT_TRUE(choice->resident_embedding);
  EXPECT_EQ(choice->resident_layers, 28);
  ExpectPlanFits(config, executor, *choice, kH100Bytes);
  const ModelLayout layout = ModelLayout::Create(config);
  const ExecutorMemoryPlan plan = PlanExecutorMemory(config, WithChoice(executor, *choice));
  EXPECT_EQ(plan.max_slot_numel, layout.blocks[layout.head_block()].numel);
  int64_t resident = 18 * layout.blocks[layout.embedding_block()].numel;
  for (int64_t l = 0; l < 28; ++l) resident += 18 * layout.blocks[layout.layer_block(l)].numel;
  EXPECT_EQ(plan.resident_bytes, resident);
}

// Clipping does not change auto's choice (Note [Auto resident layers]):
// jobs that do not clip fill the device too, since on some hosts the CPU
// AdamW of streamed layers outlasts the GPU's step even behind backward.
TEST(AutoResidentLayersTest, WithoutClippingFillsTheDeviceAsWithClipping) {
  const ModelConfig config = Preset("llama-1b");
  const absl::StatusOr<ScheduleChoice> choice =
      ChooseSchedule(config, Accumulating(1), Bf16(8, 2048), kH100Bytes);
  ASSERT_THAT(choice, IsOk());
  EXPECT_EQ(choice->resident_layers, config.num_hidden_layers);
  EXPECT_TRUE(choice->resident_embedding);
  ExpectPlanFits(config, Bf16(8, 2048), *choice, kH100Bytes);
}

// A device too small for any resident block keeps none (rather than
// running out of memory), and the CPU keeps none and plans nothing.
TEST(AutoResidentLayersTest, SmallDevicesAndTheCpuKeepNone) {
  const ModelConfig config = Preset("llama-8b");
  const int64_t gb = 1000 * 1000 * 1000;
  const absl::StatusOr<ScheduleChoice> small =
      ChooseSchedule(config, Accumulating(1), Bf16(8, 2048), 16 * gb);
  ASSERT_THAT(small, IsOk());
  EXPECT_EQ(small->resident_layers, 0);
  EXPECT_FALSE(small->resident_embedding);
  EXPECT_EQ(small->resident_bytes, 0);
  const absl::StatusOr<ScheduleChoice> cpu =
      ChooseSchedule(config, Accumulating(4), Bf16(8, 2048), 0);
  ASSERT_THAT(cpu, IsOk());
  EXPECT_EQ(cpu->resident_layers, 0);
  EXPECT_FALSE(cpu->resident_embedding);
  EXPECT_FALSE(cpu->device_grad_accumulation);
  EXPECT_EQ(cpu->planned_device_bytes(), 0);
  EXPECT_EQ(cpu->device_total_bytes, 0);
  EXPECT_THAT(cpu->Describe(), ::testing::Not(HasSubstr("resident")));
}

// Forced options stand, on the CPU as on a device they overfill.
TEST(AutoResidentLayersTest, ForcedOptionsStand) {
  const ModelConfig config = Preset("llama-8b");
  ScheduleRequest request = Accumulating(1);
  request.resident_layers = 32;
  request.resident_embedding = 0;
  request.device_grad_accumulation = 1;
  for (const int64_t device : {int64_t{0}, kH100Bytes}) {
    const absl::StatusOr<ScheduleChoice> choice =
        ChooseSchedule(config, request, Bf16(8, 2048), device);
    ASSERT_THAT(choice, IsOk());
    EXPECT_EQ(choice->resident_layers, 32);
    EXPECT_FALSE(choice->resident_embedding);
    EXPECT_TRUE(choice->device_grad_accumulation);
  }
  // 32 x 218 M x 18 bytes do not fit 80 GB: the plan says so.
  const absl::StatusOr<ScheduleChoice> over =
      ChooseSchedule(config, request, Bf16(8, 2048), kH100Bytes);
  ASSERT_THAT(over, IsOk());
  EXPECT_GT(over->planned_device_bytes(), kH100Bytes);
  EXPECT_TRUE(over->resident_layers_forced);
  EXPECT_THAT(over->Describe(), HasSubstr("resident: 32 layers (resident_layers)"));
}

// A forced count whose executor buffers alone exceed the device can never
// run: RESOURCE_EXHAUSTED naming the caller's field and what auto keeps
// (9 layers of llama-8b on 80 GB, as AutoResidentLayersTest expects). A count
// that fits, auto, and the CPU pass.
TEST(AutoResidentLayersTest, ForcedLayersThatCanNeverFitAreRefused) {
  const ModelConfig config = Preset("llama-8b");
  const ExecutorOptions executor = Bf16(8, 2048);
  ScheduleRequest request = Accumulating(1);
  request.resident_layers = 32;
  absl::StatusOr<ScheduleChoice> over = ChooseSchedule(config, request, executor, kH100Bytes);
  ASSERT_THAT(over, IsOk());
  ASSERT_GT(over->executor_device_bytes, kH100Bytes);
  EXPECT_THAT(
      CheckForcedResidentLayersFit(config, request, executor, *over, "train.resident_layers"),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("train.resident_layers: 32 resident decoder layers need "),
                     HasSubstr("> the device's 80.0 GB; it can never run there (auto "
                               "keeps 9 layers on this device)"))));
  request.resident_layers = 9;
  absl::StatusOr<ScheduleChoice> fits = ChooseSchedule(config, request, executor, kH100Bytes);
  ASSERT_THAT(fits, IsOk());
  EXPECT_THAT(CheckForcedResidentLayersFit(config, request, executor, *fits, "resident_layers"),
              IsOk());
  request.resident_layers = 32;
  absl::StatusOr<ScheduleChoice> cpu = ChooseSchedule(config, request, executor, 0);
  ASSERT_THAT(cpu, IsOk());
  EXPECT_THAT(CheckForcedResidentLayersFit(config, request, executor, *cpu, "resident_layers"),
              IsOk());
  request.resident_layers = -1;
  absl::StatusOr<ScheduleChoice> auto_choice =
      ChooseSchedule(config, request, executor, kH100Bytes);
  ASSERT_THAT(auto_choice, IsOk());
  EXPECT_THAT(
      CheckForcedResidentLayersFit(config, request, executor, *auto_choice, "resident_layers"),
      IsOk());
}

// Device gradient accumulation only where a step would use it: not for one
// micro-batch, not for one layer-major wave of all of them (the slots sum).
TEST(AutoResidentLayersTest, DeviceAccumulationOnlyWhenUsed) {
  const ModelConfig config = Preset("llama-1b");
  const ExecutorOptions executor = Bf16(8, 2048);
  auto accumulates = [&](ScheduleRequest request) {
    const absl::StatusOr<ScheduleChoice> choice =
        ChooseSchedule(config, request, executor, kH100Bytes);
    EXPECT_THAT(choice, IsOk());
    return choice.ok() && choice->device_grad_accumulation;
  };
  EXPECT_FALSE(accumulates(Accumulating(1)));
  // Layer-major in one wave of 4 (without kept graphs, which turn this
  // fully resident model micro-batch-major: then the head accumulates).
  ScheduleRequest one_wave = Accumulating(4);
  one_wave.kept_graph_layers = 0;
  EXPECT_FALSE(accumulates(one_wave));
  EXPECT_TRUE(accumulates(Accumulating(4)));
  ScheduleRequest waves = Accumulating(4);
  waves.wave = 2;
  EXPECT_TRUE(accumulates(waves));
  ScheduleRequest micro_batch_major = Accumulating(4);
  micro_batch_major.schedule = StepSchedule::kMicroBatchMajor;
  EXPECT_TRUE(accumulates(micro_batch_major));
  const absl::StatusOr<ScheduleChoice> choice =
      ChooseSchedule(config, micro_batch_major, executor, kH100Bytes);
  ASSERT_THAT(choice, IsOk());
  ExpectPlanFits(config, executor, *choice, kH100Bytes);
}

// Note [Layer graphs]: auto replays dense layers from CUDA graphs on a GPU
// at small micro-batches only, plans their memory, and leaves them off for
// mixtures of experts and on the CPU; forced values stand.
TEST(AutoResidentLayersTest, CudaGraphsAtSmallMicroBatchesOfDenseModels) {
  const ModelConfig llama = Preset("llama-1b");
  auto graphs = [&](const ModelConfig& config, const ExecutorOptions& executor, int64_t device,
                    int forced) {
    ScheduleRequest request = Accumulating(8);
    request.cuda_graphs = forced;
    const absl::StatusOr<ScheduleChoice> choice = ChooseSchedule(config, request, executor, device);
    EXPECT_THAT(choice, IsOk());
    if (!choice.ok()) return false;
    if (device > 0) ExpectPlanFits(config, executor, *choice, device);
    const ExecutorMemoryPlan plan = PlanExecutorMemory(config, WithChoice(executor, *choice));
    EXPECT_EQ(plan.layer_graph_bytes > 0, choice->cuda_graphs && config.moe == nullptr);
    return choice->cuda_graphs;
  };
  EXPECT_TRUE(graphs(llama, Bf16(1, 2048), kH100Bytes, -1));
  EXPECT_TRUE(graphs(llama, Bf16(2, 2048), kH200Bytes, -1));
  EXPECT_FALSE(graphs(llama, Bf16(8, 2048), kH100Bytes, -1));
  EXPECT_FALSE(graphs(llama, Bf16(1, 2048), 0, -1));  // the CPU
  EXPECT_FALSE(graphs(Preset("mixtral-7b"), Bf16(1, 2048), kH200Bytes, -1));
  EXPECT_FALSE(graphs(llama, Bf16(1, 2048), kH100Bytes, 0));
  EXPECT_TRUE(graphs(llama, Bf16(8, 2048), kH100Bytes, 1));
  EXPECT_TRUE(graphs(llama, Bf16(1, 128), 0, 1));
  // The graphs' memory: a pair per weights address, plus one working set.
  ExecutorOptions with = WithChoice(Bf16(1, 2048), ScheduleChoice{});
  with.cuda_graphs = true;
  with.resident_layers = 4;
  ExecutorOptions without = with;
  without.cuda_graphs = false;
  EXPECT_EQ(PlanExecutorMemory(llama, with).device_bytes() -
                PlanExecutorMemory(llama, without).device_bytes(),
            PlanExecutorMemory(llama, with).layer_graph_bytes);
  EXPECT_EQ(LayerGraphCount(llama, with.num_weight_slots, 4), 2 * (with.num_weight_slots + 4));
}

// Note [Auto resident layers]: after the resident fill, auto keeps the
// forward graphs of as many resident dense layers as the device has left
// room for (Note [Kept layer graphs] in executor.h), a wave's worth each.
TEST(KeptGraphLayersTest, AutoKeepsTheGraphsThatFitAfterTheResidentFill) {
  ExecutorOptions executor = Bf16(8, 2048);
  executor.fused_kernels = true;
  const int64_t per_layer = KeptGraphBytes(Preset("llama-1b"), 8 * 2048, 2, /*fused=*/true);
  for (const FillCase& c :
       {FillCase{"llama-1b", kH200Bytes, 1, 16}, FillCase{"llama-1b", kH200Bytes, 4, 16},
        FillCase{"llama-3b", kH200Bytes, 1, 28}, FillCase{"llama-1b", kH100Bytes, 1, 16}}) {
    SCOPED_TRACE(absl::StrCat(c.preset, " on ", c.device, " accumulation ", c.accumulation));
    const ModelConfig config = Preset(c.preset);
    const absl::StatusOr<ScheduleChoice> choice =
        ChooseSchedule(config, Accumulating(c.accumulation), executor, c.device);
    ASSERT_THAT(choice, IsOk());
    EXPECT_EQ(choice->resident_layers, c.resident_layers);
    EXPECT_GT(choice->kept_graph_layers, 0) << choice->Describe();
    EXPECT_LE(choice->kept_graph_layers, choice->resident_layers);
    const int64_t graph = KeptGraphBytes(config, 8 * 2048, 2, true) * choice->wave;
    EXPECT_EQ(choice->kept_graph_bytes, choice->kept_graph_layers * graph);
    ExpectPlanFits(config, executor, *choice, c.device);
    if (choice->kept_graph_layers < choice->resident_layers) {  // one more would not fit
      EXPECT_GT(choice->planned_device_bytes() + graph + choice->margin_bytes, c.device);
    }
    EXPECT_THAT(
        choice->Describe(),
        HasSubstr(absl::StrCat("forward graphs of ", choice->kept_graph_layers, " layers kept")));
    EXPECT_EQ(WithChoice(executor, *choice).kept_graph_layers, choice->kept_graph_layers);
    // Every layer resident: accumulation runs micro-batch-major when its
    // single micro-batch of graphs keeps more layers than a wave would.
    if (c.accumulation > 1) {
      EXPECT_EQ(choice->schedule, StepSchedule::kMicroBatchMajor) << choice->Describe();
      EXPECT_EQ(choice->kept_graph_layers, 16);
    }
  }
  // llama-1b, 8 x 2048, bf16, fused: 16,384 tokens x 2 bytes x (8 x 2,048 +
  // 6 x 32 x 64 + 3 x 8,192); without the fused kernels F + 4 C more.
  EXPECT_EQ(per_layer, int64_t{16384} * 2 * (8 * 2048 + 6 * 2048 + 3 * 8192));
  EXPECT_EQ(KeptGraphBytes(Preset("llama-1b"), 8 * 2048, 2, /*fused=*/false),
            per_layer + int64_t{16384} * 2 * (8192 + 4 * 2048));
  // fp32 compute keeps the ATen ops whatever the fused option: planned
  // at 4 bytes and without the fused path's saving.
  ExecutorOptions fp32 = executor;
  fp32.compute_dtype = ComputeDtype::kFp32;
  const absl::StatusOr<ScheduleChoice> fp32_choice =
      ChooseSchedule(Preset("llama-1b"), Accumulating(1), fp32, kH200Bytes);
  ASSERT_THAT(fp32_choice, IsOk());
  EXPECT_EQ(fp32_choice->kept_graph_bytes,
            fp32_choice->kept_graph_layers *
                KeptGraphBytes(Preset("llama-1b"), 8 * 2048, 4, /*fused=*/false));
  // A layer-major order asked for keeps its wave: fewer graphs fit.
  ScheduleRequest layer_major = Accumulating(4);
  layer_major.schedule = StepSchedule::kLayerMajor;
  const absl::StatusOr<ScheduleChoice> waves =
      ChooseSchedule(Preset("llama-1b"), layer_major, executor, kH200Bytes);
  ASSERT_THAT(waves, IsOk());
  EXPECT_EQ(waves->schedule, StepSchedule::kLayerMajor);
  EXPECT_LT(waves->kept_graph_layers, 16);
  EXPECT_GT(waves->kept_graph_layers, 0);
}

// Where auto keeps none: the CPU, CUDA graphs (small micro-batches),
// activations in host memory, mixture-of-experts models, streamed models
// that fill the device with resident layers, and `all` (0); a forced
// count is capped at the resident layers.
TEST(KeptGraphLayersTest, KeepsNoneWhereItCannotOrIsNotAsked) {
  const ModelConfig llama = Preset("llama-1b");
  auto kept = [](const ModelConfig& config, const ExecutorOptions& executor, int64_t device,
                 ScheduleRequest request) {
    const absl::StatusOr<ScheduleChoice> choice = ChooseSchedule(config, request, executor, device);
    EXPECT_THAT(choice, IsOk());
    return choice.ok() ? choice->kept_graph_layers : -1;
  };
  ScheduleRequest request = Accumulating(1);
  EXPECT_EQ(kept(llama, Bf16(8, 2048), 0, request), 0);           // the CPU
  EXPECT_EQ(kept(llama, Bf16(1, 2048), kH200Bytes, request), 0);  // CUDA graphs
  EXPECT_EQ(kept(Preset("qwen3-moe-7b"), Bf16(8, 2048), kH200Bytes, request), 0);
  EXPECT_EQ(kept(Preset("llama-8b"), Bf16(8, 2048), kH100Bytes, request), 0);   // streamed
  EXPECT_EQ(kept(Preset("gemma2-2b"), Bf16(8, 2048), kH200Bytes, request), 0);  // soft-capped
  ScheduleRequest host = request;
  host.activations = ActivationPlacement::kHost;
  EXPECT_EQ(kept(llama, Bf16(8, 2048), kH200Bytes, host), 0);
  ScheduleRequest all = request;
  all.kept_graph_layers = 0;  // train.activation_checkpointing: all
  EXPECT_EQ(kept(llama, Bf16(8, 2048), kH200Bytes, all), 0);
  ScheduleRequest forced = request;
  forced.resident_layers = 3;
  forced.kept_graph_layers = 5;
  EXPECT_EQ(kept(llama, Bf16(8, 2048), kH200Bytes, forced), 3);
  EXPECT_EQ(kept(llama, Bf16(8, 2048), 0, forced), 3);  // the CPU honours a forced count
}

TEST(KeptGraphLayersTest, RejectsBadRequestsNamingTheField) {
  ScheduleRequest request = Accumulating(1);
  request.kept_graph_layers = 17;
  EXPECT_THAT(ChooseSchedule(Preset("llama-1b"), request, Bf16(8, 2048), kH200Bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kept_graph_layers: must be -1 (auto) or in [0, "
                                 "num_hidden_layers=16], got 17")));
  request.kept_graph_layers = 2;
  EXPECT_THAT(ChooseSchedule(Preset("qwen3-moe-7b"), request, Bf16(8, 2048), kH200Bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kept_graph_layers: mixture-of-experts layers")));
  request.activations = ActivationPlacement::kHost;
  EXPECT_THAT(ChooseSchedule(Preset("llama-1b"), request, Bf16(8, 2048), kH200Bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kept_graph_layers: not with activations in host memory")));
}

TEST(AutoResidentLayersTest, RejectsBadOptionsNamingThem) {
  const ModelConfig config = Preset("llama-1b");
  ScheduleRequest request = Accumulating(1);
  request.resident_layers = 17;
  EXPECT_THAT(ChooseSchedule(config, request, Bf16(8, 2048), kH100Bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("resident_layers: must be -1 (auto) or in [0, "
                                 "num_hidden_layers=16], got 17")));
  request.resident_layers = -1;
  request.resident_embedding = 2;
  EXPECT_THAT(ChooseSchedule(config, request, Bf16(8, 2048), kH100Bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("resident_embedding: must be -1 (auto), 0 or 1, got 2")));
  request.resident_embedding = -1;
  request.device_grad_accumulation = -2;
  EXPECT_THAT(ChooseSchedule(config, request, Bf16(8, 2048), kH100Bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("device_grad_accumulation: must be -1 (auto), 0 or 1, got -2")));
  request.device_grad_accumulation = -1;
  request.cuda_graphs = 3;
  EXPECT_THAT(ChooseSchedule(config, request, Bf16(8, 2048), kH100Bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cuda_graphs: must be -1 (auto), 0 or 1, got 3")));
}

}  // namespace
}  // namespace megatrain::engine
