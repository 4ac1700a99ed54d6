// The trainer a TrainingJob drives: one Trainer on one device, or a
// DataParallelTrainer over the N devices the daemon granted the job
// (train.devices; docs/distributed.md). One interface, so that the job's
// loop (data, eval, checkpoints, resume, NaN policy) is the same for both.
// No LibTorch types here.
#ifndef MEGATRAIN_ENGINE_JOB_JOB_TRAINER_H_
#define MEGATRAIN_ENGINE_JOB_JOB_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/dist/data_parallel.h"
#include "engine/data/batch.h"
#include "engine/step/trainer.h"

namespace megatrain::engine {

// The devices a job's ranks run on: `devices` with every "cpu:K" written
// "cpu" (the daemon may name CPU "devices" apart; the engine has one CPU
// device, and N CPU ranks run over gloo as threads). INVALID_ARGUMENT
// naming train.devices when `devices` is empty, its size is not
// `spec_devices`, a device is named twice (a CUDA device), or CPU and CUDA
// devices are mixed.
absl::StatusOr<std::vector<std::string>> JobRankDevices(const std::vector<std::string>& devices,
                                                        int64_t spec_devices);

// Note [Data-parallel job]
// A job with train.devices N > 1 runs a DataParallelTrainer: N ranks, one
// thread per device, c10d over an in-process store (HashStore), gloo on the
// CPU and NCCL on CUDA; the process group is created with the job and
// destroyed with it. The job's loader reads the global batch of
// train.gradient_accumulation_steps (A) micro-batches in its order, and
// rank r trains micro-batches [r*A/N, (r+1)*A/N) of it (contiguous
// shares): the same micro-batches, in the same order, as one device
// accumulating all A. The data cursor, and so the checkpoint, does not
// depend on N; a checkpoint is written once from the shared host store and
// loads with any N that divides A. The embedding lookahead is off with
// N > 1 (the embedding updates as one block) and a forced cancel waits
// for the running step (the ranks leave their collectives together only
// at step boundaries).
//
// Thread-safety: as Trainer (one thread drives it).
class JobTrainer {
 public:
  // One Trainer on `devices[0]` (size 1), or a DataParallelTrainer over
  // `devices` (size > 1; `options.gradient_accumulation_steps` is the
  // global count, divided among the ranks). With `options.nvme_dir` each
  // rank keeps its optimizer shard's moments in files of its own there
  // (Note [Tier shards] in store/nvme_tier.h). Errors: Trainer::Create's
  // and DataParallelTrainer::Create's.
  static absl::StatusOr<std::unique_ptr<JobTrainer>> Create(
      const ModelConfig& config, TrainerOptions options, uint64_t seed,
      const std::vector<std::string>& devices);

  // One optimizer step over the global batch (Trainer::Step; with N > 1,
  // DataParallelTrainer::Step, `next_input_ids` ignored).
  absl::StatusOr<StepResult> Step(absl::Span<const MicroBatch> micro_batches,
                                  absl::Span<const int32_t> next_input_ids);
  // Mean loss over `micro_batches` (rank 0's with N > 1: the replicas are
  // identical).
  absl::StatusOr<double> Evaluate(absl::Span<const MicroBatch> micro_batches);
  // Every rank's queued updates applied; then store() holds step()'s state.
  absl::Status WaitForOptimizer();

  // The host store checkpoints write and read (the shared one with N > 1).
  HostStore& store();
  // The NVMe tier's moment files of every rank (null without the tier),
  // for checkpoints: valid after WaitForOptimizer and until the next Step.
  const NvmeMomentTier* nvme_tier() const { return tier_.get(); }
  int64_t step() const;
  void set_step(int64_t step);
  // Ranks (devices) the job trains on.
  int devices() const { return dp_ != nullptr ? dp_->world_size() : 1; }
  // Rank 0's trainer (the single one with one device).
  const Trainer& first() const { return dp_ != nullptr ? dp_->rank(0) : *single_; }
  // "gloo" or "nccl" with N > 1; empty with one device.
  std::string backend_name() const { return dp_ != nullptr ? dp_->backend_name() : ""; }

 private:
  JobTrainer() = default;
  std::unique_ptr<Trainer> single_;
  std::unique_ptr<DataParallelTrainer> dp_;
  std::unique_ptr<NvmeMomentTier> tier_;  // points into the trainers
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_JOB_JOB_TRAINER_H_
