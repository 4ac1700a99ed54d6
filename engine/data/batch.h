// Token batches as the engine consumes them (host memory, no LibTorch).
#ifndef MEGATRAIN_ENGINE_BATCH_H_
#define MEGATRAIN_ENGINE_BATCH_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace megatrain::engine {

// Label value that is not trained on (PyTorch cross_entropy ignore_index).
inline constexpr int32_t kIgnoreLabel = -100;

// One micro-batch: B sequences of T tokens, row-major [B, T].
// labels[b*T + t] is the token expected after position t (already shifted),
// or kIgnoreLabel.
//
// position_ids (Note [Document attention] in engine/model/layers.h): empty
// when the rows attend causally across everything they hold, with
// positions 0..T-1 (data.packing.document_attention: shared); else each
// token's position within its document: 0 where a document begins (and at
// every row's first token), else the previous token's plus one. A token
// attends only to the earlier tokens of its own document, and RoPE rotates
// it by its position id.
struct MicroBatch {
  std::vector<int32_t> input_ids;     // [B*T], each in [0, vocab_size)
  std::vector<int32_t> labels;        // [B*T], in [0, vocab_size) or -100
  std::vector<int32_t> position_ids;  // [B*T] or empty (see above)
};

// Whether `mb`'s position ids are none, or one per token with every row of
// `seq_len` starting at 0 and each next id 0 or the previous plus one (the
// executor's check, without its message). O(B*T); thread-safe.
inline bool PositionIdsValid(const MicroBatch& mb, size_t seq_len) {
  const std::vector<int32_t>& p = mb.position_ids;
  if (p.empty()) return true;
  if (p.size() != mb.input_ids.size() || seq_len == 0) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    const int32_t expected_next = i % seq_len == 0 ? 0 : p[i - 1] + 1;
    if (p[i] != 0 && p[i] != expected_next) return false;
  }
  return true;
}

// The distinct values of `ids` (e.g. the embedding rows a micro-batch
// reads), ascending. O(n log n); thread-safe.
template <typename Ids>
std::vector<int32_t> DistinctTokenIds(const Ids& ids) {
  std::vector<int32_t> out(ids.begin(), ids.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_BATCH_H_
