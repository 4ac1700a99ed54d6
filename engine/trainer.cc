// Optimizer steps over the streaming executor.
#include "engine/trainer.h"

#include <chrono>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/device_runtime.h"
#include "engine/executor.h"
#include "engine/status_macros.h"
#include "engine/thread_pool.h"

namespace megatrain::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Trainer::~Trainer() {
  executor_.reset();  // drains the device before the store goes away
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const ModelConfig& config,
                                                        const TrainerOptions& options,
                                                        uint64_t seed) {
  MEGATRAIN_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<Trainer> t(new Trainer());
  t->options_ = options;
  t->pool_ = ThreadPool::Create(options.threads);
  MEGATRAIN_ASSIGN_OR_RETURN(t->runtime_, DeviceRuntime::Create(options.device));
  HostStoreOptions store_options;
  store_options.streaming_bf16 = options.compute_dtype == ComputeDtype::kBf16;
  store_options.pin = t->runtime_->is_cuda();
  MEGATRAIN_ASSIGN_OR_RETURN(t->store_, HostStore::Create(config, store_options));
  t->store_->InitializeWeights(seed);
  ExecutorOptions exec;
  exec.compute_dtype = options.compute_dtype;
  exec.micro_batch = options.micro_batch;
  exec.seq_len = options.seq_len;
  exec.num_weight_slots = options.num_weight_slots;
  exec.loss_chunk_tokens = options.loss_chunk_tokens;
  MEGATRAIN_ASSIGN_OR_RETURN(
      t->executor_,
      StreamingExecutor::Create(t->store_.get(), t->runtime_.get(), t->pool_.get(), exec));
  MEGATRAIN_ASSIGN_OR_RETURN(CpuAdamW adamw, CpuAdamW::Create(options.adamw, t->pool_.get()));
  t->adamw_ = std::make_unique<CpuAdamW>(std::move(adamw));
  LrScheduleOptions schedule = options.schedule;
  schedule.peak_lr = options.adamw.lr;
  MEGATRAIN_ASSIGN_OR_RETURN(LrSchedule lr, LrSchedule::Create(schedule));
  t->schedule_ = std::make_unique<LrSchedule>(std::move(lr));
  return t;
}

absl::StatusOr<StepResult> Trainer::Step(absl::Span<const MicroBatch> micro_batches) {
  const auto start = std::chrono::steady_clock::now();
  // Squared gradient norm per block, filled on the accumulator thread as
  // each block's gradient becomes final (overlapping the rest of backward).
  std::vector<double> block_sq(store_->num_blocks(), 0.0);
  MEGATRAIN_ASSIGN_OR_RETURN(
      ForwardBackwardResult fb,
      executor_->ForwardBackward(micro_batches, [&](int64_t block) {
        block_sq[block] = SumOfSquares(store_->grad(block), store_->block_numel(block), pool_.get());
      }));
  const auto optimizer_start = std::chrono::steady_clock::now();
  StepResult result;
  result.loss = fb.loss();
  result.counted_tokens = fb.counted_tokens;
  double total_sq = 0;
  for (double s : block_sq) total_sq += s;
  result.grad_norm = std::sqrt(total_sq);
  result.lr = schedule_->LrAt(step_ + 1);
  if (!std::isfinite(result.loss) || !std::isfinite(result.grad_norm)) {
    if (!options_.skip_nonfinite_steps) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step_ + 1, ": non-finite loss (", result.loss, ") or gradient norm (",
          result.grad_norm, "); master weights left unchanged"));
    }
    result.skipped = true;
  } else {
    const float grad_scale = ClipCoefficient(result.grad_norm, options_.max_grad_norm);
    for (int64_t block = 0; block < store_->num_blocks(); ++block) {
      AdamWBuffers buffers;
      buffers.params = store_->master(block);
      buffers.grads = store_->grad(block);
      buffers.exp_avg = store_->exp_avg(block);
      buffers.exp_avg_sq = store_->exp_avg_sq(block);
      buffers.bf16_params = store_->streaming_bf16(block);
      buffers.num_elements = store_->block_numel(block);
      MEGATRAIN_RETURN_IF_ERROR(adamw_->Step(buffers, step_ + 1, result.lr, grad_scale));
    }
    ++step_;
  }
  result.step = step_;
  result.stats = fb.stats;
  result.stats.optimizer_seconds = SecondsSince(optimizer_start);
  // The optimizer runs after backward, not overlapped (yet): all exposed.
  result.stats.optimizer_exposed_seconds = result.stats.optimizer_seconds;
  result.stats.step_seconds = SecondsSince(start);
  result.stats.gpu_idle_seconds =
      std::max(0.0, result.stats.step_seconds - result.stats.compute_seconds);
  return result;
}

absl::StatusOr<double> Trainer::Evaluate(absl::Span<const MicroBatch> micro_batches) {
  MEGATRAIN_ASSIGN_OR_RETURN(ForwardBackwardResult r, executor_->Evaluate(micro_batches));
  return r.loss();
}

std::string Trainer::device_name() const { return runtime_->name(); }
bool Trainer::is_cuda() const { return runtime_->is_cuda(); }
int64_t Trainer::slot_device_bytes() const { return executor_->slot_device_bytes(); }
int64_t Trainer::staging_host_bytes() const { return executor_->staging_host_bytes(); }

}  // namespace megatrain::engine
