// Tests of engine::EstimateFootprintFromHfConfig (engine/job/training_job.h):
// the footprint of an hf_dir model sized from config.json text the caller
// read (the daemon's input preflight) equals the one EstimateFootprint
// computes by reading the file, and a bad text is an error naming the field.
// Also the footprint's bytes by kind for each memory mode of one small
// model, computed here from the layout rules and the buffers' definitions
// (issue 19's bytes per parameter), and its one-line description.
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/model/model_config.h"
#include "engine/job/training_job.h"
#include "engine/step/grad_lander.h"
#include "engine/step/executor.h"
#include "engine/step/schedule_choice.h"
#include "engine/store/nvme_tier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeTempDir;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(FootprintFromConfigTest, MatchesTheFootprintReadFromDisk) {
  ModelConfig config;
  config.model_type = "llama";
  config.vocab_size = 256;
  config.hidden_size = 64;
  config.intermediate_size = 128;
  config.num_hidden_layers = 3;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 16;
  const std::string text = config.ToHfConfigJson();
  const std::string hf_dir = MakeTempDir();
  std::ofstream(hf_dir + "/config.json") << text;
  JobSpec spec;
  spec.model.hf_dir = hf_dir;
  spec.train.micro_batch = 2;
  spec.train.seq_len = 32;
  absl::StatusOr<MemoryFootprint> from_disk = EstimateFootprint(spec);
  absl::StatusOr<MemoryFootprint> from_text = EstimateFootprintFromHfConfig(spec, text);
  ASSERT_THAT(from_disk, IsOk());
  ASSERT_THAT(from_text, IsOk());
  EXPECT_EQ(from_text->params, from_disk->params);
  EXPECT_EQ(from_text->host_total_bytes, from_disk->host_total_bytes);
  EXPECT_EQ(from_text->host.master, from_disk->host.master);
  // The file is not read: a different text gives a different answer.
  config.num_hidden_layers = 4;
  absl::StatusOr<MemoryFootprint> bigger =
      EstimateFootprintFromHfConfig(spec, config.ToHfConfigJson());
  ASSERT_THAT(bigger, IsOk());
  EXPECT_GT(bigger->params, from_disk->params);
}

