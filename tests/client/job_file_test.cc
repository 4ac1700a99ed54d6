// Tests of client/job_file.h: YAML job files -> megatrain.v1.JobSpec. (The
// client has no test folder of its own in this tree; its unit tests live
// beside the server's.)
#include "client/job_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/spec/job_spec.h"  // the rows' members, ranges and keyword tables
#include "engine/spec/keyword.h"
#include "engine/spec/spec_fields.h"
#include "tests/server/fake_engine_backend.h"
#include "tests/testing/spec_rows.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::client {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kTiny[] = R"yaml(
name: tiny
model:
  preset: tiny
data:
  tokens: data/tiny
train:
  micro_batch: 8
  seq_len: 128
  gradient_accumulation_steps: 1
  max_steps: 60
  compute_dtype: fp32
optimizer:
  lr: 3.0e-3
  weight_decay: 0.0
  warmup_steps: 5
  schedule: cosine
checkpoint:
  every_steps: 20
  keep_last: 2
priority: 0
)yaml";

TEST(JobFileTest, ParsesTheIssueExample) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobYaml(kTiny, "/jobs", "tiny.yaml");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->name(), "tiny");
  EXPECT_EQ(spec->model().preset(), "tiny");
  EXPECT_EQ(spec->data().tokens(), "/jobs/data/tiny");
  EXPECT_EQ(spec->train().micro_batch(), 8);
  EXPECT_EQ(spec->train().seq_len(), 128);
  EXPECT_EQ(spec->train().gradient_accumulation_steps(), 1);
  EXPECT_EQ(spec->train().max_steps(), 60);
  EXPECT_EQ(spec->train().compute_dtype(), v1::COMPUTE_DTYPE_FP32);
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 3.0e-3);
  EXPECT_TRUE(spec->optimizer().has_lr());
  EXPECT_EQ(spec->optimizer().warmup_steps(), 5);
  EXPECT_EQ(spec->optimizer().schedule(), "cosine");
  EXPECT_EQ(spec->checkpoint().every_steps(), 20);
  EXPECT_EQ(spec->checkpoint().keep_last(), 2);
  EXPECT_EQ(spec->priority(), 0);
  // Keys not given stay unset (the engine default applies).
  EXPECT_FALSE(spec->train().has_max_grad_norm());
  EXPECT_FALSE(spec->train().has_offload_activations());
  EXPECT_FALSE(spec->optimizer().has_beta2());
}

TEST(JobFileTest, ShippedExampleParsesAndPointsAtItsData) {
  // ctest runs from the source root (megatrain_cc_test WORKING_DIRECTORY).
  absl::StatusOr<v1::JobSpec> spec = LoadJobFile("examples/jobs/tiny.yaml");
  ASSERT_THAT(spec, IsOk());
  const std::filesystem::path expected =
      std::filesystem::absolute("examples/jobs/data/tiny").lexically_normal();
  EXPECT_EQ(spec->data().tokens(), expected.string());
  EXPECT_EQ(spec->train().max_steps(), 60);
}

TEST(JobFileTest, AbsolutePathsAreKeptAndRelativeOnesNormalised) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobYaml(
      "model: {hf_dir: ../models/llama}\ndata: {text: /corpus.txt, tokenizer: ./spm.model}\n"
      "output_dir: out\n",
      "/home/a/jobs", "j.yaml");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->model().hf_dir(), "/home/a/models/llama");
  EXPECT_EQ(spec->data().text(), "/corpus.txt");
  EXPECT_EQ(spec->data().tokenizer(), "/home/a/jobs/spm.model");
  EXPECT_EQ(spec->output_dir(), "/home/a/jobs/out");
}

TEST(JobFileTest, StepScheduleKeys) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobYaml("train: {schedule: layer-major, wave: 4, activations: device}\n", "/", "j.yaml");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->train().schedule(), "layer-major");
  EXPECT_EQ(spec->train().wave(), 4);
  EXPECT_EQ(spec->train().activations(), "device");
  absl::StatusOr<v1::JobSpec> absent = ParseJobYaml("train: {micro_batch: 2}\n", "/", "j.yaml");
  ASSERT_THAT(absent, IsOk());
  EXPECT_FALSE(absent->train().has_schedule());
  EXPECT_FALSE(absent->train().has_wave());
}

