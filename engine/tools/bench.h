// megatrain-bench: trains a model for a few steps on synthetic tokens and
// reports throughput, phase times and memory as JSON (docs/performance.md).
// The run lives here, beside the binary's thin main (bench_main.cc: the
// flags); its flags become a JobSpec, so that the trainer's options and the
// footprint come from the job path's StepOptionsOf
// (engine/job/step_options.h).
#ifndef MEGATRAIN_ENGINE_TOOLS_BENCH_H_
#define MEGATRAIN_ENGINE_TOOLS_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace megatrain::engine {

struct BenchOptions {
  std::string model = "tiny";  // preset name or HF model directory (config.json,
                               // and its safetensors weights when present)
  std::string device = "cpu";  // cpu | cuda | cuda:N
  int64_t micro_batch = 8;     // B
  int64_t seq_len = 128;       // T
  // > 0: each row packs isolated documents of this many tokens (the last
  // one shorter), with position ids (Note [Document attention] in
  // engine/model/layers.h); 0: one shared row, no position ids.
  int64_t document_tokens = 0;
  int64_t gradient_accumulation_steps = 1;
  // Data-parallel devices (docs/distributed.md): N ranks on base `device`
  // (cuda -> cuda:0..N-1), each running gradient_accumulation_steps (per
  // device) micro-batches of a step; tokens/s counts all N.
  int devices = 1;
  // "" (this process is the run) or "env": one process of several (hosts),
  // joined through torchrun's MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK,
  // LOCAL_RANK (Note [Replica processes] in dist/data_parallel.h); each
  // runs `devices` ranks, tokens/s counts every process's.
  std::string dist;
  // auto | host_all_reduce | device_reduce_scatter (dist/gradient_shard.h).
  std::string gradient_reduction = "auto";
  // Note [Sharded weight streaming] in step/weight_slots.h: with several
  // devices, each loads 1/N of a streamed block and gathers the rest.
  bool shard_weights = true;
  // Note [Peer copies] in dist/peer_exchange.h: the devices' collectives
  // as copy-engine peer copies (false, the default: NCCL kernels).
  bool peer_copies = false;
  // Seconds a rank waits for the others at a collective before the run
  // fails with UNAVAILABLE (DataParallelOptions::timeout).
  int64_t collective_timeout_s = 600;
  // Bytes of host memory the run may hold; a larger footprint is refused
  // (RESOURCE_EXHAUSTED) before anything is allocated. 0: not checked.
  int64_t host_memory_budget = 0;
  int64_t steps = 10;  // measured steps
  int64_t warmup = 2;  // unmeasured steps first
  std::string compute_dtype = "fp32";
  std::string data = "fixed";  // fixed: one random batch repeated; random: fresh each step
  double lr = 3e-3;            // AdamW peak lr (constant schedule)
  double max_grad_norm = 1.0;  // global-norm clipping; 0 = off (as the PyTorch baselines)
  double peak_tflops = 0;      // one device's dense bf16 peak for MFU, TFLOP/s; 0 = the
                               // device's datasheet peak (PeakBf16Flops; MFU omitted
                               // when unknown)
  int threads = 0;             // CPU threads; 0 = all
  int num_weight_slots = 3;
  bool offload_activations = false;                     // Note [Activation offload] in executor.h
  int optimizer_nice = 10;                              // TrainerOptions::optimizer_nice
  int critical_threads = 0;                             // TrainerOptions::critical_threads
  int64_t optimizer_slice_elements = int64_t{1} << 24;  // TrainerOptions::optimizer_slice_elements
  bool embedding_lookahead = true;                      // pass Trainer::Step the next batch's ids
                                                        // (Note [Embedding lookahead] in trainer.h)
  int resident_layers = -1;           // TrainerOptions::resident_layers (-1 = auto)
  int resident_embedding = -1;        // TrainerOptions::resident_embedding (-1 = auto)
  int device_grad_accumulation = -1;  // TrainerOptions::device_grad_accumulation (-1 = auto)
  int cuda_graphs = -1;               // TrainerOptions::cuda_graphs (-1 = auto)
  int64_t loss_chunk_tokens = 0;      // TrainerOptions::loss_chunk_tokens (rows; 0 = auto)
  std::string fused_kernels =
      "auto";  // train.fused_kernels: auto | on | off (Note [Fused kernels])
  // train.activation_checkpointing: auto | all (Note [Kept layer graphs])
  std::string activation_checkpointing = "auto";
  // Note [Schedule choice] in step/schedule_choice.h: auto |
  // micro-batch-major | layer-major; wave (0 = auto); auto | device | host.
  std::string schedule = "auto";
  int wave = 0;
  std::string activations = "auto";
  std::string weight_stream = "bf16";      // TrainerOptions::weight_stream: bf16 | fp32 | host_cast
  std::string gradient_landing = "arena";  // TrainerOptions::gradient_landing: arena | ring | auto
  uint64_t seed = 0;
  // The NVMe tier (Note [Tiered trainer] in step/trainer.h): "off" or
  // "moments" (the AdamW moments in files under a fresh subdirectory of
  // nvme_dir, removed at the end; nvme_dir then required).
  std::string nvme_tier = "off";
  std::string nvme_dir;
  bool json = false;  // only the final JSON line on stdout
  // When non-empty: a Kineto trace of the last measured step (every
  // kernel and copy; engine/runtime/kernel_trace.h) is written to this
  // path as Chrome-trace JSON. Needs torch >= 2.0 (UNIMPLEMENTED otherwise).
  std::string kernel_trace;
};

