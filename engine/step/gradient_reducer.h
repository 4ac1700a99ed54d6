// The trainer's door to data parallelism: a reducer that combines each
// block's landed gradient, the loss and the token count of a step across
// the ranks of a data-parallel group (engine/dist/ implements it over
// c10d; docs/distributed.md). No LibTorch types here.
//
// Note [Data-parallel step]
// Every rank holds a replica of the host store and runs the same Trainer
// on its own micro-batches. The trainer calls, in this order and on every
// rank the same number of times (collectives must match across ranks):
//   BeginStep(micro_batches, failed) before the pass (step thread);
//   ReduceBlock(block, grad, numel)  once per block, when its gradient in
//                                    the store is final (accumulator thread,
//                                    blocks in the executor's landing order,
//                                    identical on every rank);
//   EndStep(sums)                    after the pass (step thread).
// Each rank's pass divides its token losses by the GLOBAL batch's counted
// tokens N (agreed in BeginStep; the executor's BatchShare), so rank r's
// gradient is that of CE_r / N + router_aux_loss_coef * sum of aux_m over
// its micro-batches (MoE models, Note [Load-balancing loss across
// micro-batches] in moe_block.h), and the plain sum over the ranks is the
// gradient of one device accumulating the whole global batch: CE / N +
// coef * sum of aux_m over every micro-batch. (Scaling each rank's own
// mean by N_r / N instead would scale the aux terms too.) A rank's
// micro-batches keep their global indices for the train-time noise
// (BatchShare::first_micro_batch). After ReduceBlock every rank's landing
// buffer holds that gradient, bit for bit the same on every rank.
//
// Note [Shared host store]
// The ranks of one host share one host store (TrainerOptions::shared_store;
// engine/dist/data_parallel.h builds it): fp32 master weights, AdamW
// moments, the bf16 streaming copy and the reduced gradient exist once.
// Each rank's Trainer owns a view of it (HostStore::CreateGradientView)
// whose only memory is the rank's landing gradient: the executor streams
// weights from the shared store and lands this rank's gradients in the
// view. ReduceBlock combines the ranks' landed gradients and each rank
// copies its 1/N shard of the block into the shared store's gradient
// (reduce-scatter semantics; engine/dist/collective_reducer.h says how
// with gloo). Each rank updates its own shard (Note [Sharded optimizer]),
// so each parameter is updated exactly once per step, and a rank's weight
// gate waits for every rank's update of a block (Trainer::
// WaitBlockUpdated), so that no rank streams a block before its update.
// A non-resident embedding then
// updates as one block (no row gate, no lookahead: Notes [Embedding rows on
// demand] and [Embedding lookahead] in trainer.h), the gradient lands in
// the arena, or with the gradient ring in each rank's own shard-sized
// ring (Note [Ring shards]). With the NVMe tier the shared store keeps no
// moments: each rank's shard of them is in files of its own (Note [Tier
// shards] in store/nvme_tier.h).
//
// Note [Sharded optimizer]
// The CPU AdamW of the shared store is split by shard: rank r of the
// host's L ranks updates elements ShardOf(numel, r, L) of every host block
// (c10d's layout; Note [Shard layout] in store/shard_layout.h) on its own
// optimizer thread and its 1/L share of the cores, from the shard of the
// reduced gradient it landed itself, as soon as it may (clipping: after
// the norm; otherwise as the block is final). No rank waits for another's
// shards to land before updating, and no core waits for one owner. A rank
// streams a block only once every rank's update of it ran (the shared
// weight gate). AdamW is elementwise, so the split gives the bits of one
// whole-block update.
#ifndef MEGATRAIN_ENGINE_STEP_GRADIENT_REDUCER_H_
#define MEGATRAIN_ENGINE_STEP_GRADIENT_REDUCER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/data/batch.h"

namespace megatrain::engine {

// The sums of one pass that EndStep adds over the ranks.
struct PassSums {
  double loss_sum = 0;         // token losses (nats)
  double aux_loss_sum = 0;     // MoE load-balancing aux losses, one per micro-batch
  int64_t aux_loss_terms = 0;  // micro-batches summed into aux_loss_sum
};

// Thread-safety: BeginStep and EndStep on the step thread, ReduceBlock on
// the executor's accumulator thread, never concurrently with each other
// within one step (Note [Data-parallel step]).
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;

  // Starts a step over this rank's `micro_batches`: agrees with the other
  // ranks on the global counted-token count. `rank_failed`: this rank
  // cannot run the step (its queued optimizer updates failed: an NVMe
  // tier file, Note [Tiered trainer] in trainer.h) and only meets the
  // others here, so that they fail now rather than at the collective
  // timeout; the trainer then returns its own error. INVALID_ARGUMENT when
  // a rank's batch is malformed (on every rank, so that none waits in a
  // collective); UNAVAILABLE naming the count when another rank failed
  // (rank_failed there), or when a peer is unreachable.
  virtual absl::Status BeginStep(absl::Span<const MicroBatch> micro_batches, bool rank_failed) = 0;

  // Replaces `grad` ([numel] fp32, host: the store's gradient of `block`,
  // this rank's part: its token losses over the global count) by the gradient of the mean
  // over the global batch's counted tokens. Returns its squared L2 norm
  // (fp32 values summed in fp64, in a fixed order); NaN after a failed
  // collective, whose error EndStep returns.
  virtual double ReduceBlock(int64_t block, float* grad, int64_t numel) = 0;

