// TieredAdamWStep (engine/optim/tiered_adamw.h) against the all-in-RAM
// optimizer step: the tiny preset trained for several steps with gradient
// accumulation, global-norm clipping and a skipped (non-finite) step gives
// bit-identical master weights, bf16 copies and moments; so does a run
// whose moments go through a checkpoint-style copy to host memory and back
// into fresh files (resume); and so do data-parallel ranks that each update
// their shard with the moments in files of their own (Note [Tier shards]
// in engine/store/nvme_tier.h), copied out and into another rank count.
#include "engine/optim/tiered_adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
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
    layout_ = NvmeShardLayout::Create(tiered_->layout(), 0, 1);
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

  // The one-device tier of moments_ (the store's layout).
  NvmeMomentTier Tier() { return *NvmeMomentTier::Create({{moments_.get(), &layout_}}); }

  // The all-in-RAM store's state against `tiered_`'s with the moments in
  // `tier`.
  void ExpectSameState(const NvmeMomentTier& tier) {
    const int64_t n = ram_->arena_numel();
    ExpectBitIdentical(ram_->master(0), tiered_->master(0), n, "master weights");
    EXPECT_EQ(std::memcmp(ram_->streaming_bf16(0), tiered_->streaming_bf16(0), n * 2), 0)
        << "bf16 copies differ";
    std::vector<float> m(n), v(n);
    ASSERT_THAT(CopyMomentsToHost(tier, *tiered_, m.data(), v.data()), IsOk());
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
  NvmeShardLayout layout_;
  std::vector<int64_t> blocks_;
};

TEST_F(TieredAdamWTest, BitIdenticalToAllInRamWithAccumulationClippingAndASkippedStep) {
  EXPECT_EQ(tiered_->exp_avg(0), nullptr);  // the host keeps no moments
  Train(1, 5, /*skip=*/3);
  ExpectSameState(Tier());
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
  ASSERT_THAT(CopyMomentsToHost(Tier(), *tiered_, m.data(), v.data()), IsOk());
  moments_ = *NvmeMomentFiles::Create(MakeTempDir("resumed"), n, false, 4096);
  ASSERT_THAT(CopyMomentsFromHost(Tier(), *tiered_, m.data(), v.data()), IsOk());
  Train(4, 6, /*skip=*/0);
  ExpectSameState(Tier());
}

// The shard files of `world` ranks (Note [Tier shards]) under a fresh
// directory, with their layouts.
struct RankFiles {
  std::vector<NvmeShardLayout> layouts;
  std::vector<std::unique_ptr<NvmeMomentFiles>> files;
  NvmeMomentTier Tier() const {
    std::vector<NvmeMomentTier::Shard> shards;
    for (size_t r = 0; r < files.size(); ++r) shards.push_back({files[r].get(), &layouts[r]});
    return *NvmeMomentTier::Create(std::move(shards));
  }
};
RankFiles MakeRankFiles(const HostStore& store, int world, const std::string& dir) {
  RankFiles out;
  for (int r = 0; r < world; ++r) {
    out.layouts.push_back(NvmeShardLayout::Create(store.layout(), r, world));
    out.files.push_back(*NvmeMomentFiles::Create(dir, out.layouts.back().numel, false, 4096, "",
                                                 NvmeShardFileSuffix(r, world)));
  }
  return out;
}

// Three ranks (tiny's blocks are not multiples of 3 x 1024, so their shard
// boundaries are not 4 KiB-aligned), each updating its shard of every
// block in slices of 2048 elements with the moments in its own files: the
// same bits as the all-in-RAM step (AdamW is elementwise). The moments
// copied out and into two ranks' files (a resume on another rank count)
// come back the same.
TEST_F(TieredAdamWTest, RanksUpdatingTheirShardsInFilesOfTheirOwnMatchOneDevice) {
  const std::string dir = MakeTempDir("ranks");
  RankFiles three = MakeRankFiles(*tiered_, 3, dir);
  EXPECT_NE(three.layouts[1].begin[1] % 1024, 0) << "a shard boundary inside a 4 KiB page";
  constexpr int64_t kSlice = 2048;
  for (int step = 1; step <= 3; ++step) {
    ram_->ZeroGrads();
    tiered_->ZeroGrads();
    AccumulateGradients(*ram_, step, 0);
    AccumulateGradients(*tiered_, step, 0);
    const float scale = ClipScale(*ram_);
    const double lr = 1e-2 / step;
    for (const int64_t block : blocks_) {
      AdamWBuffers b{ram_->master(block),         ram_->grad(block),
                     ram_->exp_avg(block),        ram_->exp_avg_sq(block),
                     ram_->streaming_bf16(block), ram_->block_numel(block)};
      ASSERT_THAT(adamw_->Step(b, step, lr, scale), IsOk());
      for (int r = 0; r < 3; ++r) {
        const NvmeShardLayout& layout = three.layouts[r];
        for (int64_t begin = layout.begin[block]; begin < layout.end[block]; begin += kSlice) {
          const int64_t count = std::min(kSlice, layout.end[block] - begin);
          ASSERT_THAT(TieredAdamWSliceStep(*adamw_, *tiered_, *three.files[r], layout, block, begin,
                                           count, step, lr, scale),
                      IsOk());
        }
      }
    }
  }
  ExpectSameState(three.Tier());
  int64_t file_bytes = 0;
  for (int r = 0; r < 3; ++r) file_bytes += 8 * three.files[r]->numel();
  EXPECT_EQ(file_bytes, NvmeTierFileBytes(tiered_->layout(), 3));

  const int64_t n = tiered_->arena_numel();
  std::vector<float> m(n), v(n);
  ASSERT_THAT(CopyMomentsToHost(three.Tier(), *tiered_, m.data(), v.data()), IsOk());
  RankFiles two = MakeRankFiles(*tiered_, 2, MakeTempDir("two-ranks"));
  ASSERT_THAT(CopyMomentsFromHost(two.Tier(), *tiered_, m.data(), v.data()), IsOk());
  ExpectSameState(two.Tier());
}

// A slice outside the rank's shard, or not 1024 elements after its start,
// is refused naming the rank.
TEST_F(TieredAdamWTest, SliceOutsideTheRanksShardIsInvalid) {
  RankFiles two = MakeRankFiles(*tiered_, 2, MakeTempDir("bad-slice"));
  const NvmeShardLayout& rank1 = two.layouts[1];
  for (const int64_t begin : {rank1.begin[1] - 1024, rank1.begin[1] + 1}) {
    EXPECT_THAT(
        TieredAdamWSliceStep(*adamw_, *tiered_, *two.files[1], rank1, 1, begin, 16, 1, 1e-2, 1.0f),
        ::megatrain::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                       ::testing::HasSubstr("rank 1 of 2's shard")));
  }
}

}  // namespace
}  // namespace megatrain::engine
