// StepOptionsOf (engine/job/step_options.h): every step field of a job
// spec reaches the trainer's options, and the schedule request and the
// executor's options derived from them state the rules once
// (RequestedActivations, RequestedOrder).
#include "engine/job/step_options.h"

#include "engine/model/fused_ops.h"
#include "engine/step/executor.h"
#include "engine/step/schedule_choice.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

JobSpec EverythingSet() {
  JobSpec s;
  s.train.micro_batch = 3;
  s.train.seq_len = 64;
  s.train.gradient_accumulation_steps = 6;
  s.train.max_steps = 40;
  s.train.compute_dtype = ComputeDtype::kBf16;
  s.train.max_grad_norm = 0.0;
  s.train.nan_policy = NanPolicy::kFail;
  s.train.schedule = StepSchedule::kLayerMajor;
  s.train.wave = 4;
  s.train.activations = ActivationPlacement::kDevice;
  s.train.cuda_graphs = CudaGraphs::kOff;
  s.train.fused_kernels = FusedKernels::kOff;
  s.train.activation_checkpointing = ActivationCheckpointing::kAll;
  s.train.resident_layers = 2;
  s.optimizer.lr = 2e-4;
  s.optimizer.beta1 = 0.8;
  s.optimizer.beta2 = 0.99;
  s.optimizer.eps = 1e-6;
  s.optimizer.weight_decay = 0.1;
  s.optimizer.warmup_steps = 5;
  s.optimizer.schedule = LrScheduleKind::kLinear;
  s.optimizer.min_lr_ratio = 0.1;
  s.memory.weight_stream = WeightStream::kFp32;
  s.memory.gradient_landing = GradientLanding::kAuto;
  return s;
}

TEST(StepOptionsTest, EveryStepFieldReachesTheTrainerOptions) {
  const TrainerOptions t = StepOptionsOf(EverythingSet());
  EXPECT_EQ(t.micro_batch, 3);
  EXPECT_EQ(t.seq_len, 64);
  EXPECT_EQ(t.gradient_accumulation_steps, 6);
  EXPECT_EQ(t.compute_dtype, ComputeDtype::kBf16);
  EXPECT_EQ(t.max_grad_norm, 0.0);
  EXPECT_EQ(t.nan_policy, NanPolicy::kFail);
  EXPECT_EQ(t.step_schedule, StepSchedule::kLayerMajor);
  EXPECT_EQ(t.wave, 4);
  EXPECT_EQ(t.activation_placement, ActivationPlacement::kDevice);
  EXPECT_EQ(t.cuda_graphs, 0);
  EXPECT_FALSE(t.fused_kernels);
  EXPECT_EQ(t.kept_graph_layers, 0);  // activation_checkpointing: all
  EXPECT_EQ(t.resident_layers, 2);
  EXPECT_EQ(t.adamw.lr, 2e-4);
  EXPECT_EQ(t.adamw.beta1, 0.8);
  EXPECT_EQ(t.adamw.beta2, 0.99);
  EXPECT_EQ(t.adamw.eps, 1e-6);
  EXPECT_EQ(t.adamw.weight_decay, 0.1);
  EXPECT_EQ(t.schedule.kind, LrScheduleKind::kLinear);
  EXPECT_EQ(t.schedule.warmup_steps, 5);
  EXPECT_EQ(t.schedule.total_steps, 40);  // MaxSteps
  EXPECT_EQ(t.schedule.min_lr_ratio, 0.1);
  EXPECT_EQ(t.weight_stream, WeightStream::kFp32);
  EXPECT_EQ(t.gradient_landing, GradientLanding::kAuto);
  // What a job file does not say keeps the trainer's defaults.
  EXPECT_EQ(t.device, TrainerOptions().device);
  EXPECT_EQ(t.resident_embedding, -1);
  EXPECT_EQ(t.device_grad_accumulation, -1);
  EXPECT_TRUE(t.nvme_dir.empty());
}

// train.activation_checkpointing: auto leaves the kept graphs to the
// schedule choice (-1), all keeps none (0).
TEST(StepOptionsTest, ActivationCheckpointingAutoLeavesTheChoiceToTheTrainer) {
  JobSpec s = EverythingSet();
  s.train.activation_checkpointing = ActivationCheckpointing::kAuto;
  EXPECT_EQ(StepOptionsOf(s).kept_graph_layers, -1);
  EXPECT_EQ(StepOptionsOf(JobSpec()).kept_graph_layers, -1);  // the default
}

