// libFuzzer target for ParseTokenShard.
//
// Each input is parsed twice: as it is (covering the magic, version and
// checksum checks), and with both XXH64 checksums recomputed over the mutated
// bytes, so the fuzzer also reaches the size, boundary and vocab checks
// behind the checksums (random mutations almost never match a 64-bit hash).
// Accepted shards are then read completely, so ASan checks every access.
//
// Invariants checked (a violation traps):
//   - file size == 64 + 8 x (documents + 1) + token bytes x tokens;
//   - document sizes add up to num_tokens;
//   - with body verification, every id is below vocab_size (or 2^31).
//
// Run: deploy/run-fuzzers.sh, or by hand
//   build-fuzz/token_shard_fuzz tests/fuzz/corpus/token_shard_fuzz
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/data/token_shard.h"

namespace {

using ::megatrain::engine::kTokenShardHeaderBytes;
using ::megatrain::engine::kTokenShardMaxVocabSize;
using ::megatrain::engine::ParseTokenShard;
using ::megatrain::engine::TokenShardParseOptions;
using ::megatrain::engine::TokenShardView;

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

void Exercise(absl::Span<const uint8_t> bytes, bool verify_body) {
  TokenShardParseOptions options;
  options.verify_body = verify_body;
  absl::StatusOr<TokenShardView> view = ParseTokenShard(bytes, "fuzz.tok", options);
  if (!view.ok()) return;
  Check(bytes.size() == kTokenShardHeaderBytes + 8 * (view->num_documents() + 1) +
                            view->token_bytes() * view->num_tokens());
  uint64_t total = 0;
  std::vector<int32_t> tokens;
  for (uint64_t doc_idx = 0; doc_idx < view->num_documents(); ++doc_idx) {
    tokens = view->DocumentAsInt32(doc_idx);
    Check(tokens.size() == view->document_size(doc_idx));
    Check(view->DocumentBytes(doc_idx).size() == tokens.size() * view->token_bytes());
    total += tokens.size();
  }
  Check(total == view->num_tokens());
  if (verify_body) {
    const uint64_t limit = view->vocab_size() != 0 ? view->vocab_size() : kTokenShardMaxVocabSize;
    for (uint64_t token_idx = 0; token_idx < view->num_tokens(); ++token_idx) {
      Check(view->token(token_idx) < limit);
    }
  }
  std::vector<uint32_t> window(4);
  const absl::Status copy = view->CopyTokens(view->num_tokens() / 2, absl::MakeSpan(window));
  Check(copy.ok() == (view->num_tokens() - view->num_tokens() / 2 >= 4));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> bytes(data, size);
  Exercise(bytes, /*verify_body=*/true);
  Exercise(bytes, /*verify_body=*/false);

  if (size >= kTokenShardHeaderBytes) {
    // Same bytes with valid checksums (offsets per docs/data-format.md).
    std::vector<uint8_t> fixed(data, data + size);
    const uint64_t body_xxh64 =
        XXH64(fixed.data() + kTokenShardHeaderBytes, size - kTokenShardHeaderBytes, 0);
    if ((fixed[48] & 1) != 0) std::memcpy(fixed.data() + 40, &body_xxh64, 8);
    const uint64_t header_xxh64 = XXH64(fixed.data(), 56, 0);
    std::memcpy(fixed.data() + 56, &header_xxh64, 8);
    Exercise(fixed, /*verify_body=*/true);
  }
  return 0;
}
