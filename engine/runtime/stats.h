// Plain statistics snapshots the engine exposes (no metrics library here:
// server/ turns these into Prometheus families). All times in seconds, all
// sizes in bytes.
#ifndef MEGATRAIN_ENGINE_STATS_H_
#define MEGATRAIN_ENGINE_STATS_H_

#include <cstdint>

namespace megatrain::engine {

// Host memory of the model store, by kind, in bytes.
struct HostStoreBytes {
  int64_t master = 0;      // fp32 master weights
  int64_t grad = 0;        // fp32 gradients (accumulated over micro-batches)
  int64_t exp_avg = 0;     // fp32 AdamW first moment
  int64_t exp_avg_sq = 0;  // fp32 AdamW second moment
  int64_t streaming = 0;   // compute-dtype copy streamed to the device
                           // (0 for fp32/tf32: the master is streamed)
  int64_t staging = 0;     // pinned gradient staging buffers
  int64_t pinned = 0;      // of the above, page-locked (registered) bytes
  int64_t Total() const { return master + grad + exp_avg + exp_avg_sq + streaming + staging; }
};

// Time and traffic of one optimizer step (or a sum of steps).
struct StepStats {
  int64_t tokens = 0;                    // tokens trained (counted in the batch)
  double step_seconds = 0;               // wall time of the step
  double h2d_seconds = 0;                // busy time of the H2D stream
  double compute_seconds = 0;            // busy time of the compute stream
  double d2h_seconds = 0;                // busy time of the D2H stream
  double optimizer_seconds = 0;          // CPU AdamW + gradient accumulation time
  double optimizer_exposed_seconds = 0;  // compute-stream idle time caused by waiting
                                         // for it (the weight and row gates; on the
                                         // CPU, the time in the gates)
  double gate_wait_seconds = 0;          // enqueue thread inside the gates (host time, an
                                         // upper bound of the exposed time)
  double gpu_idle_seconds = 0;           // step_seconds - compute_seconds
  double grad_wait_seconds = 0;          // enqueue thread waiting for a free gradient slot
                                         // (host gradient work behind the device)
  double drain_seconds = 0;              // end of the pass: waiting for the device and
                                         // the last host gradient work
  // Compute-stream idle time inside the pass (CUDA only; 0 on the CPU), by
  // what the stream waited for: its first work after the pass began (the
  // embedding gather and upload, the first layer's weights), a decoder
  // layer's forward, the head, a layer's backward (recompute + grads).
  double gap_start_seconds = 0;
  double gap_forward_seconds = 0;
  double gap_head_seconds = 0;
  double gap_backward_seconds = 0;
  int64_t h2d_bytes = 0;          // host -> device bytes
  int64_t h2d_weight_bytes = 0;   // of h2d_bytes, streamed weights loaded into the
                                  // device slots (2 or 4 per parameter and load,
                                  // memory.weight_stream)
  int64_t d2h_bytes = 0;          // device -> host bytes
  int64_t peak_device_bytes = 0;  // peak device memory allocated in the step
  // Distinct embedding rows (Note [Embedding lookahead] in trainer.h): rows the row
  // gate updated on the critical path before a gather, and rows a gather
  // read from the lookahead instead.
  int64_t gate_rows = 0;
  int64_t lookahead_rows = 0;
  // NVMe tier (Note [NVMe tier] in store/nvme_tier.h): bytes the optimizer
  // read from and wrote to the moment files since the previous step's
  // report (its updates run behind the step); 0 without the tier. The
  // writes are the SSD's wear.
  int64_t nvme_read_bytes = 0;
  int64_t nvme_written_bytes = 0;
  // Decoder-layer forwards and recompute-and-backwards replayed from CUDA
  // graphs (Note [Layer graphs] in step/layer_graphs.h); 0 when off.
  int64_t cuda_graph_replays = 0;

  void Add(const StepStats& other) {
    tokens += other.tokens;
    step_seconds += other.step_seconds;
    h2d_seconds += other.h2d_seconds;
    compute_seconds += other.compute_seconds;
    d2h_seconds += other.d2h_seconds;
    optimizer_seconds += other.optimizer_seconds;
    optimizer_exposed_seconds += other.optimizer_exposed_seconds;
    gate_wait_seconds += other.gate_wait_seconds;
    gpu_idle_seconds += other.gpu_idle_seconds;
    grad_wait_seconds += other.grad_wait_seconds;
    drain_seconds += other.drain_seconds;
    gap_start_seconds += other.gap_start_seconds;
    gap_forward_seconds += other.gap_forward_seconds;
    gap_head_seconds += other.gap_head_seconds;
    gap_backward_seconds += other.gap_backward_seconds;
    cuda_graph_replays += other.cuda_graph_replays;
    h2d_bytes += other.h2d_bytes;
    h2d_weight_bytes += other.h2d_weight_bytes;
    d2h_bytes += other.d2h_bytes;
    if (other.peak_device_bytes > peak_device_bytes) peak_device_bytes = other.peak_device_bytes;
    gate_rows += other.gate_rows;
    lookahead_rows += other.lookahead_rows;
    nvme_read_bytes += other.nvme_read_bytes;
    nvme_written_bytes += other.nvme_written_bytes;
  }
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STATS_H_
