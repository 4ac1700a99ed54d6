// Tests of engine/formats/hf_model.h: HF export -> import round trips (fp32 bit
// for bit, bf16 equal to the rounded masters, sharded, tied embeddings),
// F16/BF16 inputs, and one test per kind of bad input (missing, unexpected,
// misshapen tensor, unsupported dtype, truncated or corrupt shard), each
// asserting the code and the name in the message.
#include "engine/formats/hf_model.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/runtime/bf16.h"
#include "engine/store/host_store.h"
#include "engine/model/model_config.h"
#include "engine/model/param_layout.h"
#include "engine/formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::ListDir;
using ::megatrain::testing::StatusIs;
using ::megatrain::testing::WriteFileBytes;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A 2-layer, hidden-64 Llama with GQA: big enough to have every tensor kind,
// small enough to run in milliseconds.
ModelConfig TinyConfig(bool tied = false) {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.tie_word_embeddings = tied;
  return c;
}

std::unique_ptr<HostStore> MakeStore(const ModelConfig& config, uint64_t seed,
                                     bool streaming_bf16 = false) {
  HostStoreOptions options;
  options.optimizer_state = false;
  options.streaming_bf16 = streaming_bf16;
  absl::StatusOr<std::unique_ptr<HostStore>> store = HostStore::Create(config, options);
  EXPECT_THAT(store, IsOk());
  if (seed != 0) (*store)->InitializeWeights(seed);
  return *std::move(store);
}

// Bit-for-bit equality of every block's master, padding included.
void ExpectMastersBitIdentical(const HostStore& expected, const HostStore& actual) {
  ASSERT_EQ(expected.num_blocks(), actual.num_blocks());
  for (int64_t block = 0; block < expected.num_blocks(); ++block) {
    ASSERT_EQ(expected.block_numel(block), actual.block_numel(block));
    EXPECT_EQ(std::memcmp(expected.master(block), actual.master(block),
                          expected.block_numel(block) * sizeof(float)),
              0)
        << "block " << block;
  }
}

// What to change when writing a model by hand.
struct Mutation {
  std::string omit;                                 // leave this tensor out
  std::string extra_name;                           // add this tensor (zeros) ...
  std::vector<int64_t> extra_shape;                 // ... of this shape
  std::string reshape_name;                         // write this tensor ...
  std::vector<int64_t> reshape_shape;               // ... with this shape (same numel)
  std::string dtype_name;                           // write this tensor ...
  SafetensorsDtype dtype = SafetensorsDtype::kF32;  // ... raw in this dtype
  bool add_lm_head_from_embedding = false;          // tied: also write lm_head.weight
  float lm_head_delta = 0.0f;                       // added to lm_head element 0
};

// Writes `store`'s masters as `dir`/model.safetensors, changed by `m`.
void WriteModel(const std::string& dir, const HostStore& store, const Mutation& m) {
  std::filesystem::create_directories(dir);
  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(dir + "/model.safetensors");
  ASSERT_THAT(writer, IsOk());
  std::vector<float> extra(1, 0.0f);
  std::vector<uint8_t> raw;
  std::vector<float> head;
  for (int64_t block = 0; block < store.num_blocks(); ++block) {
    for (const ParamSpec& p : store.layout().blocks[block].params) {
      if (p.hf_name == m.omit) continue;
      const float* data = store.master(block) + p.offset;
      if (p.hf_name == m.dtype_name) {
        raw.assign(p.numel * SafetensorsDtypeSizeBytes(m.dtype), 0);
        ASSERT_THAT(writer->AddBytes(p.hf_name, m.dtype, p.shape, raw), IsOk());
        continue;
      }
      const std::vector<int64_t> shape = p.hf_name == m.reshape_name ? m.reshape_shape : p.shape;
      ASSERT_THAT(writer->AddFloat32(p.hf_name, SafetensorsDtype::kF32, shape, data), IsOk());
      if (m.add_lm_head_from_embedding && p.hf_name == "model.embed_tokens.weight") {
        head.assign(data, data + p.numel);
        head[0] += m.lm_head_delta;
        ASSERT_THAT(
            writer->AddFloat32("lm_head.weight", SafetensorsDtype::kF32, p.shape, head.data()),
            IsOk());
      }
    }
  }
  if (!m.extra_name.empty()) {
    int64_t numel = 1;
    for (int64_t d : m.extra_shape) numel *= d;
    extra.assign(numel, 0.0f);
    ASSERT_THAT(
        writer->AddFloat32(m.extra_name, SafetensorsDtype::kF32, m.extra_shape, extra.data()),
        IsOk());
  }
  ASSERT_THAT(writer->Finish(), IsOk());
}

