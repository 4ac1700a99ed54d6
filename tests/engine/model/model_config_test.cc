// Tests of HF config.json parsing, validation, presets and layouts.
#include "engine/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/param_layout.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

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
  EXPECT_THAT(
      ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": "big",
                                "intermediate_size": 4, "num_hidden_layers": 1,
                                "num_attention_heads": 1})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hidden_size: expected an integer")));
}

TEST(ParseHfConfigTest, RefusesHeadsThatDoNotDivide) {
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 12,
                                "intermediate_size": 4, "num_hidden_layers": 1,
                                "num_attention_heads": 6, "num_key_value_heads": 4})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_key_value_heads")));
}

TEST(ParseHfConfigTest, AnOddDefaultHeadDimSaysWhereItCameFrom) {
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 4096,
                                "intermediate_size": 4, "num_hidden_layers": 1,
                                "num_attention_heads": 3})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("head_dim: must be even for RoPE, got 1365 (hidden_size 4096 / "
                                 "num_attention_heads 3 when config.json gives no head_dim)")));
  EXPECT_THAT(ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 4096,
                                "intermediate_size": 4, "num_hidden_layers": 1,
                                "num_attention_heads": 32, "head_dim": 127})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("head_dim: must be even for RoPE, got 127"),
                             Not(HasSubstr("when config.json gives no head_dim")))));
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
  // A mistyped directory (the tools take a directory or a preset) is named as one.
  EXPECT_THAT(
      PresetConfig("/models/no-such-dir"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("'/models/no-such-dir' is neither a model directory nor a preset")));
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

// --- Families beyond Llama ---

std::string FixtureConfig(const std::string& family) {
  return std::string(MEGATRAIN_TESTDATA_DIR) + "/hf/" + family + "/config.json";
}

// Configs as transformers 5.17's save_pretrained wrote them (rope_parameters,
// layer_types).
// transformers 5 types Gemma's query_pre_attn_scalar as int and refuses
// 16.0 (seen in deploy/gpu-hf-check.sh's reload of an export).
TEST(ParseHfConfigTest, ExportWritesAnIntegralQueryPreAttnScalarAsAnInteger) {
  auto gemma2 = LoadHfConfigFile(FixtureConfig("gemma2"));
  ASSERT_THAT(gemma2, IsOk());
  const std::string json = gemma2->ToHfConfigJson();
  EXPECT_THAT(json, HasSubstr("\"query_pre_attn_scalar\": 16"));
  EXPECT_THAT(json, ::testing::Not(HasSubstr("\"query_pre_attn_scalar\": 16.0")));
}

