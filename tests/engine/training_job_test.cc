// TrainingJob: validation of job specs, a job trained to completion with
// checkpoints and eval, suspend + resume continuing exactly, and cancel.
#include "engine/training_job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "engine/device_info.h"
#include "engine/token_shard.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// 40 documents drawn from 4 repeated patterns, so the model can learn.
std::string WriteDataset() {
  const std::string dir = testing::MakeTempDir("tokens");
  auto writer = TokenShardWriter::Create(dir + "/train-00000.mtt", {.vocab_size = 512});
  EXPECT_THAT(writer, IsOk());
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> patterns(4);
  for (auto& p : patterns) {
    for (int i = 0; i < 24; ++i) p.push_back(static_cast<int32_t>(3 + rng() % 500));
  }
  for (int d = 0; d < 40; ++d) EXPECT_THAT(writer->AppendDocument(patterns[d % 4]), IsOk());
  EXPECT_THAT(writer->Finish(), IsOk());
  return dir;
}

JobSpec TinySpec(const std::string& tokens, const std::string& output_dir) {
  JobSpec s;
  s.name = "test";
  s.model.preset = "tiny";
  s.data.tokens = tokens;
  s.data.eval_fraction = 0.1;
  s.train.micro_batch = 2;
  s.train.seq_len = 16;
  s.train.max_steps = 8;
  s.optimizer.lr = 3e-3;
  s.optimizer.warmup_steps = 2;
  s.eval.every_steps = 4;
  s.eval.batches = 2;
  s.checkpoint.every_steps = 2;
  s.checkpoint.keep_last = 2;
  s.output_dir = output_dir;
  return s;
}

// Records what the job reports; can ask for a stop at a given step.
class Recorder : public JobObserver {
 public:
  void OnStep(const StepReport& r) override {
    losses.push_back(r.loss);
    if (job != nullptr && r.step == stop_at) job->RequestStop(stop_kind);
  }
  void OnEval(int64_t step, double loss) override { evals.push_back(loss); }
  void OnCheckpoint(int64_t step, const std::string& dir, double) override {
    checkpoint_steps.push_back(step);
  }
  std::vector<double> losses, evals;
  std::vector<int64_t> checkpoint_steps;
  TrainingJob* job = nullptr;
  int64_t stop_at = -1;
  TrainingJob::StopKind stop_kind = TrainingJob::StopKind::kSuspend;
};

TEST(ValidateJobSpecTest, NamesTheBadField) {
  JobSpec s = TinySpec("x", "/tmp/out");
  s.train.micro_batch = 0;
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.micro_batch: must be in [1, 4096], got 0")));
  s = TinySpec("x", "/tmp/out");
  s.model.hf_dir = "/models/x";
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exactly one of model.preset")));
  s = TinySpec("x", "/tmp/out");
  s.model.preset = "gpt-5";
  EXPECT_THAT(ValidateJobSpec(s), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.preset")));
  s = TinySpec("x", "/tmp/out");
  s.optimizer.schedule = "exponential";
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("optimizer.schedule")));
  s = TinySpec("x", "/tmp/out");
  s.optimizer.warmup_steps = 100;
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("optimizer.warmup_steps")));
  s = TinySpec("x", "/tmp/out");
  s.data.text = "corpus.txt";
  EXPECT_THAT(ValidateJobSpec(s), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data")));
  s = TinySpec("x", "/tmp/out");
  s.train.max_steps = 0;
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.max_steps")));
  EXPECT_THAT(ValidateJobSpec(TinySpec("x", "/tmp/out")), IsOk());
}

TEST(EstimateFootprintTest, CountsBytesPerParameter) {
  JobSpec s = TinySpec("x", "/tmp/out");
  s.model.preset = "llama-8b";
  s.train.compute_dtype = ComputeDtype::kBf16;
  auto f = EstimateFootprint(s);
  ASSERT_THAT(f, IsOk());
  // 4 (master) + 4 (grad) + 8 (AdamW moments) + 2 (bf16 copy) bytes/param,
  // plus alignment padding and staging (< 2%).
  EXPECT_GT(f->host_total_bytes, 18 * f->params);
  EXPECT_LT(f->host_total_bytes, 18.4 * f->params);
}

