// The embedding's row-wise AdamW update (embedding_updater.h).
#include "engine/optim/embedding_updater.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

namespace megatrain::engine {

std::unique_ptr<EmbeddingUpdater> EmbeddingUpdater::Create(HostStore* store, CpuAdamW* adamw,
                                                           OptimizerQueue* queue, ThreadPool* pool,
                                                           ThreadPool* critical_pool,
                                                           bool keep_lookahead) {
  const ModelLayout& layout = store->layout();
  const BlockLayout& emb = layout.blocks[layout.embedding_block()];
  if (emb.params.size() != 1 || emb.params[0].offset != 0 || emb.params[0].shape.size() != 2) {
    return nullptr;
  }
  std::unique_ptr<EmbeddingUpdater> u(new EmbeddingUpdater());
  u->store_ = store;
  u->adamw_ = adamw;
  u->queue_ = queue;
  u->pool_ = pool;
  u->critical_pool_ = critical_pool;
  u->keep_lookahead_ = keep_lookahead;
  u->block_ = layout.embedding_block();
  u->rows_ = emb.params[0].shape[0];
  u->width_ = emb.params[0].shape[1];
  u->row_state_ = std::make_unique<std::atomic<uint8_t>[]>(u->rows_);
  for (int64_t r = 0; r < u->rows_; ++r) u->row_state_[r].store(2);
  return u;
}

AdamWBuffers EmbeddingUpdater::StoreBuffers(int64_t offset, int64_t count) const {
  AdamWBuffers buffers;
  buffers.params = store_->master(block_) + offset;
  buffers.grads = store_->grad(block_) + offset;
  buffers.exp_avg = store_->exp_avg(block_) + offset;
  buffers.exp_avg_sq = store_->exp_avg_sq(block_) + offset;
  bf16_bits* bf16 = store_->streaming_bf16(block_);
  buffers.bf16_params = bf16 != nullptr ? bf16 + offset : nullptr;
  buffers.num_elements = count;
  return buffers;
}

void EmbeddingUpdater::ScheduleUpdate(int64_t step, double lr, float grad_scale) {
  // The lookahead of this step reads the rows this update rewrites.
  FinishLookahead(lookahead_[step % 2]);
  for (int64_t r = 0; r < rows_; ++r) row_state_[r].store(0, std::memory_order_relaxed);
  grad_zero_next_ = true;  // the update zeroes each row's gradient
  step_ = step;
  lr_ = lr;
  grad_scale_ = grad_scale;
  {
    absl::MutexLock lock(&mu_);
    rows_pending_ = true;
  }
  // Last in priority (order num_blocks: after the head, before any update
  // of a later step): the next forward's gathers update their own rows.
  queue_->Push({step, store_->num_blocks(), 0}, block_, [this] {
    pool_->ParallelFor(rows_, 64, [this](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) UpdateRow(r);
    });
    absl::MutexLock lock(&mu_);
    rows_pending_ = false;
    return absl::OkStatus();  // a row's error is recorded by UpdateRow
  });
}

void EmbeddingUpdater::UpdateRow(int64_t row) {
  std::atomic<uint8_t>& state = row_state_[row];
  uint8_t expected = 0;
  if (state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
    const int64_t offset = row * width_;
    queue_->RecordError(adamw_->Step(StoreBuffers(offset, width_), step_, lr_, grad_scale_));
    std::memset(store_->grad(block_) + offset, 0, static_cast<size_t>(width_) * 4);
    state.store(2, std::memory_order_release);
    return;
  }
  while (state.load(std::memory_order_acquire) != 2) std::this_thread::yield();
}

void EmbeddingUpdater::GateRows(absl::Span<const int32_t> token_ids,
                                absl::Span<const float*> row_sources) {
  const float* table = store_->master(block_);
  // Only the first gather after the lookahead's update was scheduled may
  // use it (Note [Embedding lookahead]).
  const Lookahead* la = std::exchange(gate_lookahead_, nullptr);
  bool pending;
  {
    absl::MutexLock lock(&mu_);
    pending = rows_pending_;
  }
  if (pending || la != nullptr) {
    std::vector<int32_t> rows = DistinctTokenIds(token_ids);
    if (la != nullptr) {
      const size_t all = rows.size();
      rows.erase(std::remove_if(rows.begin(), rows.end(),
                                [la](int32_t r) { return la->slot_of_row[r] >= 0; }),
                 rows.end());
      lookahead_rows_ += static_cast<int64_t>(all - rows.size());
    }
    if (!pending) rows.clear();
    critical_pool_->ParallelFor(static_cast<int64_t>(rows.size()), 16,
                                [&](int64_t begin, int64_t end) {
                                  for (int64_t i = begin; i < end; ++i) UpdateRow(rows[i]);
                                });
    gate_rows_ += static_cast<int64_t>(rows.size());
  }
  for (size_t i = 0; i < token_ids.size(); ++i) {
    const int32_t id = token_ids[i];
    const int32_t slot = la != nullptr ? la->slot_of_row[id] : -1;
    if (slot >= 0) {
      row_sources[i] = la->values.data() + static_cast<int64_t>(slot) * width_;
    } else {
      row_sources[i] = table + static_cast<int64_t>(id) * width_;
    }
  }
}

