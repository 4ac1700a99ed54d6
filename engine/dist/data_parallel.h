// Data-parallel training on several devices of one host: one Trainer per
// device ("rank"), each a thread of this process, all sharing one host
// store (weights, AdamW moments, streaming copy, reduced gradient) and one
// CPU AdamW split by shard over the ranks; resident blocks are replicated
// on every device and summed there; streamed blocks are loaded in shards
// and gathered (Notes [Data-parallel step], [Shared host store], [Sharded
// optimizer] and [Resident blocks on every rank] in step/gradient_reducer.h;
// [Sharded weight streaming] in step/weight_slots.h). No LibTorch types
// here: the job and the benchmark use it. docs/distributed.md has the
// design and what is not built.
#ifndef MEGATRAIN_ENGINE_DIST_DATA_PARALLEL_H_
#define MEGATRAIN_ENGINE_DIST_DATA_PARALLEL_H_

#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/dist/collective_reducer.h"
#include "engine/dist/rank_threads.h"
#include "engine/dist/gradient_shard.h"
#include "engine/dist/process_group.h"
#include "engine/data/batch.h"
#include "engine/step/trainer.h"

namespace megatrain::engine {

struct DataParallelOptions {
  // One device per rank: {"cpu", "cpu"} (gloo; tests) or {"cuda:0",
  // "cuda:1", ...} (NCCL). Size 1..kMaxDataParallelRanks.
  std::vector<std::string> devices;
  // A collective that waits longer fails the step with UNAVAILABLE (a
  // rank died or stalled).
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // How block gradients are reduced (gradient_shard.h; kAuto: the device
  // reduce-scatter on NCCL, the host all-reduce on gloo).
  GradientReduction gradient_reduction = GradientReduction::kAuto;
  // Note [Sharded weight streaming] in step/weight_slots.h: this process's
  // ranks load 1/N of each streamed block each and gather the rest from
  // one another (the weights cross host memory once per step, not once
  // per rank). False: every rank loads whole blocks (for comparison).
  bool shard_weights = true;
  // Note [Peer copies] in dist/peer_exchange.h: on CUDA, this process's
  // ranks reduce-scatter, all-reduce and all-gather among themselves by
  // peer copies on the copy engines, not NCCL kernels, where every pair of
  // GPUs has peer access (else NCCL, with a line on stderr). Off by
  // default: its first GPU run did not finish within the device call
  // (cause not found; docs/distributed.md "What is not built").
  bool peer_copies = false;

