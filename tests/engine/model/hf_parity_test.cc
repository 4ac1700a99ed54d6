// The streaming engine against transformers itself: for each family's tiny
// model in tests/testdata/hf/<family>/ (written by transformers'
// save_pretrained, with transformers' own fp32 logits, loss and parameter
// gradients in reference.safetensors; tests/testdata/make_hf_fixtures.py),
// load config.json and model.safetensors through the engine's HF loader,
// run the streaming executor on the CPU in fp32 and compare logits, loss
// and every gradient. Llama is the control: a family that already passed
// the engine's own reference checks.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/device_runtime.h"
#include "engine/step/executor.h"
#include "engine/formats/hf_model.h"
#include "engine/store/host_store.h"
#include "engine/formats/safetensors.h"
#include "engine/runtime/thread_pool.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;

std::string FixtureDir(const std::string& family) {
  return std::string(MEGATRAIN_TESTDATA_DIR) + "/hf/" + family;
}

// reference.safetensors as tensors by name (F32 and I64 only).
std::map<std::string, at::Tensor> ReadReference(const std::string& dir) {
  std::map<std::string, at::Tensor> out;
  auto file = SafetensorsFile::Open(dir + "/reference.safetensors");
  EXPECT_THAT(file, IsOk());
  if (!file.ok()) return out;
  for (const SafetensorsTensorInfo& info : file->tensors()) {
    const at::ScalarType type = info.dtype == SafetensorsDtype::kI64 ? at::kLong : at::kFloat;
    absl::Span<const uint8_t> bytes = file->Data(info);
    out[info.name] = at::from_blob(const_cast<uint8_t*>(bytes.data()), info.shape, type).clone();
  }
  return out;
}

// ||a - b|| / ||b|| in double.
double RelativeError(const at::Tensor& a, const at::Tensor& b) {
  const double diff = (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>();
  return diff / std::max(b.to(at::kDouble).norm().item<double>(), 1e-30);
}

class HfParityTest : public ::testing::TestWithParam<std::string> {};

// Tolerances: both sides compute in fp32 and differ only in summation order
// (chunked logits, SDPA vs eager attention, fused vs separate projections
// are the same products), so logits, loss and gradients agree to about
// 1e-6 norm-relative; 1e-5 leaves room for the accumulation order of the
// 48-token batch. Each gradient is compared as a whole tensor (norm-
// relative): an elementwise relative error is meaningless near zero.
constexpr double kTolerance = 1e-5;

TEST_P(HfParityTest, LogitsLossAndEveryGradientMatchTransformers) {
  const std::string dir = FixtureDir(GetParam());
  auto config = LoadHfConfig(dir);
  ASSERT_THAT(config, IsOk());
  std::map<std::string, at::Tensor> ref = ReadReference(dir);
  ASSERT_TRUE(ref.count("input_ids") && ref.count("labels") && ref.count("logits"));
  const int64_t b = ref["input_ids"].size(0), t = ref["input_ids"].size(1);

  HostStoreOptions store_options;
  auto store = HostStore::Create(*config, store_options);
  ASSERT_THAT(store, IsOk());
  ASSERT_THAT(LoadHfWeights(dir, store->get()), IsOk());
  auto runtime = DeviceRuntime::Create("cpu");
  ASSERT_THAT(runtime, IsOk());
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(2);
  ExecutorOptions options;
  options.compute_dtype = ComputeDtype::kFp32;
  options.micro_batch = b;
  options.seq_len = t;
  options.loss_chunk_tokens = 7;  // several chunks, one of them partial
  auto executor = StreamingExecutor::Create(store->get(), runtime->get(), pool.get(), options);
  ASSERT_THAT(executor, IsOk());

  // HF shifts labels inside the loss (logits[:, :-1] against labels[:, 1:]);
  // the engine takes them already shifted, the last position ignored.
  MicroBatch mb;
  at::Tensor ids = ref["input_ids"], labels = ref["labels"];
  for (int64_t row = 0; row < b; ++row) {
    for (int64_t pos = 0; pos < t; ++pos) {
      mb.input_ids.push_back(static_cast<int32_t>(ids[row][pos].item<int64_t>()));
      mb.labels.push_back(pos + 1 < t ? static_cast<int32_t>(labels[row][pos + 1].item<int64_t>())
                                      : kIgnoreLabel);
    }
  }

  auto logits = (*executor)->Logits(mb);
  ASSERT_THAT(logits, IsOk());
  at::Tensor ours = at::from_blob(logits->data(), ref["logits"].sizes(), at::kFloat);
  EXPECT_LT(RelativeError(ours, ref["logits"]), kTolerance);

  auto result = (*executor)->ForwardBackward(absl::MakeConstSpan(&mb, 1));
  ASSERT_THAT(result, IsOk());
  const double ref_loss = ref["loss"].item<double>();
  EXPECT_LT(std::abs(result->loss() - ref_loss) / std::abs(ref_loss), kTolerance)
      << "engine " << result->loss() << ", transformers " << ref_loss;

  const ModelLayout& layout = (*store)->layout();
  int64_t compared = 0;
  for (size_t blk = 0; blk < layout.blocks.size(); ++blk) {
    const float* grad = (*store)->grad(static_cast<int64_t>(blk));
    for (const ParamSpec& p : layout.blocks[blk].params) {
      auto it = ref.find("grad." + p.hf_name);
      EXPECT_NE(it, ref.end()) << "transformers has no gradient for " << p.hf_name;
      if (it == ref.end()) continue;
      at::Tensor g = at::from_blob(const_cast<float*>(grad + p.offset), p.shape, at::kFloat);
      EXPECT_LT(RelativeError(g, it->second), kTolerance) << p.hf_name;
      ++compared;
    }
  }
  // Every transformers parameter is one of ours (nothing left unchecked).
  int64_t ref_grads = 0;
  for (const auto& [name, tensor] : ref) ref_grads += name.rfind("grad.", 0) == 0 ? 1 : 0;
  EXPECT_EQ(compared, ref_grads);
}

INSTANTIATE_TEST_SUITE_P(Families, HfParityTest,
                         ::testing::Values("llama", "gemma2", "gemma3_text", "phi3",
                                           "phi3_longrope"));

}  // namespace
}  // namespace megatrain::engine
