// Note [Model bounds] (engine/model/model_config.h): hostile config.json
// sizes are refused before anything is sized from them, through every door
// (ParseHfConfig, ModelConfig::Validate, PlanJobForModel and the admission
// estimate EstimateFootprintFromHfConfig), naming the field and the limit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/job/plan.h"
#include "engine/job/training_job.h"
#include "engine/model/model_config.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A llama config.json with `layers` decoder layers and the other sizes
// given (Llama-3.2-1B's by default).
std::string LlamaJson(int64_t layers, int64_t vocab = 128256, int64_t hidden = 2048,
                      const std::string& model_type = "llama") {
  return absl::StrCat(R"({"model_type": ")", model_type, R"(", "vocab_size": )", vocab,
                      R"(, "hidden_size": )", hidden,
                      R"(, "intermediate_size": 8192, "num_hidden_layers": )", layers,
                      R"(, "num_attention_heads": 32, "num_key_value_heads": 8})");
}

TEST(ModelBoundsTest, TwoToTheThirtyOneLayersIsInvalidArgumentNamingTheFieldAndLimit) {
  EXPECT_THAT(ParseHfConfig(LlamaJson(int64_t{1} << 31), "hf_config_json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("hf_config_json"),
                             HasSubstr("num_hidden_layers: must be <= 4096, got 2147483648"))));
}

TEST(ModelBoundsTest, GemmaLayerPatternIsNotBuiltForTooManyLayers) {
  // gemma2 fills one layer_types entry per layer while parsing: the bound
  // comes first, so this returns at once instead of allocating 2^40 entries.
  EXPECT_THAT(ParseHfConfig(LlamaJson(int64_t{1} << 40, 256000, 2304, "gemma2")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("num_hidden_layers: must be <= 4096")));
}

TEST(ModelBoundsTest, EveryFieldOverItsBoundIsNamedAtOnce) {
  EXPECT_THAT(ParseHfConfig(LlamaJson(1000000, int64_t{1} << 40, int64_t{1} << 30)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("num_hidden_layers: must be <= 4096, got 1000000"),
                             HasSubstr("vocab_size: must be <= 16777216"),
                             HasSubstr("hidden_size: must be <= 262144"))));
}

TEST(ModelBoundsTest, TotalParametersAreBoundedWithoutOverflow) {
  // Every size within its own bound, the total (~1.3e17) far above 1e13:
  // int64 arithmetic of the products would not overflow here, but the
  // 128-bit total is what refuses it.
  const std::string json = absl::StrCat(
      R"({"model_type": "llama", "vocab_size": 16777216, "hidden_size": 262144,
          "intermediate_size": 4194304, "num_hidden_layers": 4096,
          "num_attention_heads": 16384, "num_key_value_heads": 16384, "head_dim": 16384})");
  EXPECT_THAT(ParseHfConfig(json), StatusIs(absl::StatusCode::kInvalidArgument,
                                            AllOf(HasSubstr("parameters: the model has about"),
                                                  HasSubstr("must be <= 1e+13"))));
}

TEST(ModelBoundsTest, ValidateChecksTheBoundsFirst) {
  absl::StatusOr<ModelConfig> config = PresetConfig("llama-1b");
  ASSERT_THAT(config, IsOk());
  config->num_hidden_layers = int64_t{1} << 31;
  EXPECT_THAT(config->Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("num_hidden_layers: must be <= 4096")));
}

TEST(ModelBoundsTest, MoeExpertsCountInTheTotal) {
  // 4096 experts (their own bound) of width 2^24 in 4096 layers: ~1e18.
  const std::string json = R"({"model_type": "qwen3_moe", "vocab_size": 151936,
      "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 16777216,
      "num_hidden_layers": 4096, "num_attention_heads": 32, "num_key_value_heads": 4,
      "head_dim": 128, "num_experts": 4096, "num_experts_per_tok": 8})";
  EXPECT_THAT(ParseHfConfig(json), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("parameters: the model has about")));
}

TEST(ModelBoundsTest, ReleasedShapesAndTheLargestPlannableModelAreWithinBounds) {
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<ModelConfig> config = PresetConfig(name);
    ASSERT_THAT(config, IsOk()) << name;
    EXPECT_THAT(CheckModelBounds(*config), IsOk()) << name;
  }
  // PlanJob's family/param_count reaches 1e13 with ~3,100 405B-shaped layers.
  absl::StatusOr<ModelConfig> largest = ConfigForParamCount("llama", 1e13);
  ASSERT_THAT(largest, IsOk());
  EXPECT_THAT(largest->Validate(), IsOk());
}

TEST(ModelBoundsTest, PlanJobRefusesAHostileHfConfigBeforePlanning) {
  PlanModel model;
  model.hf_config_json = LlamaJson(int64_t{1} << 31);
  JobSpec spec;
  EXPECT_THAT(PlanJobForModel(model, spec, DefaultPlanMachine()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("hf_config_json"),
                             HasSubstr("num_hidden_layers: must be <= 4096"))));
  model.hf_config_json = LlamaJson(1000000);
  EXPECT_THAT(PlanJobForModel(model, spec, DefaultPlanMachine()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("num_hidden_layers: must be <= 4096, got 1000000")));
}

TEST(ModelBoundsTest, AdmissionEstimateRefusesAHostileConfigJson) {
  JobSpec spec;
  spec.model.hf_dir = "/models/hostile";
  EXPECT_THAT(
      EstimateFootprintFromHfConfig(spec, LlamaJson(int64_t{1} << 31)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("model.hf_dir"), HasSubstr("num_hidden_layers: must be <= 4096"))));
}

TEST(ModelBoundsTest, PlanAtTheLayerBoundIsComputed) {
  // O(layers): the largest allowed layer count plans like any model.
  PlanModel model;
  model.hf_config_json = LlamaJson(kMaxHiddenLayers, 32000, 1024);
  JobSpec spec;
  EXPECT_THAT(PlanJobForModel(model, spec, DefaultPlanMachine()), IsOk());
}

}  // namespace
}  // namespace megatrain::engine
