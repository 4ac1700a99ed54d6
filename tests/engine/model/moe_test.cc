// MoE families against transformers itself: the golden files in
// tests/testdata/hf/<family>/ (tiny models written by transformers 5.17's
// save_pretrained, with its fp32 logits, loss, aux loss and every gradient)
// checked against (a) the monolithic reference (tests/testing/reference_moe)
// and (b) a model assembled from the engine's block functions
// (engine/model/moe_layers.h), plus name mapping round trips, MXFP4 decoding and
// bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/formats/hf_moe_names.h"
#include "engine/model/moe_config.h"
#include "engine/model/moe_layers.h"
#include "engine/formats/mxfp4.h"
#include "engine/formats/safetensors.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/reference_moe.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::RelativeError;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

// fp32 against transformers' fp32 CPU run: both sides do the same
// arithmetic in a different order (fused vs per-expert matmuls, our sorted
// dispatch), so differences are a few ulps amplified through 3 layers;
// 1e-5 norm-relative is the project's fp32 bar (HELPER_BRIEF).
constexpr double kFp32Tolerance = 1e-5;

const std::string kFamilies[] = {"mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss"};

std::string FixtureDir(const std::string& family) {
  return std::string(MEGATRAIN_TESTDATA_DIR) + "/hf/" + family;
}

// Every tensor of a safetensors file as a CPU tensor (float dtypes widened
// to fp32, I64 kept).
std::map<std::string, at::Tensor> ReadAll(const std::string& path) {
  std::map<std::string, at::Tensor> out;
  auto file = SafetensorsFile::Open(path);
  EXPECT_THAT(file, IsOk());
  if (!file.ok()) return out;
  for (const SafetensorsTensorInfo& info : file->tensors()) {
    if (info.dtype == SafetensorsDtype::kI64) {
      at::Tensor t = at::empty(info.shape, at::kLong);
      std::memcpy(t.data_ptr(), file->Data(info).data(), info.size_bytes());
      out[info.name] = t;
    } else {
      at::Tensor t = at::empty(info.shape, at::kFloat);
      EXPECT_THAT(file->ReadAsFloat32(info.name, t.data_ptr<float>(), t.numel()), IsOk());
      out[info.name] = t;
    }
  }
  return out;
}

struct Fixture {
  MoeModelConfig config;
  MoeTensorMap params;                       // fp32 leaves
  std::map<std::string, at::Tensor> golden;  // reference.safetensors
  at::Tensor shifted_labels;                 // [B, T]: HF's shift, -100 at the end
};

Fixture LoadFixture(const std::string& family) {
  Fixture f;
  auto config = LoadMoeHfConfigFile(FixtureDir(family) + "/config.json");
  EXPECT_THAT(config, IsOk());
  f.config = *config;
  auto model = SafetensorsModel::Open(FixtureDir(family));
  EXPECT_THAT(model, IsOk());
  auto params = LoadMoeHfParams(f.config, *model);
  EXPECT_THAT(params, IsOk());
  for (auto& [name, t] : *params) f.params[name] = t.requires_grad_(true);
  f.golden = ReadAll(FixtureDir(family) + "/reference.safetensors");
  // transformers' ForCausalLMLoss: labels padded by one -100 and shifted left.
  at::Tensor labels = f.golden.at("labels");
  f.shifted_labels = at::cat(
      {labels.narrow(1, 1, labels.size(1) - 1), at::full({labels.size(0), 1}, -100, at::kLong)}, 1);
  return f;
}

at::Tensor CrossEntropyMean(const at::Tensor& logits, const at::Tensor& labels) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}), {},
                                at::Reduction::Mean, -100);
}

struct ModelRun {
  at::Tensor logits, loss, aux_loss;
};

