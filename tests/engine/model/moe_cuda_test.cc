// The MoE MLP on the GPU in bf16 (the at::_grouped_mm path of
// compat::GroupedMm on torch >= 2.9) against the monolithic fp32 CPU
// reference. Skipped without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "engine/formats/hf_moe_names.h"
#include "engine/model/moe_config.h"
#include "engine/model/moe_layers.h"
#include "engine/formats/safetensors.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/reference_moe.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::RelativeError;

// bf16 experts against fp32: the project's bf16 bar (2e-2 norm-relative).
// Routers stay fp32 on both sides, so both pick the same experts.
constexpr double kBf16Tolerance = 2e-2;

class MoeCudaTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeCudaTest, Bf16ExpertsMatchFp32Reference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = std::string(MEGATRAIN_TESTDATA_DIR) + "/hf/" + GetParam();
  auto config = LoadMoeHfConfigFile(dir + "/config.json");
  ASSERT_THAT(config, IsOk());
  auto model = SafetensorsModel::Open(dir);
  ASSERT_THAT(model, IsOk());
  auto params = LoadMoeHfParams(*config, *model);
  ASSERT_THAT(params, IsOk());
  const MoeConfig& m = config->moe;
  BlockLayout block = MoeDecoderLayerBlock(*config, 0);
  std::vector<at::Tensor> cpu_leaves, gpu_leaves;
  for (const ParamSpec& spec : block.params) {
    at::Tensor t = params->at(spec.hf_name).requires_grad_(true);
    cpu_leaves.push_back(t);
    const bool fp32 =
        spec.local_name.find("router") != std::string::npos || spec.local_name == "mlp.gate.weight";
    gpu_leaves.push_back(
        t.detach().to(at::kCUDA, fp32 ? at::kFloat : at::kBFloat16).requires_grad_(true));
  }
  MoeDecoderLayerWeights w = MoeDecoderLayerWeightsFromParams(block, gpu_leaves);
  at::manual_seed(11);
  at::Tensor x = at::randn({64, config->base.hidden_size});
  at::Tensor out = MoeMlpForward(m, w.moe, x.to(at::kCUDA), at::Tensor(), at::kBFloat16, nullptr);
  at::Tensor logits;
  at::Tensor ref = ::megatrain::testing::ReferenceMoeMlp(m, *params, "model.layers.0.", x, &logits);
  EXPECT_LT(RelativeError(out.detach().cpu(), ref.detach()), kBf16Tolerance);
  const ParamSpec* gate_up = block.Find("mlp.experts.gate_up_proj");
  ASSERT_NE(gate_up, nullptr);
  const size_t i = static_cast<size_t>(gate_up - block.params.data());
  at::Tensor probe = at::randn(ref.sizes());
  auto g_gpu = torch::autograd::grad({(out * probe.to(at::kCUDA)).sum()}, {gpu_leaves[i]});
  auto g_cpu = torch::autograd::grad({(ref * probe).sum()}, {cpu_leaves[i]});
  EXPECT_LT(RelativeError(g_gpu[0].to(at::kCPU, at::kFloat), g_cpu[0]), kBf16Tolerance);
}

INSTANTIATE_TEST_SUITE_P(Families, MoeCudaTest,
                         ::testing::Values("mixtral", "qwen2_moe", "gpt_oss"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace megatrain::engine
