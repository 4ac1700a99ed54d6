// Tests of Note [Export copies] (engine/formats/hf_export.h): an export of a
// model loaded from a HF directory keeps that directory's config.json key
// for key (golden: the source file itself, with only the dtype changed) for
// every family the engine loads, copies its tokenizer and generation files
// byte for byte, writes what training changed, and skips (with a reason)
// a file that is a link out of the directory or not a regular file.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/formats/hf_export.h"
#include "engine/formats/hf_model.h"
#include "engine/model/model_config.h"
#include "engine/store/host_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::ListDir;
using ::megatrain::testing::WriteFileBytes;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A source model directory: the family's fixture (config.json,
// generation_config.json as transformers wrote them) plus tokenizer files.
std::string MakeSourceDir(const std::string& family) {
  const std::string fixture = std::string(MEGATRAIN_TESTDATA_DIR) + "/hf/" + family;
  const std::string dir = testing::MakeTempDir("hf_export_test") + "/source";
  fs::create_directories(dir);
  for (const char* name : {"config.json", "generation_config.json"}) {
    fs::copy_file(fs::path(fixture) / name, fs::path(dir) / name);
  }
  WriteFileBytes(dir + "/tokenizer.json", std::string(R"({"version": "1.0", "model": {}})"));
  WriteFileBytes(dir + "/tokenizer_config.json",
                 std::string(R"({"chat_template": "{{ messages }}", "eos_token": "</s>"})"));
  WriteFileBytes(dir + "/special_tokens_map.json", std::string(R"({"eos_token": "</s>"})"));
  WriteFileBytes(dir + "/chat_template.jinja", std::string("{{ bos_token }}{{ messages }}"));
  return dir;
}

// A zero-weight store of `config` (the weights do not matter here).
std::unique_ptr<HostStore> MakeStore(const ModelConfig& config) {
  HostStoreOptions options;
  options.optimizer_state = false;
  options.streaming_bf16 = false;
  options.pin = false;
  absl::StatusOr<std::unique_ptr<HostStore>> store = HostStore::Create(config, options);
  EXPECT_THAT(store, IsOk());
  return *std::move(store);
}

absl::StatusOr<HfExportReport> ExportFrom(const HostStore& store, const std::string& source_dir,
                                          const std::string& out) {
  HfExportOptions options;
  options.dtype = ExportDtype::kBf16;
  options.source_dir = source_dir;
  return ExportHfDirectory(store, out, options);
}

class HfExportFamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfExportFamilyTest, KeepsEveryConfigKeyAndCopiesTheTokenizerFiles) {
  const std::string source = MakeSourceDir(GetParam());
  absl::StatusOr<ModelConfig> config = LoadHfConfig(source);
  ASSERT_THAT(config, IsOk());
  std::unique_ptr<HostStore> store = MakeStore(*config);
  const std::string out = fs::path(source).parent_path() / "export";

  absl::StatusOr<HfExportReport> report = ExportFrom(*store, source, out);

  ASSERT_THAT(report, IsOk());
  // Golden: the source's config.json, every key and value, the dtype the
  // export's (under the source's spelling).
  nlohmann::json expected = nlohmann::json::parse(ReadFile(source + "/config.json"));
  const char* dtype_key = expected.contains("torch_dtype") ? "torch_dtype" : "dtype";
  expected[dtype_key] = "bfloat16";
  EXPECT_EQ(nlohmann::json::parse(ReadFile(out + "/config.json")), expected);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "chat_template.jinja", "generation_config.json"}) {
    EXPECT_EQ(ReadFile(out + "/" + name), ReadFile(source + "/" + name)) << name;
    EXPECT_THAT(report->copied_files, Contains(name));
  }
  EXPECT_TRUE(report->skipped_files.empty()) << report->skipped_files.front();
  // The export still loads as the same model.
  absl::StatusOr<ModelConfig> again = LoadHfConfig(out);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->ParamCount(), config->ParamCount());
}

INSTANTIATE_TEST_SUITE_P(Families, HfExportFamilyTest,
                         ::testing::Values("llama", "gemma2", "gemma3_text", "phi3",
                                           "phi3_longrope", "mixtral", "qwen2_moe", "qwen3_moe",
                                           "gpt_oss"));

TEST(HfExportTest, WritesTheKeysTrainingChangedAndKeepsTheRest) {
  const std::string source = MakeSourceDir("llama");
  absl::StatusOr<ModelConfig> config = LoadHfConfig(source);
  ASSERT_THAT(config, IsOk());
  ModelConfig trained = *config;
  trained.eos_token_id = 3;  // as if the job had changed it
  std::unique_ptr<HostStore> store = MakeStore(trained);
  const std::string out = fs::path(source).parent_path() / "export";

  ASSERT_THAT(ExportFrom(*store, source, out), IsOk());

  const nlohmann::json exported = nlohmann::json::parse(ReadFile(out + "/config.json"));
  EXPECT_EQ(exported["eos_token_id"], 3);
  // The fixture's values, which a config made from ModelConfig alone would
  // rewrite or drop.
  EXPECT_EQ(exported["pretraining_tp"], 1);
  EXPECT_EQ(exported["transformers_version"], "5.17.0");
  EXPECT_FALSE(exported.contains("torch_dtype"));
  EXPECT_EQ(exported["dtype"], "bfloat16");
}

