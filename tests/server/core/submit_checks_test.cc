// Note [Submit checks] (server/core/submit_checks.h) over a backend whose
// model limits and shard headers are scripted: the spec-level rules, the
// file existence checks and the mapping of every refusal to
// INVALID_ARGUMENT naming the field. The engine's header readers are tested
// in tests/engine/data/input_checks_test.cc and through a real daemon in
// tests/integration/submit_checks_test.sh.
#include "server/core/submit_checks.h"

#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::server {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// The fake engine plus scripted answers for the submit checks.
class ScriptedBackend final : public testing::ForwardingEngineBackend {
 public:
  ModelLimits limits{32000, 4096, 16};
  std::vector<engine::TokenShardHeaderFacts> shards;
  absl::Status shard_status;
  absl::Status weights_status;
  std::vector<std::string> shard_paths_read;

  absl::StatusOr<ModelLimits> ModelLimitsOf(const engine::JobSpec&, const std::string&) override {
    return limits;
  }
  absl::StatusOr<std::vector<engine::TokenShardHeaderFacts>> ReadTokenShardHeaders(
      const std::string& path) override {
    shard_paths_read.push_back(path);
    if (!shard_status.ok()) return shard_status;
    return shards;
  }
  absl::Status CheckHfWeightHeaders(const std::string&, const std::string&) override {
    return weights_status;
  }
};

class SubmitChecksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = megatrain::testing::MakeTempDir("submit-checks");
    spec_.model.preset = "tiny";
    spec_.data.tokens = dir_ + "/train.mtt";
    spec_.train.seq_len = 128;
  }

  std::string dir_;
  engine::JobSpec spec_;
  ScriptedBackend backend_;
  JobInputs inputs_;
};

TEST_F(SubmitChecksTest, AGoodSpecPassesAndReadsBothShardSets) {
  spec_.data.eval_tokens = dir_ + "/eval";
  spec_.eval.every_steps = 10;
  backend_.shards = {{spec_.data.tokens, 32000, 100, 2}};
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_), IsOk());
  EXPECT_EQ(backend_.shard_paths_read,
            (std::vector<std::string>{spec_.data.tokens, spec_.data.eval_tokens}));
}

TEST_F(SubmitChecksTest, EvalEveryStepsWithoutAnEvalSetIsRefused) {
  spec_.eval.every_steps = 20;
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("eval.every_steps: 20 but the job has no eval set")));
  spec_.data.eval_fraction = 0.1;
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_), IsOk());
}

TEST_F(SubmitChecksTest, SeqLenAboveMaxPositionEmbeddingsNeedsTheOverride) {
  spec_.train.seq_len = 8192;
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.seq_len: 8192 is above the model's "
                                 "max_position_embeddings 4096")));
  spec_.train.allow_seq_len_above_max_position_embeddings = true;
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_), IsOk());
}

// train.resident_layers is bounded by the model's layers (the spec's own
// validation knows only its range).
TEST_F(SubmitChecksTest, ResidentLayersAboveTheModelsLayersAreRefused) {
  spec_.train.resident_layers = 17;
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.resident_layers: 17 is more than the model's "
                                 "num_hidden_layers 16")));
  for (const int64_t layers : {int64_t{16}, int64_t{0}, engine::kAutoResidentLayers}) {
    spec_.train.resident_layers = layers;
    EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_), IsOk()) << layers;
  }
}

TEST_F(SubmitChecksTest, ShardForALargerVocabularyIsRefusedNamingTheFile) {
  backend_.shards = {{spec_.data.tokens, 128256, 100, 2}};
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.tokens: " + spec_.data.tokens +
                                 " was written for vocab_size 128256 (its header), above the "
                                 "model's vocab_size 32000")));
}

TEST_F(SubmitChecksTest, HeaderErrorsBecomeInvalidArgumentNamingTheField) {
  backend_.shard_status = absl::DataLossError("/d/x.mtt: truncated copy?");
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.tokens: /d/x.mtt: truncated copy?")));
  backend_.shard_status = absl::NotFoundError("/nope: no such file or directory");
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.tokens: /nope: no such file or directory")));
  backend_.shard_status = absl::OkStatus();
  spec_.model.preset.clear();
  spec_.model.hf_dir = dir_;
  backend_.weights_status = absl::DataLossError("model.safetensors: truncated");
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.hf_dir: model.safetensors: truncated")));
}

TEST_F(SubmitChecksTest, MissingTextOrTokenizerIsRefused) {
  spec_.data.tokens.clear();
  spec_.data.text = dir_ + "/corpus.txt";
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.text: '" + spec_.data.text + "'")));
  std::ofstream(spec_.data.text) << "hello\n";
  spec_.data.tokenizer = dir_ + "/missing.model";
  EXPECT_THAT(CheckSubmission(spec_, inputs_, &backend_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.tokenizer: '")));
}

}  // namespace
}  // namespace megatrain::server