// float -> IEEE binary16 bits, for values that are exactly representable
// normal halves (the test data below is built to be).
uint16_t ExactFloatToHalf(float value) {
  if (value == 0.0f) return 0;
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t sign = bits >> 31;
  const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
  const uint32_t mantissa = bits & 0x7fffff;
  EXPECT_TRUE(exponent > 0 && exponent < 31 && (mantissa & 0x1fff) == 0) << value;
  return static_cast<uint16_t>((sign << 15) | (static_cast<uint32_t>(exponent) << 10) |
                               (mantissa >> 13));
}

TEST(HfModelTest, Fp32ExportImportRoundTripIsBitIdentical) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/1);
  const std::string out = dir + "/export";

  ASSERT_THAT(ExportHfDirectory(*source, out, ExportDtype::kFp32), IsOk());
  absl::StatusOr<ModelConfig> config = LoadHfConfig(out);
  ASSERT_THAT(config, IsOk());
  std::unique_ptr<HostStore> loaded = MakeStore(*config, /*seed=*/2);
  ASSERT_THAT(LoadHfWeights(out, loaded.get()), IsOk());

  EXPECT_THAT(ListDir(out),
              ::testing::ElementsAre("config.json", "generation_config.json", "model.safetensors"));
  EXPECT_EQ(config->torch_dtype, "float32");
  ModelConfig expected_config = source->config();
  expected_config.torch_dtype = "float32";
  EXPECT_EQ(config->ToHfConfigJson(), expected_config.ToHfConfigJson());
  ExpectMastersBitIdentical(*source, *loaded);
  // No temporary directory is left beside the export.
  EXPECT_THAT(ListDir(dir), ::testing::ElementsAre("export"));
}

TEST(HfModelTest, Bf16ExportEqualsRoundedMastersAndLoadsBack) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/3);
  const std::string out = dir + "/export";

  ASSERT_THAT(ExportHfDirectory(*source, out, ExportDtype::kBf16), IsOk());

  absl::StatusOr<SafetensorsModel> model = SafetensorsModel::Open(out);
  ASSERT_THAT(model, IsOk());
  EXPECT_EQ(model->num_tensors(), source->layout().blocks[1].params.size() * 2 + 3);
  for (int64_t block = 0; block < source->num_blocks(); ++block) {
    for (const ParamSpec& p : source->layout().blocks[block].params) {
      absl::StatusOr<SafetensorsModel::TensorRef> ref = model->Find(p.hf_name);
      ASSERT_THAT(ref, IsOk());
      EXPECT_EQ(ref->info->dtype, SafetensorsDtype::kBF16) << p.hf_name;
      std::vector<bf16_bits> expected(p.numel);
      for (int64_t i = 0; i < p.numel; ++i) {
        expected[i] = FloatToBf16(source->master(block)[p.offset + i]);
      }
      const absl::Span<const uint8_t> bytes = ref->file->Data(*ref->info);
      ASSERT_EQ(bytes.size(), expected.size() * 2) << p.hf_name;
      EXPECT_EQ(std::memcmp(bytes.data(), expected.data(), bytes.size()), 0) << p.hf_name;
    }
  }
  // Cross-dtype load: BF16 widens exactly, and the streaming copy is fresh.
  absl::StatusOr<ModelConfig> config = LoadHfConfig(out);
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->torch_dtype, "bfloat16");
  std::unique_ptr<HostStore> loaded = MakeStore(*config, 0, /*streaming_bf16=*/true);
  ASSERT_THAT(LoadHfWeights(out, loaded.get()), IsOk());
  for (int64_t block = 0; block < source->num_blocks(); ++block) {
    for (int64_t i = 0; i < source->block_numel(block); ++i) {
      const bf16_bits rounded = FloatToBf16(source->master(block)[i]);
      ASSERT_EQ(Bf16ToFloat(rounded), loaded->master(block)[i]) << "block " << block << " " << i;
      ASSERT_EQ(rounded, loaded->streaming_bf16(block)[i]) << "block " << block << " " << i;
    }
  }
}