TEST(HfExportTest, SkipsATokenizerLinkLeadingOutOfTheSourceDirectory) {
  const std::string source = MakeSourceDir("llama");
  const std::string secret = testing::MakeTempDir("hf_export_test") + "/secret.json";
  WriteFileBytes(secret, std::string("another user's file"));
  fs::remove(source + "/tokenizer.json");
  fs::create_symlink(secret, source + "/tokenizer.json");
  absl::StatusOr<ModelConfig> config = LoadHfConfig(source);
  ASSERT_THAT(config, IsOk());
  std::unique_ptr<HostStore> store = MakeStore(*config);
  const std::string out = fs::path(source).parent_path() / "export";

  absl::StatusOr<HfExportReport> report = ExportFrom(*store, source, out);

  ASSERT_THAT(report, IsOk());
  EXPECT_THAT(ListDir(out), Not(Contains("tokenizer.json")));
  ASSERT_EQ(report->skipped_files.size(), 1u);
  EXPECT_THAT(report->skipped_files[0], HasSubstr("tokenizer.json: "));
  EXPECT_THAT(report->skipped_files[0], HasSubstr("resolves outside"));
  EXPECT_THAT(report->copied_files, Contains("tokenizer_config.json"));
}

TEST(HfExportTest, FollowsALinkThatStaysInsideTheSourceDirectory) {
  // The layout of a Hugging Face cache: snapshot entries link to blobs.
  const std::string source = MakeSourceDir("llama");
  fs::create_directories(source + "/blobs");
  fs::rename(source + "/tokenizer.json", source + "/blobs/abc123");
  fs::create_symlink("blobs/abc123", source + "/tokenizer.json");
  absl::StatusOr<ModelConfig> config = LoadHfConfig(source);
  ASSERT_THAT(config, IsOk());
  std::unique_ptr<HostStore> store = MakeStore(*config);
  const std::string out = fs::path(source).parent_path() / "export";

  absl::StatusOr<HfExportReport> report = ExportFrom(*store, source, out);

  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(ReadFile(out + "/tokenizer.json"), ReadFile(source + "/blobs/abc123"));
  EXPECT_FALSE(fs::is_symlink(out + "/tokenizer.json"));
}

TEST(HfExportTest, SkipsAFifoWithoutBlocking) {
  const std::string source = MakeSourceDir("llama");
  ASSERT_EQ(::mkfifo((source + "/tokenizer.model").c_str(), 0644), 0);
  absl::StatusOr<ModelConfig> config = LoadHfConfig(source);
  ASSERT_THAT(config, IsOk());
  std::unique_ptr<HostStore> store = MakeStore(*config);
  const std::string out = fs::path(source).parent_path() / "export";

  absl::StatusOr<HfExportReport> report = ExportFrom(*store, source, out);

  ASSERT_THAT(report, IsOk());
  ASSERT_EQ(report->skipped_files.size(), 1u);
  EXPECT_THAT(report->skipped_files[0], HasSubstr("tokenizer.model: "));
  EXPECT_THAT(report->skipped_files[0], HasSubstr("not a regular file"));
  EXPECT_THAT(ListDir(out), Not(Contains("tokenizer.model")));
}

TEST(HfExportTest, WithoutASourceWritesTheConfigFromTheModel) {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
  ASSERT_THAT(config, IsOk());
  std::unique_ptr<HostStore> store = MakeStore(*config);
  const std::string out = testing::MakeTempDir("hf_export_test") + "/export";

  absl::StatusOr<HfExportReport> report = ExportFrom(*store, "", out);

  ASSERT_THAT(report, IsOk());
  EXPECT_TRUE(report->copied_files.empty());
  ModelConfig expected = *config;
  expected.torch_dtype = "bfloat16";
  EXPECT_EQ(ReadFile(out + "/config.json"), expected.ToHfConfigJson());
  EXPECT_THAT(ListDir(out),
              ::testing::ElementsAre("config.json", "generation_config.json", "model.safetensors"));
}

TEST(HfExportTest, AMissingSourceDirectoryIsReportedNotFatal) {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
  ASSERT_THAT(config, IsOk());
  std::unique_ptr<HostStore> store = MakeStore(*config);
  const std::string dir = testing::MakeTempDir("hf_export_test");

  absl::StatusOr<HfExportReport> report = ExportFrom(*store, dir + "/gone", dir + "/export");

  ASSERT_THAT(report, IsOk());
  ASSERT_EQ(report->skipped_files.size(), 1u);
  EXPECT_THAT(report->skipped_files[0], HasSubstr("nothing copied"));
}

}  // namespace
}  // namespace megatrain::engine
