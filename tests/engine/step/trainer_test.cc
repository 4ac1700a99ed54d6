// Trainer: the overlapped CPU optimizer (Note [Optimizer overlap]) gives the
// same weights, bit for bit, as running forward/backward and then AdamW on
// every block in sequence; non-finite steps (Note [Non-finite steps]) leave
// weights and AdamW moments alone and training goes on, or fail under
// NanPolicy::kFail.
#include "engine/step/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/optim/adamw.h"
#include "engine/runtime/device_info.h"
#include "engine/runtime/device_runtime.h"
#include "engine/step/executor.h"
#include "engine/runtime/thread_pool.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_state.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::AllState;
using ::megatrain::testing::BitIdentical;
using ::megatrain::testing::BlockState;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeBatches;
using ::megatrain::testing::Masters;
using ::megatrain::testing::SmallLlama;
using ::megatrain::testing::SmallTrainerOptions;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kB = 2, kT = 8;

TrainerOptions Options(double max_grad_norm) {
  return SmallTrainerOptions(kB, kT, max_grad_norm, /*total_steps=*/4);
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
      AdamWBuffers buf{(*store)->master(b),     (*store)->grad(b), (*store)->exp_avg(b),
                       (*store)->exp_avg_sq(b), nullptr,           (*store)->block_numel(b)};
      EXPECT_THAT(adamw->Step(buf, static_cast<int64_t>(s) + 1, schedule->LrAt(s + 1), scale),
                  IsOk());
    }
  }
  return Masters(**store);
}

// (max_grad_norm, optimizer_slice_elements).
class TrainerOverlapTest : public ::testing::TestWithParam<std::tuple<double, int64_t>> {};

TEST_P(TrainerOverlapTest, MatchesSequentialUpdatesBitForBit) {
  const ModelConfig config = SmallLlama();
  TrainerOptions o = Options(std::get<0>(GetParam()));
  o.optimizer_slice_elements = std::get<1>(GetParam());
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
// (updates overlap the next forward). Slices of 1000 parameters split
// every block into several queued tasks (Note [Optimizer slices]); 1 << 24
// (the default) keeps each block whole.
INSTANTIATE_TEST_SUITE_P(ClipModes, TrainerOverlapTest,
                         ::testing::Combine(::testing::Values(0.0, 0.05),
                                            ::testing::Values(int64_t{1000}, int64_t{1} << 24)));

TEST(TrainerTest, RejectsAnEmptyOptimizerSlice) {
  TrainerOptions o = Options(1.0);
  o.optimizer_slice_elements = 0;
  EXPECT_THAT(Trainer::Create(SmallLlama(), o, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("optimizer_slice_elements")));
}

// Trains `steps` from seed 5 and returns the losses and the final state;
// each step gets the first micro-batch of hints[s] (if any) as its
// lookahead (Note [Embedding lookahead]).
struct LookaheadRun {
  std::vector<double> losses;
  std::vector<float> state;  // AllState after the run
  int64_t lookahead_rows = 0, gate_rows = 0;
};

LookaheadRun RunWithHints(const ModelConfig& config, const TrainerOptions& o,
                          const std::vector<std::vector<MicroBatch>>& steps,
                          const std::vector<std::vector<MicroBatch>>& hints,
                          bool evaluate_between) {
  LookaheadRun run;
  auto trainer = Trainer::Create(config, o, /*seed=*/5);
  EXPECT_THAT(trainer, IsOk());
  if (!trainer.ok()) return run;
  for (size_t s = 0; s < steps.size(); ++s) {
    absl::Span<const int32_t> next;
    if (s < hints.size() && !hints[s].empty()) next = hints[s].front().input_ids;
    auto r = (*trainer)->Step(steps[s], next);
    EXPECT_THAT(r, IsOk());
    if (!r.ok()) return run;
    run.losses.push_back(r->loss);
    run.lookahead_rows += r->stats.lookahead_rows;
    run.gate_rows += r->stats.gate_rows;
    if (evaluate_between && s == 1) EXPECT_THAT((*trainer)->Evaluate(steps[0]), IsOk());
  }
  EXPECT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  run.state = AllState((*trainer)->store());
  return run;
}

class TrainerLookaheadTest : public ::testing::TestWithParam<double> {};

// Options(clip) with every lookahead used, whatever the thread timing.
TrainerOptions KeepLookahead(double clip) {
  TrainerOptions o = Options(clip);
  o.debug_keep_lookahead = true;
  return o;
}

// With the true next batch as the hint, the gathers read most rows from the
// lookahead, and weights, moments and losses are bit for bit those of a run
// without it (itself checked against sequential AdamW above).
TEST_P(TrainerLookaheadTest, TrueHintsChangeNothingButTheGate) {
  const ModelConfig config = SmallLlama();
  const TrainerOptions o = KeepLookahead(GetParam());
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < 4; ++s) steps.push_back(MakeBatches(2, kB, kT, config.vocab_size, 200 + s));
  const std::vector<std::vector<MicroBatch>> hints(steps.begin() + 1, steps.end());
  const LookaheadRun plain = RunWithHints(config, o, steps, {}, false);
  const LookaheadRun ahead = RunWithHints(config, o, steps, hints, false);
  // (How many rows the gates update depends on how far the background
  // update got: not asserted.)
  EXPECT_EQ(plain.lookahead_rows, 0);
  EXPECT_GT(ahead.lookahead_rows, 0);
  EXPECT_EQ(ahead.losses, plain.losses);
  EXPECT_TRUE(BitIdentical(ahead.state, plain.state));
  // With the default (a lookahead not started in time is dropped) the
  // result is the same whichever lookaheads were used.
  const LookaheadRun dropped = RunWithHints(config, Options(GetParam()), steps, hints, false);
  EXPECT_EQ(dropped.losses, plain.losses);
  EXPECT_TRUE(BitIdentical(dropped.state, plain.state));
  // An Evaluate between two steps reads the lookahead for its first
  // gather; the next step then gates every row itself.
  const LookaheadRun evaluated = RunWithHints(config, o, steps, hints, true);
  EXPECT_EQ(evaluated.losses, plain.losses);
  EXPECT_TRUE(BitIdentical(evaluated.state, plain.state));
}