// train.fused_kernels: auto is on exactly in a build with the kernels;
// on is on (the spec's validation refuses it in a build without them).
TEST(StepOptionsTest, FusedKernelsAutoFollowsTheBuild) {
  JobSpec s = EverythingSet();
  s.train.fused_kernels = FusedKernels::kAuto;
  EXPECT_EQ(StepOptionsOf(s).fused_kernels, FusedKernelsCompiled());
  s.train.fused_kernels = FusedKernels::kOn;
  EXPECT_TRUE(StepOptionsOf(s).fused_kernels);
  EXPECT_FALSE(FusedKernelsEnabled(FusedKernels::kAuto, /*compiled=*/false));
  EXPECT_TRUE(FusedKernelsEnabled(FusedKernels::kAuto, /*compiled=*/true));
  EXPECT_FALSE(FusedKernelsEnabled(FusedKernels::kOff, /*compiled=*/true));
}

// train.fused_kernels 'on' is refused at submission by a build without
// the kernels (UNIMPLEMENTED naming the field), accepted by one with them;
// auto and off are accepted by both. The spec's own errors come too.
TEST(StepOptionsTest, FusedKernelsOnNeedsABuildWithThem) {
  JobSpec spec = EverythingSet();
  spec.model.preset = "tiny";
  spec.data.tokens = "/data/tokens";
  ASSERT_THAT(ValidateJobSpecForThisBuild(spec), IsOk());
  spec.train.fused_kernels = FusedKernels::kOn;
  if (FusedKernelsCompiled()) {
    EXPECT_THAT(ValidateJobSpecForThisBuild(spec), IsOk());
  } else {
    EXPECT_THAT(ValidateJobSpecForThisBuild(spec),
                StatusIs(absl::StatusCode::kUnimplemented,
                         HasSubstr("train.fused_kernels: 'on' needs a CUDA build")));
    spec.train.micro_batch = 0;
    EXPECT_THAT(ValidateJobSpecForThisBuild(spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("train.micro_batch"), HasSubstr("train.fused_kernels"))));
    spec.train.micro_batch = 3;
  }
  for (FusedKernels word : {FusedKernels::kAuto, FusedKernels::kOff}) {
    spec.train.fused_kernels = word;
    EXPECT_THAT(ValidateJobSpecForThisBuild(spec), IsOk()) << FusedKernelsName(word);
  }
}

// The request and the executor's options are those Trainer::Create
// resolves: offload_activations means the host; bf16 with weight_stream
// fp32 streams the master.
TEST(StepOptionsTest, RequestAndExecutorOptionsFollowTheSpec) {
  JobSpec s = EverythingSet();
  const ScheduleRequest request = ScheduleRequestOf(StepOptionsOf(s));
  EXPECT_EQ(request.schedule, StepSchedule::kLayerMajor);
  EXPECT_EQ(request.wave, 4);
  EXPECT_EQ(request.activations, ActivationPlacement::kDevice);
  EXPECT_EQ(request.gradient_accumulation_steps, 6);
  EXPECT_EQ(request.resident_layers, 2);
  EXPECT_EQ(request.cuda_graphs, 0);
  const ExecutorOptions exec = ExecutorOptionsOf(StepOptionsOf(s));
  EXPECT_TRUE(exec.stream_fp32_master);
  EXPECT_FALSE(exec.host_cast);
  s.memory.weight_stream = WeightStream::kHostCast;  // Note [Host cast]: no copy either
  EXPECT_TRUE(ExecutorOptionsOf(StepOptionsOf(s)).stream_fp32_master);
  EXPECT_TRUE(ExecutorOptionsOf(StepOptionsOf(s)).host_cast);
  s.memory.weight_stream = WeightStream::kFp32;
  EXPECT_EQ(exec.micro_batch, 3);
  EXPECT_EQ(exec.seq_len, 64);
  s.train.activations = ActivationPlacement::kAuto;
  s.train.offload_activations = true;
  EXPECT_EQ(ScheduleRequestOf(StepOptionsOf(s)).activations, ActivationPlacement::kHost);
}

// Note [Schedule choice]: the order and wave a request gets before the
// activation budget, the footprint's and ChooseSchedule's starting point.
TEST(StepOptionsTest, RequestedOrderIsLayerMajorForAccumulationOnAGpu) {
  JobSpec s = EverythingSet();
  s.train.schedule = std::nullopt;
  s.train.wave = 0;
  const ScheduleRequest request = ScheduleRequestOf(StepOptionsOf(s));
  EXPECT_EQ(RequestedOrder(request, /*gpu=*/true).schedule, StepSchedule::kLayerMajor);
  EXPECT_EQ(RequestedOrder(request, /*gpu=*/true).wave, 6);
  EXPECT_EQ(RequestedOrder(request, /*gpu=*/false).schedule, StepSchedule::kMicroBatchMajor);
  EXPECT_EQ(RequestedOrder(request, /*gpu=*/false).wave, 1);
  s.train.wave = 10;  // capped at the micro-batches of a step
  EXPECT_EQ(RequestedOrder(ScheduleRequestOf(StepOptionsOf(s)), /*gpu=*/false).wave, 6);
}

}  // namespace
}  // namespace megatrain::engine
