// The host cast of streamed weights (engine/step/host_cast.h, Note [Host
// cast]) on the CPU runtime: the ring's size, the order of a block's gate
// and its cast, walks that are dropped, and the weight slots' loads through
// it. Every comparison is bit for bit: the cast is FloatToBf16.
#include "engine/step/host_cast.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/runtime/bf16.h"
#include "engine/runtime/device_runtime.h"
#include "engine/runtime/thread_pool.h"
#include "engine/step/step_env.h"
#include "engine/step/weight_slots.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;

// What a load of elements [begin, end) of `block` must hold.
std::vector<bf16_bits> Expected(const HostStore& store, int64_t block, int64_t begin, int64_t end) {
  std::vector<bf16_bits> out;
  for (int64_t i = begin; i < end; ++i) out.push_back(FloatToBf16(store.master(block)[i]));
  return out;
}

// A store, the CPU runtime and a pool: what a stager's StepEnv needs.
struct Fixture {
  Fixture() {
    auto s = HostStore::Create(testing::SmallLlama(), {});
    EXPECT_THAT(s, IsOk());
    store = std::move(*s);
    store->InitializeWeights(9);
    auto r = DeviceRuntime::Create("cpu");
    EXPECT_THAT(r, IsOk());
    runtime = std::move(*r);
    pool = ThreadPool::Create(2);
    env = std::make_unique<StepEnv>(store.get(), runtime.get(), pool.get(), ComputeDtype::kBf16);
  }
  int64_t numel(int64_t block) const { return store->block_numel(block); }

  std::unique_ptr<HostStore> store;
  std::unique_ptr<DeviceRuntime> runtime;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<StepEnv> env;
};

TEST(HostCastRingTest, HoldsOneLargestBlockAndAChunk) {
  const HostCastRing ring = HostCastRingOf(1000, 100);
  EXPECT_EQ(ring.chunk_numel, 100);
  EXPECT_EQ(ring.stride_numel, 128);  // 128-byte aligned buffers
  EXPECT_EQ(ring.num_buffers, 11);
  EXPECT_EQ(ring.pinned_bytes(), 11 * 128 * 2);
  const HostCastRing small = HostCastRingOf(50);  // blocks below one chunk
  EXPECT_EQ(small.chunk_numel, 50);
  EXPECT_EQ(small.num_buffers, 2);
  EXPECT_EQ(HostCastRingOf(0).pinned_bytes(), 0);
  // llama-8b's untied head (128256 x 4096): 126 chunks of 4 Mi, plus one.
  EXPECT_EQ(HostCastRingOf(int64_t{128256} * 4096).pinned_bytes(),
            127 * kHostCastChunkElements * 2);
}

// Note [Host cast]: a block's gate (the previous step's AdamW of it)
// returns before any of its chunks is cast. The gate here finishes the
// "update" itself: it rewrites the block's master before returning, so a
// cast that ran before it would copy the old values.
TEST(HostCastStagerTest, CastsABlockOnlyAfterItsGateReturns) {
  Fixture f;
  const ModelLayout& layout = f.store->layout();
  const int64_t l1 = layout.layer_block(1), head = layout.head_block();
  std::vector<int64_t> gated;
  f.env->weight_gate = [&](int64_t block) {
    gated.push_back(block);
    float* master = f.store->master(block);
    for (int64_t i = 0; i < f.numel(block); ++i) master[i] = 0.5f * master[i] + 1e-3f;
  };
  auto stager = HostCastStager::Create(f.env.get(), f.numel(head), /*chunk_elements=*/300);
  ASSERT_THAT(stager, IsOk());
  (*stager)->BeginPass({{l1, 0, f.numel(l1)}, {head, 0, f.numel(head)}});
  for (const int64_t block : {l1, head}) {
    std::vector<bf16_bits> loaded(f.numel(block));
    EXPECT_EQ((*stager)->CopyRange(block, 0, f.numel(block), loaded.data()), 2 * f.numel(block));
    EXPECT_EQ(loaded, Expected(*f.store, block, 0, f.numel(block))) << block;
  }
  EXPECT_THAT(gated, ::testing::ElementsAre(l1, head));
}

// A pass that ends before its last load (an error, an abandoned step)
// leaves its walk unfinished: the next BeginPass starts over, and its
// loads get their own ranges' bits (partial ranges: a rank's shards).
TEST(HostCastStagerTest, NewPassDropsAnUnfinishedWalk) {
  Fixture f;
  const ModelLayout& layout = f.store->layout();
  const int64_t l0 = layout.layer_block(0), l2 = layout.layer_block(2);
  const int64_t n = f.numel(l0);
  auto stager = HostCastStager::Create(f.env.get(), n, /*chunk_elements=*/128);
  ASSERT_THAT(stager, IsOk());
  (*stager)->BeginPass({{l0, 0, n}, {l2, 0, n}});
  std::vector<bf16_bits> first(n);
  (*stager)->CopyRange(l0, 0, n, first.data());  // l2 is never loaded
  EXPECT_EQ(first, Expected(*f.store, l0, 0, n));
  for (int pass = 0; pass < 3; ++pass) {
    const int64_t begin = 100 + pass, end = n - 37;
    (*stager)->BeginPass({{l2, begin, end}, {l0, 7, 9}});
    std::vector<bf16_bits> shard(end - begin), tail(2);
    EXPECT_EQ((*stager)->CopyRange(l2, begin, end, shard.data()), 2 * (end - begin));
    EXPECT_EQ(shard, Expected(*f.store, l2, begin, end));
    (*stager)->CopyRange(l0, 7, 9, tail.data());
    EXPECT_EQ(tail, Expected(*f.store, l0, 7, 9));
  }
}

