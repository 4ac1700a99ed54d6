// Tests of engine::PlanJob and ConfigForParamCount (engine/job/plan.h): the
// tiers come from the job's footprint, the NVMe tier moves exactly the two
// moments, auto picks the tier only when needed, the projection follows
// Note [Plan projection], and bad machines and families are refused.
#include "engine/job/plan.h"
#include "engine/job/step_options.h"
#include "engine/step/executor.h"
#include "engine/step/grad_lander.h"
#include "engine/step/host_cast.h"
#include "engine/step/schedule_choice.h"
#include "engine/step/trainer.h"
#include "engine/model/param_layout.h"
#include "engine/store/nvme_tier.h"

#include <cmath>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

JobSpec Llama8bSpec() {
  JobSpec spec;
  spec.model.preset = "llama-8b";
  spec.train.micro_batch = 8;
  spec.train.seq_len = 2048;
  spec.train.compute_dtype = ComputeDtype::kBf16;
  return spec;
}

// Note [Shared host store]: train.devices 2 keeps the weights, moments and
// streaming copy once; gradients are the shared one plus one landing
// buffer per rank (pinned), staging is per rank; the device estimate is
// per device, the same as one device's.
// Note [Shard-only landing] (engine/store/host_store.h): one micro-batch
// per rank, or several summed on the device, lands shards in the shared
// gradient (llama-8b's untied embedding is planned resident: nothing else
// per rank but staging).
TEST(PlanTest, DataParallelFootprintCountsTheSharedStoreOnce) {
  const ModelConfig config = *PresetConfig("llama-8b");
  for (const int64_t per_rank : {1, 2}) {
    JobSpec one = Llama8bSpec();
    one.train.gradient_accumulation_steps = 2 * per_rank;
    JobSpec two = one;
    two.train.devices = 2;
    const MemoryFootprint a = EstimateFootprintForConfig(one, config);
    const MemoryFootprint b = EstimateFootprintForConfig(two, config);
    EXPECT_EQ(b.host.master, a.host.master);
    EXPECT_EQ(b.host.exp_avg, a.host.exp_avg);
    EXPECT_EQ(b.host.exp_avg_sq, a.host.exp_avg_sq);
    EXPECT_EQ(b.host.streaming, a.host.streaming);
    EXPECT_EQ(b.host.grad, a.host.grad) << per_rank;
    EXPECT_EQ(b.host.pinned, a.host.pinned) << per_rank;
    EXPECT_EQ(b.host.staging, 2 * a.host.staging);
    EXPECT_EQ(b.embedding_lookahead_bytes, 0);
    EXPECT_EQ(b.host_total_bytes, b.host.Total());
    EXPECT_EQ(b.device_estimate_bytes, a.device_estimate_bytes);
    // Within 0.5 bytes per parameter of one device (issue 32's bound).
    EXPECT_LE(b.host_total_bytes - a.host_total_bytes, a.params / 2) << per_rank;
  }
}

// Note [Ring shards] (engine/step/gradient_reducer.h): train.devices N
// with the gradient ring counts no gradient arena (llama-8b's untied
// table is planned resident: no embedding landing either) and N rings,
// each of kGradRingBuffers shards of ceil(layer / N) elements; the plan
// says so (megatrain plan --devices N), and each step's host bytes stay
// within issue 32's bound over one device's ring.
TEST(PlanTest, DataParallelGradientRingCountsAShardSizedRingPerRank) {
  const ModelConfig config = *PresetConfig("llama-8b");
  const ModelLayout layout = ModelLayout::Create(config);
  const int64_t layer = layout.blocks[layout.layer_block(layout.num_layers() - 1)].numel;
  JobSpec one = Llama8bSpec();
  one.train.max_grad_norm = 0;
  one.memory.weight_stream = WeightStream::kFp32;
  one.memory.gradient_landing = GradientLanding::kRing;
  const MemoryFootprint a = EstimateFootprintForConfig(one, config);
  for (const int64_t devices : {2, 4}) {
    SCOPED_TRACE(devices);
    JobSpec many = one;
    many.train.devices = devices;
    many.train.gradient_accumulation_steps = devices;
    const MemoryFootprint b = EstimateFootprintForConfig(many, config);
    EXPECT_EQ(b.host.grad, 0);
    EXPECT_EQ(b.gradient_ring_bytes,
              devices * kGradRingBuffers * 4 * ((layer + devices - 1) / devices));
    EXPECT_EQ(b.host.master, a.host.master);
    EXPECT_EQ(b.host.exp_avg, a.host.exp_avg);
    EXPECT_EQ(b.host.staging - b.gradient_ring_bytes,
              devices * (a.host.staging - a.gradient_ring_bytes));
    EXPECT_LE(b.host_total_bytes - a.host_total_bytes, a.params / 2);
    PlanMachine machine = DefaultPlanMachine();
    const absl::StatusOr<JobPlan> plan = PlanJob(many, config, machine);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->devices, devices);
    EXPECT_EQ(plan->footprint.gradient_ring_bytes, b.gradient_ring_bytes);
    EXPECT_LT(static_cast<double>(plan->tiers.host_bytes) / static_cast<double>(a.params), 12.5);
    // auto counts the ring too (clipping off, the accumulation summed on
    // the devices: DataParallelGradientRing); with clipping the arena.
    many.memory.gradient_landing = GradientLanding::kAuto;
    many.train.gradient_accumulation_steps = 2 * devices;
    EXPECT_EQ(EstimateFootprintForConfig(many, config).gradient_ring_bytes, b.gradient_ring_bytes);
    many.train.max_grad_norm = 1.0;
    EXPECT_EQ(EstimateFootprintForConfig(many, config).gradient_ring_bytes, 0);
  }
}

