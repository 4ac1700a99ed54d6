// The trainer's door to data parallelism: a reducer that combines each
// block's landed gradient, the loss and the token count of a step across
// the ranks of a data-parallel group (engine/dist/ implements it over
// c10d; docs/distributed.md). No LibTorch types here.
//
// Note [Data-parallel step]
// Every rank holds a replica of the host store and runs the same Trainer
// on its own micro-batches. The trainer calls, in this order and on every
// rank the same number of times (collectives must match across ranks):
//   BeginStep(micro_batches)         before the pass (step thread);
//   ReduceBlock(block, grad, numel)  once per block, when its gradient in
//                                    the store is final (accumulator thread,
//                                    blocks in the executor's landing order,
//                                    identical on every rank);
//   EndStep(loss_sum)                after the pass (step thread).
// After ReduceBlock every rank's landing buffer holds the gradient of the
// mean loss over the counted tokens of the GLOBAL batch, bit for bit the
// same on every rank.
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
// with gloo). One trainer, the optimizer owner (rank 0), runs AdamW: its
// ReduceBlock returns only once every rank's shard of the block landed, and
// its updates read the shared gradient, so each parameter is updated
// exactly once per step. The other ranks queue no update; their weight
// gate waits on the owner's optimizer queue (Trainer::WaitBlockUpdated),
// so that no rank streams a block before its update. The embedding then
// updates as one block (no row gate, no lookahead: Notes [Embedding rows on
// demand] and [Embedding lookahead] in trainer.h), the gradient lands in
// the arena (no ring), and the NVMe tier is not available.
#ifndef MEGATRAIN_ENGINE_STEP_GRADIENT_REDUCER_H_
#define MEGATRAIN_ENGINE_STEP_GRADIENT_REDUCER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/io/batch.h"

namespace megatrain::engine {

// Thread-safety: BeginStep and EndStep on the step thread, ReduceBlock on
// the executor's accumulator thread, never concurrently with each other
// within one step (Note [Data-parallel step]).
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;

  // Starts a step over this rank's `micro_batches`: agrees with the other
  // ranks on the global counted-token count. INVALID_ARGUMENT when a rank's
  // batch is malformed (on every rank, so that none waits in a collective);
  // UNAVAILABLE when a peer is unreachable.
  virtual absl::Status BeginStep(absl::Span<const MicroBatch> micro_batches) = 0;

  // Replaces `grad` ([numel] fp32, host: the store's gradient of `block`,
  // the mean over this rank's counted tokens) by the gradient of the mean
  // over the global batch's counted tokens. Returns its squared L2 norm
  // (fp32 values summed in fp64, in a fixed order); NaN after a failed
  // collective, whose error EndStep returns.
  virtual double ReduceBlock(int64_t block, float* grad, int64_t numel) = 0;

  // Ends the step: the global loss sum (nats) from this rank's `loss_sum`.
  // Returns the first error of the step's collectives.
  virtual absl::StatusOr<double> EndStep(double loss_sum) = 0;

  // Counted tokens of the global batch (after BeginStep).
  virtual int64_t global_counted_tokens() const = 0;

  // Note [Device reduce-scatter]
  // Optional, before a block lands: `grad` ([numel] fp32, device memory:
  // the executor's gradient slot or device accumulator, holding the block's
  // whole gradient of this pass, the mean over this rank's counted tokens)
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
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_GRADIENT_REDUCER_H_