// Note [Spec field table]: every number row is a YAML key of its section,
// read as its kind (ranges are the daemon's check, not the parser's).
TEST(JobFileTest, EveryTableRowIsAKeyOfItsSection) {
  std::string yaml;
#define MEGATRAIN_KEY(name, kind, range, json, proto) absl::StrAppend(&yaml, "  " #name ": 3\n");
  absl::StrAppend(&yaml, "train:\n");
  MEGATRAIN_TRAIN_NUMBER_FIELDS(MEGATRAIN_KEY)
  absl::StrAppend(&yaml, "optimizer:\n");
  MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(MEGATRAIN_KEY)
  absl::StrAppend(&yaml, "eval:\n");
  MEGATRAIN_EVAL_NUMBER_FIELDS(MEGATRAIN_KEY)
  absl::StrAppend(&yaml, "checkpoint:\n");
  MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(MEGATRAIN_KEY)
#undef MEGATRAIN_KEY
  const absl::StatusOr<v1::JobSpec> spec = ParseJobYaml(yaml, "/", "j.yaml");
  ASSERT_THAT(spec.status(), IsOk());
#define MEGATRAIN_EXPECT(section, name) EXPECT_EQ(spec->section().name(), 3) << #section "." #name;
#define MEGATRAIN_NUMBER_ROW(section, name, kind, range) MEGATRAIN_EXPECT(section, name)
  MEGATRAIN_EACH_NUMBER_ROW
#undef MEGATRAIN_NUMBER_ROW
#undef MEGATRAIN_EXPECT
}

// Every keyword of `keywords` is accepted under `section`.`key` and lands
// in the proto as the word (`word` reads it); another word is refused
// naming the key path and listing the keywords.
template <typename T, size_t N, typename Word>
void ExpectEveryKeywordIsAccepted(const engine::Keyword<T> (&keywords)[N],
                                  const std::string& section, const std::string& key, Word word) {
  for (const engine::Keyword<T>& keyword : keywords) {
    const absl::StatusOr<v1::JobSpec> spec =
        ParseJobYaml(absl::StrCat(section, ":\n  ", key, ": ", keyword.word, "\n"), "/", "j.yaml");
    ASSERT_THAT(spec.status(), IsOk()) << section << "." << key << ": " << keyword.word;
    EXPECT_EQ(word(*spec), keyword.word) << section << "." << key;
  }
  EXPECT_THAT(
      ParseJobYaml(absl::StrCat(section, ":\n  ", key, ": no-such-word\n"), "/", "j.yaml"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(absl::StrCat("j.yaml: ", section, ".", key, ": must be ",
                                      engine::KeywordList(keywords), ", got 'no-such-word'"))));
}

// Note [Spec field table]: every keyword row is a YAML key of its section
// taking exactly its table's words.
TEST(JobFileTest, EveryKeywordRowTakesItsWordsOnly) {
#define MEGATRAIN_ACCEPTS(section, name, keywords)                \
  ExpectEveryKeywordIsAccepted(engine::keywords, #section, #name, \
                               [](const v1::JobSpec& p) { return p.section().name(); });
#define MEGATRAIN_KEYWORD_ROW(section, name, keywords) MEGATRAIN_ACCEPTS(section, name, keywords)
  MEGATRAIN_EACH_KEYWORD_ROW
#undef MEGATRAIN_KEYWORD_ROW
#undef MEGATRAIN_ACCEPTS
}

TEST(JobFileTest, DevicesTakeACountOrAll) {
  absl::StatusOr<v1::JobSpec> two = ParseJobYaml("train: {devices: 2}\n", "/", "j.yaml");
  ASSERT_THAT(two, IsOk());
  EXPECT_EQ(two->train().devices(), 2);
  absl::StatusOr<v1::JobSpec> all = ParseJobYaml("train: {devices: all}\n", "/", "j.yaml");
  ASSERT_THAT(all, IsOk());
  EXPECT_TRUE(all->train().has_devices());
  EXPECT_EQ(all->train().devices(), 0);
  EXPECT_THAT(ParseJobYaml("train: {devices: 0}\n", "/", "j.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.devices: must be in [1, 64] or all, got 0")));
}