// The model assembled from engine block functions, as the executor will
// run it: layer by layer, load-balancing stats accumulated in the forward,
// each layer's aux term added for the backward.
ModelRun EngineModel(const MoeModelConfig& c, const MoeTensorMap& p, const at::Tensor& input_ids,
                     const at::Tensor& labels, at::ScalarType cd = at::kFloat) {
  const int64_t b = input_ids.size(0), t = input_ids.size(1);
  const at::Device cpu(at::kCPU);
  at::Tensor x = p.at("model.embed_tokens.weight")
                     .index_select(0, input_ids.reshape({-1}))
                     .view({b, t, c.base.hidden_size});
  RopeCache rope = BuildMoeRopeCache(c, t, cpu);
  LoadBalancingStats stats;
  std::vector<at::Tensor> router_logits;
  for (int64_t l = 0; l < c.base.num_hidden_layers; ++l) {
    BlockLayout block = MoeDecoderLayerBlock(c, l);
    std::vector<at::Tensor> leaves;
    // Weights in the compute dtype, as the executor streams them (the
    // block functions widen routers and norms to fp32 themselves).
    for (const ParamSpec& spec : block.params) leaves.push_back(p.at(spec.hf_name).to(cd));
    MoeDecoderLayerWeights w = MoeDecoderLayerWeightsFromParams(block, leaves);
    MoeLayerOutput out = MoeDecoderLayerForward(
        c, l, w, x, rope, BuildMoeLayerAttentionMask(c, l, t, cpu), at::Tensor(), cd);
    x = out.hidden;
    if (out.router_logits.defined()) {
      AccumulateLoadBalancing(c.moe, out.router_logits, &stats);
      router_logits.push_back(out.router_logits);
    }
  }
  ModelRun r;
  r.logits =
      HeadLogits(c.base, x, p.at("model.norm.weight").to(cd), p.at("lm_head.weight").to(cd), cd);
  r.aux_loss = LoadBalancingLoss(c.moe, stats);
  at::Tensor aux_terms = at::zeros({}, at::kFloat);
  for (const at::Tensor& logits : router_logits) {
    aux_terms = aux_terms + LoadBalancingLayerTerm(c.moe, logits, stats);
  }
  r.loss = CrossEntropyMean(r.logits, labels) + c.moe.router_aux_loss_coef * aux_terms;
  return r;
}

// Checks logits, loss, aux_loss and every parameter gradient against the
// golden file; `what` names the implementation in failures.
void ExpectMatchesTransformers(const Fixture& f, const ModelRun& run, const std::string& what) {
  EXPECT_LT(RelativeError(run.logits.detach(), f.golden.at("logits")), kFp32Tolerance) << what;
  EXPECT_LT(RelativeError(run.loss.detach().reshape({1}), f.golden.at("loss")), kFp32Tolerance)
      << what;
  EXPECT_LT(RelativeError(run.aux_loss.detach().reshape({1}), f.golden.at("aux_loss")),
            kFp32Tolerance)
      << what;
  std::vector<std::string> names;
  std::vector<at::Tensor> leaves;
  for (const auto& [name, t] : f.params) {
    names.push_back(name);
    leaves.push_back(t);
  }
  auto grads = torch::autograd::grad({run.loss}, leaves, {}, /*retain_graph=*/false,
                                     /*create_graph=*/false, /*allow_unused=*/true);
  int64_t golden_grads = 0;
  for (const auto& [name, t] : f.golden) golden_grads += name.rfind("grad.", 0) == 0;
  EXPECT_EQ(golden_grads, static_cast<int64_t>(names.size())) << what;
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = f.golden.find("grad." + names[i]);
    ASSERT_NE(it, f.golden.end()) << what << ": no golden gradient for " << names[i];
    ASSERT_TRUE(grads[i].defined()) << what << ": no gradient for " << names[i];
    EXPECT_LT(RelativeError(grads[i], it->second), kFp32Tolerance) << what << ": " << names[i];
  }
}

class MoeFamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeFamilyTest, ReferenceMatchesTransformers) {
  Fixture f = LoadFixture(GetParam());
  ASSERT_FALSE(f.params.empty());
  auto r = ::megatrain::testing::ReferenceMoeForward(f.config, f.params, f.golden.at("input_ids"),
                                                     f.shifted_labels);
  ExpectMatchesTransformers(f, ModelRun{r.logits, r.loss, r.aux_loss}, "reference");
}

TEST_P(MoeFamilyTest, EngineBlocksMatchTransformers) {
  Fixture f = LoadFixture(GetParam());
  ASSERT_FALSE(f.params.empty());
  ModelRun run = EngineModel(f.config, f.params, f.golden.at("input_ids"), f.shifted_labels);
  ExpectMatchesTransformers(f, run, "engine");
}

