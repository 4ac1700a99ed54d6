// The device reduce-scatter on NCCL (Note [Device reduce-scatter] in
// engine/step/gradient_reducer.h), on two GPUs of one host; skipped with
// fewer than 2 CUDA devices or without NCCL in the build. Run:
//   build-gpu/tests/nccl_reduce_scatter_test
// (or `ctest --test-dir build-gpu -R nccl_reduce_scatter_test`).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <ATen/ATen.h>

#include <cstring>
#include <thread>
#include <vector>

#include "engine/dist/data_parallel.h"
#include "engine/dist/gradient_shard.h"
#include "engine/dist/process_group.h"
#include "tests/testing/parity.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_state.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::AllState;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeBatches;
using ::megatrain::testing::SmallLlama;

#define MEGATRAIN_SKIP_WITHOUT_TWO_GPUS()                                 \
  if (torch::cuda::device_count() < 2 || !HasCollectiveBackend("cuda:0")) \
  GTEST_SKIP() << "needs 2 CUDA devices and NCCL (" << torch::cuda::device_count() << " devices)"

// c10d's _reduce_scatter_base on NCCL, a block of 11 (2 does not divide
// it: padded to 12): each GPU's shard holds the scaled sum, exactly.
TEST(NcclReduceScatterTest, EachGpuHoldsItsShardOfTheSum) {
  MEGATRAIN_SKIP_WITHOUT_TWO_GPUS();
  constexpr int kWorld = 2;
  constexpr int64_t kNumel = 11;
  auto store = RendezvousStore::CreateInProcess();
  std::vector<at::Tensor> data(kWorld);
  std::vector<absl::Status> status(kWorld);
  std::vector<bool> has_rs(kWorld, false);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    data[r] = (at::arange(kNumel, at::kFloat) + 100 * r).to(at::Device(at::kCUDA, r));
    threads.emplace_back([&, r] {
      auto group = CollectiveGroup::Create(store, r, kWorld, "cuda:" + std::to_string(r),
                                           std::chrono::seconds(60));
      if (!group.ok()) {
        status[r] = group.status();
        return;
      }
      has_rs[r] = (*group)->has_reduce_scatter();
      status[r] = (*group)->ReduceScatterSum(data[r].data_ptr<float>(), kNumel, 0.5f);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_THAT(status[r], IsOk());
    EXPECT_TRUE(has_rs[r]);
    const at::Tensor host = data[r].cpu();
    const ShardRange shard = ShardOf(kNumel, r, kWorld);
    for (int64_t i = shard.begin; i < shard.end; ++i) {
      EXPECT_EQ(host[i].item<float>(), 0.5f * (100 + 2 * i)) << "rank " << r << " element " << i;
    }
  }
}

// Two GPUs, one micro-batch each, fp32, no clipping: kAuto picks the device
// reduce-scatter on NCCL; its weights and moments are bit-identical to the
// host all-reduce's (2 ranks: the same two fp32 addends), and GPU 0's D2H
// bytes are smaller by exactly the other half of every dense block.
TEST(NcclReduceScatterTest, DevicePathMatchesTheHostPathWithHalfTheD2HBytes) {
  MEGATRAIN_SKIP_WITHOUT_TWO_GPUS();
  const ModelConfig config = SmallLlama();
  TrainerOptions o;
  o.micro_batch = 2;
  o.seq_len = 8;
  o.adamw.lr = 1e-3;
  o.max_grad_norm = 0;
  o.gradient_accumulation_steps = 2;
  // Every block streamed, so that every dense block lands (auto would keep
  // this small model resident).
  o.resident_layers = 0;
  o.resident_embedding = 0;
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < 3; ++s) steps.push_back(MakeBatches(2, 2, 8, config.vocab_size, 300 + s));
  std::vector<std::vector<float>> state(2);
  std::vector<int64_t> d2h(2, 0);
  for (int path = 0; path < 2; ++path) {
    DataParallelOptions dp;
    dp.devices = DataParallelDevices("cuda", 2);
    dp.timeout = std::chrono::seconds(120);
    dp.gradient_reduction =
        path == 0 ? GradientReduction::kHostAllReduce : GradientReduction::kAuto;
    auto t = DataParallelTrainer::Create(config, o, /*seed=*/5, dp);
    ASSERT_THAT(t, IsOk());
    EXPECT_EQ((*t)->backend_name(), "nccl");
    EXPECT_EQ((*t)->gradient_reduction(), path == 0 ? GradientReduction::kHostAllReduce
                                                    : GradientReduction::kDeviceReduceScatter);
    for (const auto& batch : steps) {
      auto r = (*t)->Step(batch);
      ASSERT_THAT(r, IsOk());
      d2h[path] = r->stats.d2h_bytes;
    }
    ASSERT_THAT((*t)->WaitForOptimizer(), IsOk());
    state[path] = AllState((*t)->store());
  }
  ASSERT_EQ(state[0].size(), state[1].size());
  EXPECT_EQ(std::memcmp(state[0].data(), state[1].data(), state[0].size() * sizeof(float)), 0);
  auto store = HostStore::Create(config, {});
  ASSERT_THAT(store, IsOk());
  int64_t saved = 0;
  for (int64_t b = 0; b < (*store)->num_blocks(); ++b) {
    if (b == (*store)->layout().embedding_block()) continue;
    const int64_t numel = (*store)->block_numel(b);
    saved += 4 * (numel - ShardOf(numel, 0, 2).size());
  }
  EXPECT_EQ(d2h[0] - d2h[1], saved);
}

