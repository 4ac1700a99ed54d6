// Implementation of RunOptimizerBenchmark (see optimizer_bench.h). This is
// the only engine file that includes torch/optim: the reference optimizer
// lives here and in the tests, never on the training path.
#include "engine/tools/optimizer_bench.h"

#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/optim/adamw.h"
#include "engine/runtime/bf16.h"
#include "engine/runtime/status_macros.h"
#include "engine/runtime/thread_pool.h"

namespace megatrain::engine {
namespace {

// Hyperparameters shared by both optimizers: torch::optim::AdamW's defaults.
constexpr double kLr = 1e-3;
constexpr double kBeta1 = 0.9;
constexpr double kBeta2 = 0.999;
constexpr double kEps = 1e-8;
constexpr double kWeightDecay = 0.01;

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status ValidateOptions(const OptimizerBenchOptions& options) {
  if (options.params < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench.params: must be >= 1, got ", options.params));
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench.threads: must be >= 0 (0 = all cores), got ", options.threads));
  }
  if (options.iterations < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench.iterations: must be >= 1, got ", options.iterations));
  }
  if (options.warmup < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench.warmup: must be >= 0, got ", options.warmup));
  }
  if (options.bf16_offset_elements < 0 || options.bf16_offset_elements > 31) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench.bf16_offset_elements: must be in [0, 31], got ", options.bf16_offset_elements));
  }
  return absl::OkStatus();
}

// Times our CpuAdamW on copies of `init_params` / `grads` ([N] fp32, CPU).
// Fills the `adamw_*`, `threads` and `kernel_variant` fields of `result`.
absl::Status TimeOurs(const OptimizerBenchOptions& options, const torch::Tensor& init_params,
                      const torch::Tensor& grads, OptimizerBenchResult& result) {
  const int64_t n = options.params;
  torch::Tensor params = init_params.clone();            // [N] fp32
  torch::Tensor exp_avg = torch::zeros_like(params);     // [N] fp32
  torch::Tensor exp_avg_sq = torch::zeros_like(params);  // [N] fp32
  // [N] bf16, 64-byte aligned like the store's arenas (the kernel's
  // streaming stores need 32) unless an offset is asked for.
  torch::Tensor bf16_params = torch::empty({n + options.bf16_offset_elements}, torch::kBFloat16)
                                  .narrow(0, options.bf16_offset_elements, n);

  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(options.threads);
  AdamWOptions adamw_options;
  adamw_options.lr = kLr;
  adamw_options.beta1 = kBeta1;
  adamw_options.beta2 = kBeta2;
  adamw_options.eps = kEps;
  adamw_options.weight_decay = kWeightDecay;
  MEGATRAIN_ASSIGN_OR_RETURN(CpuAdamW adamw, CpuAdamW::Create(adamw_options, pool.get()));

  AdamWBuffers buffers;
  buffers.params = params.data_ptr<float>();
  buffers.grads = grads.data_ptr<float>();
  buffers.exp_avg = exp_avg.data_ptr<float>();
  buffers.exp_avg_sq = exp_avg_sq.data_ptr<float>();
  buffers.bf16_params = static_cast<bf16_bits*>(bf16_params.data_ptr());
  buffers.num_elements = n;

  std::vector<double> step_seconds;
  int64_t step = 0;
  for (int iteration = 0; iteration < options.warmup + options.iterations; ++iteration) {
    const auto start = std::chrono::steady_clock::now();
    MEGATRAIN_RETURN_IF_ERROR(adamw.Step(buffers, ++step, kLr, 1.0f));
    const double seconds = SecondsSince(start);
    if (iteration >= options.warmup) step_seconds.push_back(seconds);
  }
  result.threads = pool->num_threads();
  result.kernel_variant = std::string(CpuKernelName(adamw.kernel()));
  result.adamw_seconds_per_step = Median(step_seconds);
  result.adamw_params_per_s = static_cast<double>(n) / result.adamw_seconds_per_step;
  return absl::OkStatus();
}

// Times torch::optim::AdamW on one [N] parameter tensor holding a copy of
// `init_params`, gradient `grads`. Fills the `torch_*` fields of `result`.
void TimeTorch(const OptimizerBenchOptions& options, const torch::Tensor& init_params,
               const torch::Tensor& grads, OptimizerBenchResult& result) {
  torch::Tensor param = init_params.clone().set_requires_grad(true);  // [N]
  param.mutable_grad() = grads;
  torch::optim::AdamW optimizer(
      std::vector<torch::Tensor>{param},
      torch::optim::AdamWOptions(kLr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(kWeightDecay));
  std::vector<double> step_seconds;
  for (int iteration = 0; iteration < options.warmup + options.iterations; ++iteration) {
    const auto start = std::chrono::steady_clock::now();
    optimizer.step();
    const double seconds = SecondsSince(start);
    if (iteration >= options.warmup) step_seconds.push_back(seconds);
  }
  result.torch_threads = at::get_num_threads();
  result.torch_adamw_seconds_per_step = Median(step_seconds);
  result.torch_adamw_params_per_s =
      static_cast<double>(options.params) / result.torch_adamw_seconds_per_step;
}

}  // namespace

absl::StatusOr<OptimizerBenchResult> RunOptimizerBenchmark(const OptimizerBenchOptions& options) {
  MEGATRAIN_RETURN_IF_ERROR(ValidateOptions(options));
  OptimizerBenchResult result;
  result.params = options.params;
  // LibTorch throws; no exception leaves this function (STYLE "Errors").
  try {
    torch::NoGradGuard no_grad;
    // Fixed seed: both optimizers see the same parameters and gradients.
    torch::manual_seed(0);
    const torch::Tensor init_params = torch::randn({options.params});  // [N]
    // Gradient-sized values (~1e-2) keep v away from denormals.
    const torch::Tensor grads = torch::randn({options.params}) * 1e-2;  // [N]
    MEGATRAIN_RETURN_IF_ERROR(TimeOurs(options, init_params, grads, result));
    TimeTorch(options, init_params, grads, result);
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("bench: out of memory: ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    // CPU allocation failures in LibTorch 1.13 are plain c10::Error.
    if (message.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos) {
      return absl::ResourceExhaustedError(absl::StrCat("bench: ", message));
    }
    return absl::InternalError(absl::StrCat("bench: LibTorch: ", message));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("bench: out of memory");
  }
  result.speedup = result.adamw_params_per_s / result.torch_adamw_params_per_s;
  return result;
}

}  // namespace megatrain::engine