// train.resident_layers: a count (set), auto (unset, as absent); anything
// else names the field.
TEST(JobFileTest, InitFromTakesAnIdOrAMappingWithTheOptimizer) {
  absl::StatusOr<v1::JobSpec> id =
      ParseJobYaml("model: {preset: tiny, init_from: job-000012/step-400}\n", "/", "j.yaml");
  ASSERT_THAT(id, IsOk());
  EXPECT_EQ(id->model().init_from().checkpoint(), "job-000012/step-400");
  EXPECT_EQ(id->model().init_from().optimizer(), "");  // fresh
  absl::StatusOr<v1::JobSpec> restore = ParseJobYaml(
      "model:\n  preset: tiny\n  init_from: {checkpoint: job-000012/step-400, optimizer: "
      "restore}\n",
      "/", "j.yaml");
  ASSERT_THAT(restore, IsOk());
  EXPECT_EQ(restore->model().init_from().checkpoint(), "job-000012/step-400");
  EXPECT_EQ(restore->model().init_from().optimizer(), "restore");
  EXPECT_THAT(
      ParseJobYaml("model: {init_from: {checkpoint: job-1/step-2, optimizer: keep}}\n", "/",
                   "j.yaml"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("model.init_from.optimizer: must be fresh or restore, got 'keep'")));
  EXPECT_THAT(ParseJobYaml("model: {init_from: {optimizer: fresh}}\n", "/", "j.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.init_from.checkpoint: required")));
  EXPECT_THAT(
      ParseJobYaml("model: {init_from: {step: 4}}\n", "/", "j.yaml"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("model.init_from.step: unknown key (known: checkpoint, optimizer)")));
}

TEST(JobFileTest, ResidentLayersTakeACountOrAuto) {
  absl::StatusOr<v1::JobSpec> four = ParseJobYaml("train: {resident_layers: 4}\n", "/", "j.yaml");
  ASSERT_THAT(four, IsOk());
  EXPECT_TRUE(four->train().has_resident_layers());
  EXPECT_EQ(four->train().resident_layers(), 4);
  absl::StatusOr<v1::JobSpec> none = ParseJobYaml("train: {resident_layers: 0}\n", "/", "j.yaml");
  ASSERT_THAT(none, IsOk());
  EXPECT_TRUE(none->train().has_resident_layers());
  EXPECT_EQ(none->train().resident_layers(), 0);
  for (const char* text : {"train: {resident_layers: auto}\n", "train: {micro_batch: 2}\n"}) {
    absl::StatusOr<v1::JobSpec> unset = ParseJobYaml(text, "/", "j.yaml");
    ASSERT_THAT(unset, IsOk()) << text;
    EXPECT_FALSE(unset->train().has_resident_layers()) << text;
  }
  EXPECT_THAT(ParseJobYaml("train: {resident_layers: -1}\n", "/", "j.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.resident_layers: must be auto or in [0, 4096], got -1")));
  EXPECT_THAT(ParseJobYaml("train: {resident_layers: all}\n", "/", "j.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train.resident_layers")));
}

TEST(JobFileTest, OptionalKeysAndLabels) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobYaml(
      "train: {global_batch: 32, max_tokens: 100000, compute_dtype: bf16, max_grad_norm: 0, "
      "seed: 7, nan_policy: fail, offload_activations: true}\n"
      "optimizer: {beta1: 0.8, beta2: 0.99, eps: 1e-6, min_lr_ratio: 0.1}\n"
      "eval: {every_steps: 10, batches: 2}\n"
      "data: {eval_fraction: 0.05, shuffle_seed: 3}\n"
      "checkpoint: {keep_every: 100}\n"
      "labels: {team: nlp, exp: '42'}\npriority: -5\n",
      "/", "j.yaml");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->train().global_batch(), 32);
  EXPECT_EQ(spec->train().max_tokens(), 100000);
  EXPECT_EQ(spec->train().compute_dtype(), v1::COMPUTE_DTYPE_BF16);
  EXPECT_TRUE(spec->train().has_max_grad_norm());
  EXPECT_EQ(spec->train().max_grad_norm(), 0);
  EXPECT_EQ(spec->train().seed(), 7u);
  EXPECT_EQ(spec->train().nan_policy(), v1::NAN_POLICY_FAIL);
  EXPECT_TRUE(spec->train().has_offload_activations());
  EXPECT_TRUE(spec->train().offload_activations());
  EXPECT_DOUBLE_EQ(spec->optimizer().beta2(), 0.99);
  EXPECT_EQ(spec->eval().batches(), 2);
  EXPECT_DOUBLE_EQ(spec->data().eval_fraction(), 0.05);
  EXPECT_EQ(spec->checkpoint().keep_every(), 100);
  EXPECT_EQ(spec->labels().at("exp"), "42");
  EXPECT_EQ(spec->priority(), -5);
}

