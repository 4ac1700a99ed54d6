// LayerGraphs (Note [Layer graphs] in engine/step/layer_graphs.h) on the
// CPU runtime, whose graphs re-run the captured body: the first use of a
// key runs eagerly on the caller's tensors, later ones on the static
// inputs the caller's values are copied into; kept outputs are clones;
// keys separate weights, variants and shapes; the graph cap holds. Then
// the executor with graphs on against graphs off: bit for bit the same
// loss and gradients, in both schedules, with resident layers,
// accumulation and activation offload, and graphs actually replayed.
#include "engine/step/layer_graphs.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/runtime/device_runtime.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;

struct Recorder {
  int calls = 0;
  std::vector<const void*> input_addresses;
  // y = x * 2 + 1; z = x.sum()
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& in) {
    ++calls;
    input_addresses.push_back(in[0].data_ptr());
    return {in[0] * 2 + 1, in[0].sum()};
  }
};

std::unique_ptr<DeviceRuntime> Cpu() {
  auto runtime = DeviceRuntime::Create("cpu");
  EXPECT_THAT(runtime, IsOk());
  return std::move(*runtime);
}

TEST(LayerGraphsTest, WarmsUpThenCapturesThenReplaysWithTheCallersValues) {
  std::unique_ptr<DeviceRuntime> runtime = Cpu();
  LayerGraphs graphs(runtime.get(), /*enabled=*/true, /*max_graphs=*/8);
  Recorder rec;
  const int weights = 0;
  std::vector<at::Tensor> xs;
  for (int i = 0; i < 4; ++i) xs.push_back(at::full({2, 3}, static_cast<float>(i)));
  std::vector<at::Tensor> first_outputs;
  for (int i = 0; i < 4; ++i) {
    std::vector<at::Tensor> out =
        graphs.Run(LayerWork::kForward, &weights, 0, {xs[i]},
                   /*kept_last=*/1, [&](const auto& in) { return rec(in); });
    ASSERT_EQ(out.size(), 2u);
    EXPECT_TRUE(at::equal(out[0], xs[i] * 2 + 1)) << "use " << i;
    EXPECT_EQ(out[1].item<float>(), 6.0f * i) << "use " << i;
    if (i == 2) first_outputs = out;
  }
  // Use 0 eagerly on the caller's tensor; uses 1-3 on one static input.
  ASSERT_EQ(rec.calls, 4);
  EXPECT_EQ(rec.input_addresses[0], xs[0].data_ptr());
  EXPECT_NE(rec.input_addresses[1], xs[1].data_ptr());
  EXPECT_EQ(rec.input_addresses[2], rec.input_addresses[1]);
  EXPECT_EQ(rec.input_addresses[3], rec.input_addresses[1]);
  EXPECT_EQ(graphs.graphs(), 1);
  EXPECT_EQ(graphs.replays(), 3);
  // The kept output (the last) is the caller's: later replays leave it.
  EXPECT_EQ(first_outputs[1].item<float>(), 12.0f);
}

TEST(LayerGraphsTest, KeysSeparateWorkWeightsVariantsAndShapes) {
  std::unique_ptr<DeviceRuntime> runtime = Cpu();
  LayerGraphs graphs(runtime.get(), /*enabled=*/true, /*max_graphs=*/64);
  const int w0 = 0, w1 = 0;
  const at::Tensor x = at::ones({2, 3}), wide = at::ones({2, 4});
  auto body = [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{in[0] + 1}; };
  for (int round = 0; round < 2; ++round) {
    graphs.Run(LayerWork::kForward, &w0, 0, {x}, 1, body);
    graphs.Run(LayerWork::kRecomputeBackward, &w0, 0, {x}, 1, body);
    graphs.Run(LayerWork::kForward, &w1, 0, {x}, 1, body);
    graphs.Run(LayerWork::kForward, &w0, 1, {x}, 1, body);
    graphs.Run(LayerWork::kForward, &w0, 0, {wide}, 1, body);
    graphs.Run(LayerWork::kForward, &w0, 0, {x.to(at::kDouble)}, 1, body);
  }
  EXPECT_EQ(graphs.graphs(), 6);  // each key warmed up in round 0, captured in round 1
  EXPECT_EQ(graphs.replays(), 6);
}

