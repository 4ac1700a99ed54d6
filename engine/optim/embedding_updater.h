// The embedding's AdamW update, row by row, off the GPU's critical path
// (Notes [Embedding rows on demand] and [Embedding lookahead] in
// trainer.h): the background row-wise update on the optimizer queue, the
// executor's row gate that updates just the rows a gather needs, and the
// lookahead of the next batch's rows.
//
// Row states (pending -> in progress -> done) are atomics, so that every
// row is updated exactly once by whichever thread claims it first: the
// optimizer thread (background), the critical pool (row gate) or the
// lookahead.
//
// Ownership: borrows the store, the AdamW kernel, the queue and both
// pools (all outlive it; the queue must be drained or destroyed before
// it). Thread-safety: ScheduleUpdate, QueueLookahead, AfterStep,
// FinishStepLookahead, DropLookahead and the counters on the step thread;
// GateRows on the executor's enqueuing thread (the same thread, inside
// ForwardBackward); the queued tasks on the optimizer thread.
#ifndef MEGATRAIN_ENGINE_OPTIM_EMBEDDING_UPDATER_H_
#define MEGATRAIN_ENGINE_OPTIM_EMBEDDING_UPDATER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/optim/adamw.h"
#include "engine/data/batch.h"
#include "engine/store/host_store.h"
#include "engine/optim/optimizer_queue.h"
#include "engine/runtime/thread_pool.h"

namespace megatrain::engine {

class EmbeddingUpdater {
 public:
  // Row-wise updates need the table as one [V, C] parameter at the start
  // of its block; returns null otherwise (the embedding then updates as a
  // whole block). `keep_lookahead`: TrainerOptions::debug_keep_lookahead.
  static std::unique_ptr<EmbeddingUpdater> Create(HostStore* store, CpuAdamW* adamw,
                                                  OptimizerQueue* queue, ThreadPool* pool,
                                                  ThreadPool* critical_pool, bool keep_lookahead);

  // Queues update number `step` of the table, row by row, last in its
  // step's priority order; each row's gradient is zeroed once used.
  void ScheduleUpdate(int64_t step, double lr, float grad_scale);
  // Whether the last ScheduleUpdate leaves the table's gradient zero for
  // the next step's scatter (StreamingExecutor::AssumeEmbeddingGradZero);
  // clears the flag.
  bool TakeGradZero() { return std::exchange(grad_zero_next_, false); }

  // The executor's row gate (StreamingExecutor::EmbeddingRowGate).
  void GateRows(absl::Span<const int32_t> token_ids, absl::Span<const float*> row_sources);

  // Note [Embedding lookahead]: queues, for step `step` with rate `lr`,
  // the update of `next_input_ids`' rows that `micro_batches` leave with a
  // zero gradient, into a side buffer.
  void QueueLookahead(int64_t step, double lr, absl::Span<const MicroBatch> micro_batches,
                      absl::Span<const int32_t> next_input_ids);
  // Step `step` ended: with `applied`, lets the next gate use its
  // lookahead if this step's update is the one it anticipated; in any
  // case the lookahead is settled (cancelled if still queued).
  void AfterStep(int64_t step, bool applied);
  // The lookahead the current step's gathers could use is spent.
  void EndGather() { gate_lookahead_ = nullptr; }
  // Drops the lookahead (a resume: set_step).
  void DropLookahead() { gate_lookahead_ = nullptr; }

  // Rows the gates updated / the gathers read from a lookahead since the
  // last ResetCounters.
  int64_t gate_rows() const { return gate_rows_; }
  int64_t lookahead_rows() const { return lookahead_rows_; }
  void ResetCounters() { gate_rows_ = lookahead_rows_ = 0; }

 private:
  enum class LookaheadState { kIdle, kQueued, kRunning, kDone, kCancelled };
  // The rows of a future micro-batch that step `step` leaves with a zero
  // gradient, and their values after it.
  struct Lookahead {
    int64_t step = 0;  // the update it anticipates
    double lr = 0;
    std::vector<int32_t> rows;                     // distinct rows
    std::vector<float> values;                     // [rows.size(), C] fp32: row after update `step`
    std::vector<int32_t> slot_of_row;              // [V]: index into rows, or -1
    LookaheadState state = LookaheadState::kIdle;  // guarded by mu_
  };

  EmbeddingUpdater() = default;
  AdamWBuffers StoreBuffers(int64_t offset, int64_t count) const;
  // Updates row `row` unless another thread has claimed it; then waits
  // until it is done.
  void UpdateRow(int64_t row);
  absl::Status RunLookahead(Lookahead& la);
  // Cancels `la` if still queued, waits for it if running.
  void FinishLookahead(Lookahead& la);
  // Collects into la.rows the rows of `next_input_ids` no micro-batch touches.
  void CollectUntouchedRows(Lookahead& la, absl::Span<const MicroBatch> micro_batches,
                            absl::Span<const int32_t> next_input_ids);

  HostStore* store_ = nullptr;
  CpuAdamW* adamw_ = nullptr;
  OptimizerQueue* queue_ = nullptr;
  ThreadPool* pool_ = nullptr;           // the optimizer's
  ThreadPool* critical_pool_ = nullptr;  // the row gate's
  bool keep_lookahead_ = false;
  int64_t block_ = 0;  // the embedding block
  int64_t rows_ = 0;   // V
  int64_t width_ = 0;  // C

  // The pending row-wise update. Row states: 0 pending, 1 being updated,
  // 2 done. The parameters are written before rows_pending_ is set (under
  // mu_) and read after it is seen set.
  std::unique_ptr<std::atomic<uint8_t>[]> row_state_;
  int64_t step_ = 0;
  double lr_ = 0;
  float grad_scale_ = 1.0f;
  bool grad_zero_next_ = false;

  absl::Mutex mu_;
  bool rows_pending_ ABSL_GUARDED_BY(mu_) = false;

  Lookahead lookahead_[2];               // by step parity
  Lookahead* gate_lookahead_ = nullptr;  // for the next row gate; step thread only
  std::vector<uint8_t> touched_;         // [V] scratch of QueueLookahead
  int64_t gate_rows_ = 0;
  int64_t lookahead_rows_ = 0;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_OPTIM_EMBEDDING_UPDATER_H_