// A hint that is not the next batch is harmless: the rows it prepared that
// the next batch happens to read hold their correct value all the same.
TEST_P(TrainerLookaheadTest, WrongHintsChangeNothing) {
  const ModelConfig config = SmallLlama();
  const TrainerOptions o = KeepLookahead(GetParam());
  std::vector<std::vector<MicroBatch>> steps, hints;
  for (int s = 0; s < 4; ++s) {
    steps.push_back(MakeBatches(2, kB, kT, config.vocab_size, 300 + s));
    hints.push_back(MakeBatches(1, kB, kT, config.vocab_size, 400 + s));
  }
  const LookaheadRun plain = RunWithHints(config, o, steps, {}, false);
  const LookaheadRun wrong = RunWithHints(config, o, steps, hints, false);
  EXPECT_GT(wrong.lookahead_rows, 0);  // 96 rows: some hinted rows are read
  EXPECT_EQ(wrong.losses, plain.losses);
  EXPECT_TRUE(BitIdentical(wrong.state, plain.state));
}

INSTANTIATE_TEST_SUITE_P(ClipModes, TrainerLookaheadTest, ::testing::Values(0.0, 0.05));

// A skipped step's lookahead is never used and never written to the store:
// the run equals, bit for bit, one that never saw the poisoned batch.
TEST(TrainerTest, LookaheadOfASkippedStepIsDropped) {
  const ModelConfig config = SmallLlama();
  const auto b1 = MakeBatches(1, kB, kT, config.vocab_size, 21);
  const auto b2 = MakeBatches(1, kB, kT, config.vocab_size, 22);
  const auto b3 = MakeBatches(1, kB, kT, config.vocab_size, 23);
  for (double clip : {0.0, 1.0}) {
    TrainerOptions o = KeepLookahead(clip);
    o.debug_nonfinite = {.step = 2, .kind = NonFiniteInjection::Kind::kLoss};
    auto trainer = Trainer::Create(config, o, /*seed=*/5);
    ASSERT_THAT(trainer, IsOk());
    ASSERT_THAT((*trainer)->Step(b1, b2.front().input_ids), IsOk());
    auto skipped = (*trainer)->Step(b2, b3.front().input_ids);
    ASSERT_THAT(skipped, IsOk());
    EXPECT_TRUE(skipped->skipped);
    EXPECT_GT(skipped->stats.lookahead_rows, 0) << "step 1's lookahead serves step 2";
    auto next = (*trainer)->Step(b3);
    ASSERT_THAT(next, IsOk());
    EXPECT_EQ(next->stats.lookahead_rows, 0) << "clip " << clip;
    ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
    const LookaheadRun clean = RunWithHints(config, Options(clip), {b1, b3}, {}, false);
    EXPECT_TRUE(BitIdentical(AllState((*trainer)->store()), clean.state)) << "clip " << clip;
  }
}