TEST(TrainingJobTest, TrainsToCompletionWithCheckpointsAndEval) {
  const std::string out = testing::MakeTempDir("job");
  auto job = TrainingJob::Create(TinySpec(WriteDataset(), out), "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  Recorder rec;
  auto outcome = (*job)->Run(&rec);
  ASSERT_THAT(outcome, IsOk());
  EXPECT_EQ(*outcome, JobOutcome::kSucceeded);
  ASSERT_EQ(rec.losses.size(), 8u);
  EXPECT_LT(rec.losses.back(), rec.losses.front());
  EXPECT_EQ(rec.evals.size(), 2u);  // steps 4 and 8
  EXPECT_EQ(rec.checkpoint_steps, (std::vector<int64_t>{2, 4, 6, 8}));
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 2u);  // keep_last 2
  EXPECT_EQ((*listed)[1].step, 8);
}

TEST(TrainingJobTest, SuspendThenResumeContinuesExactly) {
  const std::string data = WriteDataset();
  Recorder straight;
  {
    auto job = TrainingJob::Create(TinySpec(data, testing::MakeTempDir("straight")), "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    ASSERT_THAT((*job)->Run(&straight), IsOk());
  }
  const std::string out = testing::MakeTempDir("suspended");
  Recorder first;
  {
    auto job = TrainingJob::Create(TinySpec(data, out), "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    first.job = job->get();
    first.stop_at = 3;  // not a checkpoint step: suspend writes one
    auto outcome = (*job)->Run(&first);
    ASSERT_THAT(outcome, IsOk());
    EXPECT_EQ(*outcome, JobOutcome::kSuspended);
  }
  ASSERT_EQ(first.losses.size(), 3u);
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_FALSE(listed->empty());
  EXPECT_EQ(listed->back().step, 3);
  Recorder second;
  auto job = TrainingJob::Create(TinySpec(data, out), "cpu", listed->back().dir);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ((*job)->step(), 3);
  ASSERT_THAT((*job)->Run(&second), IsOk());
  ASSERT_EQ(second.losses.size(), 5u);
  // Same weights, optimizer state, schedule and data cursor: the losses of
  // steps 4..8 are bit-identical to the uninterrupted run's.
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << i;
}

TEST(TrainingJobTest, CancelStopsWithoutFinishing) {
  auto job = TrainingJob::Create(TinySpec(WriteDataset(), testing::MakeTempDir("cancel")), "cpu", std::nullopt);
  ASSERT_THAT(job, IsOk());
  Recorder rec;
  rec.job = job->get();
  rec.stop_at = 1;
  rec.stop_kind = TrainingJob::StopKind::kCancel;
  auto outcome = (*job)->Run(&rec);
  ASSERT_THAT(outcome, IsOk());
  EXPECT_EQ(*outcome, JobOutcome::kCancelled);
  EXPECT_EQ(rec.losses.size(), 1u);
}

// The daemon's GPU path without the daemon: the tiny example's shapes in
// bf16 on CUDA with eval and checkpoints every few steps. Skipped without a
// CUDA device.
TEST(TrainingJobTest, TrainsOnCudaWithEvalAndCheckpoints) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  JobSpec spec = TinySpec(WriteDataset(), testing::MakeTempDir("cuda"));
  spec.train.micro_batch = 8;
  spec.train.seq_len = 128;
  spec.train.max_steps = 60;
  spec.train.compute_dtype = ComputeDtype::kBf16;
  spec.eval.every_steps = 20;
  spec.checkpoint.every_steps = 20;
  auto job = TrainingJob::Create(spec, "cuda:0", std::nullopt);
  ASSERT_THAT(job, IsOk());
  Recorder rec;
  auto outcome = (*job)->Run(&rec);
  ASSERT_THAT(outcome, IsOk());
  EXPECT_EQ(*outcome, JobOutcome::kSucceeded);
  EXPECT_EQ(rec.losses.size(), 60u);
  EXPECT_LT(rec.losses.back(), rec.losses.front());
  EXPECT_EQ(rec.evals.size(), 3u);
}

TEST(TrainingJobTest, MissingDataIsAnErrorNamingTheField) {
  EXPECT_THAT(TrainingJob::Create(TinySpec("/nonexistent/tokens", testing::MakeTempDir("missing")), "cpu",
                                  std::nullopt),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("data")));
}

}  // namespace
}  // namespace megatrain::engine
