// Tests of HF config.json parsing, validation, presets and layouts.
#include "engine/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/param_layout.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// Llama-3.2-1B's config.json as published (fields that matter here).
constexpr char kLlama32Config[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
  "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0, "tie_word_embeddings": true, "hidden_act": "silu",
  "attention_bias": false, "mlp_bias": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}
})";

TEST(ParseHfConfigTest, ReadsLlama32Config) {
  auto config = ParseHfConfig(kLlama32Config);
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->hidden_size, 2048);
  EXPECT_EQ(config->num_key_value_heads, 8);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->eos_token_id, 128001);
  EXPECT_EQ(config->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(config->rope_scaling.factor, 32.0);
  // Llama-3.2-1B has 1,235,814,400 parameters (tied lm_head counted once).
  EXPECT_EQ(config->ParamCount(), 1235814400);
}

TEST(ParseHfConfigTest, RefusesUnknownModelTypeNamingTheField) {
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "gpt2", "vocab_size": 10})", "x/config.json"),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("x/config.json: model_type: 'gpt2' is not supported")));
}

TEST(ParseHfConfigTest, RefusesMalformedJson) {
  EXPECT_THAT(ParseHfConfig("{not json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid JSON")));
}

TEST(ParseHfConfigTest, RefusesMissingAndMistypedFields) {
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hidden_size: missing")));
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": "big",
                                "intermediate_size": 4, "num_hidden_layers": 1,
                                "num_attention_heads": 1})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("hidden_size: expected an integer")));
}

TEST(ParseHfConfigTest, RefusesHeadsThatDoNotDivide) {
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 12,
                                "intermediate_size": 4, "num_hidden_layers": 1,
                                "num_attention_heads": 6, "num_key_value_heads": 4})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_key_value_heads")));
}

TEST(ParseHfConfigTest, RefusesUnsupportedRopeScaling) {
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
                                "intermediate_size": 4, "num_hidden_layers": 1,
                                "num_attention_heads": 2,
                                "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})"),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("rope_scaling.rope_type")));
}

TEST(ParseHfConfigTest, SelectsVariantsFromModelType) {
  auto mistral = ParseHfConfig(R"({"model_type": "mistral", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
      "sliding_window": 4096})");
  ASSERT_THAT(mistral, IsOk());
  EXPECT_EQ(mistral->sliding_window, 4096);
  EXPECT_FALSE(mistral->HasQkvBias());

  auto qwen2 = ParseHfConfig(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
      "sliding_window": 4096, "use_sliding_window": false})");
  ASSERT_THAT(qwen2, IsOk());
  EXPECT_EQ(qwen2->sliding_window, 0);  // use_sliding_window is false
  EXPECT_TRUE(qwen2->HasQkvBias());
  EXPECT_FALSE(qwen2->HasOutputBias());

  auto qwen3 = ParseHfConfig(R"({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
      "head_dim": 16, "attention_bias": false})");
  ASSERT_THAT(qwen3, IsOk());
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_EQ(qwen3->head_dim, 16);
}

// transformers 5 writes RoPE as `rope_parameters` (theta inside), with no
// top-level rope_theta or rope_scaling: this is a config.json it saved.
TEST(ParseHfConfigTest, ReadsTransformers5RopeParameters) {
  auto config = ParseHfConfig(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-06, "tie_word_embeddings": true,
    "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                        "original_max_position_embeddings": 64, "rope_theta": 500000.0,
                        "rope_type": "llama3"},
    "dtype": "float32", "transformers_version": "5.17.0"})");
  ASSERT_THAT(config, IsOk());
  EXPECT_DOUBLE_EQ(config->rope_theta, 500000.0);
  EXPECT_EQ(config->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(config->rope_scaling.factor, 8.0);
  EXPECT_EQ(config->rope_scaling.original_max_position_embeddings, 64);
  auto plain = ParseHfConfig(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
      "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})");
  ASSERT_THAT(plain, IsOk());
  EXPECT_DOUBLE_EQ(plain->rope_theta, 1e6);
  EXPECT_EQ(plain->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
      "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}})"),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("rope_parameters.rope_type")));
}

TEST(ModelConfigTest, RoundTripsThroughHfJson) {
  auto original = ParseHfConfig(kLlama32Config);
  ASSERT_THAT(original, IsOk());
  auto again = ParseHfConfig(original->ToHfConfigJson());
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->ParamCount(), original->ParamCount());
  EXPECT_EQ(again->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(again->eos_token_id, 128001);
}

TEST(PresetConfigTest, MatchesBaselineShapes) {
  // ../shared/bench/torch_baselines.py prints params_b 1.498 and 3.607.
  auto llama1b = PresetConfig("llama-1b");
  ASSERT_THAT(llama1b, IsOk());
  EXPECT_NEAR(llama1b->ParamCount() / 1e9, 1.498, 0.0005);
  auto llama3b = PresetConfig("llama-3b");
  ASSERT_THAT(llama3b, IsOk());
  EXPECT_NEAR(llama3b->ParamCount() / 1e9, 3.607, 0.0005);
  EXPECT_THAT(PresetConfig("llama-70b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.preset")));
}

TEST(ModelLayoutTest, AlignsParamsAndCountsThemOnce) {
  auto config = PresetConfig("tiny");
  ASSERT_THAT(config, IsOk());
  ModelLayout layout = ModelLayout::Create(*config);
  ASSERT_EQ(layout.num_layers(), config->num_hidden_layers);
  EXPECT_EQ(layout.ParamCount(), config->ParamCount());
  for (const BlockLayout& block : layout.blocks) {
    for (const ParamSpec& p : block.params) {
      EXPECT_EQ(p.offset % kParamAlignElements, 0) << p.hf_name;
      EXPECT_LE(p.offset + p.numel, block.numel) << p.hf_name;
    }
  }
  int64_t block_idx = -1;
  const ParamSpec* param = nullptr;
  ASSERT_TRUE(layout.FindHfName("model.layers.2.mlp.up_proj.weight", &block_idx, &param));
  EXPECT_EQ(block_idx, layout.layer_block(2));
  EXPECT_EQ(param->shape, (std::vector<int64_t>{config->intermediate_size, config->hidden_size}));
  EXPECT_FALSE(layout.FindHfName("model.layers.9.mlp.up_proj.weight", &block_idx, &param));
}

}  // namespace
}  // namespace megatrain::engine