// Tied embeddings: every row has a gradient (the lm_head's), so there is
// nothing to prepare ahead.
// A token id outside the vocabulary, in this step's batch or in the next
// one's hint, is the executor's INVALID_ARGUMENT, never a write outside the
// lookahead's bookkeeping; the trainer goes on.
TEST(TrainerTest, OutOfRangeIdsWithALookaheadAreInvalidArgument) {
  const ModelConfig config = SmallLlama();
  auto trainer = Trainer::Create(config, Options(1.0), 1);
  ASSERT_THAT(trainer, IsOk());
  std::vector<MicroBatch> bad = MakeBatches(1, kB, kT, config.vocab_size, 3);
  bad[0].input_ids[1] = static_cast<int32_t>(config.vocab_size) + 1000000;
  bad[0].input_ids[2] = -7;
  const std::vector<MicroBatch> good = MakeBatches(1, kB, kT, config.vocab_size, 4);
  EXPECT_THAT((*trainer)->Step(bad, good[0].input_ids),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is outside [0, vocab_size")));
  EXPECT_THAT((*trainer)->Step(good, bad[0].input_ids), IsOk());
  EXPECT_THAT((*trainer)->Step(bad, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("input_ids[1]")));
}

TEST(TrainerTest, NoLookaheadWithTiedEmbeddings) {
  ModelConfig config = SmallLlama();
  config.tie_word_embeddings = true;
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < 3; ++s) steps.push_back(MakeBatches(1, kB, kT, config.vocab_size, 500 + s));
  const std::vector<std::vector<MicroBatch>> hints(steps.begin() + 1, steps.end());
  const LookaheadRun plain = RunWithHints(config, Options(0.0), steps, {}, false);
  const LookaheadRun ahead = RunWithHints(config, KeepLookahead(0.0), steps, hints, false);
  EXPECT_EQ(ahead.lookahead_rows, 0);
  EXPECT_EQ(ahead.losses, plain.losses);
  EXPECT_TRUE(BitIdentical(ahead.state, plain.state));
}

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

// Note [Abandoned steps] in executor.h: with the flag set, a step and an
// eval pass stop before their first action and return CANCELLED; nothing
// was landed, so the weights and AdamW state are bit for bit unchanged.
TEST(TrainerTest, AbandonedStepReturnsCancelledAndChangesNothing) {
  const ModelConfig config = SmallLlama();
  std::atomic<bool> abandon{false};
  TrainerOptions o = Options(1.0);
  o.abandon_step = &abandon;
  auto trainer = Trainer::Create(config, o, 1);
  ASSERT_THAT(trainer, IsOk());
  const auto batches = MakeBatches(1, kB, kT, config.vocab_size, 3);
  ASSERT_THAT((*trainer)->Step(batches), IsOk());
  ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  const std::vector<float> before = AllState((*trainer)->store());
  abandon.store(true);
  EXPECT_THAT((*trainer)->Step(batches),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("step abandoned (forced cancel)")));
  EXPECT_THAT((*trainer)->Evaluate(batches),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("step abandoned")));
  EXPECT_EQ((*trainer)->step(), 1);
  ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  EXPECT_TRUE(BitIdentical(AllState((*trainer)->store()), before));
}

TEST(TrainerTest, NonFiniteLossSkipsStepAndKeepsWeights) {
  const ModelConfig config = SmallLlama();
  for (double clip : {0.0, 1.0}) {
    TrainerOptions o = Options(clip);
    auto trainer = Trainer::Create(config, o, 1);
    ASSERT_THAT(trainer, IsOk());
    // Poison one weight: every loss and gradient becomes NaN.
    (*trainer)->store().master((*trainer)->store().layout().head_block())[0] = NAN;
    const std::vector<float> before = AllState((*trainer)->store());
    auto r = (*trainer)->Step(MakeBatches(1, kB, kT, config.vocab_size, 3));
    ASSERT_THAT(r, IsOk());
    EXPECT_TRUE(r->skipped);
    EXPECT_FALSE(r->partial) << "clip " << clip;
    EXPECT_EQ((*trainer)->step(), 0) << "clip " << clip;
    ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
    EXPECT_TRUE(BitIdentical(AllState((*trainer)->store()), before)) << "clip " << clip;
  }
}