TEST_P(MoeFamilyTest, EngineBlocksAreBitwiseReproducible) {
  Fixture f = LoadFixture(GetParam());
  ASSERT_FALSE(f.params.empty());
  std::vector<at::Tensor> leaves;
  for (const auto& [name, t] : f.params) leaves.push_back(t);
  std::vector<at::Tensor> first;
  for (int run = 0; run < 2; ++run) {
    ModelRun r = EngineModel(f.config, f.params, f.golden.at("input_ids"), f.shifted_labels);
    std::vector<at::Tensor> outs = {r.logits.detach(), r.loss.detach()};
    for (at::Tensor& g : torch::autograd::grad({r.loss}, leaves)) outs.push_back(g);
    if (run == 0) {
      first = outs;
      continue;
    }
    for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(at::equal(outs[i], first[i])) << i;
  }
}

// Checkpoint names out = the names transformers wrote, values bit for bit;
// the fused names load back to the same parameters.
TEST_P(MoeFamilyTest, SafetensorsRoundTripKeepsNamesAndBits) {
  Fixture f = LoadFixture(GetParam());
  ASSERT_FALSE(f.params.empty());
  const std::string dir = ::megatrain::testing::MakeTempDir("moe_roundtrip");
  ASSERT_THAT(WriteMoeSafetensors(dir + "/model.safetensors", f.config, f.params,
                                  MoeExportFormat::kCheckpoint, SafetensorsDtype::kF32),
              IsOk());
  auto written = ReadAll(dir + "/model.safetensors");
  auto original = ReadAll(FixtureDir(GetParam()) + "/model.safetensors");
  std::set<std::string> written_names, original_names;
  for (const auto& [name, t] : written) written_names.insert(name);
  for (const auto& [name, t] : original) original_names.insert(name);
  EXPECT_EQ(written_names, original_names);
  for (const auto& [name, t] : original) {
    auto it = written.find(name);
    if (it != written.end()) {
      EXPECT_TRUE(at::equal(it->second, t)) << name;
    }
  }
  ASSERT_THAT(WriteMoeSafetensors(dir + "/model.safetensors", f.config, f.params,
                                  MoeExportFormat::kFused, SafetensorsDtype::kF32),
              IsOk());
  auto model = SafetensorsModel::Open(dir);
  ASSERT_THAT(model, IsOk());
  auto reloaded = LoadMoeHfParams(f.config, *model);
  ASSERT_THAT(reloaded, IsOk());
  ASSERT_EQ(reloaded->size(), f.params.size());
  for (const auto& [name, t] : f.params) EXPECT_TRUE(at::equal(reloaded->at(name), t)) << name;
}

