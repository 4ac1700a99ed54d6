// TieredAdamWStep (engine/optim/tiered_adamw.h) against the all-in-RAM
// optimizer step: the tiny preset trained for several steps with gradient
// accumulation, global-norm clipping and a skipped (non-finite) step gives
// bit-identical master weights, bf16 copies and moments; so does a run
// whose moments go through a checkpoint-style copy to host memory and back
// into fresh files (resume).
#include "engine/optim/tiered_adamw.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "engine/runtime/thread_pool.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeTempDir;

std::unique_ptr<HostStore> TinyStore(bool moments_in_host) {
  HostStoreOptions options;
  options.streaming_bf16 = true;
  options.moments_in_host = moments_in_host;
  std::unique_ptr<HostStore> store = *HostStore::Create(*PresetConfig("tiny"), options);
  store->InitializeWeights(/*seed=*/7);
  return store;
}

// Micro-batch `micro` of step `step`: the same pseudo-random gradient for
// both stores, accumulated (+=) as the gradient lander does.
void AccumulateGradients(HostStore& store, int step, int micro) {
  // Uniform in [-1, 1): a cheap generator (the test's time is in here);
  // large enough that clipping at 1.0 is active.
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(1000 * step + micro + 1);
  for (int64_t block = 0; block < store.num_blocks(); ++block) {
    float* g = store.grad(block);
    for (int64_t i = 0; i < store.block_numel(block); ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      g[i] += static_cast<float>(static_cast<int64_t>(x >> 40) - (int64_t{1} << 23)) * 0x1.0p-23f;
    }
  }
}

float ClipScale(const HostStore& store) {
  double sq = 0;
  for (int64_t block = 0; block < store.num_blocks(); ++block) {
    sq += SumOfSquares(store.grad(block), store.block_numel(block), nullptr);
  }
  return ClipCoefficient(std::sqrt(sq), /*max_norm=*/1.0);
}

void ExpectBitIdentical(const float* a, const float* b, int64_t n, const char* what) {
  EXPECT_EQ(std::memcmp(a, b, n * sizeof(float)), 0) << what << " differ";
}

class TieredAdamWTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AdamWOptions options;
    options.lr = 1e-2;
    options.weight_decay = 0.1;
    pool_ = ThreadPool::Create(2);
    adamw_ = std::make_unique<CpuAdamW>(*CpuAdamW::Create(options, pool_.get()));
    ram_ = TinyStore(/*moments_in_host=*/true);
    tiered_ = TinyStore(/*moments_in_host=*/false);
    // Small chunks: blocks span several, the pipeline wraps its buffers.
    moments_ = *NvmeMomentFiles::Create(MakeTempDir("tiered"), tiered_->arena_numel(), false,
                                        /*chunk_elements=*/4096);
    for (int64_t block = 0; block < ram_->num_blocks(); ++block) blocks_.push_back(block);
  }

  // Steps `from`..`to` (inclusive); step `skip` is non-finite: no update,
  // its number reused by the next step (Note [Non-finite steps]).
  void Train(int from, int to, int skip) {
    int64_t applied = from - 1;
    for (int step = from; step <= to; ++step) {
      ram_->ZeroGrads();
      tiered_->ZeroGrads();
      for (int micro = 0; micro < 2; ++micro) {
        AccumulateGradients(*ram_, step, micro);
        AccumulateGradients(*tiered_, step, micro);
      }
      if (step == skip) continue;
      ++applied;
      const float scale = ClipScale(*ram_);
      ASSERT_LT(scale, 1.0f);
      const double lr = 1e-2 / applied;
      for (const int64_t block : blocks_) {
        AdamWBuffers b;
        b.params = ram_->master(block);
        b.grads = ram_->grad(block);
        b.exp_avg = ram_->exp_avg(block);
        b.exp_avg_sq = ram_->exp_avg_sq(block);
        b.bf16_params = ram_->streaming_bf16(block);
        b.num_elements = ram_->block_numel(block);
        ASSERT_THAT(adamw_->Step(b, applied, lr, scale), IsOk());
      }
      ASSERT_THAT(
          TieredAdamWStep(*adamw_, *tiered_, *moments_, blocks_, applied, lr, ClipScale(*tiered_)),
          IsOk());
    }
  }

  void ExpectSameState() {
    const int64_t n = ram_->arena_numel();
    ExpectBitIdentical(ram_->master(0), tiered_->master(0), n, "master weights");
    EXPECT_EQ(std::memcmp(ram_->streaming_bf16(0), tiered_->streaming_bf16(0), n * 2), 0)
        << "bf16 copies differ";
    std::vector<float> m(n), v(n);
    ASSERT_THAT(CopyMomentsToHost(*moments_, *tiered_, m.data(), v.data()), IsOk());
    for (int64_t block = 0; block < ram_->num_blocks(); ++block) {
      const int64_t offset = ram_->block_offset(block);
      ExpectBitIdentical(ram_->exp_avg(block), m.data() + offset, ram_->block_numel(block),
                         "exp_avg");
      ExpectBitIdentical(ram_->exp_avg_sq(block), v.data() + offset, ram_->block_numel(block),
                         "exp_avg_sq");
    }
  }

  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CpuAdamW> adamw_;
  std::unique_ptr<HostStore> ram_, tiered_;
  std::unique_ptr<NvmeMomentFiles> moments_;
  std::vector<int64_t> blocks_;
};

TEST_F(TieredAdamWTest, BitIdenticalToAllInRamWithAccumulationClippingAndASkippedStep) {
  EXPECT_EQ(tiered_->exp_avg(0), nullptr);  // the host keeps no moments
  Train(1, 5, /*skip=*/3);
  ExpectSameState();
  // 4 applied steps x 2 files x every byte of the moment files (tiny's
  // blocks are 4 KiB multiples once padded): the wear the job reports.
  EXPECT_EQ(moments_->bytes_written(), 4 * 2 * tiered_->arena_numel() * 4);
}

TEST_F(TieredAdamWTest, ResumeThroughHostCopiesStaysBitIdentical) {
  Train(1, 3, /*skip=*/0);
  // A checkpoint copies the moments out; a resumed job writes them into
  // fresh files and goes on.
  const int64_t n = tiered_->arena_numel();
  std::vector<float> m(n), v(n);
  ASSERT_THAT(CopyMomentsToHost(*moments_, *tiered_, m.data(), v.data()), IsOk());
  moments_ = *NvmeMomentFiles::Create(MakeTempDir("resumed"), n, false, 4096);
  ASSERT_THAT(CopyMomentsFromHost(*moments_, *tiered_, m.data(), v.data()), IsOk());
  Train(4, 6, /*skip=*/0);
  ExpectSameState();
}

}  // namespace
}  // namespace megatrain::engine