TEST(ParseHfConfigTest, ReadsTransformers5FamilyConfigs) {
  auto gemma2 = LoadHfConfigFile(FixtureConfig("gemma2"));
  ASSERT_THAT(gemma2, IsOk());
  EXPECT_EQ(gemma2->norm_kind, NormKind::kRmsOnePlusWeight);
  EXPECT_TRUE(gemma2->sandwich_norms);
  EXPECT_TRUE(gemma2->scale_embeddings);
  EXPECT_EQ(gemma2->hidden_activation, MlpActivation::kGeluTanh);
  EXPECT_DOUBLE_EQ(gemma2->attn_logit_softcapping, 50.0);
  EXPECT_DOUBLE_EQ(gemma2->final_logit_softcapping, 30.0);
  EXPECT_DOUBLE_EQ(gemma2->AttentionScale(), 0.25);  // query_pre_attn_scalar 16
  EXPECT_EQ(gemma2->layer_types,
            (std::vector<LayerType>{LayerType::kSlidingAttention, LayerType::kFullAttention,
                                    LayerType::kSlidingAttention}));
  EXPECT_EQ(gemma2->sliding_window, 8);
  EXPECT_TRUE(gemma2->tie_word_embeddings);
  EXPECT_EQ(gemma2->EmbeddingPaddingIdx(), 0);

  auto gemma3 = LoadHfConfigFile(FixtureConfig("gemma3_text"));
  ASSERT_THAT(gemma3, IsOk());
  EXPECT_TRUE(gemma3->qk_norm);
  EXPECT_DOUBLE_EQ(gemma3->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(gemma3->rope_local_base_freq, 1e4);
  EXPECT_DOUBLE_EQ(gemma3->attn_logit_softcapping, 0.0);  // null: off
  EXPECT_DOUBLE_EQ(gemma3->final_logit_softcapping, 0.0);
  EXPECT_EQ(gemma3->AttentionType(2), LayerType::kFullAttention);

  auto phi3 = LoadHfConfigFile(FixtureConfig("phi3"));
  ASSERT_THAT(phi3, IsOk());
  EXPECT_TRUE(phi3->fused_qkv && phi3->fused_gate_up);
  EXPECT_EQ(phi3->RotaryDim(), 4);
  EXPECT_EQ(phi3->sliding_window, 0);  // null
  EXPECT_FALSE(phi3->AnySlidingLayer());

  auto longrope = LoadHfConfigFile(FixtureConfig("phi3_longrope"));
  ASSERT_THAT(longrope, IsOk());
  EXPECT_EQ(longrope->rope_scaling.type, RopeScalingType::kLongRope);
  EXPECT_EQ(longrope->rope_scaling.original_max_position_embeddings, 16);
  EXPECT_EQ(longrope->rope_scaling.long_factor, (std::vector<double>{1.5, 2.0, 2.5, 3.0}));
  EXPECT_EQ(longrope->rope_scaling.short_factor.size(), 4u);
}

// The same families as transformers 4 wrote them (published checkpoints:
// top-level rope_theta / rope_scaling, no layer_types).
TEST(ParseHfConfigTest, ReadsTransformers4FamilyConfigs) {
  auto gemma2 = ParseHfConfig(R"({"model_type": "gemma2", "vocab_size": 256000,
      "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
      "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
      "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
      "query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_theta": 10000.0,
      "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "pad_token_id": 0,
      "rms_norm_eps": 1e-06, "max_position_embeddings": 8192})");
  ASSERT_THAT(gemma2, IsOk());
  EXPECT_EQ(gemma2->AttentionType(0), LayerType::kSlidingAttention);  // even layers slide
  EXPECT_EQ(gemma2->AttentionType(1), LayerType::kFullAttention);
  EXPECT_TRUE(gemma2->tie_word_embeddings);  // Gemma's default
  // Gemma-2-2B: 2,614,341,888 parameters (tied).
  EXPECT_EQ(gemma2->ParamCount(), 2614341888);

  auto gemma3 = ParseHfConfig(R"({"model_type": "gemma3_text", "vocab_size": 1000,
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 12,
      "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
      "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
      "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 512,
      "sliding_window_pattern": 6})");
  ASSERT_THAT(gemma3, IsOk());
  EXPECT_EQ(gemma3->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(gemma3->AttentionType(4), LayerType::kSlidingAttention);
  EXPECT_EQ(gemma3->AttentionType(5), LayerType::kFullAttention);  // every 6th
  EXPECT_EQ(gemma3->AttentionType(11), LayerType::kFullAttention);

  // A multimodal gemma3 config is read through its text_config.
  auto multimodal = ParseHfConfig(R"({"model_type": "gemma3", "text_config": {
      "model_type": "gemma3_text", "vocab_size": 1000, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 1, "head_dim": 32}, "vision_config": {}})");
  ASSERT_THAT(multimodal, IsOk());
  EXPECT_EQ(multimodal->model_type, "gemma3_text");
  EXPECT_TRUE(multimodal->multimodal_checkpoint);

  EXPECT_THAT(ParseHfConfig(R"({"model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
      "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
      "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rope_scaling.short_factor: 1 entries, longrope needs 48")));
  std::string factors = "1.0";
  for (int i = 1; i < 48; ++i) factors += ", 1.0";
  auto phi35 = ParseHfConfig(absl::StrCat(R"({"model_type": "phi3", "vocab_size": 32064,
      "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 131072,
      "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
      "rope_scaling": {"type": "longrope", "short_factor": [)",
                                          factors, R"(], "long_factor": [)", factors, "]}}"));
  ASSERT_THAT(phi35, IsOk());
  EXPECT_EQ(phi35->rope_scaling.original_max_position_embeddings, 4096);
  // Phi-3.5-mini-instruct: 3,821,079,552 parameters.
  EXPECT_EQ(phi35->ParamCount(), 3821079552);
}