TEST(HfModelTest, ShardedExportWritesIndexAndLoadsBack) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/4);
  const std::string out = dir + "/export";
  // 40 KB: the embedding (96 x 64 x 4 = 24 KB) and each 16 KB projection
  // cannot all share a shard, so the model splits into several.
  constexpr int64_t kMaxShardBytes = 40'000;

  ASSERT_THAT(ExportHfDirectory(*source, out, ExportDtype::kFp32, kMaxShardBytes), IsOk());

  const std::vector<std::string> names = ListDir(out);
  int num_shards = 0;
  for (const std::string& name : names) {
    if (name.rfind("model-", 0) == 0) ++num_shards;
  }
  ASSERT_GT(num_shards, 2);
  EXPECT_THAT(names, ::testing::Contains("model.safetensors.index.json"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("model.safetensors")));
  EXPECT_THAT(names,
              ::testing::Contains(absl::StrFormat("model-00001-of-%05d.safetensors", num_shards)));
  std::ifstream index_file(out + "/model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(index_file);
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), source->layout().ParamCount() * 4);
  EXPECT_EQ(index["weight_map"].size(),
            static_cast<size_t>(source->layout().blocks[1].params.size() * 2 + 3));
  for (const std::string& name : names) {
    if (name.rfind("model-", 0) != 0) continue;
    absl::StatusOr<SafetensorsFile> shard = SafetensorsFile::Open(out + "/" + name);
    ASSERT_THAT(shard, IsOk());
    // A shard exceeds the cap only when it holds one tensor that alone does.
    if (shard->tensors().size() > 1) {
      EXPECT_LE(shard->header().data_size_bytes, kMaxShardBytes) << name;
    }
  }

  absl::StatusOr<ModelConfig> config = LoadHfConfig(out);
  ASSERT_THAT(config, IsOk());
  std::unique_ptr<HostStore> loaded = MakeStore(*config, 0);
  ASSERT_THAT(LoadHfWeights(out, loaded.get()), IsOk());
  ExpectMastersBitIdentical(*source, *loaded);
}

TEST(HfModelTest, TiedEmbeddingsRoundTripWithoutLmHead) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(/*tied=*/true), /*seed=*/5);
  const std::string out = dir + "/export";

  ASSERT_THAT(ExportHfDirectory(*source, out, ExportDtype::kFp32), IsOk());
  absl::StatusOr<ModelConfig> config = LoadHfConfig(out);
  ASSERT_THAT(config, IsOk());
  std::unique_ptr<HostStore> loaded = MakeStore(*config, 0);
  ASSERT_THAT(LoadHfWeights(out, loaded.get()), IsOk());

  EXPECT_TRUE(config->tie_word_embeddings);
  absl::StatusOr<SafetensorsModel> model = SafetensorsModel::Open(out);
  ASSERT_THAT(model, IsOk());
  EXPECT_FALSE(model->Contains("lm_head.weight"));
  ExpectMastersBitIdentical(*source, *loaded);
}

TEST(HfModelTest, TiedModelAcceptsLmHeadEqualToEmbedding) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(/*tied=*/true), /*seed=*/6);
  Mutation m;
  m.add_lm_head_from_embedding = true;
  WriteModel(dir, *source, m);
  std::unique_ptr<HostStore> loaded = MakeStore(source->config(), 0);

  ASSERT_THAT(LoadHfWeights(dir, loaded.get()), IsOk());

  ExpectMastersBitIdentical(*source, *loaded);
}

TEST(HfModelTest, TiedModelRefusesLmHeadThatDiffersFromEmbedding) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(/*tied=*/true), /*seed=*/7);
  Mutation m;
  m.add_lm_head_from_embedding = true;
  m.lm_head_delta = 1.0f;
  WriteModel(dir, *source, m);
  std::unique_ptr<HostStore> loaded = MakeStore(source->config(), 0);

  EXPECT_THAT(LoadHfWeights(dir, loaded.get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("lm_head.weight"), HasSubstr("tie_word_embeddings"))));
}

