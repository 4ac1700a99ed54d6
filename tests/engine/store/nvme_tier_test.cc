// Tests of the NVMe tier's moment files (engine/store/nvme_tier.h): a pass
// reads every chunk in order and writes back what the callback left, with
// more chunks than buffers; synchronous copies round-trip; the byte
// counters count the writes (wear); a truncated file is DATA_LOSS and a
// full disk RESOURCE_EXHAUSTED, both naming the file; bad ranges and modes
// are INVALID_ARGUMENT. The layout of data-parallel ranks' shard files
// (Note [Tier shards]): aligned, disjoint files whose pieces cover every
// block in order.
#include "engine/store/nvme_tier.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#include "engine/model/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tmpfs.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeTempDir;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kChunk = 1024;  // small chunks: many per pass

TEST(NvmeTierModeTest, ParsesTheJobFileValues) {
  EXPECT_EQ(*ParseNvmeTierMode("off"), NvmeTierMode::kOff);
  EXPECT_EQ(*ParseNvmeTierMode("moments"), NvmeTierMode::kMoments);
  EXPECT_EQ(*ParseNvmeTierMode("auto"), NvmeTierMode::kAuto);
  EXPECT_THAT(ParseNvmeTierMode("all").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memory.nvme_tier")));
}

TEST(NvmeMomentFilesTest, PassReadsAheadAndWritesBehindInOrder) {
  const std::string dir = MakeTempDir("nvme");
  constexpr int64_t kNumel = 16 * 1024;
  absl::StatusOr<std::unique_ptr<NvmeMomentFiles>> files =
      NvmeMomentFiles::Create(dir, kNumel, /*pin_staging=*/false, kChunk);
  ASSERT_THAT(files.status(), IsOk());
  std::vector<float> m(kNumel), v(kNumel);
  std::iota(m.begin(), m.end(), 0.0f);
  std::iota(v.begin(), v.end(), 0.5f);
  ASSERT_THAT((*files)->Write(MomentKind::kExpAvg, 0, kNumel, m.data()), IsOk());
  ASSERT_THAT((*files)->Write(MomentKind::kExpAvgSq, 0, kNumel, v.data()), IsOk());
  const int64_t written_before = (*files)->bytes_written();
  // Two "blocks": 5000 elements at 0 (a partial last chunk) and 7 chunks
  // at 8192: 12 chunks through 3 buffers.
  const std::vector<MomentRange> ranges = {{0, 5000}, {8192, 7 * 1024}};
  std::vector<int64_t> seen;
  ASSERT_THAT((*files)->ForEachChunk(ranges,
                                     [&](const MomentRange& r, float* ea, float* eas) {
                                       seen.push_back(r.offset);
                                       for (int64_t i = 0; i < r.count; ++i) {
                                         EXPECT_EQ(ea[i], m[r.offset + i]);
                                         EXPECT_EQ(eas[i], v[r.offset + i]);
                                         ea[i] = -ea[i];
                                         eas[i] *= 2;
                                       }
                                       return absl::OkStatus();
                                     }),
              IsOk());
  const std::vector<int64_t> expected = {0,    1024,  2048,  3072,  4096,  8192,
                                         9216, 10240, 11264, 12288, 13312, 14336};
  EXPECT_EQ(seen, expected);
  // 12 chunks x 2 files x 4 KiB written (the last chunk of block 0 whole).
  EXPECT_EQ((*files)->bytes_written() - written_before, 12 * 2 * 4096);
  std::vector<float> m2(kNumel), v2(kNumel);
  ASSERT_THAT((*files)->Read(MomentKind::kExpAvg, 0, kNumel, m2.data()), IsOk());
  ASSERT_THAT((*files)->Read(MomentKind::kExpAvgSq, 0, kNumel, v2.data()), IsOk());
  for (int64_t i = 0; i < kNumel; ++i) {
    const bool updated = i < 5000 || (i >= 8192 && i < 8192 + 7 * 1024);
    ASSERT_EQ(m2[i], updated ? -m[i] : m[i]) << i;
    ASSERT_EQ(v2[i], updated ? 2 * v[i] : v[i]) << i;
  }
}

TEST(NvmeMomentFilesTest, CallbackErrorStopsThePass) {
  const std::string dir = MakeTempDir("nvme");
  auto files = *NvmeMomentFiles::Create(dir, 8192, false, kChunk);
  int calls = 0;
  EXPECT_THAT(files->ForEachChunk({{0, 8192}},
                                  [&](const MomentRange&, float*, float*) {
                                    return ++calls == 3 ? absl::InvalidArgumentError("lr: bad")
                                                        : absl::OkStatus();
                                  }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lr: bad")));
  EXPECT_EQ(calls, 3);
}

TEST(NvmeMomentFilesTest, TruncatedFileIsDataLossNamingIt) {
  const std::string dir = MakeTempDir("nvme");
  auto files = *NvmeMomentFiles::Create(dir, 8192, false, kChunk);
  ASSERT_EQ(::truncate(files->path(MomentKind::kExpAvgSq).c_str(), 4096 * 3), 0);
  const absl::Status status = files->ForEachChunk(
      {{0, 8192}}, [](const MomentRange&, float*, float*) { return absl::OkStatus(); });
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("exp_avg_sq.bin")));
  EXPECT_THAT(std::string(status.message()), HasSubstr("truncated"));
}

TEST(NvmeMomentFilesTest, FullDiskIsResourceExhaustedNamingTheFile) {
  std::string why_not;
  std::unique_ptr<testing::ScopedTmpfs> disk = testing::ScopedTmpfs::Mount(64 << 10, &why_not);
  if (disk == nullptr) GTEST_SKIP() << why_not;
  // 2 x 256 KiB of sparse files on a 64 KiB tmpfs: the pass's writes fill it.
  auto files = NvmeMomentFiles::Create(disk->path(), 64 * 1024, false, kChunk);
  ASSERT_THAT(files.status(), IsOk());
  // tmpfs takes O_DIRECT from Linux 6.6 on; older kernels refuse it and
  // the files use the page cache: either way the write fails for space.
  const absl::Status status =
      (*files)->ForEachChunk({{0, 64 * 1024}}, [](const MomentRange&, float* m, float*) {
        m[0] = 1;
        return absl::OkStatus();
      });
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr(".bin")));
}

