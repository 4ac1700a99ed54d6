// Trainer: the overlapped CPU optimizer (Note [Optimizer overlap]) gives the
// same weights, bit for bit, as running forward/backward and then AdamW on
// every block in sequence; non-finite steps leave the weights alone.
#include "engine/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/adamw.h"
#include "engine/device_runtime.h"
#include "engine/executor.h"
#include "engine/thread_pool.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeBatches;
using ::megatrain::testing::SmallLlama;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kB = 2, kT = 8;

TrainerOptions Options(double max_grad_norm) {
  TrainerOptions o;
  o.micro_batch = kB;
  o.seq_len = kT;
  o.adamw.lr = 1e-2;
  o.adamw.weight_decay = 0.1;
  o.schedule.kind = LrScheduleKind::kCosine;
  o.schedule.warmup_steps = 1;
  o.schedule.total_steps = 4;
  o.max_grad_norm = max_grad_norm;
  o.threads = 2;
  return o;
}

std::vector<float> Masters(HostStore& store) {
  std::vector<float> out;
  for (int64_t b = 0; b < store.num_blocks(); ++b) {
    out.insert(out.end(), store.master(b), store.master(b) + store.block_numel(b));
  }
  return out;
}

// Sequential reference: ForwardBackward, global norm, clip, AdamW per block.
std::vector<float> SequentialTraining(const ModelConfig& config, const TrainerOptions& o,
                                      const std::vector<std::vector<MicroBatch>>& steps) {
  auto store = HostStore::Create(config, {});
  (*store)->InitializeWeights(5);
  auto runtime = DeviceRuntime::Create("cpu");
  auto pool = ThreadPool::Create(2);
  ExecutorOptions e;
  e.micro_batch = kB;
  e.seq_len = kT;
  auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), e);
  auto adamw = CpuAdamW::Create(o.adamw, pool.get());
  LrScheduleOptions so = o.schedule;
  so.peak_lr = o.adamw.lr;
  auto schedule = LrSchedule::Create(so);
  for (size_t s = 0; s < steps.size(); ++s) {
    auto fb = (*executor)->ForwardBackward(steps[s]);
    EXPECT_THAT(fb, IsOk());
    double sq = 0;
    for (int64_t b = 0; b < (*store)->num_blocks(); ++b) {
      sq += SumOfSquares((*store)->grad(b), (*store)->block_numel(b), pool.get());
    }
    const float scale = ClipCoefficient(std::sqrt(sq), o.max_grad_norm);
    for (int64_t b = 0; b < (*store)->num_blocks(); ++b) {
      AdamWBuffers buf{(*store)->master(b), (*store)->grad(b), (*store)->exp_avg(b),
                       (*store)->exp_avg_sq(b), nullptr, (*store)->block_numel(b)};
      EXPECT_THAT(adamw->Step(buf, static_cast<int64_t>(s) + 1, schedule->LrAt(s + 1), scale),
                  IsOk());
    }
  }
  return Masters(**store);
}

class TrainerOverlapTest : public ::testing::TestWithParam<double> {};

TEST_P(TrainerOverlapTest, MatchesSequentialUpdatesBitForBit) {
  const ModelConfig config = SmallLlama();
  const TrainerOptions o = Options(GetParam());
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < 3; ++s) steps.push_back(MakeBatches(2, kB, kT, config.vocab_size, 100 + s));
  auto trainer = Trainer::Create(config, o, /*seed=*/5);
  ASSERT_THAT(trainer, IsOk());
  for (const auto& batches : steps) {
    auto r = (*trainer)->Step(batches);
    ASSERT_THAT(r, IsOk());
    EXPECT_FALSE(r->skipped);
    EXPECT_GT(r->grad_norm, 0);
  }
  ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  EXPECT_EQ((*trainer)->step(), 3);
  std::vector<float> ours = Masters((*trainer)->store());
  std::vector<float> reference = SequentialTraining(config, o, steps);
  ASSERT_EQ(ours.size(), reference.size());
  EXPECT_EQ(std::memcmp(ours.data(), reference.data(), ours.size() * 4), 0);
}

// 0: no clipping (updates overlap backward); 0.05: clipping active
// (updates overlap the next forward).
INSTANTIATE_TEST_SUITE_P(ClipModes, TrainerOverlapTest, ::testing::Values(0.0, 0.05));

TEST(TrainerTest, LossFallsOnAFixedBatch) {
  const ModelConfig config = SmallLlama();
  auto trainer = Trainer::Create(config, Options(1.0), 1);
  ASSERT_THAT(trainer, IsOk());
  const auto batches = MakeBatches(1, kB, kT, config.vocab_size, 3);
  double first = 0, last = 0;
  for (int s = 0; s < 4; ++s) {
    auto r = (*trainer)->Step(batches);
    ASSERT_THAT(r, IsOk());
    (s == 0 ? first : last) = r->loss;
  }
  EXPECT_LT(last, first);
  auto eval = (*trainer)->Evaluate(batches);
  ASSERT_THAT(eval, IsOk());
  EXPECT_LT(*eval, first);
}

TEST(TrainerTest, NonFiniteLossSkipsStepAndKeepsWeights) {
  const ModelConfig config = SmallLlama();
  for (double clip : {0.0, 1.0}) {
    TrainerOptions o = Options(clip);
    auto trainer = Trainer::Create(config, o, 1);
    ASSERT_THAT(trainer, IsOk());
    // Poison one weight: every loss and gradient becomes NaN.
    (*trainer)->store().master((*trainer)->store().layout().head_block())[0] = NAN;
    std::vector<float> before = Masters((*trainer)->store());
    auto r = (*trainer)->Step(MakeBatches(1, kB, kT, config.vocab_size, 3));
    ASSERT_THAT(r, IsOk());
    EXPECT_TRUE(r->skipped);
    ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
    std::vector<float> after = Masters((*trainer)->store());
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * 4), 0) << "clip " << clip;
  }
}

TEST(TrainerTest, NonFiniteLossFailsWhenAsked) {
  const ModelConfig config = SmallLlama();
  TrainerOptions o = Options(1.0);
  o.skip_nonfinite_steps = false;
  auto trainer = Trainer::Create(config, o, 1);
  ASSERT_THAT(trainer, IsOk());
  (*trainer)->store().master((*trainer)->store().layout().head_block())[0] = NAN;
  EXPECT_THAT((*trainer)->Step(MakeBatches(1, kB, kT, config.vocab_size, 3)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("non-finite loss")));
}

}  // namespace
}  // namespace megatrain::engine