TEST(PlanTest, TiersAreTheFootprintsBytes) {
  const JobSpec spec = Llama8bSpec();
  const ModelConfig config = *PresetConfig("llama-8b");
  PlanMachine machine = DefaultPlanMachine();
  machine.host_memory_bytes = int64_t{1500} * 1000 * 1000 * 1000;
  const absl::StatusOr<JobPlan> plan = PlanJob(spec, config, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const MemoryFootprint f = EstimateFootprintForConfig(spec, config);
  EXPECT_EQ(plan->params, config.ParamCount());
  EXPECT_EQ(plan->nvme_tier, NvmeTierMode::kOff);
  EXPECT_EQ(plan->tiers.host_bytes, f.host_total_bytes);
  EXPECT_EQ(plan->tiers.pinned_bytes, f.host.pinned + f.host.staging);
  EXPECT_EQ(plan->tiers.nvme_bytes, 0);
  EXPECT_TRUE(plan->fits);
  EXPECT_THAT(plan->verdict, HasSubstr("everything in host memory"));
  // The device: the trainer's own choice for this machine (Note [Auto
  // resident layers] in step/schedule_choice.h), under the device's memory
  // with the margin.
  ScheduleRequest request;
  ExecutorOptions executor;
  executor.compute_dtype = spec.train.compute_dtype;
  executor.micro_batch = spec.train.micro_batch;
  executor.seq_len = spec.train.seq_len;
  const absl::StatusOr<ScheduleChoice> choice =
      ChooseSchedule(config, request, executor, machine.gpu_memory_bytes);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(plan->tiers.device_bytes, choice->planned_device_bytes());
  EXPECT_EQ(plan->footprint.device_resident_bytes,
            choice->resident_bytes + choice->grad_accumulation_bytes);
  EXPECT_LE(plan->tiers.device_bytes + choice->margin_bytes, machine.gpu_memory_bytes);
  EXPECT_GT(choice->resident_layers, 2);  // clipping: more than the floor
}

// Issue 19: llama-8b at 8 x 2048 x 4 with clipping fits a 125 GiB host
// only with the fp32 master streamed (16 bytes/param + bounded staging,
// not 18), at twice the weight H2D time; the ring (clipping off) drops the
// gradient arena but for the embedding's.
TEST(PlanTest, WeightStreamAndGradientRingChangeTheHostBytes) {
  JobSpec spec = Llama8bSpec();
  spec.train.gradient_accumulation_steps = 4;
  const ModelConfig config = *PresetConfig("llama-8b");
  PlanMachine machine = DefaultPlanMachine();
  machine.host_memory_bytes = int64_t{125} << 30;
  const absl::StatusOr<JobPlan> copy = PlanJob(spec, config, machine);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_FALSE(copy->fits);
  spec.memory.weight_stream = WeightStream::kFp32;
  const absl::StatusOr<JobPlan> stream = PlanJob(spec, config, machine);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_TRUE(stream->fits) << stream->verdict;
  EXPECT_EQ(stream->footprint.host.streaming, 0);
  EXPECT_EQ(copy->tiers.host_bytes - stream->tiers.host_bytes, copy->footprint.host.streaming);
  const double params = static_cast<double>(config.ParamCount());
  EXPECT_LT(static_cast<double>(stream->tiers.host_bytes) / params, 16.25);
  EXPECT_DOUBLE_EQ(stream->projection.h2d_seconds, 2 * copy->projection.h2d_seconds);
  spec.train.max_grad_norm = 0;
  spec.train.gradient_accumulation_steps = 1;
  spec.memory.gradient_landing = GradientLanding::kRing;
  const absl::StatusOr<JobPlan> ring = PlanJob(spec, config, machine);
  ASSERT_TRUE(ring.ok()) << ring.status();
  // The untied table is planned resident on the GPU: no host gradient at
  // all; the ring is kGradRingBuffers buffers of a layer, the head landing
  // in pieces (issue 19: <= 12.5 bytes/param without clipping).
  const ModelLayout layout = ModelLayout::Create(config);
  EXPECT_EQ(ring->footprint.host.grad, 0);
  EXPECT_EQ(
      ring->footprint.gradient_ring_bytes,
      kGradRingBuffers * 4 * layout.blocks[layout.layer_block(layout.num_layers() - 1)].numel);
  EXPECT_LT(static_cast<double>(ring->tiers.host_bytes) / params, 12.5);
  EXPECT_THAT(ring->verdict, HasSubstr("host 12.33 bytes/param"));
}

// Issue 19's target without clipping (exact fp32 AdamW, gradient ring,
// fp32 weight stream, 8 x 2048, accumulation 1) on both of its models: the
// ring is kGradRingBuffers decoder layers whatever the vocabulary (Note
// [Gradient ring]), so llama-3b's 128,256 x 3,072 head no longer sets it
// (before, 2026-11-24: one head-sized buffer and one layer, 12.55 bytes/param).
TEST(PlanTest, GradientRingMeetsTwelveAndAHalfBytesPerParameter) {
  struct Case {
    const char* preset;
    const char* described;
  };
  for (const Case& c :
       {Case{"llama-3b", "host 12.34 bytes/param"}, Case{"llama-8b", "host 12.33 bytes/param"}}) {
    SCOPED_TRACE(c.preset);
    JobSpec spec = Llama8bSpec();
    spec.model.preset = c.preset;
    spec.train.max_grad_norm = 0;
    spec.memory.weight_stream = WeightStream::kFp32;
    spec.memory.gradient_landing = GradientLanding::kRing;
    const ModelConfig config = *PresetConfig(c.preset);
    const absl::StatusOr<JobPlan> plan = PlanJob(spec, config, DefaultPlanMachine());
    ASSERT_TRUE(plan.ok()) << plan.status();
    const MemoryFootprint& f = plan->footprint;
    const ModelLayout layout = ModelLayout::Create(config);
    const int64_t layer = layout.blocks[layout.layer_block(layout.num_layers() - 1)].numel;
    EXPECT_EQ(f.gradient_ring_bytes, kGradRingBuffers * 4 * layer);
    // Everything above 12 bytes/param: the ring, the input upload (ids
    // and labels, 16 bytes a token: the embedding is resident), the two
    // gradient slots' norms and the resident norm ring (Note [Resident
    // norm ring] in engine/step/grad_lander.h), and the arenas' 4 KiB
    // alignment.
    EXPECT_EQ(f.host.staging,
              f.gradient_ring_bytes + 8 * 2048 * 16 + 2 * 8 + kResidentNormSlots * 8);
    EXPECT_EQ(f.host.grad, 0);
    EXPECT_EQ(f.host.streaming, 0);
    EXPECT_EQ(f.embedding_lookahead_bytes, 0);
    EXPECT_EQ(f.host_total_bytes, f.host.master * 3 + f.host.staging);
    const double per_param =
        static_cast<double>(f.host_total_bytes) / static_cast<double>(config.ParamCount());
    EXPECT_LE(per_param, 12.5);
    EXPECT_THAT(plan->verdict, HasSubstr(c.described));
  }
}

// Issue 19's target with clipping (<= 16.5 bytes/param; fp32 weight
// stream, the arena, 8 x 2048) on both of its models: 16 plus the chunk
// ring for host accumulation (Note [Bounded gradient staging]), the input
// upload and the slots' norms. Prints the plan's line (docs/operations.md).
TEST(PlanTest, ClippingMeetsSixteenAndAHalfBytesPerParameter) {
  for (const char* preset : {"llama-3b", "llama-8b"}) {
    SCOPED_TRACE(preset);
    JobSpec spec = Llama8bSpec();
    spec.model.preset = preset;
    spec.train.max_grad_norm = 1.0;
    spec.memory.weight_stream = WeightStream::kFp32;
    const ModelConfig config = *PresetConfig(preset);
    const absl::StatusOr<JobPlan> plan = PlanJob(spec, config, DefaultPlanMachine());
    ASSERT_TRUE(plan.ok()) << plan.status();
    const MemoryFootprint& f = plan->footprint;
    EXPECT_EQ(f.gradient_ring_bytes, 0);
    EXPECT_EQ(f.host.grad, f.host.master);
    EXPECT_EQ(f.host.staging, kGradChunkBuffers * 4 * kGradChunkElements + 8 * 2048 * 16 + 2 * 8 +
                                  kResidentNormSlots * 8);
    EXPECT_EQ(f.host_total_bytes, f.host.master * 4 + f.host.staging);
    EXPECT_LE(static_cast<double>(f.host_total_bytes) / static_cast<double>(config.ParamCount()),
              16.5);
    std::cout << preset << ": " << DescribeHostBytesPerParam(f) << "\n";
  }
}

TEST(PlanTest, NvmeMomentsMoveEightBytesPerParameterOffTheHost) {
  JobSpec spec = Llama8bSpec();
  spec.memory.nvme_tier = NvmeTierMode::kMoments;
  const ModelConfig config = *PresetConfig("llama-8b");
  PlanMachine machine = DefaultPlanMachine();
  machine.nvme_bytes = int64_t{1} << 40;
  const absl::StatusOr<JobPlan> plan = PlanJob(spec, config, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  JobSpec in_ram = spec;
  in_ram.memory.nvme_tier = NvmeTierMode::kOff;
  const MemoryFootprint ram = EstimateFootprintForConfig(in_ram, config);
  EXPECT_EQ(plan->tiers.nvme_bytes, ram.host.exp_avg + ram.host.exp_avg_sq);
  EXPECT_EQ(plan->tiers.host_bytes,
            ram.host_total_bytes - plan->tiers.nvme_bytes + NvmeTierStagingBytes());
  // The tiered footprint is what EstimateFootprint gives the job itself.
  EXPECT_EQ(EstimateFootprintForConfig(spec, config).host_total_bytes, plan->tiers.host_bytes);
  // 8 B/param read and written at the machine's rates.
  const double nvme = static_cast<double>(plan->tiers.nvme_bytes);
  EXPECT_DOUBLE_EQ(plan->projection.nvme_seconds, nvme / machine.nvme_read_bytes_per_second +
                                                      nvme / machine.nvme_write_bytes_per_second);
}

// Note [Tier shards] (engine/store/nvme_tier.h): with train.devices 2 the
// tier's files are the two ranks' shards (at most (N - 1) 4 KiB pages per
// block and moment more than one device's), each rank has its own
// staging, and each lands the embedding's gradient in a buffer of its own
// (nothing is resident with the tier); `megatrain plan --devices 2` and
// admission count the same.
TEST(PlanTest, NvmeMomentsOnTwoDevicesCountEveryRanksFilesAndStaging) {
  JobSpec spec = Llama8bSpec();
  spec.memory.nvme_tier = NvmeTierMode::kMoments;
  spec.train.devices = 2;
  spec.train.gradient_accumulation_steps = 2;
  const ModelConfig config = *PresetConfig("llama-8b");
  const ModelLayout layout = ModelLayout::Create(config);
  PlanMachine machine = DefaultPlanMachine();
  machine.nvme_bytes = int64_t{1} << 40;
  const absl::StatusOr<JobPlan> plan = PlanJob(spec, config, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->nvme_tier, NvmeTierMode::kMoments);
  EXPECT_EQ(plan->tiers.nvme_bytes, NvmeTierFileBytes(layout, 2));
  const int64_t one_device = NvmeTierFileBytes(layout, 1);
  EXPECT_GE(plan->tiers.nvme_bytes, one_device);
  // (N - 1) = 1 page of 4 KiB per block and moment at most.
  EXPECT_LE(plan->tiers.nvme_bytes - one_device,
            2 * 4096 * static_cast<int64_t>(layout.blocks.size()));
  JobSpec in_ram = spec;
  in_ram.memory.nvme_tier = NvmeTierMode::kOff;
  const MemoryFootprint ram = EstimateFootprintForConfig(in_ram, config);
  const MemoryFootprint tiered = EstimateFootprintForConfig(spec, config);
  EXPECT_EQ(tiered.host.exp_avg + tiered.host.exp_avg_sq, 0);
  EXPECT_EQ(tiered.host.staging, ram.host.staging + 2 * NvmeTierStagingBytes());
  const int64_t embedding = (layout.blocks[layout.embedding_block()].numel + 1023) / 1024 * 1024;
  EXPECT_EQ(tiered.host.grad, ram.host.grad + 2 * 4 * embedding);
  EXPECT_EQ(tiered.host_total_bytes, plan->tiers.host_bytes);
}

TEST(PlanTest, AutoUsesTheTierOnlyWhenTheHostIsTooSmall) {
  JobSpec spec = Llama8bSpec();
  spec.memory.nvme_tier = NvmeTierMode::kAuto;
  const ModelConfig config = *PresetConfig("llama-8b");
  PlanMachine machine = DefaultPlanMachine();
  machine.nvme_bytes = int64_t{1} << 40;
  machine.host_memory_bytes = int64_t{1} << 40;
  absl::StatusOr<JobPlan> plan = PlanJob(spec, config, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->nvme_tier, NvmeTierMode::kOff);
  // 125 GiB: llama-8b's ~145 GB do not fit, ~81 GB do.
  machine.host_memory_bytes = int64_t{125} << 30;
  plan = PlanJob(spec, config, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->nvme_tier, NvmeTierMode::kMoments);
  EXPECT_TRUE(plan->fits);
  EXPECT_THAT(plan->verdict, HasSubstr("AdamW moments on NVMe"));
  // Without a tier, the verdict says what does not fit and what would.
  machine.nvme_bytes = 0;
  spec.memory.nvme_tier = NvmeTierMode::kOff;
  plan = PlanJob(spec, config, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->fits);
  EXPECT_THAT(plan->verdict, HasSubstr("does not fit: host"));
  EXPECT_THAT(plan->verdict, HasSubstr("NVMe"));
}

TEST(PlanTest, ProjectionMatchesTheMeasuredLlama8bStep) {
  // docs/performance.md: llama-8b, 8 x 2048, bf16, H200: step 2.230 s,
  // compute-bound. The calibration point of kPlanMatmulFraction; 5% is
  // the run-to-run spread of the measured steps (2.230 to 2.307 s).
  const absl::StatusOr<JobPlan> plan =
      PlanJob(Llama8bSpec(), *PresetConfig("llama-8b"), DefaultPlanMachine());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->projection.bound, "compute");
  EXPECT_NEAR(plan->projection.step_seconds, 2.23, 0.05 * 2.23);
  EXPECT_EQ(plan->projection.tokens, 8 * 2048);
}

// Note [Plan projection]: layers whose forward graph is kept are not
// recomputed, so llama-1b, whose layers all keep it on the default H200,
// is projected with 2 N_layers x tokens fewer FLOPs than with `all`.
TEST(PlanTest, KeptGraphsTakeTheRecomputeOutOfTheProjection) {
  const ModelConfig config = *PresetConfig("llama-1b");
  JobSpec spec = Llama8bSpec();
  spec.model.preset = "llama-1b";
  JobSpec all = spec;
  all.train.activation_checkpointing = ActivationCheckpointing::kAll;
  const absl::StatusOr<JobPlan> kept = PlanJob(spec, config, DefaultPlanMachine());
  const absl::StatusOr<JobPlan> recomputed = PlanJob(all, config, DefaultPlanMachine());
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(recomputed.ok()) << recomputed.status();
  const ModelLayout layout = ModelLayout::Create(config);
  double layers = 0;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    layers += static_cast<double>(layout.blocks[layout.layer_block(l)].numel);
  }
  const double saved_flops = 2.0 * layers * 8 * 2048;
  EXPECT_NEAR(recomputed->projection.compute_seconds - kept->projection.compute_seconds,
              saved_flops / (DefaultPlanMachine().matmul_flops_per_second * kPlanMatmulFraction),
              1e-9);
  EXPECT_GT(kept->footprint.device_estimate_bytes, recomputed->footprint.device_estimate_bytes);
}