// Experts that receive no tokens: a router that sends every token to
// experts 0 and 1. Output and gradients match the reference's expert loop,
// and the idle experts' weights get exactly zero gradient.
TEST_P(MoeFamilyTest, IdleExpertsGetZeroGradient) {
  Fixture f = LoadFixture(GetParam());
  ASSERT_FALSE(f.params.empty());
  const MoeConfig& m = f.config.moe;
  int64_t layer_idx = 0;
  while (!m.IsMoeLayer(layer_idx)) ++layer_idx;
  const std::string pre = "model.layers." + std::to_string(layer_idx) + ".";
  const std::string router_name =
      pre + (m.family == MoeFamily::kGptOss ? "mlp.router.weight" : "mlp.gate.weight");
  // x > 0 and router rows +1, +0.5, -0.5, -1: logits strictly ordered.
  at::Tensor router = at::tensor({1.0f, 0.5f, -0.5f, -1.0f})
                          .unsqueeze(1)
                          .expand({m.num_experts, f.config.base.hidden_size})
                          .contiguous()
                          .requires_grad_(true);
  MoeTensorMap params = f.params;
  params[router_name] = router;
  if (m.router_bias)
    params[pre + "mlp.router.bias"] = at::zeros({m.num_experts}).requires_grad_(true);
  at::manual_seed(3);
  at::Tensor x = (at::rand({10, f.config.base.hidden_size}) + 0.1).requires_grad_(true);

  BlockLayout block = MoeDecoderLayerBlock(f.config, layer_idx);
  std::vector<at::Tensor> leaves;
  for (const ParamSpec& spec : block.params) leaves.push_back(params.at(spec.hf_name));
  MoeDecoderLayerWeights w = MoeDecoderLayerWeightsFromParams(block, leaves);
  RouterOutput decision;
  at::Tensor engine_out = MoeMlpForward(m, w.moe, x, at::Tensor(), at::kFloat, &decision);
  EXPECT_TRUE(
      at::equal(std::get<0>(decision.topk_index.sort(1)), at::tensor({0L, 1L}).expand({10, 2})));
  at::Tensor logits;
  at::Tensor reference_out = ::megatrain::testing::ReferenceMoeMlp(m, params, pre, x, &logits);
  EXPECT_LT(RelativeError(engine_out.detach(), reference_out.detach()), kFp32Tolerance);

  at::Tensor gate_up = params.at(pre + "mlp.experts.gate_up_proj");
  at::Tensor down = params.at(pre + "mlp.experts.down_proj");
  at::Tensor probe = at::randn(engine_out.sizes());
  auto engine_grads =
      torch::autograd::grad({(engine_out * probe).sum()}, {x, gate_up, down, router});
  auto reference_grads =
      torch::autograd::grad({(reference_out * probe).sum()}, {x, gate_up, down, router});
  for (size_t i = 0; i < engine_grads.size(); ++i) {
    EXPECT_LT(RelativeError(engine_grads[i], reference_grads[i]), kFp32Tolerance) << i;
  }
  for (int64_t e = 2; e < m.num_experts; ++e) {
    EXPECT_EQ(engine_grads[1][e].abs().max().item<float>(), 0.0f) << "expert " << e;
    EXPECT_EQ(engine_grads[2][e].abs().max().item<float>(), 0.0f) << "expert " << e;
  }
  EXPECT_GT(engine_grads[1][0].abs().max().item<float>(), 0.0f);
}

