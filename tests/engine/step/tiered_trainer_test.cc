// The trainer with its AdamW moments on the NVMe tier (Note [Tiered
// trainer] in engine/step/trainer.h) against the all-in-RAM trainer: after
// several steps with gradient accumulation, with and without clipping and
// with a skipped (NaN) step, master weights and both moments are bit for
// bit the same; the step reports the tier's bytes; a truncated moment file
// fails the next step with DATA_LOSS naming the file; destroying the
// trainer with updates queued finishes them before the files close.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/fs/mapped_file.h"
#include "engine/optim/tiered_adamw.h"
#include "engine/step/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/parity.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_state.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::BitIdentical;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeBatches;
using ::megatrain::testing::MakeTempDir;
using ::megatrain::testing::SmallLlama;
using ::megatrain::testing::SmallTrainerOptions;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kB = 2, kT = 8;

TrainerOptions Options(double max_grad_norm) {
  TrainerOptions o = SmallTrainerOptions(kB, kT, max_grad_norm, /*total_steps=*/6);
  o.gradient_accumulation_steps = 2;
  // Several slices per block and several chunks per slice (rounded up to
  // 3072 with the tier: Note [Tiered trainer]).
  o.optimizer_slice_elements = 3000;
  o.nvme_chunk_elements = 1024;
  return o;
}

// Master weights, exp_avg and exp_avg_sq of every block, back to back
// (the moments from the tier's files when the trainer has them).
std::vector<float> State(Trainer& trainer) {
  EXPECT_THAT(trainer.WaitForOptimizer(), IsOk());
  HostStore& store = trainer.store();
  const int64_t n = store.arena_numel();
  std::vector<float> m(n), v(n);
  if (trainer.nvme_moments() != nullptr) {
    absl::StatusOr<NvmeMomentTier> tier = NvmeMomentTier::Create({trainer.nvme_shard()});
    EXPECT_THAT(tier, IsOk());
    if (tier.ok()) {
      EXPECT_THAT(CopyMomentsToHost(*tier, store, m.data(), v.data()), IsOk());
    }
  }
  std::vector<float> out;
  for (int64_t b = 0; b < store.num_blocks(); ++b) {
    const int64_t offset = store.block_offset(b), numel = store.block_numel(b);
    const float* exp_avg = store.exp_avg(b) != nullptr ? store.exp_avg(b) : m.data() + offset;
    const float* exp_avg_sq =
        store.exp_avg_sq(b) != nullptr ? store.exp_avg_sq(b) : v.data() + offset;
    out.insert(out.end(), store.master(b), store.master(b) + numel);
    out.insert(out.end(), exp_avg, exp_avg + numel);
    out.insert(out.end(), exp_avg_sq, exp_avg_sq + numel);
  }
  return out;
}

// (max_grad_norm, tied embeddings).
class TieredTrainerTest : public ::testing::TestWithParam<std::tuple<double, bool>> {};

// Five steps of two micro-batches each, step 3 poisoned (NaN loss:
// skipped), on the tier and in RAM: the same state bit for bit after
// every step.
TEST_P(TieredTrainerTest, BitIdenticalToAllInRamWithAccumulationAndANanSkip) {
  const auto [clip, tied] = GetParam();
  ModelConfig config = SmallLlama();
  config.tie_word_embeddings = tied;
  TrainerOptions ram_options = Options(clip);
  ram_options.debug_nonfinite = {.step = 3, .kind = NonFiniteInjection::Kind::kLoss};
  TrainerOptions tier_options = ram_options;
  tier_options.nvme_dir = MakeTempDir("tier");
  auto ram = Trainer::Create(config, ram_options, /*seed=*/5);
  auto tier = Trainer::Create(config, tier_options, /*seed=*/5);
  ASSERT_THAT(ram, IsOk());
  ASSERT_THAT(tier, IsOk());
  ASSERT_NE((*tier)->nvme_moments(), nullptr);
  EXPECT_EQ((*tier)->store().exp_avg(0), nullptr);  // no moments in host memory
  int64_t written = 0;
  for (int s = 1; s <= 5; ++s) {
    const auto batches = MakeBatches(2, kB, kT, config.vocab_size, 100 + s);
    auto a = (*ram)->Step(batches);
    auto b = (*tier)->Step(batches);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ(a->skipped, s == 3);
    EXPECT_EQ(b->skipped, s == 3);
    EXPECT_EQ(std::memcmp(&a->loss, &b->loss, sizeof(double)), 0) << "step " << s;
    EXPECT_TRUE(BitIdentical(State(**ram), State(**tier))) << "after step " << s;
    written += b->stats.nvme_written_bytes;
    EXPECT_EQ(a->stats.nvme_written_bytes, 0);
  }
  EXPECT_EQ((*ram)->step(), 4);
  EXPECT_EQ((*tier)->step(), 4);
  // Every step but the skipped one rewrites both files whole (every block
  // is a 4 KiB multiple once padded). A step reports the writes finished
  // since the previous report (its updates run behind it), so the reports
  // add up to at most that.
  const int64_t file_bytes = (*tier)->store().arena_numel() * 4;
  EXPECT_EQ((*tier)->nvme_moments()->bytes_written(), 4 * 2 * file_bytes);
  EXPECT_LE(written, 4 * 2 * file_bytes);
}

