// The trainer under the layer-major schedule (Note [Layer-major schedule]
// in engine/step/step_plan.h): every block's gradient is summed in the
// micro-batch-major order, so whole training runs (clipping that fires and
// that does not, no clipping, activations on the device and offloaded,
// waves smaller than the step) and every non-finite step under each
// nan_policy end bit for bit where the micro-batch-major trainer ends
// (itself checked against sequential AdamW in trainer_test.cc); and the
// schedule choice (Note [Schedule choice] in engine/step/schedule_choice.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/step/executor.h"
#include "engine/step/schedule_choice.h"
#include "engine/step/trainer.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_state.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::AllState;
using ::megatrain::testing::BitIdentical;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeBatches;
using ::megatrain::testing::SmallLlama;
using ::megatrain::testing::SmallTrainerOptions;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kB = 2, kT = 8;

// Both schedules sum the micro-batches on the "device" (the CPU runtime
// here): micro-batch-major in the accumulation buffers, layer-major in the
// gradient slots (one wave) or the same buffers (several), so every
// block's squared norm is computed by the same device function on the
// same fp32 sum and the reported grad_norm is equal too (host-side
// accumulation sums the squares in another fp64 order).
TrainerOptions Options(double max_grad_norm, StepSchedule schedule) {
  TrainerOptions o = SmallTrainerOptions(kB, kT, max_grad_norm, /*total_steps=*/4);
  o.step_schedule = schedule;
  o.device_grad_accumulation = 1;
  return o;
}

struct TrainingRun {
  std::vector<StepResult> results;  // every step's (ok ones)
  absl::Status error;               // the first failed step's
  std::vector<float> state;         // AllState at the end
  ScheduleChoice choice;
};

TrainingRun Train(const TrainerOptions& o, const std::vector<std::vector<MicroBatch>>& steps) {
  TrainingRun run;
  auto trainer = Trainer::Create(SmallLlama(), o, /*seed=*/5);
  EXPECT_THAT(trainer, IsOk());
  if (!trainer.ok()) return run;
  run.choice = (*trainer)->schedule_choice();
  for (const auto& batches : steps) {
    auto r = (*trainer)->Step(batches);
    if (!r.ok()) {
      run.error = r.status();
      break;
    }
    run.results.push_back(*r);
  }
  EXPECT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  run.state = AllState((*trainer)->store());
  return run;
}

std::vector<std::vector<MicroBatch>> Steps(int accumulation, int count) {
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < count; ++s) {
    steps.push_back(MakeBatches(accumulation, kB, kT, SmallLlama().vocab_size, 500 + s));
  }
  return steps;
}

// Equal, or both NaN.
bool Same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// Both runs' step results and final state agree bit for bit.
void ExpectSameRun(const TrainingRun& mbm, const TrainingRun& lm) {
  ASSERT_EQ(mbm.results.size(), lm.results.size());
  for (size_t s = 0; s < mbm.results.size(); ++s) {
    EXPECT_PRED2(Same, mbm.results[s].loss, lm.results[s].loss) << "step " << s;
    EXPECT_PRED2(Same, mbm.results[s].grad_norm, lm.results[s].grad_norm) << "step " << s;
    EXPECT_EQ(mbm.results[s].skipped, lm.results[s].skipped) << "step " << s;
    EXPECT_EQ(mbm.results[s].partial, lm.results[s].partial) << "step " << s;
    EXPECT_EQ(mbm.results[s].step, lm.results[s].step) << "step " << s;
  }
  EXPECT_EQ(mbm.error.code(), lm.error.code());
  EXPECT_TRUE(BitIdentical(mbm.state, lm.state));
}

// (max_grad_norm, accumulation, wave, activations in host memory,
// resident layers).
using Case = std::tuple<double, int, int, bool, int>;

class LayerMajorTrainerTest : public ::testing::TestWithParam<Case> {};