TEST(JobFileTest, OffloadActivationsIsABool) {
  for (bool offload : {true, false}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobYaml(
        absl::StrCat("train:\n  offload_activations: ", offload ? "true" : "false", "\n"), "/jobs",
        "job.yaml");
    ASSERT_THAT(spec, IsOk());
    EXPECT_TRUE(spec->train().has_offload_activations());  // an explicit false is kept too
    EXPECT_EQ(spec->train().offload_activations(), offload);
  }
}

struct BadFileCase {
  std::string name;
  std::string yaml;
  std::string message;
};

class BadJobFileTest : public ::testing::TestWithParam<BadFileCase> {};

TEST_P(BadJobFileTest, IsInvalidArgumentNamingTheKey) {
  EXPECT_THAT(
      ParseJobYaml(GetParam().yaml, "/jobs", "job.yaml"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job.yaml: " + GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadJobFileTest,
    ::testing::Values(
        BadFileCase{"UnknownTopLevelKey", "name: a\nmodle: {preset: tiny}\n",
                    "modle: unknown key (known: name, model, data, train"},
        BadFileCase{"UnknownNestedKey", "train: {micro_btch: 8}\n",
                    "train.micro_btch: unknown key (known: micro_batch, seq_len"},
        BadFileCase{"UnknownOptimizerKey", "optimizer: {learning_rate: 0.1}\n",
                    "optimizer.learning_rate: unknown key"},
        BadFileCase{"IntegerExpected", "train: {micro_batch: eight}\n",
                    "train.micro_batch: expected an integer, got 'eight'"},
        BadFileCase{"FractionForInteger", "train: {max_steps: 1.5}\n",
                    "train.max_steps: expected an integer, got '1.5'"},
        BadFileCase{"NumberExpected", "optimizer: {lr: fast}\n",
                    "optimizer.lr: expected a number, got 'fast'"},
        BadFileCase{"BadNanPolicy", "train: {nan_policy: maybe}\n",
                    "train.nan_policy: must be skip or fail, got 'maybe'"},
        BadFileCase{"IntegerForBool", "train: {offload_activations: 3}\n",
                    "train.offload_activations: expected true or false, got '3'"},
        BadFileCase{"StringForBool", "train: {offload_activations: \"always\"}\n",
                    "train.offload_activations: expected true or false, got 'always'"},
        BadFileCase{"ListForBool", "train: {offload_activations: [true]}\n",
                    "train.offload_activations: expected a single value"},
        BadFileCase{"BadComputeDtype", "train: {compute_dtype: fp16}\n",
                    "train.compute_dtype: must be fp32, tf32 or bf16, got 'fp16'"},
        BadFileCase{"SectionNotAMapping", "train: 5\n", "train: expected a mapping of keys"},
        BadFileCase{"ListForScalar", "name: [a, b]\n", "name: expected a single value"},
        BadFileCase{"MissingValue", "name:\n", "name: missing value"},
        BadFileCase{"BothModelSources", "model: {preset: tiny, hf_dir: /m}\n",
                    "model: give one of preset and hf_dir, not both"},
        BadFileCase{"NegativeSeed", "train: {seed: -1}\n", "train.seed: must be >= 0, got -1"},
        BadFileCase{"LabelsNotAMapping", "labels: [a]\n", "labels: expected a mapping"},
        BadFileCase{"NotAMappingAtAll", "- a\n", "job file: expected a mapping of keys"},
        BadFileCase{"BadYaml", "train: {micro_batch: 8\n", "bad YAML"},
        // yaml-cpp keeps both entries of a repeated key; the later must not
        // silently replace the earlier.
        BadFileCase{"TopLevelKeyTwice", "train: {micro_batch: 8}\nname: a\ntrain: {seq_len: 64}\n",
                    "train: given twice in one mapping (again on line 3)"},
        BadFileCase{"NestedKeyTwice", "optimizer:\n  lr: 0.1\n  lr: 0.2\n",
                    "optimizer.lr: given twice in one mapping (again on line 3)"},
        BadFileCase{"LabelKeyTwice", "labels: {team: a, team: b}\n",
                    "labels.team: given twice in one mapping (again on line 1)"}),
    [](const ::testing::TestParamInfo<BadFileCase>& info) { return info.param.name; });

TEST(JobFileTest, MissingFileIsNotFound) {
  EXPECT_THAT(LoadJobFile("/nonexistent/job.yaml"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/job.yaml")));
}

TEST(JobFileTest, LoadResolvesAgainstTheFilesDirectory) {
  const std::filesystem::path dir = server::testing::MakeTempDir();
  std::ofstream(dir / "job.yaml") << "model: {preset: tiny}\ndata: {tokens: shards}\n";
  absl::StatusOr<v1::JobSpec> spec = LoadJobFile((dir / "job.yaml").string());
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->data().tokens(), (dir / "shards").string());
}

// Regression (job_yaml_fuzz): yaml-cpp passes bytes that are not UTF-8
// through, the CLI sent them in proto3 string fields, and the daemon refused
// the whole request as unparsable instead of the file naming the key.
TEST(JobFileTest, ValueThatIsNotUtf8IsInvalidArgumentNamingTheKey) {
  EXPECT_THAT(ParseJobYaml("name: caf\xe9\nmodel: {preset: tiny}\n", "/jobs", "job.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml: name: not UTF-8 text (byte 3 of the value)")));
  EXPECT_THAT(ParseJobYaml("data: {tokens: /data/\xff}\n", "/jobs", "job.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml: data.tokens: not UTF-8 text")));
  // A UTF-16 surrogate written as UTF-8 bytes (yaml-cpp refuses "\ud800").
  EXPECT_THAT(ParseJobYaml("labels: {team: \"\xed\xa0\x80\"}\n", "/jobs", "job.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml: labels.team: not UTF-8 text")));
  EXPECT_THAT(ParseJobYaml("labels: {\xc0\x80: a}\n", "/jobs", "job.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml: labels key: not UTF-8 text")));
}

