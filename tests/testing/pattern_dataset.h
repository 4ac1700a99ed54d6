// A small token dataset a model can learn, for the job-level tests
// (training_job_test, tiered_job_test, data_parallel_job_test,
// family_resume_test).
#ifndef MEGATRAIN_TESTS_TESTING_PATTERN_DATASET_H_
#define MEGATRAIN_TESTS_TESTING_PATTERN_DATASET_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/data/token_shard.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::testing {

// What WritePatternDataset writes: `documents` documents cycling through 4
// patterns of `pattern_length` ids drawn (std::mt19937 seeded with `seed`)
// from [3, 3 + id_span), id_span <= vocab_size - 3.
struct PatternDataset {
  std::string prefix = "tokens";  // of the fresh directory's name
  int32_t vocab_size = 512;
  uint32_t id_span = 500;
  int pattern_length = 24;
  int documents = 40;
  uint32_t seed = 7;
};

// Writes one shard, train-00000.mtt, into a fresh temporary directory and
// returns the directory; records a test failure if a write fails.
inline std::string WritePatternDataset(const PatternDataset& d = {}) {
  const std::string dir = MakeTempDir(d.prefix);
  auto writer = engine::TokenShardWriter::Create(
      dir + "/train-00000.mtt", {.vocab_size = static_cast<uint64_t>(d.vocab_size)});
  EXPECT_THAT(writer, IsOk());
  if (!writer.ok()) return dir;
  std::mt19937 rng(d.seed);
  std::vector<std::vector<int32_t>> patterns(4);
  for (auto& p : patterns) {
    for (int i = 0; i < d.pattern_length; ++i) {
      p.push_back(static_cast<int32_t>(3 + rng() % d.id_span));
    }
  }
  for (int doc = 0; doc < d.documents; ++doc) {
    EXPECT_THAT(writer->AppendDocument(patterns[doc % 4]), IsOk());
  }
  EXPECT_THAT(writer->Finish(), IsOk());
  return dir;
}

}  // namespace megatrain::testing

#endif  // MEGATRAIN_TESTS_TESTING_PATTERN_DATASET_H_