TEST(FootprintFromConfigTest, BadTextNamesTheField) {
  JobSpec spec;
  spec.model.hf_dir = "/nowhere/model";
  spec.train.micro_batch = 1;
  spec.train.seq_len = 8;
  EXPECT_THAT(
      EstimateFootprintFromHfConfig(spec, "{not json"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/nowhere/model/config.json")));
}

// Llama, vocab 1024, hidden 64, MLP 128, 4 layers, 4 heads of 16, 2 kv
// heads, untied: every parameter a multiple of the 64-element alignment,
// so blocks have no inner padding.
ModelConfig Small() {
  ModelConfig config;
  config.model_type = "llama";
  config.vocab_size = 1024;
  config.hidden_size = 64;
  config.intermediate_size = 128;
  config.num_hidden_layers = 4;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 16;
  config.tie_word_embeddings = false;
  return config;
}

// Elements of Small()'s blocks, from the shapes (param_layout.cc's order):
constexpr int64_t kEmbedding = 1024 * 64;  // embed_tokens [V, C]
// input norm C, q [H*Dh, C], k and v [KV*Dh, C], o [C, H*Dh], post norm C,
// gate, up [F, C], down [C, F].
constexpr int64_t kLayer = 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 64 + 3 * 128 * 64;
constexpr int64_t kHead = 64 + 1024 * 64;  // model.norm C, lm_head [V, C]
static_assert(kLayer == 36992);
// The store's arenas put every block at a multiple of 1024 elements (4
// KiB): 65536 + 4 x 37888 + 66560.
constexpr int64_t kArena = 65536 + 4 * 37888 + 66560;
constexpr int64_t kParams = kEmbedding + 4 * kLayer + kHead;
constexpr int64_t kTokens = 2 * 32;  // micro_batch x seq_len

JobSpec SmallSpec(ComputeDtype dtype, WeightStream stream, GradientLanding landing, double clip) {
  JobSpec spec;
  spec.train.micro_batch = 2;
  spec.train.seq_len = 32;
  spec.train.compute_dtype = dtype;
  spec.train.max_grad_norm = clip;
  spec.memory.weight_stream = stream;
  spec.memory.gradient_landing = landing;
  return spec;
}

// Pinned staging of the executor the footprint plans (a GPU: layers 0-1
// and the untied embedding resident, so the head is the largest streamed
// block, and the embedding's rows and gradient never cross): an fp64 norm
// per gradient slot (2), the chunk ring of 8 x min(8 Mi, head) fp32 for
// host accumulation (none with the gradient ring, whose landings are
// whole), each token's int64 id and label, and the gradient ring.
int64_t Staging(int64_t ring_bytes) {
  // The two gradient slots' norms and the resident norm ring (Note
  // [Resident norm ring] in engine/step/grad_lander.h).
  const int64_t norms = 2 * 8 + kResidentNormSlots * 8;
  const int64_t chunk_ring = ring_bytes > 0 ? 0 : kGradChunkBuffers * 4 * kHead;
  const int64_t inputs = kTokens * 16;
  return norms + chunk_ring + inputs + ring_bytes;
}

TEST(FootprintModesTest, BytesByKindForEachMode) {
  const ModelConfig config = Small();
  ASSERT_EQ(config.ParamCount(), kParams);
  struct Mode {
    const char* name;
    JobSpec spec;
    int64_t grad, streaming, ring;
    int64_t cast_ring = 0;  // weight_stream host_cast: its pinned ring (Note [Host cast])
  };
  // Gradient ring (Note [Gradient ring]): kGradRingBuffers buffers of the
  // largest streamed block but the head (layers 2-3), whatever the
  // vocabulary (the head lands in pieces); no embedding gradient (resident
  // on the device).
  const int64_t ring = kGradRingBuffers * 4 * kLayer;
  const Mode modes[] = {
      {"bf16 copy, arena, clipping",
       SmallSpec(ComputeDtype::kBf16, WeightStream::kBf16, GradientLanding::kArena, 1.0),
       4 * kArena, 2 * kArena, 0},
      {"bf16 fp32 stream, arena, clipping",
       SmallSpec(ComputeDtype::kBf16, WeightStream::kFp32, GradientLanding::kArena, 1.0),
       4 * kArena, 0, 0},
      {"bf16 fp32 stream, ring",
       SmallSpec(ComputeDtype::kBf16, WeightStream::kFp32, GradientLanding::kRing, 0.0), 0, 0,
       ring},
      {"bf16 copy, ring",
       SmallSpec(ComputeDtype::kBf16, WeightStream::kBf16, GradientLanding::kRing, 0.0), 0,
       2 * kArena, ring},
      {"fp32, auto without clipping (ring)",
       SmallSpec(ComputeDtype::kFp32, WeightStream::kBf16, GradientLanding::kAuto, 0.0), 0, 0,
       ring},
      // The host cast's ring holds the largest streamed block (the head,
      // below one 4 Mi-element chunk: one buffer of it) and one chunk more:
      // two buffers of kHead bf16 elements (a multiple of 64: no padding).
      {"bf16 host cast, arena, clipping",
       SmallSpec(ComputeDtype::kBf16, WeightStream::kHostCast, GradientLanding::kArena, 1.0),
       4 * kArena, 0, 0, 2 * kHead * 2},
      {"bf16 host cast, ring",
       SmallSpec(ComputeDtype::kBf16, WeightStream::kHostCast, GradientLanding::kRing, 0.0), 0, 0,
       ring, 2 * kHead * 2},
  };
  for (const Mode& mode : modes) {
    SCOPED_TRACE(mode.name);
    const MemoryFootprint f = EstimateFootprintForConfig(mode.spec, config);
    EXPECT_EQ(f.params, kParams);
    EXPECT_EQ(f.host.master, 4 * kArena);
    EXPECT_EQ(f.host.grad, mode.grad);
    EXPECT_EQ(f.host.exp_avg, 4 * kArena);
    EXPECT_EQ(f.host.exp_avg_sq, 4 * kArena);
    EXPECT_EQ(f.host.streaming, mode.streaming);
    EXPECT_EQ(f.gradient_ring_bytes, mode.ring);
    EXPECT_EQ(f.host.staging, Staging(mode.ring) + mode.cast_ring);
    // The resident embedding has no lookahead buffers.
    EXPECT_EQ(f.embedding_lookahead_bytes, 0);
    EXPECT_EQ(f.host_total_bytes,
              4 * kArena * 3 + mode.grad + mode.streaming + Staging(mode.ring) + mode.cast_ring);
    EXPECT_EQ(f.nvme_bytes, 0);
    // The moments on NVMe: 8 bytes per arena element on disk, the tier's
    // staging in memory.
    const MemoryFootprint tiered = WithNvmeMoments(f, config, 1);
    EXPECT_EQ(tiered.nvme_bytes, 8 * kArena);
    EXPECT_EQ(tiered.host.exp_avg + tiered.host.exp_avg_sq, 0);
    EXPECT_EQ(tiered.host_total_bytes, f.host_total_bytes - 8 * kArena + NvmeTierStagingBytes());
  }
}

// Tied embeddings are never planned resident: the ring keeps the table's
// gradient in host memory (its scatter-add), the table visits a slot as
// lm_head (the largest streamed block) but never the ring, whose buffers
// are then all a decoder layer's.
TEST(FootprintModesTest, TiedEmbeddingKeepsItsGradientAndLeavesTheRingToTheLayers) {
  ModelConfig config = Small();
  config.tie_word_embeddings = true;
  const MemoryFootprint f = EstimateFootprintForConfig(
      SmallSpec(ComputeDtype::kBf16, WeightStream::kFp32, GradientLanding::kRing, 0.0), config);
  const int64_t tied_head = 1024;  // model.norm's 64 elements, one 4 KiB block in the arena
  const int64_t arena = 65536 + 4 * 37888 + tied_head;
  EXPECT_EQ(f.params, kEmbedding + 4 * kLayer + 64);
  EXPECT_EQ(f.host.master, 4 * arena);
  EXPECT_EQ(f.host.grad, 4 * kEmbedding);
  EXPECT_EQ(f.gradient_ring_bytes, kGradRingBuffers * 4 * kLayer);
  // The table is on the host: its d hidden_0 is staged per gradient slot
  // and the inputs carry its gathered fp32 rows; no chunk ring.
  const int64_t staging = 2 * (kTokens * 64 * 4 + 8) + kTokens * (64 * 4 + 8) +
                          kGradRingBuffers * 4 * kLayer + kResidentNormSlots * 8;
  EXPECT_EQ(f.host.staging, staging);
  EXPECT_EQ(f.embedding_lookahead_bytes, 0);
}

// Every buffer holds the largest streamed decoder layer, whatever the head
// (which lands in pieces when larger); when every layer is resident, the
// model's largest layer or the head, whichever is smaller.
TEST(FootprintModesTest, GradRingNumels) {
  ASSERT_EQ(kGradRingBuffers, 3);
  EXPECT_EQ(GradRingNumels({5, 7, 7}, 9, 7), (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(GradRingNumels({5}, 3, 8), (std::vector<int64_t>{5, 5, 5}));
  EXPECT_EQ(GradRingNumels({}, 9, 7), (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(GradRingNumels({}, 4, 7), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(GradRingNumels({}, 4, 0), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_TRUE(GradRingNumels({}, 0, 0).empty());
}

TEST(FootprintModesTest, DescriptionGivesBytesPerParameterByKind) {
  MemoryFootprint f;
  f.params = 1000;
  f.host.master = 4000;
  f.host.exp_avg = 4000;
  f.host.exp_avg_sq = 4000;
  f.host.staging = 140;
  f.gradient_ring_bytes = 100;
  f.host_total_bytes = 12140;
  EXPECT_EQ(DescribeHostBytesPerParam(f),
            "host 12.14 bytes/param = master 4.00 + grad 0.00 + exp_avg 4.00 + exp_avg_sq 4.00 + "
            "streaming 0.00 + staging 0.14 (gradient ring 0.10) + lookahead 0.00");
  f.nvme_bytes = 8000;  // the moments on the tier
  EXPECT_THAT(DescribeHostBytesPerParam(f), HasSubstr("NVMe 8.00 bytes/param"));
}

// Note [Loss working bytes] (engine/step/schedule_choice.h): the logits of a
// micro-batch, one loss chunk at a time, in the device estimate (issue 35: a
// tiny job of micro_batch 4096 x seq_len 256 holds gigabytes of them).
TEST(FootprintLossTest, CountsTheLogitsOfAMicroBatch) {
  const ModelConfig tiny = *PresetConfig("tiny");
  ASSERT_EQ(tiny.vocab_size, 512);
  const int64_t tokens = int64_t{4096} * 256;  // 1,048,576
  // The auto chunk is 2^30 / (4 x 512) = 524,288 rows, below the
  // micro-batch's tokens; each row holds V logits in fp32 (compute dtype
  // fp32: 4 bytes), again in fp32, their log-softmax and gradient (12).
  const int64_t chunk_bytes = int64_t{524288} * 512 * (4 + 12);  // 4 GiB
  EXPECT_EQ(LossWorkingBytes(tiny, ComputeDtype::kFp32, tokens), chunk_bytes);
  // bf16 logits take 2 bytes; a micro-batch below a chunk holds all rows.
  EXPECT_EQ(LossWorkingBytes(tiny, ComputeDtype::kBf16, 256), int64_t{256} * 512 * (2 + 12));
  // An explicit chunk (ExecutorOptions::loss_chunk_tokens) caps the rows.
  EXPECT_EQ(LossWorkingBytes(tiny, ComputeDtype::kFp32, tokens, 1024), int64_t{1024} * 512 * 16);

  JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.tokens = "/data/train.mtt";
  spec.train.max_steps = 1;
  spec.train.micro_batch = 4096;
  spec.train.seq_len = 256;
  absl::StatusOr<MemoryFootprint> f = EstimateFootprint(spec);
  ASSERT_THAT(f, IsOk());
  // At least the loss chunk and the layer working set (12 [B, T, F] fp32
  // tensors, F = 384) beside each other.
  EXPECT_GE(f->device_estimate_bytes, chunk_bytes + 12 * tokens * 384 * 4);
}

}  // namespace
}  // namespace megatrain::engine
