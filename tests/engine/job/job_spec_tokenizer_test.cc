// data.tokenizer's default (engine/job/training_job.h): with model.hf_dir a
// data.text job uses the model directory's tokenizer.json; with
// model.preset a tokenizer must be named.
#include "engine/job/training_job.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

JobSpec TextSpec() {
  JobSpec s;
  s.name = "text";
  s.data.text = "/data/corpus.jsonl";
  s.train.micro_batch = 2;
  s.train.seq_len = 16;
  s.train.max_steps = 8;
  s.optimizer.lr = 3e-3;
  s.optimizer.warmup_steps = 2;
  s.output_dir = "/tmp/out";
  return s;
}

TEST(JobSpecTokenizerTest, TextWithPresetNeedsATokenizer) {
  JobSpec s = TextSpec();
  s.model.preset = "tiny";
  EXPECT_THAT(ValidateJobSpec(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.tokenizer: required with data.text and model.preset")));
  s.data.tokenizer = "/models/x";  // a HF directory or a SentencePiece model
  EXPECT_THAT(ValidateJobSpec(s), IsOk());
}

TEST(JobSpecTokenizerTest, TextWithHfDirDefaultsToTheModelsTokenizer) {
  JobSpec s = TextSpec();
  s.model.hf_dir = "/models/llama";
  EXPECT_THAT(ValidateJobSpec(s), IsOk());
}

}  // namespace
}  // namespace megatrain::engine