TEST(TrainerTest, NonFiniteLossFailsWhenAsked) {
  const ModelConfig config = SmallLlama();
  TrainerOptions o = Options(1.0);
  o.nan_policy = NanPolicy::kFail;
  auto trainer = Trainer::Create(config, o, 1);
  ASSERT_THAT(trainer, IsOk());
  (*trainer)->store().master((*trainer)->store().layout().head_block())[0] = NAN;
  EXPECT_THAT((*trainer)->Step(MakeBatches(1, kB, kT, config.vocab_size, 3)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("step 1: loss nan"), HasSubstr("not finite"),
                             HasSubstr("train.nan_policy: fail"))));
}

// (max_grad_norm, what goes non-finite): the cases where a skip is exact.
using SkipCase = std::tuple<double, NonFiniteInjection::Kind>;

class TrainerNanSkipTest : public ::testing::TestWithParam<SkipCase> {};

// Skipping step 2 leaves master weights and AdamW moments bit-identical,
// does not advance the step, and the run then equals, bit for bit, a run
// that never saw the poisoned batch: the gradients were discarded.
TEST_P(TrainerNanSkipTest, SkippedStepChangesNothingAndTrainingGoesOn) {
  const auto [clip, kind] = GetParam();
  const ModelConfig config = SmallLlama();
  const auto b1 = MakeBatches(1, kB, kT, config.vocab_size, 11);
  const auto b2 = MakeBatches(1, kB, kT, config.vocab_size, 12);
  const auto b3 = MakeBatches(1, kB, kT, config.vocab_size, 13);
  TrainerOptions o = Options(clip);
  o.debug_nonfinite = {.step = 2, .kind = kind};
  auto trainer = Trainer::Create(config, o, /*seed=*/5);
  ASSERT_THAT(trainer, IsOk());
  ASSERT_THAT((*trainer)->Step(b1), IsOk());
  ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  const std::vector<float> after_step1 = AllState((*trainer)->store());

  auto skipped = (*trainer)->Step(b2);
  ASSERT_THAT(skipped, IsOk());
  EXPECT_TRUE(skipped->skipped);
  EXPECT_FALSE(skipped->partial);
  EXPECT_EQ(skipped->step, 1);
  EXPECT_EQ((*trainer)->step(), 1);
  EXPECT_FALSE(std::isfinite(skipped->loss) && std::isfinite(skipped->grad_norm));
  ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  EXPECT_TRUE(BitIdentical(AllState((*trainer)->store()), after_step1));

  auto next = (*trainer)->Step(b3);
  ASSERT_THAT(next, IsOk());
  EXPECT_FALSE(next->skipped);
  EXPECT_EQ(next->step, 2);
  EXPECT_TRUE(std::isfinite(next->loss));
  EXPECT_TRUE(std::isfinite(next->grad_norm));
  ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  const LookaheadRun clean = RunWithHints(config, Options(clip), {b1, b3}, {}, false);
  EXPECT_TRUE(BitIdentical(AllState((*trainer)->store()), clean.state));
}

INSTANTIATE_TEST_SUITE_P(ExactCases, TrainerNanSkipTest,
                         ::testing::Values(SkipCase{1.0, NonFiniteInjection::Kind::kLoss},
                                           SkipCase{1.0, NonFiniteInjection::Kind::kGradient},
                                           SkipCase{0.0, NonFiniteInjection::Kind::kLoss}),
                         [](const auto& info) {
                           return absl::StrCat(
                               std::get<0>(info.param) > 0 ? "Clipping" : "NoClipping",
                               std::get<1>(info.param) == NonFiniteInjection::Kind::kLoss
                                   ? "NanLoss"
                                   : "InfGradient");
                         });

