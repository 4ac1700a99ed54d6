// Exact resume for the dense families beyond Llama (issue 18): a job of
// each family's tiny transformers-made model (tests/testdata/hf/) suspended
// after step 3 and resumed from its checkpoint gives steps 4..8 losses
// bit-identical to the uninterrupted job's, in fp32. The Llama family's
// resume is TrainingJobTest.SuspendThenResumeContinuesExactly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

#include "engine/checkpoint/checkpoint.h"
#include "engine/data/token_shard.h"
#include "tests/testing/pattern_dataset.h"
#include "engine/job/training_job.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;

// 40 documents from 4 repeated patterns of ids in [3, 128): the fixtures'
// vocab_size is 128.
std::string WriteDataset() {
  return testing::WritePatternDataset({.prefix = "family_tokens",
                                       .vocab_size = 128,
                                       .id_span = 125,
                                       .pattern_length = 30,
                                       .seed = 9});
}

// The fixture's directory, or for Phi-3 a copy whose config.json has
// eos_token_id 2: the fixtures keep Phi-3's real 32000, beyond their tiny
// vocab_size 128, which a job rightly refuses (data.eos_id).
std::string ModelDir(const std::string& family) {
  const std::filesystem::path fixture =
      std::filesystem::path(MEGATRAIN_TESTDATA_DIR) / "hf" / family;
  nlohmann::json config = nlohmann::json::parse(std::ifstream(fixture / "config.json"));
  if (config.value("eos_token_id", 0) < config.value("vocab_size", 0)) return fixture.string();
  const std::filesystem::path dir = testing::MakeTempDir("family_model");
  config["eos_token_id"] = 2;
  std::ofstream(dir / "config.json") << config.dump(2);
  std::filesystem::copy_file(fixture / "model.safetensors", dir / "model.safetensors");
  return dir.string();
}

// 8 fp32 steps of [2, 24] (past the fixtures' sliding_window 8 and
// phi3_longrope's original_max_position_embeddings 16), with clipping,
// warmup, a cosine schedule, weight decay and eval.
JobSpec FamilySpec(const std::string& family, const std::string& tokens,
                   const std::string& output_dir) {
  JobSpec s;
  s.name = "resume-" + family;
  s.model.hf_dir = ModelDir(family);
  s.data.tokens = tokens;
  s.data.eval_fraction = 0.1;
  s.train.micro_batch = 2;
  s.train.seq_len = 24;
  s.train.gradient_accumulation_steps = 2;
  s.train.max_steps = 8;
  s.optimizer.lr = 3e-3;
  s.optimizer.warmup_steps = 2;
  s.optimizer.weight_decay = 0.1;
  s.eval.every_steps = 4;
  s.eval.batches = 2;
  s.checkpoint.every_steps = 2;
  s.checkpoint.keep_last = 2;
  s.output_dir = output_dir;
  return s;
}

// Records applied steps' losses and eval losses; suspends at `stop_at`.
class Recorder : public JobObserver {
 public:
  void OnStep(const StepReport& r) override {
    if (r.skipped) return;
    losses.push_back(r.loss);
    if (job != nullptr && r.step == stop_at) job->RequestStop(TrainingJob::StopKind::kSuspend);
  }
  void OnEval(int64_t, double loss) override { evals.push_back(loss); }
  std::vector<double> losses, evals;
  TrainingJob* job = nullptr;
  int64_t stop_at = -1;
};

class FamilyResumeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyResumeTest, SuspendThenResumeContinuesBitIdentically) {
  const std::string family = GetParam();
  const std::string data = WriteDataset();
  Recorder straight;
  {
    auto job = TrainingJob::Create(FamilySpec(family, data, testing::MakeTempDir("straight")),
                                   "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    ASSERT_THAT((*job)->Run(&straight), IsOk());
  }
  ASSERT_EQ(straight.losses.size(), 8u);
  const std::string out = testing::MakeTempDir("suspended");
  Recorder first;
  {
    auto job = TrainingJob::Create(FamilySpec(family, data, out), "cpu", std::nullopt);
    ASSERT_THAT(job, IsOk());
    first.job = job->get();
    first.stop_at = 3;  // not a checkpoint step: the suspend writes one
    auto outcome = (*job)->Run(&first);
    ASSERT_THAT(outcome, IsOk());
    EXPECT_EQ(*outcome, JobOutcome::kSuspended);
  }
  ASSERT_EQ(first.losses.size(), 3u);
  auto listed = ListCheckpoints(out);
  ASSERT_THAT(listed, IsOk());
  ASSERT_FALSE(listed->empty());
  ASSERT_EQ(listed->back().step, 3);
  Recorder second;
  auto job = TrainingJob::Create(FamilySpec(family, data, out), "cpu", listed->back().dir);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ((*job)->step(), 3);
  ASSERT_THAT((*job)->Run(&second), IsOk());
  ASSERT_EQ(second.losses.size(), 5u);
  // Same weights, AdamW state, schedule and data cursor: bit-identical.
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << i;
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(first.losses[i], straight.losses[i]) << i;
  // Eval at step 8 (the resumed job's only one) matches too.
  ASSERT_FALSE(second.evals.empty());
  ASSERT_EQ(straight.evals.size(), 2u);
  EXPECT_EQ(second.evals.back(), straight.evals.back());
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyResumeTest,
                         ::testing::Values("gemma2", "gemma3_text", "phi3", "phi3_longrope"));

}  // namespace
}  // namespace megatrain::engine