void EmbeddingUpdater::CollectUntouchedRows(Lookahead& la,
                                            absl::Span<const MicroBatch> micro_batches,
                                            absl::Span<const int32_t> next_input_ids) {
  for (const int32_t r : la.rows) la.slot_of_row[r] = -1;
  la.rows.clear();
  if (la.slot_of_row.empty()) la.slot_of_row.assign(rows_, -1);
  if (touched_.empty()) touched_.assign(rows_, 0);
  // Ids come from the caller unchecked here (the executor validates this
  // step's batch after this, the next one's a step later): out-of-range
  // ones are skipped, and the batch then fails with INVALID_ARGUMENT.
  auto in_range = [this](int32_t id) { return id >= 0 && id < rows_; };
  auto mark = [&](uint8_t value) {
    for (const MicroBatch& mb : micro_batches) {
      for (const int32_t id : mb.input_ids) {
        if (in_range(id)) touched_[id] = value;
      }
    }
  };
  mark(1);
  for (const int32_t id : next_input_ids) {
    if (!in_range(id) || touched_[id] || la.slot_of_row[id] >= 0) continue;
    la.slot_of_row[id] = static_cast<int32_t>(la.rows.size());
    la.rows.push_back(id);
  }
  mark(0);
}

void EmbeddingUpdater::QueueLookahead(int64_t step, double lr,
                                      absl::Span<const MicroBatch> micro_batches,
                                      absl::Span<const int32_t> next_input_ids) {
  Lookahead& la = lookahead_[step % 2];
  FinishLookahead(la);  // step - 2's, long consumed
  CollectUntouchedRows(la, micro_batches, next_input_ids);
  if (la.rows.empty()) return;
  const size_t values = la.rows.size() * static_cast<size_t>(width_);
  if (la.values.size() < values) la.values.resize(values);
  la.step = step;
  la.lr = lr;
  {
    absl::MutexLock lock(&mu_);
    la.state = LookaheadState::kQueued;
  }
  // Order -1: before its step's updates, after the previous step's.
  queue_->Push({step, -1, 0}, /*block=*/-1, [this, &la] { return RunLookahead(la); });
}

absl::Status EmbeddingUpdater::RunLookahead(Lookahead& la) {
  {
    absl::MutexLock lock(&mu_);
    if (la.state != LookaheadState::kQueued) return absl::OkStatus();  // cancelled
    la.state = LookaheadState::kRunning;
  }
  const int64_t c = width_;
  std::atomic<bool> failed{false};
  pool_->ParallelFor(static_cast<int64_t>(la.rows.size()), 16, [&](int64_t begin, int64_t end) {
    std::vector<float> zero(c, 0.0f), m(c), v(c);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = la.rows[i];
      UpdateRow(row);  // the previous step's update of the row, if pending
      const AdamWBuffers stored = StoreBuffers(row * c, c);
      float* value = la.values.data() + i * c;
      std::memcpy(value, stored.params, c * 4);
      std::memcpy(m.data(), stored.exp_avg, c * 4);
      std::memcpy(v.data(), stored.exp_avg_sq, c * 4);
      AdamWBuffers buffers;
      buffers.params = value;
      buffers.grads = zero.data();
      buffers.exp_avg = m.data();
      buffers.exp_avg_sq = v.data();
      buffers.num_elements = c;
      if (!adamw_->Step(buffers, la.step, la.lr, 1.0f).ok()) failed = true;
    }
  });
  absl::MutexLock lock(&mu_);
  // A failed lookahead is only not used: the store update reports the error.
  la.state = failed ? LookaheadState::kCancelled : LookaheadState::kDone;
  return absl::OkStatus();
}

void EmbeddingUpdater::FinishLookahead(Lookahead& la) {
  absl::MutexLock lock(&mu_);
  if (la.state == LookaheadState::kQueued && !keep_lookahead_)
    la.state = LookaheadState::kCancelled;
  auto settled = [&la]() {
    return la.state != LookaheadState::kRunning && la.state != LookaheadState::kQueued;
  };
  mu_.Await(absl::Condition(&settled));
}

void EmbeddingUpdater::AfterStep(int64_t step, bool applied) {
  Lookahead& la = lookahead_[step % 2];
  FinishLookahead(la);
  if (!applied) return;
  bool done;
  {
    absl::MutexLock lock(&mu_);
    done = la.state == LookaheadState::kDone;
  }
  if (done && la.step == step && step_ == step && lr_ == la.lr) gate_lookahead_ = &la;
}

}  // namespace megatrain::engine