// Note [Router jitter] written out with uint32 arithmetic, independently
// of the int64 tensor ops of MakeRouterJitter.
uint32_t LowBias32Scalar(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

float JitterScalar(uint64_t key, uint64_t i, double eps) {
  const uint32_t key_lo = static_cast<uint32_t>(key), key_hi = static_cast<uint32_t>(key >> 32);
  uint32_t x = LowBias32Scalar(static_cast<uint32_t>(i) ^ key_lo);
  x = LowBias32Scalar(x ^ (static_cast<uint32_t>(i >> 32) + key_hi));
  const float u = static_cast<float>(x >> 8) / 16777216.0f;  // exact
  const float product = static_cast<float>(2.0 * eps) * u;
  return product + static_cast<float>(1.0 - eps);
}

// Mixtral's train-time jitter: every element is the Note's formula bit for
// bit (so any device that runs the same integer ops draws the same noise),
// a function of its key alone; keys of different steps, micro-batches and
// layers differ; values are uniform on [1 - eps, 1 + eps); it multiplies
// the MLP input of router and experts.
TEST(MoeLayersTest, RouterJitterFollowsItsKeyAndScalesTheInput) {
  Fixture f = LoadFixture("mixtral");
  ASSERT_FALSE(f.params.empty());
  MoeConfig m = f.config.moe;
  m.router_jitter_noise = 0.1;
  const int64_t hidden = f.config.base.hidden_size;
  const uint64_t key = RouterJitterKey(/*seed=*/3, /*step=*/7, /*micro_batch=*/1, /*layer_idx=*/0);
  const at::Device cpu(at::kCPU);
  at::Tensor jitter = MakeRouterJitter(m, 6, hidden, key, cpu);
  ASSERT_TRUE(jitter.defined());
  ASSERT_EQ(jitter.sizes(), at::IntArrayRef({6, hidden}));
  ASSERT_EQ(jitter.scalar_type(), at::kFloat);
  const float* values = jitter.data_ptr<float>();
  for (int64_t i = 0; i < jitter.numel(); ++i) {
    const float expected = JitterScalar(key, static_cast<uint64_t>(i), 0.1);
    ASSERT_EQ(std::memcmp(&values[i], &expected, 4), 0) << "element " << i;
  }
  EXPECT_TRUE(at::equal(jitter, MakeRouterJitter(m, 6, hidden, key, cpu)));
  const std::set<uint64_t> keys = {key, RouterJitterKey(4, 7, 1, 0), RouterJitterKey(3, 8, 1, 0),
                                   RouterJitterKey(3, 7, 2, 0), RouterJitterKey(3, 7, 1, 1)};
  EXPECT_EQ(keys.size(), 5u);
  EXPECT_FALSE(at::equal(jitter, MakeRouterJitter(m, 6, hidden, RouterJitterKey(3, 7, 1, 1), cpu)));
  // 2^18 draws: the range, and the mean and variance of U(0.9, 1.1)
  // (1 and 0.2^2 / 12; standard errors 0.0577 / 512 and 5.8e-6) within 5
  // standard errors.
  at::Tensor many = MakeRouterJitter(m, 512, 512, key, cpu).to(at::kDouble);
  EXPECT_GE(many.min().item<double>(), 0.9 - 1e-7);
  EXPECT_LT(many.max().item<double>(), 1.1);
  EXPECT_NEAR(many.mean().item<double>(), 1.0, 5 * 0.0577 / 512);
  EXPECT_NEAR(many.var().item<double>(), 0.04 / 12, 3e-5);
  BlockLayout block = MoeDecoderLayerBlock(f.config, 0);
  std::vector<at::Tensor> leaves;
  for (const ParamSpec& spec : block.params) leaves.push_back(f.params.at(spec.hf_name).detach());
  MoeDecoderLayerWeights w = MoeDecoderLayerWeightsFromParams(block, leaves);
  at::manual_seed(5);
  at::Tensor x = at::randn({6, hidden});
  at::Tensor with_jitter = MoeMlpForward(m, w.moe, x, jitter, at::kFloat, nullptr);
  at::Tensor prescaled = MoeMlpForward(m, w.moe, x * jitter, at::Tensor(), at::kFloat, nullptr);
  EXPECT_TRUE(at::equal(with_jitter, prescaled));
  EXPECT_FALSE(
      at::equal(with_jitter, MoeMlpForward(m, w.moe, x, at::Tensor(), at::kFloat, nullptr)));
  m.router_jitter_noise = 0.0;
  EXPECT_FALSE(MakeRouterJitter(m, 6, hidden, key, cpu).defined());
}

INSTANTIATE_TEST_SUITE_P(Families, MoeFamilyTest, ::testing::ValuesIn(kFamilies),
                         [](const auto& info) { return info.param; });

TEST(MoeConfigTest, ParsesEachFamilysFields) {
  auto mixtral = LoadMoeHfConfigFile(FixtureDir("mixtral") + "/config.json");
  ASSERT_THAT(mixtral, IsOk());
  EXPECT_EQ(mixtral->moe.num_experts, 4);
  EXPECT_EQ(mixtral->moe.moe_intermediate_size, 48);
  EXPECT_TRUE(mixtral->moe.norm_topk_prob);
  EXPECT_EQ(mixtral->base.rope_theta, 1000000.0);

  auto qwen2 = LoadMoeHfConfigFile(FixtureDir("qwen2_moe") + "/config.json");
  ASSERT_THAT(qwen2, IsOk());
  EXPECT_EQ(qwen2->moe.shared_expert_intermediate_size, 40);
  EXPECT_FALSE(qwen2->moe.norm_topk_prob);
  EXPECT_TRUE(qwen2->moe.IsMoeLayer(0));
  EXPECT_FALSE(qwen2->moe.IsMoeLayer(1));  // mlp_only_layers [1]
  EXPECT_TRUE(qwen2->moe.IsMoeLayer(2));
  EXPECT_TRUE(qwen2->base.HasQkvBias());

  auto qwen3 = LoadMoeHfConfigFile(FixtureDir("qwen3_moe") + "/config.json");
  ASSERT_THAT(qwen3, IsOk());
  EXPECT_EQ(qwen3->moe.num_experts, 4);  // written as num_local_experts by transformers 5
  EXPECT_TRUE(qwen3->base.qk_norm);

  auto oss = LoadMoeHfConfigFile(FixtureDir("gpt_oss") + "/config.json");
  ASSERT_THAT(oss, IsOk());
  EXPECT_EQ(oss->moe.router_type, RouterType::kTopKSoftmax);
  EXPECT_TRUE(oss->moe.yarn.enabled);
  EXPECT_EQ(oss->moe.yarn.factor, 32.0);
  EXPECT_FALSE(oss->moe.yarn.truncate);
  EXPECT_EQ(oss->moe.layer_sliding_window, (std::vector<int64_t>{8, 0, 8}));
  EXPECT_TRUE(oss->base.HasOutputBias());
}

// The layout holds every parameter the loader produces, once, with
// aligned offsets, and finds expert tensors by HF name.
TEST(MoeNamesTest, ModelLayoutCoversEveryParameter) {
  for (const std::string& family : kFamilies) {
    Fixture f = LoadFixture(family);
    ASSERT_FALSE(f.params.empty()) << family;
    ModelLayout layout = MoeModelLayout(f.config);
    ASSERT_EQ(layout.num_layers(), f.config.base.num_hidden_layers);
    std::set<std::string> names;
    for (const BlockLayout& block : layout.blocks) {
      for (const ParamSpec& p : block.params) {
        EXPECT_TRUE(names.insert(p.hf_name).second) << p.hf_name;
        EXPECT_EQ(p.offset % kParamAlignElements, 0) << p.hf_name;
        EXPECT_EQ(f.params.at(p.hf_name).sizes().vec(), p.shape) << p.hf_name;
      }
    }
    EXPECT_EQ(names.size(), f.params.size()) << family;
    int64_t block_idx = -1;
    const ParamSpec* spec = nullptr;
    ASSERT_TRUE(layout.FindHfName("model.layers.2.mlp.experts.down_proj", &block_idx, &spec));
    EXPECT_EQ(block_idx, layout.layer_block(2));
  }
}

TEST(MoeConfigTest, DecoderSparseStepSelectsLayers) {
  MoeConfig m;
  m.family = MoeFamily::kQwen2Moe;
  m.num_experts = 4;
  m.decoder_sparse_step = 2;
  m.mlp_only_layers = {3};
  EXPECT_FALSE(m.IsMoeLayer(0));
  EXPECT_TRUE(m.IsMoeLayer(1));
  EXPECT_FALSE(m.IsMoeLayer(2));
  EXPECT_FALSE(m.IsMoeLayer(3));  // (3+1) % 2 == 0 but listed in mlp_only_layers
  EXPECT_TRUE(m.IsMoeLayer(5));
}

std::string FixtureConfigWith(const std::string& family, const std::string& key,
                              const std::string& value_json) {
  std::ifstream in(FixtureDir(family) + "/config.json");
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  // Replace the value of `key` (up to the next ',' or newline), or add the
  // key at the front when the fixture has none.
  const std::string quoted = "\"" + key + "\":";
  const size_t at_key = text.find(quoted);
  if (at_key == std::string::npos) return "{\"" + key + "\": " + value_json + "," + text.substr(1);
  const size_t value_end = text.find_first_of(",\n}", at_key + quoted.size() + 1);
  return text.substr(0, at_key) + quoted + " " + value_json + text.substr(value_end);
}

TEST(MoeConfigTest, RefusesMoreExpertsPerTokenThanExperts) {
  EXPECT_THAT(ParseMoeHfConfig(FixtureConfigWith("mixtral", "num_experts_per_tok", "5")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("num_experts_per_tok: must be in [1, 4], got 5")));
}

TEST(MoeConfigTest, RefusesUnknownFamilyNamingModelType) {
  EXPECT_THAT(ParseMoeHfConfig(FixtureConfigWith("mixtral", "model_type", "\"deepseek_v3\"")),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("model_type: 'deepseek_v3'")));
  EXPECT_THAT(ParseMoeHfConfig(FixtureConfigWith("mixtral", "model_type", "\"phimoe\"")),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("model_type: 'phimoe'")));
}