INSTANTIATE_TEST_SUITE_P(Modes, TieredTrainerTest,
                         ::testing::Combine(::testing::Values(1.0, 0.0), ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat(
                               std::get<0>(info.param) > 0 ? "Clipping" : "NoClipping",
                               std::get<1>(info.param) ? "Tied" : "Untied");
                         });

TEST(TieredTrainerTest, TruncatedMomentFileFailsTheNextStepNamingIt) {
  const ModelConfig config = SmallLlama();
  TrainerOptions o = Options(1.0);
  o.nvme_dir = MakeTempDir("tier");
  auto trainer = Trainer::Create(config, o, /*seed=*/5);
  ASSERT_THAT(trainer, IsOk());
  ASSERT_THAT((*trainer)->Step(MakeBatches(2, kB, kT, config.vocab_size, 1)), IsOk());
  ASSERT_THAT((*trainer)->WaitForOptimizer(), IsOk());
  const std::string path = (*trainer)->nvme_moments()->path(MomentKind::kExpAvg);
  EXPECT_EQ(path, o.nvme_dir + "/exp_avg.bin");
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  // The update that meets the short file runs behind step 2; step 3 (or
  // the wait) reports it.
  absl::Status status = (*trainer)->Step(MakeBatches(2, kB, kT, config.vocab_size, 2)).status();
  if (status.ok()) status = (*trainer)->WaitForOptimizer();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
  EXPECT_THAT(std::string(status.message()), HasSubstr("truncated"));
}

// The first `numel` fp32 values of the moment file at `path`.
std::vector<float> ReadMomentFile(const std::string& path, int64_t numel) {
  std::vector<float> out(numel);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(out.data()), numel * 4);
  EXPECT_EQ(in.gcount(), numel * 4) << path;
  return out;
}

// The teardown order (Note [Tiered trainer]): destroying a tiered trainer
// right after Step, with its updates still queued on the optimizer thread,
// runs them all before the moment files, the AdamW kernel and the store go
// (~Trainer drains the queue first): the files then hold the moments of
// the all-in-RAM trainer bit for bit, and the directory is removed
// afterwards (RemoveTree, as megatrain-bench's teardown does). Under ASan
// a file, buffer or callback freed while an update still ran is an error.
TEST(TieredTrainerTest, DestroyedWithUpdatesQueuedFinishesThemBeforeClosingTheFiles) {
  const ModelConfig config = SmallLlama();
  const TrainerOptions ram_options = Options(/*max_grad_norm=*/0.0);
  TrainerOptions tier_options = ram_options;
  tier_options.nvme_dir = MakeTempDir("tier");
  auto ram = Trainer::Create(config, ram_options, /*seed=*/7);
  auto tier = Trainer::Create(config, tier_options, /*seed=*/7);
  ASSERT_THAT(ram, IsOk());
  ASSERT_THAT(tier, IsOk());
  for (int s = 1; s <= 3; ++s) {
    const auto batches = MakeBatches(2, kB, kT, config.vocab_size, 200 + s);
    ASSERT_THAT((*ram)->Step(batches), IsOk());
    ASSERT_THAT((*tier)->Step(batches), IsOk());
  }
  const std::string exp_avg_path = (*tier)->nvme_moments()->path(MomentKind::kExpAvg);
  const std::string exp_avg_sq_path = (*tier)->nvme_moments()->path(MomentKind::kExpAvgSq);
  tier->reset();  // no WaitForOptimizer: the destructor drains
  ASSERT_THAT((*ram)->WaitForOptimizer(), IsOk());
  const HostStore& store = (*ram)->store();
  const std::vector<float> m = ReadMomentFile(exp_avg_path, store.arena_numel());
  const std::vector<float> v = ReadMomentFile(exp_avg_sq_path, store.arena_numel());
  for (int64_t b = 0; b < store.num_blocks(); ++b) {
    const size_t bytes = static_cast<size_t>(store.block_numel(b)) * 4;
    EXPECT_EQ(std::memcmp(m.data() + store.block_offset(b), store.exp_avg(b), bytes), 0)
        << "exp_avg of block " << b;
    EXPECT_EQ(std::memcmp(v.data() + store.block_offset(b), store.exp_avg_sq(b), bytes), 0)
        << "exp_avg_sq of block " << b;
  }
  ASSERT_THAT(RemoveTree(tier_options.nvme_dir), IsOk());
  EXPECT_NE(::access(tier_options.nvme_dir.c_str(), F_OK), 0);
}

TEST(TieredTrainerTest, ResidentLayersWithTheTierAreInvalidArgument) {
  TrainerOptions o = Options(1.0);
  o.nvme_dir = MakeTempDir("tier");
  o.resident_layers = 1;
  EXPECT_THAT(Trainer::Create(SmallLlama(), o, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NVMe tier")));
}

}  // namespace
}  // namespace megatrain::engine