TEST(HfModelTest, F16AndBf16TensorsWidenExactly) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> expected = MakeStore(TinyConfig(), 0);
  // Values k/64 for k in [-16, 16]: exact in F16 and BF16 (5 mantissa bits).
  std::vector<std::vector<uint16_t>> encoded;
  {
    absl::StatusOr<SafetensorsWriter> writer =
        SafetensorsWriter::Create(dir + "/model.safetensors");
    ASSERT_THAT(writer, IsOk());
    int tensor_idx = 0;
    for (int64_t block = 0; block < expected->num_blocks(); ++block) {
      for (const ParamSpec& p : expected->layout().blocks[block].params) {
        const bool half = tensor_idx++ % 2 == 0;
        std::vector<uint16_t>& bits = encoded.emplace_back(p.numel);
        for (int64_t i = 0; i < p.numel; ++i) {
          const float value = static_cast<float>((i * 7 + block) % 33 - 16) / 64.0f;
          expected->master(block)[p.offset + i] = value;
          bits[i] = half ? ExactFloatToHalf(value) : FloatToBf16(value);
        }
        ASSERT_THAT(writer->AddBytes(
                        p.hf_name, half ? SafetensorsDtype::kF16 : SafetensorsDtype::kBF16, p.shape,
                        absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bits.data()),
                                                  bits.size() * 2)),
                    IsOk());
      }
    }
    ASSERT_THAT(writer->Finish(), IsOk());
  }
  std::unique_ptr<HostStore> loaded = MakeStore(TinyConfig(), /*seed=*/8);

  ASSERT_THAT(LoadHfWeights(dir, loaded.get()), IsOk());

  ExpectMastersBitIdentical(*expected, *loaded);
}

TEST(HfModelTest, RotaryInvFreqBufferIsIgnored) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/9);
  Mutation m;
  m.extra_name = "model.layers.0.self_attn.rotary_emb.inv_freq";
  m.extra_shape = {8};
  WriteModel(dir, *source, m);
  std::unique_ptr<HostStore> loaded = MakeStore(source->config(), 0);

  ASSERT_THAT(LoadHfWeights(dir, loaded.get()), IsOk());

  ExpectMastersBitIdentical(*source, *loaded);
}

TEST(HfModelTest, MissingTensorIsNotFoundAndLeavesStoreUntouched) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/10);
  Mutation m;
  m.omit = "model.layers.1.mlp.down_proj.weight";
  WriteModel(dir, *source, m);
  std::unique_ptr<HostStore> loaded = MakeStore(source->config(), /*seed=*/11);
  std::unique_ptr<HostStore> untouched = MakeStore(source->config(), /*seed=*/11);

  EXPECT_THAT(LoadHfWeights(dir, loaded.get()),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("'model.layers.1.mlp.down_proj.weight'"), HasSubstr(dir),
                             HasSubstr("[64, 128]"))));
  ExpectMastersBitIdentical(*untouched, *loaded);
}

TEST(HfModelTest, UnexpectedTensorIsInvalidArgument) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/12);
  Mutation m;
  m.extra_name = "model.layers.2.mlp.up_proj.weight";  // a third layer
  m.extra_shape = {128, 64};
  WriteModel(dir, *source, m);
  std::unique_ptr<HostStore> loaded = MakeStore(source->config(), 0);

  EXPECT_THAT(LoadHfWeights(dir, loaded.get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("unexpected tensor 'model.layers.2.mlp.up_proj.weight'"),
                             HasSubstr(dir))));
}

TEST(HfModelTest, TiedConfigRefusesUntiedCheckpoint) {
  // An untied checkpoint loaded with a tied config: lm_head.weight is there
  // but differs from the embedding, so it is reported, not silently dropped.
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> untied = MakeStore(TinyConfig(/*tied=*/false), /*seed=*/13);
  WriteModel(dir, *untied, Mutation{});
  std::unique_ptr<HostStore> tied = MakeStore(TinyConfig(/*tied=*/true), 0);

  EXPECT_THAT(LoadHfWeights(dir, tied.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lm_head.weight")));
}

TEST(HfModelTest, ShapeMismatchIsInvalidArgumentNamingBothShapes) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/14);
  Mutation m;
  m.reshape_name = "model.layers.0.self_attn.q_proj.weight";
  m.reshape_shape = {32, 128};
  WriteModel(dir, *source, m);
  std::unique_ptr<HostStore> loaded = MakeStore(source->config(), 0);

  EXPECT_THAT(LoadHfWeights(dir, loaded.get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'model.layers.0.self_attn.q_proj.weight'"),
                             HasSubstr("shape [32, 128]"), HasSubstr("expects [64, 64]"))));
}