TEST(MoeConfigTest, RefusesUnknownRouterType) {
  EXPECT_THAT(
      ParseMoeHfConfig(FixtureConfigWith("qwen3_moe", "scoring_func", "\"sigmoid\"")),
      StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("scoring_func: router 'sigmoid'")));
}

TEST(MoeConfigTest, RefusesMissingExpertCount) {
  std::string text = FixtureConfigWith("mixtral", "num_local_experts", "null");
  EXPECT_THAT(ParseMoeHfConfig(text), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("num_local_experts: missing")));
}

// Writes the fixture's model.safetensors into a fresh dir with `drop`
// removed and `add` added; returns the dir.
std::string RewrittenFixture(const std::string& family, const std::string& drop,
                             const std::map<std::string, at::Tensor>& add) {
  const std::string dir = ::megatrain::testing::MakeTempDir("moe_bad");
  auto writer = SafetensorsWriter::Create(dir + "/model.safetensors");
  EXPECT_THAT(writer, IsOk());
  for (const auto& [name, t] : ReadAll(FixtureDir(family) + "/model.safetensors")) {
    if (name == drop || add.count(name) != 0) continue;
    EXPECT_THAT(writer->AddFloat32(name, SafetensorsDtype::kF32, t.sizes().vec(),
                                   t.contiguous().data_ptr<float>()),
                IsOk());
  }
  for (const auto& [name, t] : add) {
    at::Tensor c = t.contiguous();
    if (c.scalar_type() == at::kByte) {
      EXPECT_THAT(writer->AddBytes(name, SafetensorsDtype::kU8, c.sizes().vec(),
                                   absl::Span<const uint8_t>(c.data_ptr<uint8_t>(), c.numel())),
                  IsOk());
    } else {
      EXPECT_THAT(
          writer->AddFloat32(name, SafetensorsDtype::kF32, c.sizes().vec(), c.data_ptr<float>()),
          IsOk());
    }
  }
  EXPECT_THAT(writer->Finish(), IsOk());
  return dir;
}

