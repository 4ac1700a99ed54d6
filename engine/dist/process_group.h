// Collectives for data parallelism over LibTorch's c10d: a rendezvous store
// (in-process HashStore for ranks that are threads of one process; TCPStore
// with torchrun's environment variables across processes and hosts) and a
// process group over it (ProcessGroupGloo on the CPU, ProcessGroupNCCL on
// CUDA). No LibTorch types in this header: the job and the benchmark use it.
//
// Legend: a "rank" is one member of the group (one device); world_size is
// the number of ranks. docs/distributed.md says how to run it.
#ifndef MEGATRAIN_ENGINE_DIST_PROCESS_GROUP_H_
#define MEGATRAIN_ENGINE_DIST_PROCESS_GROUP_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace megatrain::engine {

class PeerExchange;

// torchrun's rendezvous variables (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
// RANK, LOCAL_RANK).
//
// Note [torchrun's agent store]
// torchrun's agent on the first node already serves a TCPStore at
// MASTER_ADDR:MASTER_PORT (its static and c10d rendezvous share it with
// the workers) and sets TORCHELASTIC_USE_AGENT_STORE=True: then no worker
// may serve one (the port is taken); every process connects as a client
// and keeps its keys under "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>",
// as torch.distributed's env:// init does (torch/distributed/rendezvous.py,
// _create_c10d_store). Without the variable (a hand-made launch, the
// tests), RANK 0 serves the store.
struct TorchrunEnv {
  std::string master_addr;
  int master_port = 0;       // 1..65535
  int world_size = 1;        // >= 1
  int rank = 0;              // [0, world_size)
  int local_rank = 0;        // this process's device on its host
  bool agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE == "True"
  int restart_count = 0;     // TORCHELASTIC_RESTART_COUNT (0 when unset)
};

// Reads TorchrunEnv from the environment. NOT_FOUND when WORLD_SIZE is
// unset (not launched by torchrun); INVALID_ARGUMENT naming the variable
// when one is missing or out of range (TORCHELASTIC_RESTART_COUNT
// included, when set).
absl::StatusOr<TorchrunEnv> ReadTorchrunEnv();

// A c10d key-value store the ranks meet in. Thread-safe (c10d's stores
// are). Shared by every rank that joins through it; keeps the store alive.
class RendezvousStore {
 public:
  // A store for ranks that are threads of this process (c10d::HashStore).
  static std::shared_ptr<RendezvousStore> CreateInProcess();
  // c10d::TCPStore at env.master_addr:env.master_port; rank 0 serves it
  // (unless torchrun's agent does: Note [torchrun's agent store]) and
  // returns at once, the others connect within `timeout`; the first
  // group's creation is the barrier. UNAVAILABLE naming
  // MASTER_ADDR:MASTER_PORT when the server cannot be reached or bound.
  static absl::StatusOr<std::shared_ptr<RendezvousStore>> CreateTcp(
      const TorchrunEnv& env, std::chrono::milliseconds timeout);
  // Note [One client per rank]
  // c10d's TCPStore client serialises its operations, and a blocking
  // wait holds it: two ranks (threads) sharing one client deadlock when
  // one waits for a key the other has yet to set (every process group's
  // rendezvous does that; torchrun's one process driving several GPUs hung
  // on it). Each rank thread therefore joins through a connection of its
  // own. Returns a new client of `store`'s TCP server (the same key prefix),
  // or `store` itself for an in-process store (c10d's HashStore serves
  // every thread). UNAVAILABLE as CreateTcp.
  static absl::StatusOr<std::shared_ptr<RendezvousStore>> Connect(
      const std::shared_ptr<RendezvousStore>& store);
  ~RendezvousStore();
  // The TCP port the store listens on (rank 0 of CreateTcp; port 0 asked
  // for an ephemeral one); 0 for an in-process store.
  int port() const;

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  explicit RendezvousStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One rank's membership of a process group.
// Thread-safety: collectives are issued by one thread at a time, and every
// rank issues the same collectives in the same order (c10d's rule).
class CollectiveGroup {
 public:
  // Joins group `rank` of `world_size` through `store` over gloo (device
  // "cpu") or NCCL (device "cuda[:N]", CUDA builds only). Collectives fail
  // with UNAVAILABLE after `timeout`. Blocks until every rank joined.
  // Errors: INVALID_ARGUMENT for a rank outside [0, world_size);
  // UNIMPLEMENTED for a backend this build lacks; UNAVAILABLE when the
  // rendezvous fails.
  // `prefix`: the group's keys in the store; groups created over the same
  // store at the same time (a job's all-ranks, per-host and cross-host
  // groups) need distinct prefixes.
  static absl::StatusOr<std::unique_ptr<CollectiveGroup>> Create(
      std::shared_ptr<RendezvousStore> store, int rank, int world_size, const std::string& device,
      std::chrono::milliseconds timeout, const std::string& prefix = "megatrain");
  ~CollectiveGroup();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // "gloo" or "nccl".
  const std::string& backend_name() const { return backend_name_; }