  // Note [Replica processes]: several processes (one per host, launched by
  // torchrun), each with `devices` local ranks and its own replica of the
  // host store. `rendezvous`: the store every process joins
  // (RendezvousStore::CreateTcp; JoinFromTorchrunEnv fills these three);
  // null: this process is the whole job (process_rank 0 of 1).
  std::shared_ptr<RendezvousStore> rendezvous;
  int process_rank = 0;   // [0, num_processes): torchrun's RANK
  int num_processes = 1;  // torchrun's WORLD_SIZE
};

inline constexpr int kMaxDataParallelRanks = 64;

// Note [Replica processes]
// With several processes (hosts), the job's ranks are process p's local
// rank l at global rank p * L + l (L local ranks in every process). Each
// process holds a full replica of the host store and runs one AdamW over it
// (split by shard over its local ranks, Note [Sharded optimizer] in
// step/gradient_reducer.h). Every block's gradient is reduced over all P * L ranks before
// it lands in the replicas (host path: one all-reduce over all ranks;
// device path: a reduce-scatter over the process's L ranks, then each
// shard all-reduced over the P ranks of its local index), so every
// replica receives the same gradient bits: the c10d all-reduce gives every
// rank the same result (gloo and NCCL reduce each chunk once and broadcast
// it), the norm is summed in a fixed order, and the loss and token count
// are all-reduced integers / fp64 sums identical everywhere. The replicas
// start identical (the same seed, or the same checkpoint read by every
// process) and apply the same AdamW code to the same bits, so they stay
// bit-identical as long as every process runs the same binary on CPUs
// that compute the same fp32 (AdamW's arithmetic is per element; the pool's
// thread count does not change it). DataParallelTrainer::ReplicasAgree
// checks it (a checksum of every replica's weights and moments compared
// over the ranks). Checkpoints are written once, by process 0
// (writes_checkpoints()); to resume, every process reads the same
// checkpoint into its replica and set_step()s: the same world size
// continues bit for bit. With the NVMe tier each process's replica of
// the moments is in its ranks' files (Note [Tier shards] in
// store/nvme_tier.h, named by global rank): process 0 writes the
// checkpoint's moments from its files, every process reads them into its
// own, and ReplicasAgree reads them back to compare.

// Note [Ring shards] in step/gradient_reducer.h: whether `world` ranks
// (every process's) training with `options` on `config` land their
// gradients in rings of shards: memory.gradient_landing ring, or auto
// where the ring is sure to be allowed (otherwise the arena): clipping
// off, no NVMe tier, `reduction` not kHostAllReduce, and each rank's
// landings whole: one micro-batch per rank, or several summed on the
// device (DataParallelTrainer asks for it; not where
// device_grad_accumulation is forced off), and then no tied table on
// the host (resident_embedding not forced on). The job's footprint
// counts the same.
bool DataParallelGradientRing(const TrainerOptions& options, const ModelConfig& config, int world,
                              GradientReduction reduction);

// Fills dp's rendezvous, process_rank and num_processes from torchrun's
// variables (ReadTorchrunEnv; WORLD_SIZE = processes, RANK = this
// process), joining the TCPStore at MASTER_ADDR:MASTER_PORT within
// `timeout`. Errors: INVALID_ARGUMENT naming the variable that is missing
// or out of range (a missing WORLD_SIZE included); UNAVAILABLE naming
// MASTER_ADDR:MASTER_PORT when the store cannot be reached (or served)
// within `timeout`.
absl::Status JoinFromTorchrunEnv(std::chrono::milliseconds timeout, DataParallelOptions* dp);

// The devices of `devices` ranks on `base_device` ("cpu": that many CPU
// ranks; "cuda" / "cuda:K": cuda:0 .. cuda:N-1, or from K on).
std::vector<std::string> DataParallelDevices(const std::string& base_device, int devices);

// Ownership: owns the group, the reducers and the Trainers.
// Thread-safety: driven by one thread at a time (as Trainer); Step runs
// one thread per rank internally and joins them before it returns.
class DataParallelTrainer {
 public:
  // Allocates the shared host store (weights initialised from `seed`;
  // without a gradient arena for options.gradient_landing ring, Note
  // [Ring shards] in step/gradient_reducer.h; without AdamW moments with
  // `options.nvme_dir`, where each rank keeps its shard's in files of its
  // own, named by its global rank, Note [Tier shards] in
  // store/nvme_tier.h), builds one Trainer per
  // device with `options` (its device replaced,
  // gradient_accumulation_steps divided by the rank count; each rank
  // updates its shard) and joins them in one process group. Errors:
  // INVALID_ARGUMENT for no or too many devices, an accumulation count
  // the rank count does not divide, or the ring with
  // dp.gradient_reduction kHostAllReduce; Trainer::Create's (the ring's
  // refusals among them) and CollectiveGroup::Create's.
  static absl::StatusOr<std::unique_ptr<DataParallelTrainer>> Create(const ModelConfig& config,
                                                                     const TrainerOptions& options,
                                                                     uint64_t seed,
                                                                     const DataParallelOptions& dp);
  ~DataParallelTrainer();

  // One optimizer step over the global batch `micro_batches`: rank r runs
  // the r-th contiguous 1/world of them. Their number must be a multiple of
  // world_size() (INVALID_ARGUMENT otherwise). The result is rank 0's (loss
  // and counted tokens of the global batch; every rank's is the same), but
  // its stats' NVMe tier bytes, every rank's summed (the host's tier).
  // Errors: the first rank's error that is not UNAVAILABLE (Trainer::Step:
  // e.g. one rank's DATA_LOSS from its NVMe tier files, found at the start
  // of its step; it still meets the other ranks in the step's first
  // collective, where they fail at once with UNAVAILABLE, in every
  // process: GradientReducer::BeginStep), else the first rank's
  // (UNAVAILABLE for a failed collective).
  absl::StatusOr<StepResult> Step(absl::Span<const MicroBatch> micro_batches);

  // Mean loss over `micro_batches` on rank 0 (the replicas are identical).
  absl::StatusOr<double> Evaluate(absl::Span<const MicroBatch> micro_batches);

  // Waits for every rank's queued updates (Trainer::WaitForOptimizer).
  absl::Status WaitForOptimizer();