// Clipping off, only the embedding's gradient (the last to be final)
// overflows: the blocks updated during backward keep their update, the
// embedding is not touched, and the step counts (Note [Non-finite steps]).
TEST(TrainerTest, InfGradientWithoutClippingIsAPartialStep) {
  const ModelConfig config = SmallLlama();
  TrainerOptions o = Options(0.0);
  o.debug_nonfinite = {.step = 2, .kind = NonFiniteInjection::Kind::kGradient};
  auto trainer = Trainer::Create(config, o, /*seed=*/5);
  ASSERT_THAT(trainer, IsOk());
  HostStore& store = (*trainer)->store();
  const int64_t emb = store.layout().embedding_block();
  const int64_t head = store.layout().head_block();
  ASSERT_THAT((*trainer)->Step(MakeBatches(1, kB, kT, config.vocab_size, 11)), IsOk());
  ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  const std::vector<float> emb_before = BlockState(store, emb);
  const std::vector<float> head_before = BlockState(store, head);

  auto r = (*trainer)->Step(MakeBatches(1, kB, kT, config.vocab_size, 12));
  ASSERT_THAT(r, IsOk());
  ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  EXPECT_TRUE(r->skipped);
  EXPECT_TRUE(r->partial);
  EXPECT_EQ((*trainer)->step(), 2);
  EXPECT_TRUE(BitIdentical(BlockState(store, emb), emb_before));
  EXPECT_FALSE(BitIdentical(BlockState(store, head), head_before));
  for (const float v : Masters(store)) ASSERT_TRUE(std::isfinite(v));
}

TEST(TrainerTest, FailPolicyNamesTheStepAndLeavesTheWeights) {
  const ModelConfig config = SmallLlama();
  for (const auto kind : {NonFiniteInjection::Kind::kLoss, NonFiniteInjection::Kind::kGradient}) {
    TrainerOptions o = Options(1.0);
    o.nan_policy = NanPolicy::kFail;
    o.debug_nonfinite = {.step = 2, .kind = kind};
    auto trainer = Trainer::Create(config, o, /*seed=*/5);
    ASSERT_THAT(trainer, IsOk());
    ASSERT_THAT((*trainer)->Step(MakeBatches(1, kB, kT, config.vocab_size, 11)), IsOk());
    ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
    const std::vector<float> before = AllState((*trainer)->store());
    EXPECT_THAT((*trainer)->Step(MakeBatches(1, kB, kT, config.vocab_size, 12)),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("step 2: loss "), HasSubstr("gradient norm "),
                               HasSubstr("train.nan_policy: fail"),
                               HasSubstr("the update was not applied"))));
    ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
    EXPECT_EQ((*trainer)->step(), 1);
    EXPECT_TRUE(BitIdentical(AllState((*trainer)->store()), before));
  }
}

// --- Note [Resident layers] (engine/step/executor.h) ---

// ||a - b|| / ||b||, in double.
double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

TrainerOptions Resident(double clip, int layers, bool embedding = false) {
  TrainerOptions o = Options(clip);
  o.resident_layers = layers;
  o.resident_embedding = embedding ? 1 : 0;
  return o;
}

// Checks shared by the resident-layer and resident-embedding cases,
// defined below.
void ExpectStateRoundTrip(const TrainerOptions& options);
void ExpectSkippedStepLeavesState(const TrainerOptions& options);
void ExpectPartialStepUpdatesLayer0Only(const TrainerOptions& options);

class TrainerResidentTest : public ::testing::TestWithParam<double> {};

// The resident blocks' AdamW (TensorAdamWStep) differs from the CPU
// kernel's by a few ulp per update (and a resident embedding's gradient
// sum may differ by rounding, Note [Resident embedding]), so a run with
// resident layers and/or embedding follows the streamed run to rounding:
// losses, weights and moments within 1e-6, also through an Evaluate (which
// enqueues the waiting update first).
TEST_P(TrainerResidentTest, MatchesTheStreamedRunToRounding) {
  const ModelConfig config = SmallLlama();
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < 3; ++s) steps.push_back(MakeBatches(2, kB, kT, config.vocab_size, 200 + s));
  const LookaheadRun streamed = RunWithHints(config, Resident(GetParam(), 0), steps, {}, true);
  for (const auto& [layers, embedding] :
       std::vector<std::pair<int, bool>>{{1, false}, {3, false}, {0, true}, {2, true}}) {
    SCOPED_TRACE(absl::StrCat(layers, " resident layers, resident embedding ", embedding));
    const LookaheadRun resident =
        RunWithHints(config, Resident(GetParam(), layers, embedding), steps, {}, true);
    ASSERT_EQ(resident.losses.size(), streamed.losses.size());
    for (size_t s = 0; s < streamed.losses.size(); ++s) {
      EXPECT_NEAR(resident.losses[s], streamed.losses[s], 1e-6 * std::abs(streamed.losses[s]))
          << "step " << s;
    }
    ASSERT_EQ(resident.state.size(), streamed.state.size());
    EXPECT_LT(RelativeDifference(resident.state, streamed.state), 1e-6);
  }
}