TEST(ParseHfConfigTest, RefusesBadFamilyFieldsNamingThem) {
  const std::string base = R"("vocab_size": 10, "hidden_size": 8, "intermediate_size": 4,
      "num_hidden_layers": 2, "num_attention_heads": 2)";
  EXPECT_THAT(ParseHfConfig(absl::StrCat(R"({"model_type": "phi3", )", base,
                                         R"(, "rope_scaling": {"type": "su"}})")),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("rope_scaling.rope_type: 'su' is not supported")));
  // An unknown rope_scaling type on a Gemma 3 global layer, in either the
  // legacy or the transformers 5 spelling, names the field.
  EXPECT_THAT(ParseHfConfig(absl::StrCat(R"({"model_type": "gemma3_text", )", base,
                                         R"(, "rope_scaling": {"rope_type": "dynamic",
                                         "factor": 2.0}})")),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("rope_scaling.rope_type: 'dynamic' is not supported")));
  EXPECT_THAT(
      ParseHfConfig(absl::StrCat(R"({"model_type": "gemma3_text", )", base,
                                 R"(, "rope_parameters": {"full_attention": {"rope_type": "yarn",
                                 "rope_theta": 1000000.0, "factor": 8.0}, "sliding_attention":
                                 {"rope_type": "default", "rope_theta": 10000.0}}})")),
      StatusIs(absl::StatusCode::kUnimplemented,
               HasSubstr("rope_parameters.full_attention.rope_type: 'yarn' is not supported")));
  // head_dim inconsistent with the rotary fraction: Phi-3 rotates
  // head_dim * partial_rotary_factor dimensions, which must be even.
  EXPECT_THAT(ParseHfConfig(absl::StrCat(R"({"model_type": "phi3", )", base,
                                         R"(, "head_dim": 6, "partial_rotary_factor": 0.5})")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("partial_rotary_factor")));
  EXPECT_THAT(ParseHfConfig(absl::StrCat(R"({"model_type": "gemma2", )", base,
                                         R"(, "layer_types": ["full_attention"]})")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("layer_types: 1 entries for num_hidden_layers 2")));
  EXPECT_THAT(ParseHfConfig(absl::StrCat(R"({"model_type": "gemma2", )", base,
                                         R"(, "layer_types": ["full_attention", "chunked"]})")),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("layer_types[1]")));
  EXPECT_THAT(
      ParseHfConfig(absl::StrCat(R"({"model_type": "gemma2", )", base, R"(, "head_dim": 7})")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head_dim: must be even")));
  EXPECT_THAT(ParseHfConfig(absl::StrCat(R"({"model_type": "phi3", )", base,
                                         R"(, "partial_rotary_factor": 0.25})")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("partial_rotary_factor")));
  EXPECT_THAT(ParseHfConfig(absl::StrCat(R"({"model_type": "gemma2", )", base,
                                         R"(, "hidden_activation": "relu"})")),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("hidden_activation: 'relu'")));
  EXPECT_THAT(
      ParseHfConfig(absl::StrCat(R"({"model_type": "llama", )", base, R"(, "pad_token_id": 10})")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pad_token_id")));
}

TEST(PresetConfigTest, FamilyPresetsHavePublishedParameterCounts) {
  auto gemma = PresetConfig("gemma2-2b");
  ASSERT_THAT(gemma, IsOk());
  EXPECT_EQ(gemma->ParamCount(), 2614341888);  // google/gemma-2-2b
  EXPECT_EQ(gemma->AttentionType(0), LayerType::kSlidingAttention);
  auto phi = PresetConfig("phi3-mini");
  ASSERT_THAT(phi, IsOk());
  EXPECT_EQ(phi->ParamCount(), 3821079552);  // microsoft/Phi-3-mini-4k-instruct
  EXPECT_EQ(phi->sliding_window, 2047);
}

TEST(ModelLayoutTest, FamiliesHaveTheirHfTensors) {
  auto gemma2 = LoadHfConfigFile(FixtureConfig("gemma2"));
  auto phi3 = LoadHfConfigFile(FixtureConfig("phi3"));
  ASSERT_THAT(gemma2, IsOk());
  ASSERT_THAT(phi3, IsOk());
  ModelLayout g = ModelLayout::Create(*gemma2);
  const BlockLayout& layer = g.blocks[g.layer_block(0)];
  for (const char* name : {"pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight",
                           "post_attention_layernorm.weight", "input_layernorm.weight"}) {
    const ParamSpec* p = layer.Find(name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_TRUE(p->is_bias && !p->is_norm) << name;  // zero-centred: initialised to 0
  }
  EXPECT_EQ(g.ParamCount(), gemma2->ParamCount());
  ModelLayout ph = ModelLayout::Create(*phi3);
  const BlockLayout& phi_layer = ph.blocks[ph.layer_block(0)];
  ASSERT_NE(phi_layer.Find("self_attn.qkv_proj.weight"), nullptr);
  EXPECT_EQ(phi_layer.Find("self_attn.qkv_proj.weight")->shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(phi_layer.Find("mlp.gate_up_proj.weight")->shape, (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(phi_layer.Find("self_attn.q_proj.weight"), nullptr);
  EXPECT_EQ(ph.ParamCount(), phi3->ParamCount());
}

}  // namespace
}  // namespace megatrain::engine