  // Note [Ring shards]
  // With the gradient ring (memory.gradient_landing ring, clipping off;
  // Note [Gradient ring] in step/grad_lander.h) a streamed block's
  // gradient never lands in the store: ReduceScatterOnDevice reduced it
  // and this rank's shard, grad[begin, end) of the device buffer, went to
  // the rank's own ring buffers, in pieces its AdamW shard reads there.
  // The store has no gradient of such a block (grad() is nullptr), so the
  // block's ReduceBlock is replaced by this call, once per block and pass
  // with its first piece: `shard_squared_norm` is the squared norm of this
  // rank's reduced shard (fp64, taken on the device before the first
  // piece landed). Counts the landing and returns the block's squared
  // norm, every rank's shard norm added in rank order once every rank's
  // shard landed, so that every rank decides the block's non-finite check
  // (Note [Non-finite steps] in trainer.h) alike and reports the same
  // gradient norm. No clipping depends on it: the ring needs
  // max_grad_norm 0. NaN after a failed collective, or when the block was
  // not reduced on the device (FAILED_PRECONDITION from EndStep); the
  // step then fails.
  virtual double ReduceRingShard(int64_t block, double shard_squared_norm) = 0;

  // The ranks a streamed block's gradient is reduce-scattered over on the
  // device (this process's ranks on the device path; Note [Device
  // reduce-scatter]): each rank lands a shard of ceil(numel / world)
  // elements at most, which sizes the gradient ring's buffers. 1 where
  // blocks land whole (the default).
  virtual int gradient_shard_world() const { return 1; }

  // Ends the step: the global batch's sums from this rank's `local` ones.
  // Returns the first error of the step's collectives.
  virtual absl::StatusOr<PassSums> EndStep(const PassSums& local) = 0;

  // Counted tokens of the global batch (after BeginStep).
  virtual int64_t global_counted_tokens() const = 0;

  // Index of this rank's first micro-batch in the global batch (after
  // BeginStep): the rank's global index times its micro-batch count.
  virtual int64_t first_micro_batch() const = 0;

  // Note [Device reduce-scatter]
  // Optional, before a block lands: `grad` ([numel] fp32, device memory:
  // the executor's gradient slot or device accumulator, holding the block's
  // whole gradient of this pass, this rank's part of the global batch's)
  // may be reduced over the ranks on the device. Returns false when this
  // reducer does not (the default): the block lands whole and ReduceBlock
  // reduces it on the host. Returns true when grad[*begin, *end) now holds
  // this rank's shard of the global batch's gradient: only that range is
  // copied to the host (into the same range of the store's gradient), and
  // the block's ReduceBlock receives that landing. Called on the executor's
  // enqueuing thread with its compute stream current, for every block whose
  // whole gradient is on the device at landing, in the landing order
  // (identical on every rank). A failed collective still returns true
  // (with an empty range); EndStep then returns its error.
  virtual bool ReduceScatterOnDevice(int64_t block, float* grad, int64_t numel, int64_t* begin,
                                     int64_t* end) {
    (void)block, (void)grad, (void)numel, (void)begin, (void)end;
    return false;
  }

  // Whether ReduceScatterOnDevice reduces (the device path): a rank whose
  // every streamed block's whole gradient is on the device at landing then
  // lands only its shard (Note [Shard-only landing] in
  // store/host_store.h).
  virtual bool reduce_scatters_on_device() const { return false; }

  // Note [Sharded weight streaming] in step/weight_slots.h: the ranks that
  // share the loads of streamed blocks (this host's) and this rank's index
  // among them; 1 and 0: every rank loads whole blocks (the default).
  virtual int weight_shard_world() const { return 1; }
  virtual int weight_shard_rank() const { return 0; }
  // Gathers the shards of `block`'s weights in `slot` (shard_numel
  // elements of element_bytes each per rank, this rank's already there)
  // over those ranks, in place on the device, on the current stream.
  // Called on the executor's enqueuing thread in the plan's load order
  // (identical on every rank). A failed collective is recorded: EndStep
  // returns it.
  virtual void AllGatherWeights(int64_t block, void* slot, int64_t shard_numel, int element_bytes) {
    (void)block, (void)slot, (void)shard_numel, (void)element_bytes;
  }

  // Note [Resident blocks on every rank]
  // Each rank keeps the same resident blocks (decoder layers 0..N-1 and,
  // when resident, the embedding) on its own device, with their fp32
  // master, AdamW moments and gradient (Notes [Resident layers] and
  // [Resident embedding] in step/executor.h). When such a block's gradient
  // of the pass is final, `grad` ([numel] fp32, device memory: the
  // resident gradient: this rank's part of the global batch's, Note
  // [Data-parallel step]) is summed over every rank of the job in place, on
  // the device (NCCL over NVLink; gloo on CPU ranks), so that every rank
  // holds the same bits of the global batch's gradient. Every rank then
  // computes the same norm and applies the same AdamW to the same state:
  // the replicas stay bit-identical without any host traffic. Returns
  // false when this reducer does not (the default: the trainer then
  // refuses resident blocks). Called on the executor's enqueuing thread
  // with the stream the work must follow current, in the landing order
  // (identical on every rank); enqueues the collective on that stream
  // (NCCL: no host synchronisation). A failed collective still returns
  // true; EndStep then returns its error.
  virtual bool AllReduceOnDevice(int64_t block, float* grad, int64_t numel) {
    (void)block, (void)grad, (void)numel;
    return false;
  }
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_GRADIENT_REDUCER_H_