TEST(NvmeMomentFilesTest, RejectsUnalignedRangesAndSizes) {
  const std::string dir = MakeTempDir("nvme");
  EXPECT_THAT(NvmeMomentFiles::Create(dir, 1000, false).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiples of 1024")));
  auto files = *NvmeMomentFiles::Create(dir, 4096, false, kChunk);
  EXPECT_THAT(files->ForEachChunk(
                  {{100, 10}}, [](const MomentRange&, float*, float*) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4 KiB-aligned")));
  EXPECT_THAT(files->ForEachChunk(
                  {{0, 5000}}, [](const MomentRange&, float*, float*) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4096 elements")));
  EXPECT_THAT(NvmeMomentFiles::Create(dir + "/missing", 4096, false).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing/exp_avg.bin")));
}

// Note [Tier shards]: one device keeps the host store's layout (the whole
// of every block at 1024-aligned offsets); three ranks each hold c10d's
// shard of every block at 1024-aligned offsets of files of their own, and
// the tier's pieces of a block are the shards in rank order, contiguous
// and covering it.
TEST(NvmeShardLayoutTest, ShardsAreAlignedAndTheirPiecesCoverEveryBlockInOrder) {
  const ModelLayout layout = ModelLayout::Create(*PresetConfig("tiny"));
  const NvmeShardLayout one = NvmeShardLayout::Create(layout, 0, 1);
  int64_t offset = 0;
  for (size_t b = 0; b < layout.blocks.size(); ++b) {
    EXPECT_EQ(one.begin[b], 0);
    EXPECT_EQ(one.end[b], layout.blocks[b].numel);
    EXPECT_EQ(one.file_offset[b], offset);
    offset += (layout.blocks[b].numel + 1023) / 1024 * 1024;
  }
  EXPECT_EQ(one.numel, offset);
  EXPECT_EQ(NvmeTierFileBytes(layout, 1), 8 * offset);
  EXPECT_EQ(NvmeShardFileSuffix(0, 1), "");
  EXPECT_EQ(NvmeShardFileSuffix(2, 3), ".rank-2-of-3");

  const std::string dir = MakeTempDir("shards");
  std::vector<NvmeShardLayout> layouts;
  std::vector<std::unique_ptr<NvmeMomentFiles>> files;
  std::vector<NvmeMomentTier::Shard> shards;
  for (int r = 0; r < 3; ++r) layouts.push_back(NvmeShardLayout::Create(layout, r, 3));
  for (int r = 0; r < 3; ++r) {
    for (size_t b = 0; b < layout.blocks.size(); ++b) {
      EXPECT_EQ(layouts[r].file_offset[b] % 1024, 0);
      if (b + 1 < layout.blocks.size()) {
        EXPECT_GE(layouts[r].file_offset[b + 1],
                  layouts[r].file_offset[b] + layouts[r].end[b] - layouts[r].begin[b]);
      }
    }
    auto created = NvmeMomentFiles::Create(dir, layouts[r].numel, false, kChunk, "",
                                           NvmeShardFileSuffix(r, 3));
    ASSERT_THAT(created, IsOk());
    EXPECT_THAT((*created)->path(MomentKind::kExpAvgSq),
                HasSubstr(absl::StrCat("exp_avg_sq.rank-", r, "-of-3.bin")));
    files.push_back(std::move(*created));
    shards.push_back({files.back().get(), &layouts[r]});
  }
  absl::StatusOr<NvmeMomentTier> tier = NvmeMomentTier::Create(shards);
  ASSERT_THAT(tier, IsOk());
  for (int64_t b = 0; b < tier->num_blocks(); ++b) {
    int64_t next = 0;
    for (const NvmeBlockPiece& piece : tier->Pieces(b)) {
      EXPECT_EQ(piece.begin, next) << "block " << b;
      EXPECT_GT(piece.count, 0);
      next = piece.begin + piece.count;
    }
    EXPECT_EQ(next, layout.blocks[static_cast<size_t>(b)].numel) << "block " << b;
  }
  // Out of rank order: refused.
  std::swap(shards[0], shards[1]);
  EXPECT_THAT(NvmeMomentTier::Create(shards).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shard 0 of 3")));
}

}  // namespace
}  // namespace megatrain::engine