TEST(HfModelTest, UnsupportedDtypeIsUnimplemented) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/15);
  Mutation m;
  m.dtype_name = "model.norm.weight";
  m.dtype = SafetensorsDtype::kI32;
  WriteModel(dir, *source, m);
  std::unique_ptr<HostStore> loaded = MakeStore(source->config(), 0);

  EXPECT_THAT(LoadHfWeights(dir, loaded.get()),
              StatusIs(absl::StatusCode::kUnimplemented,
                       AllOf(HasSubstr("'model.norm.weight'"), HasSubstr("I32"))));
}

TEST(HfModelTest, TruncatedShardIsDataLossNamingTheShard) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/16);
  const std::string out = dir + "/export";
  ASSERT_THAT(ExportHfDirectory(*source, out, ExportDtype::kBf16, /*max_shard_bytes=*/20'000),
              IsOk());
  std::string shard;
  for (const std::string& name : ListDir(out)) {
    if (name.rfind("model-00002-of-", 0) == 0) shard = out + "/" + name;
  }
  ASSERT_FALSE(shard.empty());
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 10);
  std::unique_ptr<HostStore> loaded = MakeStore(source->config(), 0);

  EXPECT_THAT(LoadHfWeights(out, loaded.get()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("model-00002-of-")));
}

TEST(HfModelTest, CorruptHeaderIsDataLossNamingTheFile) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/17);
  WriteModel(dir, *source, Mutation{});
  {
    // Byte 8 is the header's opening '{'.
    std::fstream file(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(8);
    file.put('x');
  }
  std::unique_ptr<HostStore> loaded = MakeStore(source->config(), 0);

  EXPECT_THAT(LoadHfWeights(dir, loaded.get()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("model.safetensors")));
}

TEST(HfModelTest, MissingDirectoryIsNotFound) {
  std::unique_ptr<HostStore> store = MakeStore(TinyConfig(), 0);
  const std::string dir = testing::MakeTempDir("hf_model_test") + "/nope";

  EXPECT_THAT(LoadHfWeights(dir, store.get()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir)));
  EXPECT_THAT(LoadHfConfig(dir), StatusIs(absl::StatusCode::kNotFound, HasSubstr("config.json")));
}

TEST(HfModelTest, ExportRefusesNonEmptyDirectory) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/18);
  std::filesystem::create_directories(dir + "/export");
  std::ofstream(dir + "/export/keep.txt") << "mine";

  EXPECT_THAT(ExportHfDirectory(*source, dir + "/export", ExportDtype::kFp32),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("export")));
  EXPECT_THAT(ListDir(dir + "/export"), ::testing::ElementsAre("keep.txt"));
  // An existing empty directory is fine.
  std::filesystem::create_directories(dir + "/empty");
  EXPECT_THAT(ExportHfDirectory(*source, dir + "/empty", ExportDtype::kFp32), IsOk());
}

// Issue 14: temporaries are deleted only when the writer made them; a
// user's entry named like one is left alone.
TEST(HfModelTest, ExportLeavesAnEntryNamedLikeItsTemporaryAlone) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/19);
  std::filesystem::create_directories(dir + "/.export.tmp.abc123");
  std::ofstream(dir + "/.export.tmp.abc123/model.safetensors") << "mine";

  ASSERT_THAT(ExportHfDirectory(*source, dir + "/export", ExportDtype::kFp32), IsOk());

  EXPECT_THAT(ListDir(dir), ::testing::ElementsAre(".export.tmp.abc123", "export"));
  EXPECT_THAT(ListDir(dir + "/export"),
              ::testing::ElementsAre("config.json", "generation_config.json", "model.safetensors"));
}

// Issue 14: an export never writes through a symbolic link at its target.
TEST(HfModelTest, ExportRefusesASymbolicLinkAtItsTargetAndWritesNothingOutside) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  const std::string outside = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/20);
  std::filesystem::create_directory_symlink(outside, dir + "/export");

  EXPECT_THAT(ExportHfDirectory(*source, dir + "/export", ExportDtype::kFp32),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("not an empty directory")));
  EXPECT_THAT(ListDir(outside), ::testing::IsEmpty());
  // The export's parent itself a link: refused, nothing written through it.
  std::filesystem::create_directory_symlink(outside, dir + "/parent");
  EXPECT_THAT(ExportHfDirectory(*source, dir + "/parent/export", ExportDtype::kFp32),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("symbolic link")));
  EXPECT_THAT(ListDir(outside), ::testing::IsEmpty());
  EXPECT_THAT(ListDir(dir), ::testing::ElementsAre("export", "parent"));
}

