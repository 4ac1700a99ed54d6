// Parts of the executor (engine/step/) on their own, on the CPU runtime:
// contribution counting, device accumulation's arithmetic, and the weight
// slots' loads.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/runtime/device_runtime.h"
#include "engine/store/host_store.h"
#include "engine/step/device_grad_accumulator.h"
#include "engine/step/grad_lander.h"
#include "engine/step/step_env.h"
#include "engine/step/weight_slots.h"
#include "engine/runtime/thread_pool.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;

TEST(GradContributionsTest, MarksFirstAndLastContributionPerBlock) {
  GradContributions c;
  c.Begin({2, 1});
  EXPECT_FALSE(c.seen(0));
  const GradContributions::Mark a = c.Count(0);
  EXPECT_TRUE(a.first);
  EXPECT_FALSE(a.final);
  EXPECT_TRUE(c.seen(0));
  const GradContributions::Mark b = c.Count(0);
  EXPECT_FALSE(b.first);
  EXPECT_TRUE(b.final);
  const GradContributions::Mark only = c.Count(1);
  EXPECT_TRUE(only.first && only.final);
}

TEST(AccumulateIntoTest, CopiesTheFirstContributionThenAddsInFp32) {
  const ModelLayout layout = ModelLayout::Create(testing::SmallLlama());
  const BlockLayout& head = layout.blocks[layout.head_block()];
  at::Tensor dst = at::zeros({head.numel}, at::kFloat);
  std::vector<at::Tensor> one, two;
  for (const ParamSpec& p : head.params) {
    one.push_back(at::full(p.shape, 1.5, at::kFloat));
    two.push_back(at::full(p.shape, 0.25, at::kBFloat16));  // added as fp32
  }
  AccumulateInto(head, dst, one, /*first=*/true);
  AccumulateInto(head, dst, two, /*first=*/false);
  for (const ParamSpec& p : head.params) {
    const at::Tensor v = dst.narrow(0, p.offset, p.numel);
    EXPECT_TRUE(at::equal(v, at::full({p.numel}, 1.75, at::kFloat))) << p.local_name;
  }
}

TEST(WeightSlotsTest, LoadsEachUseOnceAndReusesABlockStillInItsSlot) {
  const ModelConfig config = testing::SmallLlama();
  auto store = HostStore::Create(config, {});
  ASSERT_THAT(store, IsOk());
  (*store)->InitializeWeights(1);
  auto runtime = DeviceRuntime::Create("cpu");
  ASSERT_THAT(runtime, IsOk());
  auto pool = ThreadPool::Create(1);
  StepEnv env(store->get(), runtime->get(), pool.get(), ComputeDtype::kFp32);
  std::vector<int64_t> gated;
  env.weight_gate = [&gated](int64_t block) { gated.push_back(block); };
  const ModelLayout& layout = (*store)->layout();
  int64_t max_numel = 0;
  for (const BlockLayout& b : layout.blocks) max_numel = std::max(max_numel, b.numel);
  WeightSlots slots(&env, 3, max_numel, /*cast_chunk_elements=*/0);
  EXPECT_EQ(slots.device_bytes(), 3 * 4 * max_numel);
  env.BeginPass();
  // Layers 2, then head, then layer 2 again: the second use reuses the load.
  const int64_t l2 = layout.layer_block(2), head = layout.head_block();
  slots.BeginPass({l2, head, l2});
  for (int use = 0; use < 3; ++use) {
    const at::Tensor w = slots.Acquire(use);
    const int64_t block = use == 1 ? head : l2;
    ASSERT_EQ(w.numel(), layout.blocks[block].numel);
    EXPECT_EQ(std::memcmp(w.data_ptr(), (*store)->master(block), w.numel() * 4), 0);
    slots.Release(use);
  }
  EXPECT_THAT(gated, ::testing::ElementsAre(l2, head));  // the gate guards every load
  EXPECT_EQ(env.h2d_bytes, (*store)->streaming_bytes(l2) + (*store)->streaming_bytes(head));
}

}  // namespace
}  // namespace megatrain::engine
