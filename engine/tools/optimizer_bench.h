// The CPU optimizer benchmark: our fused CpuAdamW against LibTorch's
// torch::optim::AdamW on the same number of fp32 parameters, on this
// machine. `megatrain-bench --optimizer_only --params=N --json` prints it.
// The optimizer must keep up with the GPU (one layer's AdamW while the GPU
// computes the next), so its parameters/s is a number we track.
#ifndef MEGATRAIN_ENGINE_OPTIMIZER_BENCH_H_
#define MEGATRAIN_ENGINE_OPTIMIZER_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace megatrain::engine {

// What to run.
struct OptimizerBenchOptions {
  int64_t params = 50'000'000;  // N, fp32 parameters in one flat buffer, >= 1
  int threads = 0;              // our ThreadPool size; 0 = all cores
  int iterations = 10;          // timed steps per optimizer, >= 1
  int warmup = 2;               // untimed steps first (page faults, caches)
  // Elements between a 64-byte boundary and the bf16 copy: 0 as in the
  // store (the kernels' streaming stores); 1 forces plain stores, for an
  // A/B of the two (engine/optim/adamw.cc, Bf16Store).
  int bf16_offset_elements = 0;
};

// Timings: median over `iterations` steps of each optimizer.
struct OptimizerBenchResult {
  int64_t params = 0;                       // N
  int threads = 0;                          // our ThreadPool size (resolved)
  int torch_threads = 0;                    // at::get_num_threads() (unchanged)
  std::string kernel_variant;               // CpuKernelName(ActiveCpuKernel())
  double adamw_seconds_per_step = 0;        // ours: fp32 update + bf16 copy
  double adamw_params_per_s = 0;            // N / adamw_seconds_per_step
  double torch_adamw_seconds_per_step = 0;  // torch::optim::AdamW::step()
  double torch_adamw_params_per_s = 0;      // N / torch_..._seconds_per_step
  double speedup = 0;                       // adamw_params_per_s / torch_adamw_params_per_s
};

// Times CpuAdamW (fp32 AdamW + bf16 output, `threads` threads, best kernel
// variant) and torch::optim::AdamW (one N-element tensor, LibTorch's default
// intra-op threads) on the same N parameters with the same hyperparameters
// (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01), gradients
// held constant across steps. Memory: 8 bytes/param of shared inputs plus
// 14 bytes/param for ours (params, m, v copies + bf16) and then 12
// bytes/param plus temporaries (~8) for torch's; the two are not held at
// the same time (about 1.5 GB at N = 50M). Blocks for the whole run; call from one thread
// at a time (it changes nothing global, but two runs would share the cores).
// Errors: INVALID_ARGUMENT for a bad option ("bench.params: must be >= 1,
// got 0"); RESOURCE_EXHAUSTED when memory runs out; INTERNAL for any other
// LibTorch error.
absl::StatusOr<OptimizerBenchResult> RunOptimizerBenchmark(const OptimizerBenchOptions& options);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_OPTIMIZER_BENCH_H_
