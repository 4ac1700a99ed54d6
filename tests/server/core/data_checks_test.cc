// server/core/data_checks.h: the daemon's side of Note [Data checks at
// submit] (engine/data/input_checks.h): which tokenizer and field a data.text
// job is checked with, every problem refused as INVALID_ARGUMENT, and
// CheckSubmission calling it with the model's vocab_size. The engine's checks
// themselves are tested in tests/engine/data/input_checks_test.cc.
#include "server/core/data_checks.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/submit_checks.h"
#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// The fake engine, recording the data checks it is asked for and answering
// `data_status`.
class DataCheckingBackend final : public testing::ForwardingEngineBackend {
 public:
  std::vector<engine::DataInputsToCheck> checked;
  absl::Status data_status;

  absl::StatusOr<ModelLimits> ModelLimitsOf(const engine::JobSpec&, const std::string&) override {
    return ModelLimits{32000, 4096, 16};
  }
  absl::Status CheckDataInputs(const engine::DataInputsToCheck& inputs) override {
    checked.push_back(inputs);
    return data_status;
  }
};

TEST(DataChecksTest, TextIsCheckedWithTheModelDirectoryTokenizerUnlessOneIsGiven) {
  engine::JobSpec spec;
  spec.model.hf_dir = "/models/llama";
  spec.data.text = "/data/corpus.jsonl";
  engine::DataInputsToCheck inputs = DataInputsOf(spec, 128256);
  EXPECT_EQ(inputs.text, "/data/corpus.jsonl");
  EXPECT_EQ(inputs.tokenizer, "/models/llama");
  EXPECT_EQ(inputs.tokenizer_field, "model.hf_dir");
  EXPECT_EQ(inputs.model_vocab_size, 128256);
  spec.data.tokenizer = "/tokenizers/llama";
  inputs = DataInputsOf(spec, 128256);
  EXPECT_EQ(inputs.tokenizer, "/tokenizers/llama");
  EXPECT_EQ(inputs.tokenizer_field, "data.tokenizer");
}

TEST(DataChecksTest, TokenJobsNeedNoTokenizer) {
  engine::JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.tokens = "/data/tokens";
  spec.data.eval_tokens = "/data/tokens/eval";
  spec.data.tokenizer = "/unused";
  const engine::DataInputsToCheck inputs = DataInputsOf(spec, 0);
  EXPECT_TRUE(inputs.text.empty());
  EXPECT_TRUE(inputs.tokenizer.empty());
  EXPECT_EQ(inputs.tokens, "/data/tokens");
  EXPECT_EQ(inputs.eval_tokens, "/data/tokens/eval");
}

TEST(DataChecksTest, SubmissionRefusesWhatTheEngineFindsAsInvalidArgument) {
  engine::JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.tokens = "";  // the shard checks are the fake's (none)
  spec.train.seq_len = 128;
  DataCheckingBackend backend;
  EXPECT_THAT(CheckSubmission(spec, JobInputs{}, &backend), IsOk());
  ASSERT_EQ(backend.checked.size(), 1u);
  EXPECT_EQ(backend.checked[0].model_vocab_size, 32000);
  backend.data_status = absl::NotFoundError(
      "data.tokens: /d: no trained token; data.eval_tokens: /e: no trained token");
  EXPECT_THAT(CheckSubmission(spec, JobInputs{}, &backend),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.tokens: /d: no trained token; data.eval_tokens")));
}

}  // namespace
}  // namespace megatrain::server