// On CUDA the resident blocks' AdamW is ATen's fused multi-tensor kernel
// on torch >= 2.1 (Note [Fused device AdamW]; TensorAdamWStep on 1.13),
// whose rounding differs from the CPU kernel's by a few ulp per update:
// fp32 runs with resident layers and embedding follow the all-streamed run
// on the same device to rounding (losses, weights and moments within 1e-6,
// as on the CPU above), with and without clipping.
TEST_P(TrainerResidentTest, FusedDeviceAdamWOnCudaFollowsTheStreamedRun) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const ModelConfig config = SmallLlama();
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < 3; ++s) steps.push_back(MakeBatches(2, kB, kT, config.vocab_size, 400 + s));
  TrainerOptions streamed = Resident(GetParam(), 0);
  streamed.device = "cuda";
  const LookaheadRun reference = RunWithHints(config, streamed, steps, {}, true);
  for (const auto& [layers, embedding] : std::vector<std::pair<int, bool>>{{1, false}, {3, true}}) {
    SCOPED_TRACE(absl::StrCat(layers, " resident layers, resident embedding ", embedding));
    TrainerOptions o = Resident(GetParam(), layers, embedding);
    o.device = "cuda";
    const LookaheadRun resident = RunWithHints(config, o, steps, {}, true);
    ASSERT_EQ(resident.losses.size(), reference.losses.size());
    for (size_t s = 0; s < reference.losses.size(); ++s) {
      EXPECT_NEAR(resident.losses[s], reference.losses[s], 1e-6 * std::abs(reference.losses[s]))
          << "step " << s;
    }
    ASSERT_EQ(resident.state.size(), reference.state.size());
    EXPECT_LT(RelativeDifference(resident.state, reference.state), 1e-6);
  }
}

// A tied table (Note [Resident embedding]) is resident too: lm_head reads
// its compute copy and its lm_head gradient is summed on the device before
// the rows'. fp32 follows the streamed run to rounding as above; bf16
// within 2e-2 (the bf16 copy of a master a few ulp away may round to the
// neighbouring bf16 value, which the later steps then carry).
TEST_P(TrainerResidentTest, TiedTableMatchesTheStreamedRun) {
  ModelConfig config = SmallLlama();
  config.tie_word_embeddings = true;
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < 3; ++s) steps.push_back(MakeBatches(3, kB, kT, config.vocab_size, 300 + s));
  for (const ComputeDtype dtype : {ComputeDtype::kFp32, ComputeDtype::kBf16}) {
    const double tolerance = dtype == ComputeDtype::kBf16 ? 2e-2 : 1e-6;
    TrainerOptions streamed = Resident(GetParam(), 0);
    streamed.compute_dtype = dtype;
    const LookaheadRun reference = RunWithHints(config, streamed, steps, {}, true);
    for (const int layers : {0, 3}) {
      SCOPED_TRACE(absl::StrCat(ComputeDtypeName(dtype), ", ", layers, " resident layers"));
      TrainerOptions o = Resident(GetParam(), layers, /*embedding=*/true);
      o.compute_dtype = dtype;
      auto trainer = Trainer::Create(config, o, 1);
      ASSERT_THAT(trainer, IsOk());
      EXPECT_TRUE((*trainer)->resident_embedding());
      const LookaheadRun resident = RunWithHints(config, o, steps, {}, true);
      ASSERT_EQ(resident.losses.size(), reference.losses.size());
      for (size_t s = 0; s < reference.losses.size(); ++s) {
        EXPECT_NEAR(resident.losses[s], reference.losses[s],
                    tolerance * std::abs(reference.losses[s]))
            << "step " << s;
      }
      EXPECT_LT(RelativeDifference(resident.state, reference.state), tolerance);
    }
  }
}

// What store() hands out after WaitForOptimizer is the resident layers'
// current state, and what the caller writes there is what the next step
// uses: a second trainer given the first's state continues it bit for bit.
TEST_P(TrainerResidentTest, StateRoundTripsThroughTheStore) {
  for (const bool embedding : {false, true}) {
    SCOPED_TRACE(absl::StrCat("resident embedding ", embedding));
    ExpectStateRoundTrip(Resident(GetParam(), 1, embedding));
  }
}

// A skipped step (NaN loss) leaves the resident blocks alone too.
TEST_P(TrainerResidentTest, SkippedStepLeavesTheResidentBlocks) {
  for (const bool embedding : {false, true}) {
    SCOPED_TRACE(absl::StrCat("resident embedding ", embedding));
    ExpectSkippedStepLeavesState(Resident(GetParam(), 2, embedding));
  }
}