// Issue 14: the whole path from the root is walked through directory
// descriptors; a link at an upper component (here two levels above the
// export) fails the export and nothing is written through it.
TEST(HfModelTest, ExportRefusesASymbolicLinkAtAnUpperComponent) {
  // Normalised: messages name the path as the walk from the root spells it.
  const std::string dir =
      std::filesystem::path(testing::MakeTempDir("hf_model_test")).lexically_normal().string();
  const std::string outside = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/21);
  std::filesystem::create_directories(outside + "/b");
  std::filesystem::create_directory_symlink(outside, dir + "/a");

  // From the default root "/" and from an explicit root alike.
  EXPECT_THAT(ExportHfDirectory(*source, dir + "/a/b/export", ExportDtype::kFp32),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(dir + "/a"), HasSubstr("symbolic link"))));
  EXPECT_THAT(ExportHfDirectory(*source, dir + "/a/b/c/export", ExportDtype::kFp32,
                                kDefaultMaxShardBytes, dir),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("symbolic link")));
  EXPECT_THAT(ListDir(outside), ::testing::ElementsAre("b"));
  EXPECT_THAT(ListDir(outside + "/b"), ::testing::IsEmpty());

  // The same path with a real directory there: missing parents are made.
  std::filesystem::remove(dir + "/a");
  ASSERT_THAT(ExportHfDirectory(*source, dir + "/a/b/c/export", ExportDtype::kFp32,
                                kDefaultMaxShardBytes, dir),
              IsOk());
  EXPECT_THAT(ListDir(dir + "/a/b/c/export"),
              ::testing::ElementsAre("config.json", "generation_config.json", "model.safetensors"));
}