// bf16 slots loaded through the host cast hold FloatToBf16 of the master,
// each load gated once, and count 2 bytes per parameter as H2D weight
// bytes; a block still in its slot is not cast again.
TEST(WeightSlotsTest, HostCastLoadsTheMastersBf16Bits) {
  Fixture f;
  const ModelLayout& layout = f.store->layout();
  int64_t max_numel = 0;
  for (const BlockLayout& b : layout.blocks) max_numel = std::max(max_numel, b.numel);
  std::mutex mu;  // the slots and the stager's worker both call the gate
  std::vector<int64_t> gated;
  f.env->weight_gate = [&](int64_t block) {
    std::lock_guard<std::mutex> lock(mu);
    gated.push_back(block);
  };
  auto stager = HostCastStager::Create(f.env.get(), max_numel, /*chunk_elements=*/500);
  ASSERT_THAT(stager, IsOk());
  const int64_t ring_bytes = (*stager)->pinned_bytes();
  WeightSlots slots(f.env.get(), 3, max_numel, /*cast_chunk_elements=*/0, std::move(*stager));
  EXPECT_EQ(slots.pinned_bytes(), ring_bytes);
  EXPECT_EQ(slots.device_bytes(), 3 * 2 * max_numel);  // no device cast staging
  const int64_t l2 = layout.layer_block(2), head = layout.head_block();
  for (int pass = 0; pass < 2; ++pass) {
    f.env->BeginPass();
    slots.BeginPass({l2, head, l2});
    for (int use = 0; use < 3; ++use) {
      const at::Tensor w = slots.Acquire(use);
      const int64_t block = use == 1 ? head : l2;
      ASSERT_EQ(w.numel(), f.numel(block));
      EXPECT_EQ(std::vector<bf16_bits>(static_cast<const bf16_bits*>(w.data_ptr()),
                                       static_cast<const bf16_bits*>(w.data_ptr()) + w.numel()),
                Expected(*f.store, block, 0, f.numel(block)));
      slots.Release(use);
    }
    EXPECT_EQ(f.env->h2d_weight_bytes, 2 * (f.numel(l2) + f.numel(head)));
  }
  // Per pass: the slots' gate and the stager's, for each load.
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(std::count(gated.begin(), gated.end(), l2), 4);
  EXPECT_EQ(std::count(gated.begin(), gated.end(), head), 4);
}

// Note [Sharded weight streaming] with the host cast: rank 1 of 2 casts
// and copies only its shard, elements [S, numel) with S = ceil(numel / 2),
// and the gather brings the rest (here a stand-in for rank 0 writing its
// cast of [0, S)); the slot then holds the whole block's bf16 bits.
TEST(WeightSlotsTest, HostCastLoadsOnlyThisRanksShard) {
  Fixture f;
  const int64_t l2 = f.store->layout().layer_block(2);
  const int64_t n = f.numel(l2), shard = (n + 1) / 2;
  f.env->weight_sharding.rank = 1;
  f.env->weight_sharding.world = 2;
  std::vector<int64_t> gathered;
  f.env->weight_sharding.all_gather = [&](int64_t block, void* slot, int64_t shard_numel,
                                          int element_bytes) {
    ASSERT_EQ(element_bytes, 2);
    ASSERT_EQ(shard_numel, shard);
    const std::vector<bf16_bits> peer = Expected(*f.store, block, 0, shard_numel);
    std::copy(peer.begin(), peer.end(), static_cast<bf16_bits*>(slot));
    gathered.push_back(block);
  };
  auto stager = HostCastStager::Create(f.env.get(), n, /*chunk_elements=*/1000);
  ASSERT_THAT(stager, IsOk());
  WeightSlots slots(f.env.get(), 3, n, /*cast_chunk_elements=*/0, std::move(*stager));
  f.env->BeginPass();
  slots.BeginPass({l2}, /*sharded=*/true);
  const at::Tensor w = slots.Acquire(0);
  EXPECT_EQ(std::vector<bf16_bits>(static_cast<const bf16_bits*>(w.data_ptr()),
                                   static_cast<const bf16_bits*>(w.data_ptr()) + n),
            Expected(*f.store, l2, 0, n));
  slots.Release(0);
  EXPECT_EQ(f.env->h2d_weight_bytes, 2 * (n - shard));
  EXPECT_THAT(gathered, ::testing::ElementsAre(l2));
}

}  // namespace
}  // namespace megatrain::engine