INSTANTIATE_TEST_SUITE_P(ClipModes, TrainerResidentTest, ::testing::Values(0.0, 1.0),
                         [](const auto& info) {
                           return info.param > 0 ? "Clipping" : "NoClipping";
                         });

void ExpectStateRoundTrip(const TrainerOptions& options) {
  const ModelConfig config = SmallLlama();
  const auto b1 = MakeBatches(1, kB, kT, config.vocab_size, 31);
  const auto b2 = MakeBatches(1, kB, kT, config.vocab_size, 32);
  const auto b3 = MakeBatches(1, kB, kT, config.vocab_size, 33);
  auto first = Trainer::Create(config, options, /*seed=*/5);
  auto second = Trainer::Create(config, options, /*seed=*/6);
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  ASSERT_EQ((*first)->resident_layers(), 1);
  ASSERT_EQ((*first)->resident_embedding(), options.resident_embedding == 1);
  ASSERT_THAT((*first)->Step(b1), IsOk());
  ASSERT_THAT((*first)->Step(b2), IsOk());
  ASSERT_THAT((*first)->WaitForOptimizer(), IsOk());
  HostStore& from = (*first)->store();
  HostStore& to = (*second)->store();
  const int64_t layer0 = from.layout().layer_block(0);
  const int64_t emb = from.layout().embedding_block();
  auto fresh = Trainer::Create(config, Resident(options.max_grad_norm, 0), /*seed=*/5);
  ASSERT_THAT(fresh, IsOk());
  // Synced: updated.
  EXPECT_FALSE(BitIdentical(BlockState(from, layer0), BlockState((*fresh)->store(), layer0)));
  EXPECT_FALSE(BitIdentical(BlockState(from, emb), BlockState((*fresh)->store(), emb)));
  for (int64_t b = 0; b < from.num_blocks(); ++b) {
    const size_t bytes = static_cast<size_t>(from.block_numel(b)) * 4;
    std::memcpy(to.master(b), from.master(b), bytes);
    std::memcpy(to.exp_avg(b), from.exp_avg(b), bytes);
    std::memcpy(to.exp_avg_sq(b), from.exp_avg_sq(b), bytes);
  }
  (*second)->set_step(2);
  auto r1 = (*first)->Step(b3);
  auto r2 = (*second)->Step(b3);
  ASSERT_THAT(r1, IsOk());
  ASSERT_THAT(r2, IsOk());
  EXPECT_EQ(r1->loss, r2->loss);
  ASSERT_THAT((*first)->WaitForOptimizer(), IsOk());
  ASSERT_THAT((*second)->WaitForOptimizer(), IsOk());
  EXPECT_TRUE(BitIdentical(AllState((*first)->store()), AllState((*second)->store())));
}

// A trainer with `options` whose step 2 will be poisoned with `kind`,
// after step 1 and its optimizer work; null (with a failure recorded) if
// any of that failed.
std::unique_ptr<Trainer> PoisonedAfterStep1(const TrainerOptions& options,
                                            NonFiniteInjection::Kind kind) {
  const ModelConfig config = SmallLlama();
  TrainerOptions o = options;
  o.debug_nonfinite = {.step = 2, .kind = kind};
  auto trainer = Trainer::Create(config, o, /*seed=*/5);
  EXPECT_THAT(trainer, IsOk());
  if (!trainer.ok()) return nullptr;
  const auto step1 = (*trainer)->Step(MakeBatches(1, kB, kT, config.vocab_size, 11));
  EXPECT_THAT(step1, IsOk());
  const absl::Status waited = (*trainer)->WaitForOptimizer();
  EXPECT_THAT(waited, IsOk());
  if (!step1.ok() || !waited.ok()) return nullptr;
  return std::move(*trainer);
}