absl::Status LoadDir(const std::string& family, const std::string& dir) {
  auto config = LoadMoeHfConfigFile(FixtureDir(family) + "/config.json");
  if (!config.ok()) return config.status();
  auto model = SafetensorsModel::Open(dir);
  if (!model.ok()) return model.status();
  return LoadMoeHfParams(*config, *model).status();
}

TEST(MoeNamesTest, MissingExpertTensorIsNamed) {
  const std::string missing = "model.layers.1.block_sparse_moe.experts.2.w3.weight";
  EXPECT_THAT(LoadDir("mixtral", RewrittenFixture("mixtral", missing, {})),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'" + missing + "' missing")));
}

TEST(MoeNamesTest, WrongExpertShapeIsNamed) {
  const std::string name = "model.layers.0.mlp.experts.3.up_proj.weight";
  EXPECT_THAT(
      LoadDir("qwen2_moe", RewrittenFixture("qwen2_moe", "", {{name, at::zeros({24, 31})}})),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("'" + name + "': shape [24, 31], expected [24, 32]")));
  const std::string fused = "model.layers.2.mlp.experts.down_proj";
  EXPECT_THAT(
      LoadDir("gpt_oss", RewrittenFixture("gpt_oss", "", {{fused, at::zeros({4, 48, 31})}})),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("'" + fused + "': shape [4, 48, 31], expected [4, 48, 32]")));
}

