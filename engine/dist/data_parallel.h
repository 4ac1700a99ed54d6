// Data-parallel training on several devices of one host: one Trainer per
// device ("rank"), each a thread of this process, all sharing one host
// store (weights, AdamW moments, streaming copy, reduced gradient) and one
// CPU AdamW, gradients combined over c10d (gloo on the CPU, NCCL on CUDA)
// as they land (Notes [Data-parallel step] and [Shared host store] in
// step/gradient_reducer.h). No LibTorch types here: the job and the
// benchmark use it. docs/distributed.md has the design and what is not
// built (device-side reduce-scatter, multi-host jobs).
#ifndef MEGATRAIN_ENGINE_DIST_DATA_PARALLEL_H_
#define MEGATRAIN_ENGINE_DIST_DATA_PARALLEL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/dist/collective_reducer.h"
#include "engine/dist/process_group.h"
#include "engine/io/batch.h"
#include "engine/step/trainer.h"

namespace megatrain::engine {

struct DataParallelOptions {
  // One device per rank: {"cpu", "cpu"} (gloo; tests) or {"cuda:0",
  // "cuda:1", ...} (NCCL). Size 1..kMaxDataParallelRanks.
  std::vector<std::string> devices;
  // A collective that waits longer fails the step with UNAVAILABLE (a
  // rank died or stalled).
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
};

inline constexpr int kMaxDataParallelRanks = 64;

// The devices of `devices` ranks on `base_device` ("cpu": that many CPU
// ranks; "cuda" / "cuda:K": cuda:0 .. cuda:N-1, or from K on).
std::vector<std::string> DataParallelDevices(const std::string& base_device, int devices);

// Ownership: owns the group, the reducers and the Trainers.
// Thread-safety: driven by one thread at a time (as Trainer); Step runs
// one thread per rank internally and joins them before it returns.
class DataParallelTrainer {
 public:
  // Allocates the shared host store (weights initialised from `seed`),
  // builds one Trainer per device with `options` (its device replaced,
  // gradient_accumulation_steps divided by the rank count; rank 0 owns the
  // optimizer) and joins them in one process group. Errors:
  // INVALID_ARGUMENT for no or too many devices, or an accumulation count
  // the rank count does not divide; Trainer::Create's and
  // CollectiveGroup::Create's.
  static absl::StatusOr<std::unique_ptr<DataParallelTrainer>> Create(const ModelConfig& config,
                                                                     const TrainerOptions& options,
                                                                     uint64_t seed,
                                                                     const DataParallelOptions& dp);
  ~DataParallelTrainer();

  // One optimizer step over the global batch `micro_batches`: rank r runs
  // the r-th contiguous 1/world of them. Their number must be a multiple of
  // world_size() (INVALID_ARGUMENT otherwise). The result is rank 0's (loss
  // and counted tokens of the global batch; every rank's is the same).
  // Errors: the first rank's error (Trainer::Step; UNAVAILABLE for a
  // failed collective).
  absl::StatusOr<StepResult> Step(absl::Span<const MicroBatch> micro_batches);

  // Mean loss over `micro_batches` on rank 0 (the replicas are identical).
  absl::StatusOr<double> Evaluate(absl::Span<const MicroBatch> micro_batches);

  // Waits for every rank's queued updates (Trainer::WaitForOptimizer).
  absl::Status WaitForOptimizer();

  // The shared host store: what checkpoints write (once) and read; call
  // WaitForOptimizer() before reading it. The caller may write it (loading
  // weights or a checkpoint, then set_step) between steps.
  HostStore& store() { return *shared_; }
  // Host bytes held: the shared store's plus every rank's landing
  // gradients (each counted once).
  HostStoreBytes host_bytes() const;

  int64_t step() const { return ranks_[0]->step(); }
  void set_step(int64_t step);
  int world_size() const { return static_cast<int>(ranks_.size()); }
  Trainer& rank(int r) { return *ranks_[static_cast<size_t>(r)]; }
  const std::string& backend_name() const { return groups_[0]->backend_name(); }

 private:
  DataParallelTrainer() = default;
  // Runs fn(r) on one thread per rank; returns the lowest rank's error.
  template <typename F>
  absl::Status OnEveryRank(F fn);

  std::unique_ptr<HostStore> shared_;  // destroyed last (declared first)
  std::unique_ptr<GradientShards> shards_;
  std::vector<std::unique_ptr<CollectiveGroup>> groups_;
  std::vector<std::unique_ptr<CollectiveGradientReducer>> reducers_;
  std::vector<std::unique_ptr<Trainer>> ranks_;  // destroyed first (declared last)
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIST_DATA_PARALLEL_H_