void ExpectSkippedStepLeavesState(const TrainerOptions& options) {
  const ModelConfig config = SmallLlama();
  std::unique_ptr<Trainer> trainer = PoisonedAfterStep1(options, NonFiniteInjection::Kind::kLoss);
  ASSERT_NE(trainer, nullptr);
  const std::vector<float> after_step1 = AllState(trainer->store());
  auto skipped = trainer->Step(MakeBatches(1, kB, kT, config.vocab_size, 12));
  ASSERT_THAT(skipped, IsOk());
  EXPECT_TRUE(skipped->skipped);
  EXPECT_FALSE(skipped->partial);
  ASSERT_THAT(trainer->WaitForOptimizer(), IsOk());
  EXPECT_TRUE(BitIdentical(AllState(trainer->store()), after_step1));
  auto next = trainer->Step(MakeBatches(1, kB, kT, config.vocab_size, 13));
  ASSERT_THAT(next, IsOk());
  EXPECT_FALSE(next->skipped);
}

// Clipping off, the embedding's gradient (final after layer 0's) overflows:
// the resident layer, approved during backward, keeps its update like the
// streamed blocks (Note [Non-finite steps]).
TEST(TrainerTest, PartialStepUpdatesTheResidentLayer) {
  for (const bool embedding : {false, true}) {
    SCOPED_TRACE(absl::StrCat("resident embedding ", embedding));
    ExpectPartialStepUpdatesLayer0Only(Resident(0.0, 1, embedding));
  }
}

void ExpectPartialStepUpdatesLayer0Only(const TrainerOptions& options) {
  const ModelConfig config = SmallLlama();
  std::unique_ptr<Trainer> trainer =
      PoisonedAfterStep1(options, NonFiniteInjection::Kind::kGradient);
  ASSERT_NE(trainer, nullptr);
  const int64_t layer0 = trainer->store().layout().layer_block(0);
  const int64_t emb = trainer->store().layout().embedding_block();
  const std::vector<float> layer0_before = BlockState(trainer->store(), layer0);
  const std::vector<float> emb_before = BlockState(trainer->store(), emb);
  auto r = trainer->Step(MakeBatches(1, kB, kT, config.vocab_size, 12));
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->partial);
  ASSERT_THAT(trainer->WaitForOptimizer(), IsOk());
  EXPECT_FALSE(BitIdentical(BlockState(trainer->store(), layer0), layer0_before));
  EXPECT_TRUE(BitIdentical(BlockState(trainer->store(), emb), emb_before));
}

TEST(TrainerTest, RejectsResidentLayersOutsideTheModel) {
  EXPECT_THAT(
      Trainer::Create(SmallLlama(), Resident(1.0, 4), 1),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("resident_layers: must be -1 (auto) or in [0, num_hidden_layers=3]")));
  auto automatic = Trainer::Create(SmallLlama(), Resident(1.0, -1), 1);
  ASSERT_THAT(automatic, IsOk());
  EXPECT_EQ((*automatic)->resident_layers(), 0);  // auto on the CPU: none
}

// Note [Device gradient accumulation] in executor.h: summing the
// micro-batches' gradients on the device changes nothing in the result
// (the same fp32 adds in the same order), with and without clipping.
TEST(TrainerTest, DeviceGradAccumulationIsBitIdentical) {
  const ModelConfig config = SmallLlama();
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < 3; ++s) steps.push_back(MakeBatches(3, kB, kT, config.vocab_size, 300 + s));
  for (const double clip : {0.0, 1.0}) {
    SCOPED_TRACE(absl::StrCat("max_grad_norm ", clip));
    TrainerOptions host = Resident(clip, 1);
    host.device_grad_accumulation = 0;
    TrainerOptions device = host;
    device.device_grad_accumulation = 1;
    const LookaheadRun a = RunWithHints(config, host, steps, {}, false);
    const LookaheadRun b = RunWithHints(config, device, steps, {}, false);
    ASSERT_EQ(a.losses.size(), steps.size());
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_TRUE(BitIdentical(a.state, b.state));
  }
  TrainerOptions bad = Options(1.0);
  bad.device_grad_accumulation = 3;
  EXPECT_THAT(Trainer::Create(config, bad, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("device_grad_accumulation: must be -1 (auto), 0 or 1, got 3")));
}

TEST(TrainerTest, RejectsBadResidentEmbeddingValues) {
  TrainerOptions o = Options(1.0);
  o.resident_embedding = 2;
  EXPECT_THAT(Trainer::Create(SmallLlama(), o, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("resident_embedding: must be -1 (auto), 0 or 1, got 2")));
  o.resident_embedding = -1;
  auto automatic = Trainer::Create(SmallLlama(), o, 1);
  ASSERT_THAT(automatic, IsOk());
  EXPECT_FALSE((*automatic)->resident_embedding());  // auto on the CPU: off
}

}  // namespace
}  // namespace megatrain::engine
