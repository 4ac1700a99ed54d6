// The working-memory size formulas (working_bytes.h).
#include "engine/step/working_bytes.h"

#include <algorithm>

#include "engine/model/layers.h"

namespace megatrain::engine {

int64_t LayerActivationBytes(const ModelConfig& config, int64_t tokens, int64_t compute_bytes) {
  return 12 * tokens * std::max(config.hidden_size, config.intermediate_size) * compute_bytes;
}

int64_t KeptGraphBytes(const ModelConfig& config, int64_t tokens, int64_t compute_bytes,
                       bool fused) {
  const int64_t c = config.hidden_size, f = config.intermediate_size;
  const int64_t dh =
      config.head_dim > 0 ? config.head_dim : c / std::max<int64_t>(1, config.num_attention_heads);
  const int64_t q = config.num_attention_heads * dh;
  int64_t elements = 8 * c + 6 * q + 3 * f;
  if (config.qk_norm)
    elements += 2 * (config.num_attention_heads + config.num_key_value_heads) * dh;
  if (config.sandwich_norms) elements += 4 * c;
  if (!fused) elements += f + 4 * c;
  return tokens * compute_bytes * elements;
}

// Note [Loss working bytes]
// HeadForwardBackward / HeadLoss (engine/model/layers.h) never form the
// [B*T, V] logits: they take `chunk` rows at a time (Executor: chunk_tokens_,
// from ExecutorOptions::loss_chunk_tokens or kLossChunkLogitBytes / (4 V)).
// One chunk holds its logits in the compute dtype and in fp32, the fp32
// log-softmax and the fp32 gradient of the logits: rows x V x (esize + 12).
// A micro-batch smaller than a chunk (small vocabularies: the tiny preset's
// 512 gives 524,288 rows) holds all its B*T rows at once, so the bytes grow
// with micro_batch x seq_len until the chunk caps them.
int64_t LossWorkingBytes(const ModelConfig& config, ComputeDtype compute_dtype, int64_t tokens,
                         int64_t loss_chunk_tokens) {
  const int64_t esize = compute_dtype == ComputeDtype::kBf16 ? 2 : 4;
  const int64_t vocab = std::max<int64_t>(1, config.vocab_size);
  const int64_t chunk = loss_chunk_tokens > 0
                            ? loss_chunk_tokens
                            : std::max<int64_t>(64, kLossChunkLogitBytes / (4 * vocab));
  return std::min(std::max<int64_t>(tokens, 0), chunk) * vocab * (esize + 3 * 4);
}

int64_t WorkingBytes(const ModelConfig& config, ComputeDtype compute_dtype, int64_t micro_batch,
                     int64_t seq_len) {
  const int64_t esize = compute_dtype == ComputeDtype::kBf16 ? 2 : 4;
  const int64_t tokens = micro_batch * seq_len;
  return LayerActivationBytes(config, tokens, esize) + config.LayerParamCount() * (4 + esize) +
         4 * kLossChunkLogitBytes;
}

}  // namespace megatrain::engine
