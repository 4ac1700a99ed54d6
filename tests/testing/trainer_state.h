// Helpers shared by the trainer tests (tests/engine/step/) and the
// data-parallel tests (tests/engine/dist/): the small trainer options they
// start from, flat copies of a host store's state, and the bit-for-bit
// comparison their "ends where the other run ends" checks use.
#ifndef MEGATRAIN_TESTS_TESTING_TRAINER_STATE_H_
#define MEGATRAIN_TESTS_TESTING_TRAINER_STATE_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/optim/tiered_adamw.h"
#include "engine/store/host_store.h"
#include "engine/store/nvme_tier.h"
#include "engine/step/trainer.h"

namespace megatrain::testing {

// Options of a short run on a small model (SmallLlama in parity.h): AdamW
// at lr 1e-2 with weight decay 0.1, a cosine schedule of `total_steps`
// with one warm-up step, clipping at `max_grad_norm` (0: none), two
// optimizer threads. Tests change what they test from here.
inline engine::TrainerOptions SmallTrainerOptions(int64_t micro_batch, int64_t seq_len,
                                                  double max_grad_norm, int64_t total_steps) {
  engine::TrainerOptions o;
  o.micro_batch = micro_batch;
  o.seq_len = seq_len;
  o.adamw.lr = 1e-2;
  o.adamw.weight_decay = 0.1;
  o.schedule.kind = engine::LrScheduleKind::kCosine;
  o.schedule.warmup_steps = 1;
  o.schedule.total_steps = total_steps;
  o.max_grad_norm = max_grad_norm;
  o.threads = 2;
  return o;
}

// SmallTrainerOptions for data-parallel ranks that run as threads of one
// process on a 2-core CI machine: one optimizer and one critical thread
// each, lr 1e-3, eight scheduled steps, `micro_batches` micro-batches per
// global batch.
inline engine::TrainerOptions SmallDataParallelOptions(int64_t micro_batch, int64_t seq_len,
                                                       double max_grad_norm, int micro_batches) {
  engine::TrainerOptions o =
      SmallTrainerOptions(micro_batch, seq_len, max_grad_norm, /*total_steps=*/8);
  o.adamw.lr = 1e-3;
  o.gradient_accumulation_steps = micro_batches;
  o.threads = 1;
  o.critical_threads = 1;
  return o;
}

// Master weights of every block, back to back (fp32).
inline std::vector<float> Masters(const engine::HostStore& store) {
  std::vector<float> out;
  for (int64_t b = 0; b < store.num_blocks(); ++b) {
    out.insert(out.end(), store.master(b), store.master(b) + store.block_numel(b));
  }
  return out;
}

// Everything a step updates in block `b`: master, exp_avg, exp_avg_sq, back
// to back. The moments must be in host memory (not on an NVMe tier).
inline std::vector<float> BlockState(const engine::HostStore& store, int64_t b) {
  std::vector<float> out;
  for (const float* data : {store.master(b), store.exp_avg(b), store.exp_avg_sq(b)}) {
    out.insert(out.end(), data, data + store.block_numel(b));
  }
  return out;
}

// BlockState of every block, back to back.
inline std::vector<float> AllState(const engine::HostStore& store) {
  std::vector<float> out;
  for (int64_t b = 0; b < store.num_blocks(); ++b) {
    std::vector<float> block = BlockState(store, b);
    out.insert(out.end(), block.begin(), block.end());
  }
  return out;
}

// AllState of a store whose AdamW moments are on the NVMe tier: the
// moments read back from `tier`'s files (every rank's shard: Note [Tier
// shards] in engine/store/nvme_tier.h). Empty when they cannot be read.
inline std::vector<float> AllState(const engine::HostStore& store,
                                   const engine::NvmeMomentTier& tier) {
  const int64_t n = store.arena_numel();
  std::vector<float> m(n), v(n);
  if (!engine::CopyMomentsToHost(tier, store, m.data(), v.data()).ok()) return {};
  std::vector<float> out;
  for (int64_t b = 0; b < store.num_blocks(); ++b) {
    const int64_t offset = store.block_offset(b), numel = store.block_numel(b);
    out.insert(out.end(), store.master(b), store.master(b) + numel);
    out.insert(out.end(), m.data() + offset, m.data() + offset + numel);
    out.insert(out.end(), v.data() + offset, v.data() + offset + numel);
  }
  return out;
}

// Same length and the same bits (NaNs and signed zeros included).
inline bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A tiny Mixtral (transformers' config.json keys) for the data-parallel
// tests: 4 experts, top 2, the load-balancing loss on (coefficient 0.1,
// large enough to move the weights) and train-time router jitter.
inline engine::ModelConfig SmallMixtral() {
  constexpr char kConfig[] = R"({
    "model_type": "mixtral", "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 128,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "output_router_logits": true, "router_aux_loss_coef": 0.1,
    "router_jitter_noise": 0.1, "tie_word_embeddings": false})";
  absl::StatusOr<engine::ModelConfig> config = engine::ParseHfConfig(kConfig);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : engine::ModelConfig();
}

}  // namespace megatrain::testing

#endif  // MEGATRAIN_TESTS_TESTING_TRAINER_STATE_H_