TEST(MoeNamesTest, ExtraExpertIsRefused) {
  const std::string name = "model.layers.0.block_sparse_moe.experts.4.w1.weight";
  EXPECT_THAT(
      LoadDir("mixtral", RewrittenFixture("mixtral", "", {{name, at::zeros({48, 32})}})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'" + name + "' is not a parameter")));
}

// The E2M1 values by code, written out from the OCP MX spec table 5.3.3
// (independent of engine/formats/mxfp4.cc's table).
constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

TEST(Mxfp4Test, DecodesHandComputedTable) {
  std::vector<uint8_t> blocks(3 * 16), scales = {128, 0, 252};
  for (int i = 0; i < 16; ++i) blocks[i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  for (int i = 16; i < 32; ++i) blocks[i] = 0x71;  // low 1 (0.5), high 7 (6)
  for (int i = 32; i < 48; ++i) blocks[i] = 0xF7;  // low 7 (6), high 15 (-6)
  std::vector<float> out(96);
  ASSERT_THAT(DequantizeMxfp4("t", blocks, scales, absl::MakeSpan(out)), IsOk());
  // Block 0, scale 2^(128-127) = 2: element 2i = 2 * E2M1[i], 2i+1 = 2 * E2M1[15-i].
  const float block0[32] = {0,     -12, 1,  -8, 2,  -6, 3,  -4, 4,  -3, 6,  -2, 8,  -1, 12,  -0.0f,
                            -0.0f, 12,  -1, 8,  -2, 6,  -3, 4,  -4, 3,  -6, 2,  -8, 1,  -12, 0};
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(out[i], block0[i]) << i;
    EXPECT_EQ(std::signbit(out[i]), std::signbit(block0[i])) << i;
  }
  // Block 1, scale 2^-127: 0.5 * 2^-127 = 2^-128 (subnormal), 6 * 2^-127.
  for (int i = 32; i < 64; i += 2) {
    EXPECT_EQ(out[i], 0x1p-128f) << i;
    EXPECT_EQ(out[i + 1], 0x1.8p-125f) << i;
  }
  // Block 2, scale 2^125: +-6 * 2^125 = +-1.5 * 2^127 (FLT_MAX is just
  // under 2^128).
  for (int i = 64; i < 96; i += 2) {
    EXPECT_EQ(out[i], 0x1.8p+127f) << i;
    EXPECT_EQ(out[i + 1], -0x1.8p+127f) << i;
  }
}

TEST(Mxfp4Test, RefusesNanScaleAndOverflow) {
  std::vector<uint8_t> blocks(32), scales = {127, 255};
  std::vector<float> out(64);
  EXPECT_THAT(DequantizeMxfp4("w_scales", blocks, scales, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("w_scales: MXFP4 scale of block 1")));
  // 6 * 2^(254-127) = 1.5 * 2^129 is past FLT_MAX.
  std::vector<uint8_t> big(16, 0x07), big_scale = {254};
  std::vector<float> big_out(32);
  EXPECT_THAT(DequantizeMxfp4("w", big, big_scale, absl::MakeSpan(big_out)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("w: MXFP4 block 0 decodes beyond the fp32 range (scale 254)")));
}

// A GPT-OSS checkpoint whose layer-0 gate_up_proj is stored in MXFP4 as
// released ([E, 2Fe, C/32, 16] blocks): it loads, transposed to [E, C, 2Fe],
// equal element by element to the hand-computed table.
TEST(Mxfp4Test, LoadsGptOssExpertsFromMxfp4) {
  const int64_t e_count = 4, rows = 96, hidden = 32;
  at::Tensor blocks = at::empty({e_count, rows, 1, 16}, at::kByte);
  at::Tensor scales = at::empty({e_count, rows, 1}, at::kByte);
  for (int64_t e = 0; e < e_count; ++e) {
    for (int64_t r = 0; r < rows; ++r) {
      scales[e][r][0] = static_cast<uint8_t>(126 + (r + e) % 3);  // 2^-1, 2^0, 2^1
      for (int64_t i = 0; i < 16; ++i) {
        blocks[e][r][0][i] = static_cast<uint8_t>(((2 * i) % 16) | (((2 * i + 1) % 16) << 4));
      }
    }
  }
  const std::string name = "model.layers.0.mlp.experts.gate_up_proj";
  const std::string dir =
      RewrittenFixture("gpt_oss", name, {{name + "_blocks", blocks}, {name + "_scales", scales}});
  auto config = LoadMoeHfConfigFile(FixtureDir("gpt_oss") + "/config.json");
  ASSERT_THAT(config, IsOk());
  auto model = SafetensorsModel::Open(dir);
  ASSERT_THAT(model, IsOk());
  auto params = LoadMoeHfParams(*config, *model);
  ASSERT_THAT(params, IsOk());
  at::Tensor w = params->at(name);
  ASSERT_EQ(w.sizes().vec(), (std::vector<int64_t>{e_count, hidden, rows}));
  const float pow2[3] = {0.5f, 1.0f, 2.0f};
  auto a = w.accessor<float, 3>();
  for (int64_t e = 0; e < e_count; ++e) {
    for (int64_t c = 0; c < hidden; ++c) {
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(a[e][c][r], kE2m1[c % 16] * pow2[(r + e) % 3]) << e << " " << c << " " << r;
      }
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
