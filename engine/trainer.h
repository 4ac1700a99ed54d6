// One model being trained: the host store, the device runtime, the
// streaming executor and the CPU AdamW, tied into optimizer steps. No
// LibTorch types here: the server and the benchmark use this header.
//
// A step: forward/backward over the micro-batches of the global batch
// (executor.h), global gradient norm (summed per block as each block's
// gradient becomes final), clipping coefficient, then AdamW on every block
// with the learning rate of the schedule; the optimizer also rewrites the
// bf16 streaming copy. Steps are counted from 1.
//
// Note [Optimizer overlap]
// The CPU AdamW moves ~30 bytes of host memory per parameter, as long as a
// whole forward+backward of the GPU for billion-parameter models, so it runs
// on its own thread, block by block, while the GPU works:
//   * with clipping (max_grad_norm > 0) the updates of step k need the
//     global norm, known when backward ends; they are queued in forward order
//     (embedding, layer 0, ..., head) and step k+1's forward waits, block by
//     block, only for the update of the block it is about to load;
//   * without clipping (max_grad_norm <= 0) a block's update is queued as
//     soon as its gradient is final, so it also overlaps step k's backward.
// The executor's weight gate (StreamingExecutor::SetWeightGate) enforces the
// order; the update stays exact AdamW (no staleness). Step() can return
// while updates are still running: WaitForOptimizer() (called by Evaluate,
// and by anything that reads the store) waits for them.
// Non-finite values: with clipping, a non-finite loss or norm skips the
// whole step. Without clipping, a block whose gradient is non-finite is not
// updated (the step is reported skipped), while blocks already updated
// keep their update; master weights never receive NaN or inf.
//
// Thread-safety: a Trainer is driven by one thread at a time; it owns an
// optimizer thread internally.
#ifndef MEGATRAIN_ENGINE_TRAINER_H_
#define MEGATRAIN_ENGINE_TRAINER_H_

#include <cstdint>
#include <memory>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/adamw.h"
#include "engine/batch.h"
#include "engine/host_store.h"
#include "engine/lr_schedule.h"
#include "engine/model_config.h"
#include "engine/precision.h"
#include "engine/stats.h"

namespace megatrain::engine {

class DeviceRuntime;
class StreamingExecutor;
class ThreadPool;

struct TrainerOptions {
  std::string device = "cpu";        // "cpu", "cuda", "cuda:N"
  ComputeDtype compute_dtype = ComputeDtype::kFp32;
  int64_t micro_batch = 1;           // B, sequences per forward/backward
  int64_t seq_len = 128;             // T, tokens per sequence
  AdamWOptions adamw;                // lr is the schedule's peak
  LrScheduleOptions schedule;        // peak_lr is overwritten with adamw.lr
  double max_grad_norm = 1.0;        // global-norm clipping; <= 0 disables
  bool skip_nonfinite_steps = true;  // NaN/inf loss or norm: skip vs fail
  int threads = 0;                   // CPU threads (optimizer, accumulation); 0 = all
  int num_weight_slots = 3;          // device weight buffers
  int64_t loss_chunk_tokens = 0;     // 0 = auto
};

struct StepResult {
  int64_t step = 0;         // this step's number (from 1); unchanged if skipped
  double loss = 0;          // mean over counted tokens of the global batch
  int64_t counted_tokens = 0;
  double grad_norm = 0;     // global L2 norm before clipping
  double lr = 0;            // learning rate used
  bool skipped = false;     // non-finite loss/norm; weights untouched
  StepStats stats;
};

class Trainer {
 public:
  // Allocates the store (fp32 master + grads + AdamW moments, plus a bf16
  // streaming copy for bf16 compute; pinned on CUDA), initialises weights
  // from `seed` (HF init, std 0.02), and builds the pipeline.
  // Errors: INVALID_ARGUMENT / UNIMPLEMENTED for a bad config or option
  // (naming the field); UNAVAILABLE for a missing device;
  // RESOURCE_EXHAUSTED when host, pinned or device memory runs out.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const ModelConfig& config,
                                                         const TrainerOptions& options,
                                                         uint64_t seed);
  ~Trainer();

  // One optimizer step over `micro_batches` ([B*T] tokens each). Errors as
  // StreamingExecutor::ForwardBackward; FAILED_PRECONDITION for a
  // non-finite loss when skip_nonfinite_steps is false.
  absl::StatusOr<StepResult> Step(absl::Span<const MicroBatch> micro_batches);

  // Mean loss over `micro_batches` without training. Waits for pending
  // optimizer work first.
  absl::StatusOr<double> Evaluate(absl::Span<const MicroBatch> micro_batches);

  // Logits [B, T, V] fp32 of one micro-batch (see
  // StreamingExecutor::Logits). Waits for pending optimizer work first.
  absl::StatusOr<std::vector<float>> Logits(const MicroBatch& micro_batch);

  // Blocks until every queued optimizer update has been applied, so that
  // store() holds the weights of step(). Returns the first error an
  // asynchronous update hit, if any.
  absl::Status WaitForOptimizer();

  // The host store. Call WaitForOptimizer() before reading weights.
  HostStore& store() { return *store_; }
  const ModelConfig& config() const { return store_->config(); }
  const TrainerOptions& options() const { return options_; }
  // Optimizer steps taken (the next step is step() + 1). Settable on resume.
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  std::string device_name() const;
  bool is_cuda() const;
  // Device bytes of the weight/gradient slots; pinned staging bytes.
  int64_t slot_device_bytes() const;
  int64_t staging_host_bytes() const;

 private:
  Trainer() = default;
  // Queues AdamW of `block` for update number `step` on the optimizer thread.
  void ScheduleUpdate(int64_t block, int64_t step, double lr, float grad_scale);
  void OptimizerLoop();
  // The executor's weight gate: waits until `block` has no pending update.
  void WaitBlock(int64_t block);

  TrainerOptions options_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<HostStore> store_;
  std::unique_ptr<DeviceRuntime> runtime_;
  std::unique_ptr<StreamingExecutor> executor_;
  std::unique_ptr<CpuAdamW> adamw_;
  std::unique_ptr<LrSchedule> schedule_;
  int64_t step_ = 0;

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> pending_ ABSL_GUARDED_BY(mu_);     // per block
  int64_t pending_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status optimizer_error_ ABSL_GUARDED_BY(mu_);
  double optimizer_busy_seconds_ ABSL_GUARDED_BY(mu_) = 0;  // since last Step()
  std::thread optimizer_thread_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_TRAINER_H_