// Runs the benchmark; progress lines go to stderr (stdout with !json), the
// returned string is the final one-line JSON object with tokens_per_s,
// step_seconds, loss_first, loss_last, phase seconds (h2d, compute, d2h,
// optimizer, optimizer_exposed (compute-stream idle caused by the gates),
// gpu_idle, and the enqueue thread's gate_wait, grad_wait and drain waits;
// medians over measured steps), h2d_bytes and d2h_bytes per step (the last
// step's) and of h2d_bytes h2d_weight_bytes (the streamed weights' loads:
// halved by weight_stream bf16 or host_cast against fp32), the last
// step's gate_rows and lookahead_rows (Note [Embedding lookahead] in
// trainer.h), resident_layers (the resolved TrainerOptions::resident_layers;
// Note [Resident layers] in executor.h), resident_embedding and
// device_grad_accumulation (resolved; Notes [Resident embedding] and
// [Device gradient accumulation] in executor.h), cuda_graphs (resolved;
// Note [Layer graphs] in step/layer_graphs.h), kept_graph_layers and
// kept_graph_bytes (Note [Kept layer graphs] in executor.h), the resolved schedule, wave and
// activations ("device" | "host") with schedule_choice (the one-line reason;
// Note [Schedule choice] in step/schedule_choice.h), device_plan (bytes: the device's
// total, planned = executor + saved inputs outside it + working, of the
// executor's the resident blocks, activations, working, margin; Note [Auto
// resident layers]), host_bytes by kind, peak_gpu_bytes,
// model_tflops, and when the peak is known peak_tflops, mfu and mfu_params;
// host_bytes_per_param (all host bytes over the
// parameters), rss_bytes / rss_peak_bytes (the process's) and the
// current rss_anon_bytes / rss_file_bytes / rss_shmem_bytes (allocated
// memory against mapped library files) and rss_allocated_peak_bytes (the
// largest RssAnon + RssShmem read after any step), admission's
// footprint_host_bytes and footprint (its bytes by kind: master, grad,
// exp_avg, exp_avg_sq, streaming, staging, gradient_ring (part of
// staging), lookahead, total, bytes_per_param, nvme; also printed as one
// line before the steps), nvme_tier, and with the tier nvme_direct (O_DIRECT in use),
// nvme_read_bytes_per_step and nvme_written_bytes_per_step (means over the
// measured steps);
// on CUDA also the link's pinned copy bandwidth measured before the run
// (link_h2d_gb_per_s, link_d2h_gb_per_s) and h2d_link_utilization.
//
// MFU (model FLOPs utilisation, PaLM appendix B):
//   model_tflops = tokens/s x TrainFlopsPerToken(T) / 1e12,
//   TrainFlopsPerToken(T) = 6 (N - V C) + 12 L C T,
//   mfu = model_tflops / (peak_tflops x devices),
// N the parameters a token uses: all of them for a dense model, the active
// ones for a MoE model (MoeActiveParamCount: the k routed experts of E,
// routers, shared experts and attention; mfu_params "active"), V C the
// input embedding (a lookup). Recomputation's extra forward is not counted
// (it is not model FLOPs).
absl::StatusOr<std::string> RunTrainingBenchmark(const BenchOptions& options);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_TOOLS_BENCH_H_