  // Sums `data` ([numel], host memory) over the ranks, in place; every
  // rank receives the same values. NCCL stages through device memory.
  // UNAVAILABLE when a peer fails or the timeout passes.
  absl::Status AllReduceSum(float* data, int64_t numel);
  absl::Status AllReduceSum(double* data, int64_t numel);
  absl::Status AllReduceSum(int64_t* data, int64_t numel);
  // Element-wise maximum over the ranks of `data` ([numel], host memory).
  absl::Status AllReduceMax(int64_t* data, int64_t numel);

  // Whether ReduceScatterSum runs c10d's reduce-scatter (NCCL); false: it
  // is emulated by an all-reduce (gloo 1.13 has none; torch_compat.h).
  bool has_reduce_scatter() const;
  // Note [Shard layout] in engine/store/shard_layout.h: sums `data` ([numel] fp32 in
  // this group's device memory: host memory for gloo) over the ranks and
  // leaves this rank's shard of the sum, ShardOf(numel, rank, world), in
  // data[begin, end); the other elements are unspecified afterwards (the
  // emulation leaves the whole sum). With NCCL: padded to world * S on the
  // device when world does not divide numel, enqueued on the calling
  // thread's current CUDA stream, which then waits for the collective (no
  // host synchronisation). UNAVAILABLE when a peer fails or the timeout
  // passes.
  // `scale`: data is multiplied by it first (on the device; skipped at 1).
  absl::Status ReduceScatterSum(float* data, int64_t numel, float scale = 1.0f);
  // Note [Sharded weight streaming] in step/weight_slots.h: `data` holds
  // world_size() * shard_numel elements in this group's device memory
  // (bf16 when element_bytes is 2, fp32 when 4), of which this rank wrote
  // [rank * shard_numel, (rank + 1) * shard_numel); afterwards every rank
  // holds every rank's shard (all-gather). On the current stream (NCCL: the
  // stream waits for the collective, the host does not). UNAVAILABLE when
  // a peer fails or the timeout passes.
  absl::Status AllGatherInPlace(void* data, int64_t shard_numel, int element_bytes);
  // Sums `data` ([numel] fp32 in this group's device memory, as
  // ReduceScatterSum) over the ranks, in place, on the current stream,
  // after multiplying it by `scale` (on the device; skipped at 1).
  absl::Status AllReduceSumOnDevice(float* data, int64_t numel, float scale = 1.0f);

  // Note [Peer copies] in peer_exchange.h: from now on ReduceScatterSum,
  // AllGatherInPlace and AllReduceSumOnDevice run as peer copies through
  // `exchange` (whose rank rank() is this group's) rather than NCCL. For
  // the groups of one process's ranks only; call before any collective.
  void UsePeerCopies(std::shared_ptr<PeerExchange> exchange);
  bool uses_peer_copies() const;

  struct Impl;

 private:
  CollectiveGroup() = default;
  int rank_ = 0;
  int world_size_ = 1;
  std::string backend_name_;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<RendezvousStore> store_;
};

// Whether this build has the c10d backend for `device` ("cpu": gloo,
// "cuda...": NCCL).
bool HasCollectiveBackend(const std::string& device);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIST_PROCESS_GROUP_H_