TEST_P(LayerMajorTrainerTest, EndsBitIdenticalToMicroBatchMajor) {
  const auto [clip, accumulation, wave, host, resident] = GetParam();
  TrainerOptions mbm = Options(clip, StepSchedule::kMicroBatchMajor);
  mbm.resident_layers = resident;
  mbm.gradient_accumulation_steps = accumulation;
  TrainerOptions lm = mbm;
  lm.step_schedule = StepSchedule::kLayerMajor;
  lm.wave = wave;
  lm.activation_placement = host ? ActivationPlacement::kHost : ActivationPlacement::kDevice;
  const auto steps = Steps(accumulation, 3);
  const TrainingRun a = Train(mbm, steps);
  const TrainingRun b = Train(lm, steps);
  EXPECT_EQ(b.choice.schedule, StepSchedule::kLayerMajor);
  EXPECT_EQ(b.choice.wave, wave > 0 ? std::min(wave, accumulation) : accumulation);
  EXPECT_EQ(b.choice.offload_activations, host);
  ASSERT_EQ(a.results.size(), 3u);
  ExpectSameRun(a, b);
  for (const StepResult& r : b.results) {
    EXPECT_FALSE(r.skipped);
    // 0.05 clips every step of this model; 1e3 never does.
    if (clip == 0.05) EXPECT_GT(r.grad_norm, clip);
    if (clip == 1e3) EXPECT_LT(r.grad_norm, clip);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, LayerMajorTrainerTest,
                         ::testing::Values(Case{0.05, 1, 0, false, 0}, Case{0.05, 3, 0, false, 0},
                                           Case{1e3, 3, 0, false, 0}, Case{0.0, 3, 0, false, 0},
                                           Case{0.05, 4, 0, true, 0}, Case{0.05, 4, 3, false, 1},
                                           Case{0.0, 4, 2, true, 1}, Case{1e3, 3, 2, false, 0},
                                           // Every layer resident (Note [Auto resident
                                           // layers] keeps all of them when they fit).
                                           Case{0.05, 4, 0, false, 3}, Case{0.05, 3, 2, true, 3},
                                           Case{1e3, 4, 0, true, 2}),
                         [](const auto& info) {
                           const double clip = std::get<0>(info.param);
                           return absl::StrCat(clip == 0  ? "NoClip"
                                               : clip < 1 ? "ClipFires"
                                                          : "ClipIdle",
                                               "Accum", std::get<1>(info.param), "Wave",
                                               std::get<2>(info.param),
                                               std::get<3>(info.param) ? "Offloaded" : "OnDevice",
                                               "Resident", std::get<4>(info.param));
                         });

// (nan_policy, what goes non-finite, max_grad_norm): a poisoned step 2 of
// three under each policy gives the same outcome (skipped, partial or the
// job's error) and the same weights under both schedules.
using NanCase = std::tuple<NanPolicy, NonFiniteInjection::Kind, double>;

class LayerMajorNanTest : public ::testing::TestWithParam<NanCase> {};

TEST_P(LayerMajorNanTest, PoisonedStepEndsAsUnderMicroBatchMajor) {
  const auto [policy, kind, clip] = GetParam();
  TrainerOptions mbm = Options(clip, StepSchedule::kMicroBatchMajor);
  mbm.nan_policy = policy;
  mbm.debug_nonfinite = {.step = 2, .kind = kind};
  mbm.gradient_accumulation_steps = 3;
  TrainerOptions lm = mbm;
  lm.step_schedule = StepSchedule::kLayerMajor;
  const auto steps = Steps(3, 3);
  const TrainingRun a = Train(mbm, steps);
  const TrainingRun b = Train(lm, steps);
  ExpectSameRun(a, b);
  if (policy == NanPolicy::kFail) {
    EXPECT_THAT(b.error,
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step 2: loss ")));
    EXPECT_EQ(b.results.size(), 1u);
  } else {
    ASSERT_EQ(b.results.size(), 3u);
    EXPECT_TRUE(b.results[1].skipped);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, LayerMajorNanTest,
                         ::testing::Combine(::testing::Values(NanPolicy::kSkip, NanPolicy::kFail),
                                            ::testing::Values(NonFiniteInjection::Kind::kLoss,
                                                              NonFiniteInjection::Kind::kGradient),
                                            ::testing::Values(0.0, 1.0)),
                         [](const auto& info) {
                           return absl::StrCat(
                               std::get<0>(info.param) == NanPolicy::kSkip ? "Skip" : "Fail",
                               std::get<1>(info.param) == NonFiniteInjection::Kind::kLoss
                                   ? "NanLoss"
                                   : "InfGradient",
                               std::get<2>(info.param) > 0 ? "Clipping" : "NoClipping");
                         });

// The executor's options of the schedule tests: [8, 2048] fp32.
ExecutorOptions Executor() {
  ExecutorOptions o;
  o.micro_batch = 8;
  o.seq_len = 2048;
  return o;
}

// The executor's device bytes before any resident block (what the
// activation budget is taken from).
int64_t StreamingBytes() { return PlanExecutorMemory(SmallLlama(), Executor()).device_bytes(); }

// Note [Schedule choice].
TEST(ScheduleChoiceTest, AutoIsLayerMajorOnAGpuWithAccumulation) {
  const ModelConfig config = SmallLlama();
  ScheduleRequest request;
  request.gradient_accumulation_steps = 4;
  const int64_t gpu = int64_t{80} << 30;
  auto choice = ChooseSchedule(config, request, Executor(), gpu);
  ASSERT_THAT(choice, IsOk());
  EXPECT_EQ(choice->schedule, StepSchedule::kLayerMajor);
  EXPECT_EQ(choice->wave, 4);
  EXPECT_FALSE(choice->offload_activations);
  // 4 micro-batches x (3 layers + 2) x [8, 2048, 64] fp32.
  EXPECT_EQ(choice->activation_device_bytes, 4 * 5 * 8 * 2048 * 64 * 4);
  EXPECT_EQ(choice->activation_budget_bytes, (gpu - StreamingBytes()) / 2);
  EXPECT_THAT(choice->Describe(), HasSubstr("layer-major, wave 4, activations on the device"));
  // One micro-batch per step, or the CPU: micro-batch-major.
  request.gradient_accumulation_steps = 1;
  EXPECT_EQ(ChooseSchedule(config, request, Executor(), gpu)->schedule,
            StepSchedule::kMicroBatchMajor);
  request.gradient_accumulation_steps = 4;
  EXPECT_EQ(ChooseSchedule(config, request, Executor(), 0)->schedule,
            StepSchedule::kMicroBatchMajor);
}

// Auto keeps the activations on the device and shrinks the wave; it never
// moves them to pinned host memory on its own (admission counts those bytes
// only when the spec asks for them).
TEST(ScheduleChoiceTest, ShrinksTheWaveOnTheDeviceWhenTheDeviceIsSmall) {
  const ModelConfig config = SmallLlama();
  ScheduleRequest request;
  request.gradient_accumulation_steps = 8;
  const int64_t input = 8 * 2048 * 64 * 4;  // one [B, T, C] fp32
  // Budget (half the device) 30 inputs: 8 x 5 kept do not fit, 6 x 5 do.
  auto smaller = ChooseSchedule(config, request, Executor(), 2 * 30 * input + StreamingBytes());
  ASSERT_THAT(smaller, IsOk());
  EXPECT_FALSE(smaller->offload_activations);
  EXPECT_EQ(smaller->wave, 6);
  EXPECT_EQ(smaller->activation_device_bytes, 6 * 5 * input);
  EXPECT_THAT(smaller->Describe(), HasSubstr("layer-major, wave 6, activations on the device"));
  // Budget 4 inputs: not even one micro-batch's 5 fit; still the device, wave 1.
  auto one = ChooseSchedule(config, request, Executor(), 2 * 4 * input + StreamingBytes());
  ASSERT_THAT(one, IsOk());
  EXPECT_FALSE(one->offload_activations);
  EXPECT_EQ(one->wave, 1);
  // Host memory when asked for, at the whole wave (which the footprint counts).
  request.activations = ActivationPlacement::kHost;
  auto host = ChooseSchedule(config, request, Executor(), 2 * 14 * input + StreamingBytes());
  ASSERT_THAT(host, IsOk());
  EXPECT_TRUE(host->offload_activations);
  EXPECT_EQ(host->wave, 8);
  EXPECT_EQ(host->activation_device_bytes, (8 * 3 + 2) * input);
  // Forced choices stand.
  request.activations = ActivationPlacement::kDevice;
  request.wave = 8;
  auto forced = ChooseSchedule(config, request, Executor(), 2 * 14 * input + StreamingBytes());
  ASSERT_THAT(forced, IsOk());
  EXPECT_FALSE(forced->offload_activations);
  EXPECT_EQ(forced->wave, 8);
}

TEST(ScheduleChoiceTest, RejectsBadOptionsNamingThem) {
  const ModelConfig config = SmallLlama();
  ScheduleRequest request;
  request.gradient_accumulation_steps = 4;
  request.wave = 5000;
  EXPECT_THAT(ChooseSchedule(config, request, Executor(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("wave: must be in [0 (auto), 4096], got 5000")));
  request.wave = 2;
  request.schedule = StepSchedule::kMicroBatchMajor;
  EXPECT_THAT(ChooseSchedule(config, request, Executor(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs the layer-major")));
  EXPECT_THAT(ParseStepSchedule("layer_major", "train.schedule"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.schedule: must be auto, micro-batch-major or "
                                 "layer-major, got 'layer_major'")));
  EXPECT_THAT(ParseActivationPlacement("gpu", "--activations"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--activations: must be auto, device or host, got 'gpu'")));
  TrainerOptions o = Options(1.0, StepSchedule::kMicroBatchMajor);
  o.wave = 3;
  EXPECT_THAT(Trainer::Create(config, o, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("wave: 3 micro-batches")));
}

}  // namespace
}  // namespace megatrain::engine