  // Note [Replica processes]: whether every process's replica holds the
  // same bits (fp32 master weights and AdamW moments; the streaming copy is
  // derived from the weights): a 63-bit FNV-1a checksum of this process's
  // store (its moments read from the ranks' NVMe tier files with the
  // tier), its maximum and minimum compared over all ranks.
  // Call between steps on every process (it is a collective). UNAVAILABLE
  // when a peer fails; the tier's error (DATA_LOSS naming the file) when
  // this process's files cannot be read (the other processes then get
  // false, not a timeout).
  absl::StatusOr<bool> ReplicasAgree();

  // The shared host store: what checkpoints write (once) and read; call
  // WaitForOptimizer() before reading it. The caller may write it (loading
  // weights or a checkpoint, then set_step) between steps: every rank then
  // reloads its resident blocks from it before its next pass (Note
  // [Resident blocks on every rank] in step/gradient_reducer.h).
  HostStore& store();
  // Host bytes held: the shared store's plus every rank's landing
  // gradients (each counted once; not the NVMe tier's staging).
  HostStoreBytes host_bytes() const;
  // With TrainerOptions::nvme_dir: the shared store's AdamW moments (this
  // process's replica), every local rank's shard in its own files (Note
  // [Tier shards] in store/nvme_tier.h), for checkpoints. Use it as Trainer::nvme_shard
  // (after WaitForOptimizer, before the next Step); it points into the
  // ranks. INVALID_ARGUMENT without the tier.
  absl::StatusOr<NvmeMomentTier> nvme_tier() const;

  int64_t step() const { return ranks_[0]->step(); }
  void set_step(int64_t step);
  // Ranks in this process (its devices).
  int world_size() const { return static_cast<int>(ranks_.size()); }
  // Note [Replica processes]: this process's place among the job's.
  int process_rank() const { return process_rank_; }
  int num_processes() const { return num_processes_; }
  // Whether this process writes checkpoints (process 0 only).
  bool writes_checkpoints() const { return process_rank_ == 0; }
  // The reduction the groups took (never kAuto; kDeviceReduceScatter
  // with the gradient ring).
  GradientReduction gradient_reduction() const { return reduction_; }
  // Whether the ranks land their shards in gradient rings (Note [Ring
  // shards] in step/gradient_reducer.h; DataParallelGradientRing).
  bool gradient_ring() const { return gradient_ring_; }
  Trainer& rank(int r) { return *ranks_[static_cast<size_t>(r)]; }
  const std::string& backend_name() const { return groups_[0]->backend_name(); }
  // Whether this process's ranks exchange by peer copies (Note [Peer
  // copies]).
  bool peer_copies() const { return peer_copies_; }

 private:
  DataParallelTrainer() = default;
  // Note [Replica processes]: a 63-bit FNV-1a checksum of this process's
  // fp32 master weights and AdamW moments (from the ranks' NVMe tier files
  // when the store keeps none: Note [Tier shards]), block by block.
  // Errors: the tier's (DATA_LOSS naming a file). After WaitForOptimizer.
  absl::StatusOr<int64_t> ReplicaChecksum() const;

  // Runs fn(r) on rank r's thread (Note [Rank threads]) for every rank at
  // once; returns the lowest rank's error.
  absl::Status OnEveryRank(const std::function<absl::Status(int)>& fn);

  // Joins this process's ranks to the job's groups (groups_, and for the
  // device path local_groups_ and cross_groups_).
  absl::Status JoinGroups(const DataParallelOptions& dp);

  // Note [Peer copies]: the local and weight groups' exchanges, where on.
  absl::Status UsePeerCopies(const DataParallelOptions& dp);

  int process_rank_ = 0, num_processes_ = 1;
  bool peer_copies_ = false;
  bool gradient_ring_ = false;
  GradientReduction reduction_ = GradientReduction::kHostAllReduce;
  std::unique_ptr<RankThreads> threads_;  // idle when the others go
  std::unique_ptr<HostStore> shared_;     // destroyed after the ranks
  std::unique_ptr<GradientShards> shards_;
  std::vector<std::unique_ptr<CollectiveGroup>> groups_;        // every rank of the job
  std::vector<std::unique_ptr<CollectiveGroup>> local_groups_;  // device path: this process's
  std::vector<std::unique_ptr<CollectiveGroup>> cross_groups_;  // device path, several processes
  std::vector<std::unique_ptr<CollectiveGroup>>
      weight_groups_;  // sharded streaming: this process's
  std::vector<std::unique_ptr<CollectiveGradientReducer>> reducers_;
  std::vector<std::unique_ptr<Trainer>> ranks_;  // destroyed first (declared last)
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIST_DATA_PARALLEL_H_