// Note [Plan projection] with train.devices N: one GPU's share of the
// compute and of the streamed bytes (1/N of each block loaded, 1/N of its
// gradient landed once), the whole CPU AdamW, MFU per GPU. llama-8b with
// weight_stream fp32 at accumulation 4 streams its layers, so every term
// is non-zero.
TEST(PlanTest, DataParallelProjectionIsOneGpusShare) {
  const ModelConfig config = *PresetConfig("llama-8b");
  JobSpec one = Llama8bSpec();
  one.train.gradient_accumulation_steps = 4;
  one.memory.weight_stream = WeightStream::kFp32;
  one.train.resident_layers = 8;  // the same choices on every count
  one.train.schedule = StepSchedule::kMicroBatchMajor;
  JobSpec four = one;
  four.train.devices = 4;
  const absl::StatusOr<JobPlan> a = PlanJob(one, config, DefaultPlanMachine());
  const absl::StatusOr<JobPlan> b = PlanJob(four, config, DefaultPlanMachine());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const StepProjection &p1 = a->projection, &p4 = b->projection;
  EXPECT_EQ(p4.tokens, p1.tokens) << "the global batch";
  EXPECT_DOUBLE_EQ(p4.compute_seconds, p1.compute_seconds / 4);
  ASSERT_GT(p1.h2d_seconds, 0);
  // 1 of 4 micro-batches per GPU, 1/4 of each block: 1/16 of the loads.
  EXPECT_DOUBLE_EQ(p4.h2d_seconds, p1.h2d_seconds / 16);
  EXPECT_DOUBLE_EQ(p4.adamw_seconds, p1.adamw_seconds);
  EXPECT_NEAR(p4.mfu,
              p4.model_flops / 4 / p4.step_seconds / DefaultPlanMachine().matmul_flops_per_second,
              1e-12);
  EXPECT_GT(p4.tokens_per_second, p1.tokens_per_second);
}