TEST(JobFileTest, Utf8ValuesSurviveTheWire) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobYaml(
      "name: \"caf\u00e9 \\u2713 \\U0010FFFF\"\nlabels: {team: \"\xf0\x9f\x98\x80\"}\n", "/jobs",
      "job.yaml");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->name(), "caf\u00e9 \u2713 \U0010FFFF");
  std::string bytes;
  ASSERT_TRUE(spec->SerializeToString(&bytes));
  v1::JobSpec received;
  ASSERT_TRUE(received.ParseFromString(bytes));
  EXPECT_EQ(received.name(), spec->name());
  EXPECT_EQ(received.labels().at("team"), "\xf0\x9f\x98\x80");
}

// The fuzz seeds (tests/fuzz/make_corpus.py): valid_* parse, invalid_* are
// refused with INVALID_ARGUMENT naming the file.
TEST(JobFileCorpusTest, SeedsParseAsTheirNamesSay) {
  const std::string dir = std::string(MEGATRAIN_FUZZ_CORPUS_DIR) + "/job_yaml_fuzz";
  const std::vector<std::string> names = megatrain::testing::ListDir(dir);
  ASSERT_FALSE(names.empty()) << dir;
  int valid = 0;
  for (const std::string& name : names) {
    std::ifstream in(dir + "/" + name, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    absl::StatusOr<v1::JobSpec> spec = ParseJobYaml(text, "/jobs", name);
    if (name.rfind("valid_", 0) == 0) {
      EXPECT_THAT(spec, IsOk()) << name;
      ++valid;
    } else {
      EXPECT_THAT(spec.status(),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(name + ": ")))
          << name;
    }
  }
  EXPECT_GT(valid, 0);
}

// memory.nvme_tier passes through to JobSpec.memory (issue 19); a bad
// value names the key.
TEST(JobFileTest, MemoryNvmeTier) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobYaml("memory: {nvme_tier: moments}\n", "/", "j.yaml");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->memory().nvme_tier(), "moments");
  EXPECT_THAT(ParseJobYaml("memory: {nvme_tier: disk}\n", "/", "j.yaml").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memory.nvme_tier")));
}

// data.packing.document_attention passes through to the proto (the
// daemon parses it); an unknown key under data.packing names its path.
TEST(JobFileTest, DataPackingDocumentAttention) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobYaml("data: {tokens: t, packing: {document_attention: shared}}\n", "/", "j.yaml");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->data().packing().document_attention(), "shared");
  EXPECT_THAT(ParseJobYaml("data: {packing: {attention: shared}}\n", "/", "j.yaml").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.packing.attention")));
}

}  // namespace
}  // namespace megatrain::client