TEST(LayerGraphsTest, KeysBeyondTheCapAndDisabledGraphsRunEagerly) {
  std::unique_ptr<DeviceRuntime> runtime = Cpu();
  const int weights[3] = {0, 0, 0};
  Recorder rec;
  LayerGraphs capped(runtime.get(), /*enabled=*/true, /*max_graphs=*/2);
  const at::Tensor x = at::ones({2});
  for (int round = 0; round < 3; ++round) {
    for (const int& w : weights) {
      const auto out =
          capped.Run(LayerWork::kForward, &w, 0, {x}, 1, [&](const auto& in) { return rec(in); });
      EXPECT_TRUE(at::equal(out[0], x * 2 + 1));
    }
  }
  EXPECT_EQ(capped.graphs(), 2);
  EXPECT_EQ(capped.replays(), 4);
  LayerGraphs off(runtime.get(), /*enabled=*/false, /*max_graphs=*/8);
  for (int i = 0; i < 3; ++i) {
    off.Run(LayerWork::kForward, &weights[0], 0, {x}, 1, [&](const auto& in) { return rec(in); });
  }
  EXPECT_EQ(off.graphs(), 0);
  EXPECT_EQ(off.replays(), 0);
  EXPECT_FALSE(off.enabled());
}

TEST(LayerGraphsTest, CountsAPairPerWeightsAddressAndVariant) {
  ModelConfig config = ::megatrain::testing::SmallLlama();
  EXPECT_EQ(LayerGraphCount(config, 3, 1), 2 * (3 + 1));
  // Alternating sliding and full attention: each slot sees both.
  config.layer_types = {};
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    config.layer_types.push_back(l % 2 == 0 ? LayerType::kSlidingAttention
                                            : LayerType::kFullAttention);
  }
  config.sliding_window = 4;
  EXPECT_NE(LayerGraphVariant(config, 0), LayerGraphVariant(config, 1));
  EXPECT_EQ(LayerGraphCount(config, 3, 1), 2 * (3 * 2 + 1));
  const int64_t tokens = 2 * 12;
  EXPECT_GT(LayerGraphBytes(config, 3, 1, tokens, 4, 1000),
            LayerGraphBytes(config, 3, 0, tokens, 4, 1000));
}

// The executor with graphs against without: the CPU runtime's "replay"
// re-runs the same ops on the static inputs, so any wrong key, stale
// input, overwritten output or lost clone shows as a difference.
TEST(LayerGraphsTest, ExecutorIsBitIdenticalWithGraphs) {
  struct Case {
    int micro_batches;
    StepSchedule schedule;
    int wave;
    bool offload;
    int resident_layers;
    bool device_grad_accumulation;
  };
  constexpr StepSchedule kMbm = StepSchedule::kMicroBatchMajor, kLm = StepSchedule::kLayerMajor;
  const std::vector<Case> cases = {
      {3, kMbm, 1, false, 0, false}, {3, kMbm, 1, true, 1, true},  {4, kLm, 4, false, 0, false},
      {4, kLm, 2, true, 1, true},    {3, kLm, 3, false, 2, false},
  };
  for (const ::megatrain::testing::Variant& variant : ::megatrain::testing::Variants()) {
    // Keys repeat within one pass where a layer keeps its weight slot
    // (layer-major, resident layers); in micro-batch-major order the
    // slots rotate, so a key may first repeat in a later step.
    int64_t replays = 0;
    for (const Case& c : cases) {
      for (const ComputeDtype dtype : {ComputeDtype::kFp32, ComputeDtype::kBf16}) {
        SCOPED_TRACE(absl::StrCat(variant.name, " micro-batches ", c.micro_batches, " schedule ",
                                  StepScheduleName(c.schedule), " wave ", c.wave, " offload ",
                                  c.offload, " resident ", c.resident_layers, " bf16 ",
                                  dtype == ComputeDtype::kBf16));
        auto run = [&](bool graphs) {
          return ::megatrain::testing::RunGradients(
              variant.config, "cpu", dtype, 0.2, c.micro_batches, 2, 12, c.offload,
              c.resident_layers, false, c.device_grad_accumulation, c.schedule, c.wave, graphs);
        };
        const ::megatrain::testing::GradientRun eager = run(false);
        const ::megatrain::testing::GradientRun graphed = run(true);
        ASSERT_FALSE(eager.grads.empty());
        ASSERT_EQ(eager.grads.size(), graphed.grads.size());
        EXPECT_EQ(eager.loss, graphed.loss);
        EXPECT_EQ(std::memcmp(eager.grads.data(), graphed.grads.data(), eager.grads.size() * 4), 0);
        EXPECT_EQ(eager.stats.cuda_graph_replays, 0);
        if (c.schedule == kLm && c.wave > 2) EXPECT_GT(graphed.stats.cuda_graph_replays, 0);
        replays += graphed.stats.cuda_graph_replays;
      }
    }
    EXPECT_GT(replays, 10) << variant.name;
  }
}

}  // namespace
}  // namespace megatrain::engine