// A caller's device count is bounded as at submission (the projection
// divides by it): PlanJobForModel, what PlanJob runs, refuses it.
TEST(PlanTest, ADeviceCountOutOfRangeIsRefusedNamingTheField) {
  PlanModel model;
  model.preset = "llama-8b";
  for (const int64_t devices : {int64_t{100000}, int64_t{-3}}) {
    JobSpec spec = Llama8bSpec();
    spec.train.devices = devices;
    EXPECT_THAT(PlanJobForModel(model, spec, DefaultPlanMachine()).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("train.devices: must be in [0, 64]")))
        << devices;
  }
}

TEST(PlanTest, DeviceBytesFollowTheTrainersAutoChoicesForTheGpu) {
  // 70B with accumulation: its streamed gradients (4 B/param, 280 GB) are
  // far over a quarter of an H200, so the trainer keeps them on the host;
  // the job's own footprint counts them as an upper bound.
  JobSpec spec = Llama8bSpec();
  spec.train.gradient_accumulation_steps = 8;
  const ModelConfig config = *ConfigForParamCount("llama", 70e9);
  PlanMachine machine = DefaultPlanMachine();
  machine.host_memory_bytes = int64_t{2} << 40;
  const absl::StatusOr<JobPlan> plan = PlanJob(spec, config, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const MemoryFootprint upper = EstimateFootprintForConfig(spec, config);
  EXPECT_GT(upper.device_estimate_bytes, machine.gpu_memory_bytes);
  EXPECT_LT(plan->tiers.device_bytes, machine.gpu_memory_bytes);
  EXPECT_LT(plan->tiers.device_bytes, upper.device_estimate_bytes - 4 * int64_t{60'000'000'000});
  // The wave's saved inputs (8 micro-batches x 80 layers) do not fit the
  // device: like the trainer's auto choice (Note [Schedule choice]), the
  // plan shrinks the wave and keeps them there, so the host holds what the
  // footprint counts and no pinned inputs.
  EXPECT_EQ(plan->tiers.host_bytes, upper.host_total_bytes);
  JobSpec offloaded = spec;
  offloaded.train.activations = ActivationPlacement::kHost;
  EXPECT_LT(plan->tiers.host_bytes, EstimateFootprintForConfig(offloaded, config).host_total_bytes);
  EXPECT_TRUE(plan->fits) << plan->verdict;
  // Asked for, the host holds them, and the plan counts them.
  const absl::StatusOr<JobPlan> asked = PlanJob(offloaded, config, machine);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->tiers.host_bytes,
            EstimateFootprintForConfig(offloaded, config).host_total_bytes);
}

// Note [No expert-group sub-blocks] (plan.cc): a MoE layer is one streamed
// block; when its slots alone exceed the device the plan says so, naming
// the layer, its size and the device, instead of suggesting a smaller
// micro_batch. mixtral-4b's layers are 237M parameters: 3 bf16 weight
// slots and 2 fp32 gradient slots need 14 bytes each, 3.3 GB.
TEST(PlanTest, ALayerWhoseSlotsExceedTheDeviceIsRefusedNamingIt) {
  JobSpec spec = Llama8bSpec();
  spec.model.preset = "mixtral-4b";
  spec.train.micro_batch = 1;
  spec.train.seq_len = 128;
  const ModelConfig config = *PresetConfig("mixtral-4b");
  PlanMachine machine = DefaultPlanMachine();
  machine.host_memory_bytes = int64_t{1} << 40;
  machine.gpu_memory_bytes = int64_t{2} << 30;
  absl::StatusOr<JobPlan> plan = PlanJob(spec, config, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->fits);
  EXPECT_THAT(plan->verdict, HasSubstr("decoder layer 0 is one streamed block of"));
  EXPECT_THAT(plan->verdict, HasSubstr("expert-group sub-blocks are not built"));
  machine.gpu_memory_bytes = int64_t{80} << 30;
  plan = PlanJob(spec, config, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->verdict, ::testing::Not(HasSubstr("sub-blocks")));
}

// train.resident_layers: the plan uses the count asked for (its device
// bytes are the trainer's for it), and one whose executor buffers alone
// exceed the device does not fit, naming the field (the trainer refuses
// it with RESOURCE_EXHAUSTED when the job starts).
TEST(PlanTest, ResidentLayersAskedForAreThePlansAndOneThatCanNeverFitDoesNot) {
  JobSpec spec = Llama8bSpec();
  const ModelConfig config = *PresetConfig("llama-8b");
  PlanMachine machine = DefaultPlanMachine();
  machine.host_memory_bytes = int64_t{1500} * 1000 * 1000 * 1000;
  machine.gpu_memory_bytes = int64_t{80} * 1000 * 1000 * 1000;
  spec.train.resident_layers = 4;
  absl::StatusOr<JobPlan> plan = PlanJob(spec, config, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->fits) << plan->verdict;
  const ModelLayout layout = ModelLayout::Create(config);
  const int64_t layer = layout.blocks[layout.layer_block(0)].numel;
  const int64_t table = layout.blocks[layout.embedding_block()].numel;
  // 4 layers at 18 bytes per parameter, the table (auto: it fits) at 16.
  EXPECT_EQ(plan->footprint.device_resident_bytes, 4 * 18 * layer + 16 * table);
  spec.train.resident_layers = 32;
  plan = PlanJob(spec, config, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->fits);
  EXPECT_THAT(plan->verdict, HasSubstr("train.resident_layers: 32 resident decoder layers need "));
  EXPECT_THAT(plan->verdict, HasSubstr("it can never run there"));
}

// The footprint carries the largest streamed block and its slots' bytes
// (3 bf16 weight slots and 2 fp32 gradient slots: 14 bytes per parameter;
// memory.weight_stream fp32 adds the cast staging), and
// CheckBlockSlotsFitDevice, which the daemon's admission calls, refuses a
// device smaller than them with RESOURCE_EXHAUSTED naming the layer, its
// bytes and the device's.
TEST(PlanTest, FootprintNamesTheLargestStreamedBlockAndItsSlots) {
  JobSpec spec = Llama8bSpec();
  spec.model.preset = "mixtral-4b";
  spec.train.compute_dtype = ComputeDtype::kBf16;
  const ModelConfig config = *PresetConfig("mixtral-4b");
  const ModelLayout layout = ModelLayout::Create(config);
  const int64_t layer_params = layout.blocks[layout.layer_block(0)].numel;
  MemoryFootprint f = EstimateFootprintForConfig(spec, config);
  EXPECT_EQ(f.largest_block_layer_idx, 0);
  EXPECT_EQ(f.largest_block_params, layer_params);
  EXPECT_EQ(f.block_slot_bytes, 14 * layer_params);
  EXPECT_GE(f.device_estimate_bytes, f.block_slot_bytes);
  EXPECT_THAT(CheckBlockSlotsFitDevice(f, int64_t{80} << 30, "cuda:0"), IsOk());
  EXPECT_THAT(CheckBlockSlotsFitDevice(f, 0, "cpu"), IsOk());
  EXPECT_THAT(
      CheckBlockSlotsFitDevice(f, int64_t{2} << 30, "cuda:0"),
      StatusIs(absl::StatusCode::kResourceExhausted,
               ::testing::AllOf(HasSubstr(absl::StrCat("decoder layer 0 is one streamed block of ",
                                                       layer_params, " parameters")),
                                HasSubstr(absl::StrCat("need ", 14 * layer_params, " bytes")),
                                HasSubstr("> device cuda:0 2147483648 bytes (2 GiB)"))));
  spec.memory.weight_stream = WeightStream::kFp32;
  EXPECT_GT(EstimateFootprintForConfig(spec, config).block_slot_bytes, f.block_slot_bytes);
  // A dense model's largest streamed block can be the head (lm_head).
  JobSpec dense = Llama8bSpec();
  const ModelConfig llama = *PresetConfig("llama-8b");
  const MemoryFootprint head = EstimateFootprintForConfig(dense, llama);
  EXPECT_EQ(head.largest_block_layer_idx, -1);
  EXPECT_EQ(head.largest_block_params, ModelLayout::Create(llama).blocks.back().numel);
}

// Note [Host cast] (engine/step/host_cast.h): weight_stream host_cast
// holds fp32's host bytes (no bf16 copy) plus its pinned ring (one largest
// streamed block and one chunk, as staging), moves bf16's H2D bytes (the
// plan's H2D time is the copy's, half of fp32's), and needs no device
// cast staging.
TEST(PlanTest, HostCastHasTheFp32HostBytesAndTheBf16H2dTime) {
  JobSpec spec = Llama8bSpec();
  spec.train.gradient_accumulation_steps = 4;
  const ModelConfig config = *PresetConfig("llama-8b");
  const PlanMachine machine = DefaultPlanMachine();
  absl::StatusOr<JobPlan> plans[3];
  const WeightStream streams[] = {WeightStream::kBf16, WeightStream::kFp32,
                                  WeightStream::kHostCast};
  for (int i = 0; i < 3; ++i) {
    spec.memory.weight_stream = streams[i];
    plans[i] = PlanJob(spec, config, machine);
    ASSERT_TRUE(plans[i].ok()) << plans[i].status();
  }
  const JobPlan &copy = *plans[0], &fp32 = *plans[1], &cast = *plans[2];
  EXPECT_EQ(cast.footprint.host.streaming, 0);
  EXPECT_EQ(cast.footprint.host.master, fp32.footprint.host.master);
  EXPECT_EQ(cast.footprint.host.grad, fp32.footprint.host.grad);
  EXPECT_EQ(cast.footprint.host.pinned, fp32.footprint.host.pinned);
  const int64_t ring = HostCastRingOf(cast.footprint.largest_block_params).pinned_bytes();
  EXPECT_GT(ring, 0);
  EXPECT_EQ(cast.footprint.host.staging - fp32.footprint.host.staging, ring);
  EXPECT_EQ(cast.tiers.host_bytes - fp32.tiers.host_bytes, ring);
  EXPECT_DOUBLE_EQ(cast.projection.h2d_seconds, copy.projection.h2d_seconds);
  EXPECT_DOUBLE_EQ(fp32.projection.h2d_seconds, 2 * cast.projection.h2d_seconds);
  EXPECT_LT(cast.footprint.block_slot_bytes, fp32.footprint.block_slot_bytes);
  EXPECT_EQ(cast.footprint.block_slot_bytes, copy.footprint.block_slot_bytes);
}

// The 7B MoE presets on the GPU machine (one H200, 125 GiB of host
// RAM of which the process, the CUDA context and the OS need a few): with
// memory.weight_stream fp32 (no bf16 copy: master, gradient and AdamW
// moments, 16 bytes per parameter) at micro-batch 8 x 2048, accumulation 4,
// clipping at 1.0, the footprint stays under 118 GiB; with the bf16 copy
// (18 bytes per parameter) qwen3-moe-7b's does not. The GPU commands of
// docs/performance.md run them with --weight_stream=fp32 for this reason.
TEST(PlanTest, MoeSevenBillionPresetsFitTheGpuHostWithFp32Streaming) {
  constexpr int64_t kHostBudget = int64_t{118} << 30;
  for (const char* preset : {"qwen3-moe-7b", "mixtral-7b"}) {
    SCOPED_TRACE(preset);
    JobSpec spec;
    spec.model.preset = preset;
    spec.train.micro_batch = 8;
    spec.train.seq_len = 2048;
    spec.train.gradient_accumulation_steps = 4;
    spec.train.max_grad_norm = 1.0;
    spec.train.compute_dtype = ComputeDtype::kBf16;
    spec.memory.weight_stream = WeightStream::kFp32;
    const ModelConfig config = *PresetConfig(preset);
    const MemoryFootprint f = EstimateFootprintForConfig(spec, config);
    // In --gtest_output=xml: the host bytes docs/performance.md predicts.
    RecordProperty(std::string(preset) + "_host_total_bytes", std::to_string(f.host_total_bytes));
    RecordProperty(std::string(preset) + "_params", std::to_string(f.params));
    EXPECT_LT(f.host_total_bytes, kHostBudget) << f.host_total_bytes;
    EXPECT_EQ(f.host.streaming, 0);
    EXPECT_LT(f.host_total_bytes, 17 * f.params);  // 16 B/param + staging
    PlanMachine h200 = DefaultPlanMachine();
    h200.host_memory_bytes = kHostBudget;
    const absl::StatusOr<JobPlan> plan = PlanJob(spec, config, h200);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(plan->fits) << plan->verdict;
    spec.memory.weight_stream = WeightStream::kBf16;
    const MemoryFootprint with_copy = EstimateFootprintForConfig(spec, config);
    EXPECT_NEAR(static_cast<double>(with_copy.host_total_bytes - f.host_total_bytes),
                2.0 * static_cast<double>(f.params), 1e-3 * static_cast<double>(f.params));
    if (std::string(preset) == "qwen3-moe-7b") {
      EXPECT_GT(with_copy.host_total_bytes, kHostBudget);
    }
  }
}

// Note [Schedule choice]: whatever auto picks on a device, the executor's
// pinned host buffers (staging, rings, offloaded layer inputs) are at most
// what the footprint, and so admission, counted. A 28.9 B model at
// accumulation 4 was killed by the kernel when auto moved 74 GB of saved
// layer inputs to pinned host memory that the footprint did not hold.
TEST(PlanTest, AutoNeverPinsMoreHostMemoryThanTheFootprintCounts) {
  const ModelConfig qwen32 = [] {
    ModelConfig c = *PresetConfig("llama-8b");
    c.hidden_size = 5120;  // Qwen3-32B's widths, 56 layers
    c.intermediate_size = 25600;
    c.num_hidden_layers = 56;
    c.num_attention_heads = 64;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.vocab_size = 151936;
    return c;
  }();
  constexpr int64_t kH200 = int64_t{150} * 1000 * 1000 * 1000;
  constexpr int64_t kH100 = int64_t{80} * 1000 * 1000 * 1000;
  struct Case {
    const char* name;
    ModelConfig config;
    int64_t micro_batch, seq_len, accumulation, device;
  };
  const std::vector<Case> cases = {
      {"qwen3-32b-56l acc 4, H200", qwen32, 8, 2048, 4, kH200},
      {"llama-8b acc 8, H100", *PresetConfig("llama-8b"), 8, 2048, 8, kH100},
      {"llama-8b 1 x 65536, H100", *PresetConfig("llama-8b"), 1, 65536, 2, kH100},
      {"qwen3-moe-7b acc 4, H200", *PresetConfig("qwen3-moe-7b"), 8, 2048, 4, kH200},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    JobSpec spec = Llama8bSpec();
    spec.train.micro_batch = c.micro_batch;
    spec.train.seq_len = c.seq_len;
    spec.train.gradient_accumulation_steps = c.accumulation;
    spec.train.max_grad_norm = 1.0;
    spec.memory.weight_stream = WeightStream::kFp32;
    const TrainerOptions options = StepOptionsOf(spec);
    const ExecutorOptions executor = ExecutorOptionsOf(options);
    const absl::StatusOr<ScheduleChoice> choice =
        ChooseSchedule(c.config, ScheduleRequestOf(options), executor, c.device);
    ASSERT_THAT(choice, IsOk());
    EXPECT_FALSE(choice->offload_activations) << choice->Describe();
    const ExecutorMemoryPlan plan = PlanExecutorMemory(c.config, WithChoice(executor, *choice));
    EXPECT_EQ(plan.activation_offload_bytes, 0);
    const MemoryFootprint f = EstimateFootprintForConfig(spec, c.config);
    // The footprint plans an untied embedding resident; where the device
    // cannot hold it beside one micro-batch's inputs (llama-8b at 1 x
    // 65,536 on 80 GB) the host keeps it, with its gradient and staging
    // beyond the footprint: a known gap (training_job.h, README "Not built
    // yet"), not this test's.
    if (choice->resident_embedding) {
      EXPECT_LE(plan.pinned_bytes(), f.host.staging) << choice->Describe();
    } else {
      EXPECT_STREQ(c.name, "llama-8b 1 x 65536, H100") << choice->Describe();
    }
  }
}

TEST(PlanTest, RejectsANegativeRateNamingTheField) {
  PlanMachine machine = DefaultPlanMachine();
  machine.nvme_write_bytes_per_second = -1;
  EXPECT_THAT(PlanJob(Llama8bSpec(), *PresetConfig("llama-8b"), machine).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("machine.nvme_write_bytes_per_second")));
}

// A Cancellation that counts its checks and cancels from check
// `cancel_at` on (0: never), so that a test stops a plan at a chosen point
// without clocks or threads.
class CountingCancellation {
 public:
  explicit CountingCancellation(int cancel_at) : cancel_at_(cancel_at) {}
  Cancellation token() {
    return Cancellation([this] {
      ++checks_;
      return cancel_at_ > 0 && checks_ >= cancel_at_
                 ? absl::CancelledError(absl::StrCat("test: cancelled at check ", checks_))
                 : absl::OkStatus();
    });
  }
  int checks() const { return checks_; }

 private:
  const int cancel_at_;
  int checks_ = 0;
};

TEST(PlanCancellationTest, AnAlreadyCancelledPlanReturnsCancelledAtItsFirstCheck) {
  CountingCancellation cancel(1);
  EXPECT_THAT(
      PlanJob(Llama8bSpec(), *PresetConfig("llama-8b"), DefaultPlanMachine(), cancel.token()),
      StatusIs(absl::StatusCode::kCancelled, HasSubstr("test: cancelled at check 1")));
  EXPECT_EQ(cancel.checks(), 1);
}

// llama-8b on an H200: the resident-layer search runs (32 layers, ~5
// tries) and the footprint's phases follow; a plan cancelled at any check
// returns that check's status and checks nothing more (no step of work
// runs after the cancellation is seen).
TEST(PlanCancellationTest, APlanCancelledAtAnyCheckStopsThereWithCancelled) {
  const JobSpec spec = Llama8bSpec();
  const ModelConfig config = *PresetConfig("llama-8b");
  CountingCancellation never(0);
  ASSERT_THAT(PlanJob(spec, config, DefaultPlanMachine(), never.token()).status(), IsOk());
  const int total = never.checks();
  // The search's tries, the footprint's four phases and the projection.
  ASSERT_GE(total, 8);
  for (int cancel_at = 1; cancel_at <= total; ++cancel_at) {
    CountingCancellation cancel(cancel_at);
    EXPECT_THAT(PlanJob(spec, config, DefaultPlanMachine(), cancel.token()),
                StatusIs(absl::StatusCode::kCancelled,
                         HasSubstr(absl::StrCat("cancelled at check ", cancel_at))));
    EXPECT_EQ(cancel.checks(), cancel_at);
  }
}

// The largest model Note [Model bounds] admits through PlanJob's family
// (1e13 parameters, ~3,100 layers: seconds of plan on 2 cores) stops at
// the check that cancels it: after at most one layout of every block.
TEST(PlanCancellationTest, ALargeModelsPlanStopsAtTheCheckThatCancelsIt) {
  const absl::StatusOr<ModelConfig> config = ConfigForParamCount("llama", 1e13);
  ASSERT_THAT(config.status(), IsOk());
  CountingCancellation cancel(3);
  EXPECT_THAT(PlanJob(Llama8bSpec(), *config, DefaultPlanMachine(), cancel.token()),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("cancelled at check 3")));
  EXPECT_EQ(cancel.checks(), 3);
}

TEST(PlanCancellationTest, ACancelledFootprintEstimateReturnsTheCancellationsStatus) {
  CountingCancellation cancel(2);
  EXPECT_THAT(EstimateFootprintForConfig(Llama8bSpec(), *PresetConfig("llama-8b"), cancel.token()),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("cancelled at check 2")));
  EXPECT_EQ(cancel.checks(), 2);
}

TEST(ConfigForParamCountTest, ScalesTheNearestLlamaShape) {
  const absl::StatusOr<ModelConfig> c = ConfigForParamCount("llama", 120e9);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 8192);
  EXPECT_NEAR(static_cast<double>(c->ParamCount()), 120e9, 0.01 * 120e9);
  const absl::StatusOr<ModelConfig> small = ConfigForParamCount("llama", 8.03e9);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->num_hidden_layers, 32);
}

TEST(ConfigForParamCountTest, RejectsUnknownFamiliesAndSizes) {
  EXPECT_THAT(ConfigForParamCount("gpt2", 1e9).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("known: llama")));
  EXPECT_THAT(ConfigForParamCount("llama", 1e3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.param_count")));
}

}  // namespace
}  // namespace megatrain::engine