TEST(HfModelTest, ExportRefusesAPathOutsideItsRootOrNotAbsolute) {
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(TinyConfig(), /*seed=*/22);

  EXPECT_THAT(ExportHfDirectory(*source, "/elsewhere/export", ExportDtype::kFp32,
                                kDefaultMaxShardBytes, dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not lie below the export root")));
  EXPECT_THAT(ExportHfDirectory(*source, dir, ExportDtype::kFp32, kDefaultMaxShardBytes, dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not lie below the export root")));
  EXPECT_THAT(ExportHfDirectory(*source, "relative/export", ExportDtype::kFp32),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be an absolute path")));
  EXPECT_THAT(ExportHfDirectory(*source, dir + "/x/../export", ExportDtype::kFp32),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'..'")));
  EXPECT_THAT(ListDir(dir), ::testing::IsEmpty());
}

TEST(HfModelTest, ParseExportDtype) {
  EXPECT_THAT(ParseExportDtype("bf16"), IsOk());
  EXPECT_EQ(*ParseExportDtype("float32"), ExportDtype::kFp32);
  EXPECT_THAT(ParseExportDtype("int8"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dtype: must be bf16 or fp32, got 'int8'")));
}

// --- Families beyond Llama, on the tiny models transformers wrote
// (tests/testdata/hf/<family>/, make_hf_fixtures.py). ---

std::string FixtureDir(const std::string& family) {
  return std::string(MEGATRAIN_TESTDATA_DIR) + "/hf/" + family;
}

class HfFamilyRoundTripTest : public ::testing::TestWithParam<std::string> {};

// Load what save_pretrained wrote, export fp32: the same tensor names
// (Gemma's four norms, Phi-3's fused qkv_proj / gate_up_proj), shapes and
// bytes as transformers' file, and a config.json the engine reads back to
// the same architecture.
TEST_P(HfFamilyRoundTripTest, ExportHasTransformersNamesAndBytes) {
  const std::string dir = FixtureDir(GetParam());
  auto config = LoadHfConfig(dir);
  ASSERT_THAT(config, IsOk());
  std::unique_ptr<HostStore> store = MakeStore(*config, 0);
  ASSERT_THAT(LoadHfWeights(dir, store.get()), IsOk());
  const std::string out = testing::MakeTempDir("hf_model_test") + "/export";
  ASSERT_THAT(ExportHfDirectory(*store, out, ExportDtype::kFp32), IsOk());

  auto original = SafetensorsModel::Open(dir);
  auto exported = SafetensorsModel::Open(out);
  ASSERT_THAT(original, IsOk());
  ASSERT_THAT(exported, IsOk());
  EXPECT_EQ(exported->TensorNames(), original->TensorNames());
  for (const std::string& name : original->TensorNames()) {
    auto a = original->Find(name);
    auto b = exported->Find(name);
    ASSERT_THAT(b, IsOk()) << name;
    EXPECT_EQ(b->info->shape, a->info->shape) << name;
    absl::Span<const uint8_t> bytes_a = a->file->Data(*a->info), bytes_b = b->file->Data(*b->info);
    EXPECT_TRUE(bytes_a.size() == bytes_b.size() &&
                std::memcmp(bytes_a.data(), bytes_b.data(), bytes_a.size()) == 0)
        << name;
  }
  auto again = LoadHfConfig(out);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->model_type, config->model_type);
  EXPECT_EQ(again->ParamCount(), config->ParamCount());
  EXPECT_EQ(again->layer_types, config->layer_types);
  EXPECT_EQ(again->norm_kind, config->norm_kind);
  EXPECT_EQ(again->attn_logit_softcapping, config->attn_logit_softcapping);
  EXPECT_EQ(again->final_logit_softcapping, config->final_logit_softcapping);
  EXPECT_EQ(again->rope_local_base_freq, config->rope_local_base_freq);
  EXPECT_EQ(again->partial_rotary_factor, config->partial_rotary_factor);
  EXPECT_EQ(again->rope_scaling.type, config->rope_scaling.type);
  EXPECT_EQ(again->rope_scaling.long_factor, config->rope_scaling.long_factor);
  EXPECT_EQ(again->rope_scaling.original_max_position_embeddings,
            config->rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(again->EmbeddingPaddingIdx(), config->EmbeddingPaddingIdx());
  std::unique_ptr<HostStore> reloaded = MakeStore(*again, 0);
  ASSERT_THAT(LoadHfWeights(out, reloaded.get()), IsOk());
  ExpectMastersBitIdentical(*store, *reloaded);
}

INSTANTIATE_TEST_SUITE_P(Families, HfFamilyRoundTripTest,
                         ::testing::Values("gemma2", "gemma3_text", "phi3", "phi3_longrope"));

TEST(HfModelTest, GemmaMissingPostFeedforwardNormIsNotFoundNamingIt) {
  auto config = LoadHfConfig(FixtureDir("gemma2"));
  ASSERT_THAT(config, IsOk());
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(*config, /*seed=*/21);
  Mutation m;
  m.omit = "model.layers.1.post_feedforward_layernorm.weight";
  WriteModel(dir, *source, m);
  std::unique_ptr<HostStore> loaded = MakeStore(*config, 0);
  EXPECT_THAT(LoadHfWeights(dir, loaded.get()),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("'model.layers.1.post_feedforward_layernorm.weight'"),
                             HasSubstr("[32]"))));
}

TEST(HfModelTest, PhiFusedTensorOfAnotherHeadDimIsRefusedNamingIt) {
  // config.json says head_dim 8; a checkpoint made with head_dim 16 has a
  // qkv_proj of (4 + 2 * 2) * 16 rows.
  auto config = LoadHfConfig(FixtureDir("phi3"));
  ASSERT_THAT(config, IsOk());
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(*config, /*seed=*/22);
  Mutation m;
  m.omit = "model.layers.0.self_attn.qkv_proj.weight";
  m.extra_name = "model.layers.0.self_attn.qkv_proj.weight";
  m.extra_shape = {128, 32};
  WriteModel(dir, *source, m);
  std::unique_ptr<HostStore> loaded = MakeStore(*config, 0);
  EXPECT_THAT(LoadHfWeights(dir, loaded.get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'model.layers.0.self_attn.qkv_proj.weight'"),
                             HasSubstr("shape [128, 32]"), HasSubstr("expects [64, 32]"))));
}

TEST(HfModelTest, PhiSeparateProjectionsAreUnexpected) {
  // A Llama-style q_proj in a Phi-3 checkpoint is not silently ignored.
  auto config = LoadHfConfig(FixtureDir("phi3"));
  ASSERT_THAT(config, IsOk());
  const std::string dir = testing::MakeTempDir("hf_model_test");
  std::unique_ptr<HostStore> source = MakeStore(*config, /*seed=*/23);
  Mutation m;
  m.extra_name = "model.layers.0.self_attn.q_proj.weight";
  m.extra_shape = {32, 32};
  WriteModel(dir, *source, m);
  std::unique_ptr<HostStore> loaded = MakeStore(*config, 0);
  EXPECT_THAT(LoadHfWeights(dir, loaded.get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unexpected tensor 'model.layers.0.self_attn.q_proj.weight'")));
}

TEST(HfModelTest, Gemma3MultimodalCheckpointLoadsItsTextTower) {
  // A gemma3 (image-text) checkpoint as transformers 5 names it: the text
  // tower under model.language_model., the vision tower beside it.
  auto config = LoadHfConfig(FixtureDir("gemma3_text"));
  ASSERT_THAT(config, IsOk());
  std::unique_ptr<HostStore> source = MakeStore(*config, 0);
  ASSERT_THAT(LoadHfWeights(FixtureDir("gemma3_text"), source.get()), IsOk());
  const std::string dir = testing::MakeTempDir("hf_model_test");
  {
    absl::StatusOr<SafetensorsWriter> writer =
        SafetensorsWriter::Create(dir + "/model.safetensors");
    ASSERT_THAT(writer, IsOk());
    for (int64_t block = 0; block < source->num_blocks(); ++block) {
      for (const ParamSpec& p : source->layout().blocks[block].params) {
        const std::string name = "model.language_model." + p.hf_name.substr(6);  // after "model."
        ASSERT_THAT(writer->AddFloat32(name, SafetensorsDtype::kF32, p.shape,
                                       source->master(block) + p.offset),
                    IsOk());
      }
    }
    std::vector<float> vision(16, 1.0f);
    ASSERT_THAT(writer->AddFloat32("model.vision_tower.patch_embed.weight", SafetensorsDtype::kF32,
                                   {4, 4}, vision.data()),
                IsOk());
    ASSERT_THAT(writer->Finish(), IsOk());
  }
  ModelConfig multimodal = *config;
  multimodal.multimodal_checkpoint = true;
  std::unique_ptr<HostStore> loaded = MakeStore(multimodal, 0);
  ASSERT_THAT(LoadHfWeights(dir, loaded.get()), IsOk());
  ExpectMastersBitIdentical(*source, *loaded);
  // Read as a text model, the same file is refused, naming the tensor.
  std::unique_ptr<HostStore> text_only = MakeStore(*config, 0);
  EXPECT_THAT(LoadHfWeights(dir, text_only.get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unexpected tensor 'model.language_model.")));
}

// A Gemma checkpoint whose projections or q/k norms were made with another
// head_dim than config.json's (16) is refused naming the tensor and both
// shapes, not reshaped.
TEST(HfModelTest, GemmaTensorsOfAnotherHeadDimAreRefusedNamingThem) {
  struct Case {
    const char* family;
    const char* tensor;
    std::vector<int64_t> shape;  // as made with head_dim 8
    const char* expected;
  };
  for (const Case& c :
       {Case{"gemma2", "model.layers.2.self_attn.q_proj.weight", {32, 32}, "expects [64, 32]"},
        Case{"gemma3_text", "model.layers.0.self_attn.k_norm.weight", {8}, "expects [16]"}}) {
    SCOPED_TRACE(c.tensor);
    auto config = LoadHfConfig(FixtureDir(c.family));
    ASSERT_THAT(config, IsOk());
    const std::string dir = testing::MakeTempDir("hf_model_test");
    std::unique_ptr<HostStore> source = MakeStore(*config, /*seed=*/24);
    Mutation m;
    m.omit = c.tensor;
    m.extra_name = c.tensor;
    m.extra_shape = c.shape;
    WriteModel(dir, *source, m);
    std::unique_ptr<HostStore> loaded = MakeStore(*config, 0);
    EXPECT_THAT(
        LoadHfWeights(dir, loaded.get()),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr(absl::StrCat("'", c.tensor, "'")), HasSubstr(c.expected))));
  }
}

}  // namespace
}  // namespace megatrain::engine