// Note [Resident blocks on every rank] (engine/step/gradient_reducer.h) on
// two GPUs: every layer and the embedding resident (auto, clipping at 1.0),
// their gradients summed over NVLink, AdamW on each GPU. The two GPUs end
// within the reduction order's tolerance of one GPU accumulating the same
// global batch (fp32: 1e-5, as DataParallelParityTest's resident case), and
// their replicas agree bit for bit (each evaluates with its own copy).
TEST(NcclReduceScatterTest, ResidentBlocksOnTwoGpusMatchOneGpu) {
  MEGATRAIN_SKIP_WITHOUT_TWO_GPUS();
  const ModelConfig config = SmallLlama();
  TrainerOptions o;
  o.device = "cuda:0";
  o.micro_batch = 2;
  o.seq_len = 8;
  o.adamw.lr = 1e-3;
  o.max_grad_norm = 1.0;
  o.gradient_accumulation_steps = 4;
  std::vector<std::vector<MicroBatch>> steps;
  for (int s = 0; s < 3; ++s) steps.push_back(MakeBatches(4, 2, 8, config.vocab_size, 500 + s));
  auto single = Trainer::Create(config, o, /*seed=*/5);
  ASSERT_THAT(single, IsOk());
  ASSERT_GT((*single)->resident_layers(), 0);
  for (const auto& batch : steps) ASSERT_THAT((*single)->Step(batch), IsOk());
  ASSERT_THAT((*single)->WaitForOptimizer(), IsOk());
  const std::vector<float> one = AllState((*single)->store());

  DataParallelOptions dp;
  dp.devices = DataParallelDevices("cuda", 2);
  dp.timeout = std::chrono::seconds(120);
  auto t = DataParallelTrainer::Create(config, o, /*seed=*/5, dp);
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ((*t)->rank(1).resident_layers(), (*single)->resident_layers());
  for (const auto& batch : steps) ASSERT_THAT((*t)->Step(batch), IsOk());
  ASSERT_THAT((*t)->WaitForOptimizer(), IsOk());
  const auto probe = MakeBatches(1, 2, 8, config.vocab_size, 77);
  auto loss0 = (*t)->rank(0).Evaluate(probe);
  auto loss1 = (*t)->rank(1).Evaluate(probe);
  ASSERT_THAT(loss0, IsOk());
  ASSERT_THAT(loss1, IsOk());
  EXPECT_EQ(*loss0, *loss1);
  const std::vector<float> two = AllState((*t)->store());
  EXPECT_LE(::megatrain::testing::RelativeError(two, one), 1e-5);
}

}  // namespace
}  // namespace megatrain::engine
