// Tests of engine::EstimateFootprintFromHfConfig (engine/job/training_job.h):
// the footprint of an hf_dir model sized from config.json text the caller
// read (the daemon's input preflight) equals the one EstimateFootprint
// computes by reading the file, and a bad text is an error naming the field.
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/model/model_config.h"
#include "engine/job/training_job.h"
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

}  // namespace
}  // namespace megatrain::engine
