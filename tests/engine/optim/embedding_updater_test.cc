// The row-wise embedding update (engine/optim/embedding_updater.h): rows
// updated through the row gate, in the background or by the lookahead are
// bit for bit the whole-table AdamW update, and each row's gradient is
// zeroed once used.
#include "engine/optim/embedding_updater.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "absl/synchronization/notification.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;

struct Fixture {
  Fixture() {
    config = testing::SmallLlama();
    auto s = HostStore::Create(config, {});
    EXPECT_THAT(s, IsOk());
    store = std::move(*s);
    store->InitializeWeights(5);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    const int64_t emb = store->layout().embedding_block();
    for (int64_t i = 0; i < store->block_numel(emb); ++i) store->grad(emb)[i] = normal(rng);
    pool = ThreadPool::Create(2);
    critical = ThreadPool::Create(2);
    auto a = CpuAdamW::Create(AdamWOptions{}, pool.get());
    EXPECT_THAT(a, IsOk());
    adamw = std::make_unique<CpuAdamW>(std::move(*a));
    queue = std::make_unique<OptimizerQueue>(store->num_blocks(), 0);
  }
  // The whole-table update of a copy of the table (the reference).
  std::vector<float> WholeTableUpdate(int64_t step, double lr, float scale) {
    const int64_t emb = store->layout().embedding_block();
    const int64_t n = store->block_numel(emb);
    std::vector<float> params(store->master(emb), store->master(emb) + n);
    std::vector<float> m(store->exp_avg(emb), store->exp_avg(emb) + n);
    std::vector<float> v(store->exp_avg_sq(emb), store->exp_avg_sq(emb) + n);
    AdamWBuffers b;
    b.params = params.data();
    b.grads = store->grad(emb);
    b.exp_avg = m.data();
    b.exp_avg_sq = v.data();
    b.num_elements = n;
    EXPECT_THAT(adamw->Step(b, step, lr, scale), IsOk());
    return params;
  }
  ModelConfig config;
  std::unique_ptr<HostStore> store;
  std::unique_ptr<ThreadPool> pool, critical;
  std::unique_ptr<CpuAdamW> adamw;
  std::unique_ptr<OptimizerQueue> queue;
};

TEST(EmbeddingUpdaterTest, GateAndBackgroundRowsEqualTheWholeTableUpdate) {
  Fixture f;
  const int64_t emb = f.store->layout().embedding_block();
  const int64_t c = f.config.hidden_size;
  const std::vector<float> want = f.WholeTableUpdate(1, 1e-2, 0.5f);
  auto updater = EmbeddingUpdater::Create(f.store.get(), f.adamw.get(), f.queue.get(), f.pool.get(),
                                          f.critical.get(), false);
  ASSERT_NE(updater, nullptr);
  // Hold the optimizer thread so that the gate, not the background task,
  // updates the gathered rows.
  absl::Notification release;
  f.queue->Push({0, 0, 0}, -1, [&] {
    release.WaitForNotification();
    return absl::OkStatus();
  });
  updater->ScheduleUpdate(1, 1e-2, 0.5f);
  EXPECT_TRUE(updater->TakeGradZero());
  const std::vector<int32_t> ids = {3, 7, 3, 90};
  std::vector<const float*> sources(ids.size());
  updater->GateRows(ids, absl::MakeSpan(sources));
  EXPECT_EQ(updater->gate_rows(), 3);  // distinct rows
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(sources[i], f.store->master(emb) + ids[i] * c);
    EXPECT_EQ(std::memcmp(sources[i], want.data() + ids[i] * c, c * 4), 0) << "row " << ids[i];
    EXPECT_EQ(f.store->grad(emb)[ids[i] * c], 0.0f);  // zeroed once used
  }
  release.Notify();
  ASSERT_THAT(f.queue->WaitAll(), IsOk());
  const int64_t n = f.config.vocab_size * c;
  EXPECT_EQ(std::memcmp(f.store->master(emb), want.data(), n * 4), 0);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f.store->grad(emb)[i], 0.0f) << i;
}

TEST(EmbeddingUpdaterTest, LookaheadRowsEqualTheNextUpdateOfUntouchedRows) {
  Fixture f;
  const int64_t emb = f.store->layout().embedding_block();
  const int64_t c = f.config.hidden_size;
  auto updater = EmbeddingUpdater::Create(f.store.get(), f.adamw.get(), f.queue.get(), f.pool.get(),
                                          f.critical.get(), /*keep_lookahead=*/true);
  ASSERT_NE(updater, nullptr);
  // Step 1 touches rows 1 and 2 only: their gradients stay, the others are
  // zero, as after a scatter of those tokens.
  for (int64_t r = 0; r < f.config.vocab_size; ++r) {
    if (r != 1 && r != 2) std::memset(f.store->grad(emb) + r * c, 0, c * 4);
  }
  MicroBatch mb;
  mb.input_ids = {1, 2};
  mb.labels = {2, 1};
  const std::vector<float> want = f.WholeTableUpdate(1, 1e-2, 1.0f);
  const std::vector<int32_t> next = {2, 5, 6};
  updater->QueueLookahead(1, 1e-2, absl::MakeConstSpan(&mb, 1), next);
  updater->EndGather();
  updater->ScheduleUpdate(1, 1e-2, 1.0f);
  updater->AfterStep(1, /*applied=*/true);
  ASSERT_THAT(f.queue->WaitAll(), IsOk());
  std::vector<const float*> sources(next.size());
  updater->GateRows(next, absl::MakeSpan(sources));
  EXPECT_EQ(updater->lookahead_rows(), 2);  // rows 5 and 6; row 2 had a gradient
  for (size_t i = 0; i < next.size(); ++i) {
    EXPECT_EQ(std::memcmp(sources[i], want.data() + next[i] * c, c * 4), 0) << "row " << next[i];
  }
  EXPECT_EQ(sources[0], f.store->master(emb) + 2 * c);  // from the store
  EXPECT_NE(sources[1], f.store->master(emb) + 5 * c);  // from the side buffer
}

}  // namespace
}  // namespace megatrain::engine
