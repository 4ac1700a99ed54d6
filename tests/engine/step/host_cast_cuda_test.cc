// The host cast of streamed weights (engine/step/host_cast.h, Note [Host
// cast]) on a CUDA device, where the worker's casts, the copies on kH2D and
// the ring's reuse really run concurrently: every slot a pass acquires
// holds, bit for bit, the bf16 copy of its block's master as the block's
// gate left it, over passes whose gates rewrite the masters (the previous
// step's AdamW) and chunks small enough for the ring to wrap many times
// within a pass. A buffer rewritten before its copy completed, or a cast
// that ran before its gate, shows as a mismatch.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "engine/runtime/device_runtime.h"
#include "engine/runtime/host_buffer.h"
#include "engine/runtime/thread_pool.h"
#include "engine/step/host_cast.h"
#include "engine/step/step_env.h"
#include "engine/step/weight_slots.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;

TEST(HostCastCudaTest, SlotsHoldTheBf16CopyOfEachGatedMasterWhileTheRingWraps) {
  if (!HostPinningAvailable()) GTEST_SKIP() << "no CUDA device";
  const ModelConfig config = testing::SmallLlama();
  // The store's bf16 copy is the reference: the gate below refreshes it
  // with the master it rewrites (FloatToBf16, as AdamW's bf16 output).
  HostStoreOptions store_options;
  store_options.streaming_bf16 = true;
  store_options.pin = true;
  auto store = HostStore::Create(config, store_options);
  ASSERT_THAT(store, IsOk());
  (*store)->InitializeWeights(5);
  auto runtime = DeviceRuntime::Create("cuda");
  ASSERT_THAT(runtime, IsOk());
  auto pool = ThreadPool::Create(4);
  StepEnv env(store->get(), runtime->get(), pool.get(), ComputeDtype::kBf16);
  // The gate "updates" each block once per pass (the slots and the
  // stager's worker both call it; whichever comes first does the work).
  std::mutex mu;
  std::set<int64_t> updated;  // guarded by mu
  int gate_pass = 0;          // guarded by mu
  env.weight_gate = [&](int64_t block) {
    std::lock_guard<std::mutex> lock(mu);
    if (!updated.insert(block).second) return;
    float* master = (*store)->master(block);
    for (int64_t i = 0; i < (*store)->block_numel(block); ++i) {
      master[i] = master[i] * 0.75f + 1e-3f * static_cast<float>(gate_pass + 1);
    }
    (*store)->RefreshStreamingCopy(block);
  };
  const ModelLayout& layout = (*store)->layout();
  int64_t max_numel = 0;
  std::vector<int64_t> uses;  // forward, head, backward: as a training pass
  for (int64_t l = 0; l < layout.num_layers(); ++l) uses.push_back(layout.layer_block(l));
  uses.push_back(layout.head_block());
  for (int64_t l = layout.num_layers() - 1; l >= 0; --l) uses.push_back(layout.layer_block(l));
  for (const int64_t block : uses) max_numel = std::max(max_numel, layout.blocks[block].numel);
  auto stager = HostCastStager::Create(&env, max_numel, /*chunk_elements=*/1000);
  ASSERT_THAT(stager, IsOk());
  WeightSlots slots(&env, 3, max_numel, /*cast_chunk_elements=*/0, std::move(*stager));
  for (int pass = 0; pass < 4; ++pass) {
    {
      std::lock_guard<std::mutex> lock(mu);  // the last pass's gates are done
      updated.clear();
      gate_pass = pass;
    }
    env.BeginPass();
    slots.BeginPass(uses);
    for (int use = 0; use < static_cast<int>(uses.size()); ++use) {
      const at::Tensor w = slots.Acquire(use);
      at::Tensor host;
      {
        auto scope = env.runtime->Use(StreamKind::kCompute);
        host = w.to(at::kCPU);  // after weights_ready, on the compute stream
      }
      slots.Release(use);
      const int64_t block = uses[use];
      ASSERT_EQ(host.numel(), layout.blocks[block].numel);
      EXPECT_EQ(std::memcmp(host.data_ptr(), (*store)->streaming_bf16(block), host.numel() * 2), 0)
          << "pass " << pass << " use " << use << " block " << block;
    }
    env.runtime->Synchronize();
  }
}

}  // namespace
}  // namespace megatrain::engine
