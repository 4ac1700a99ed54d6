// The CPU optimizer: AdamW on flat fp32 buffers in host memory, plus the
// gradient-norm pieces of global-norm clipping.
//
// MegaTrain keeps every parameter, gradient and AdamW moment in host RAM. As
// soon as a transformer layer's gradients have landed in host memory (D2H),
// the CPU runs AdamW over that layer's flat buffers while the GPU computes
// other layers. The update is one fused, vectorised pass over memory that also
// writes the bf16 copy of the updated parameters that the GPU streams in
// (H2D) for the next forward pass, so the optimizer touches each byte once.
//
// Conventions (this file): every buffer is a flat, contiguous host array of
// `n` elements (no alignment required), fp32 unless it says bf16; element i
// of every buffer belongs to the same parameter. `step` is the optimizer
// update count, counted from 1.
#ifndef MEGATRAIN_ENGINE_ADAMW_H_
#define MEGATRAIN_ENGINE_ADAMW_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/runtime/bf16.h"
#include "engine/runtime/thread_pool.h"

namespace megatrain::engine {

// ---------------------------------------------------------------------------
// Kernel variants

// Which instruction set the CPU kernels (AdamW update, sum of squares) use.
// kAuto picks the best one this CPU supports at run time
// (`__builtin_cpu_supports`, which also checks that the OS saves the wide
// registers). Forcing a variant is for tests and the benchmark.
enum class CpuKernel {
  kAuto,
  kScalar,  // portable C++, any x86-64 (or other) CPU
  kAvx2,    // AVX2 + FMA, 8 floats per instruction
  kAvx512,  // AVX-512F, 16 floats per instruction
};

// "auto", "scalar", "avx2" or "avx512".
std::string_view CpuKernelName(CpuKernel kernel);

// Parses a CpuKernelName() spelling. Errors: INVALID_ARGUMENT
// "optimizer.kernel: unknown 'x' (expected auto|scalar|avx2|avx512)".
absl::StatusOr<CpuKernel> ParseCpuKernel(std::string_view name);

// Whether this CPU (and OS) can run `kernel`. kAuto and kScalar: always.
// Thread-safe.
bool CpuKernelSupported(CpuKernel kernel);

// The variant kAuto resolves to on this machine: kAvx512, else kAvx2, else
// kScalar. Never returns kAuto. Thread-safe.
CpuKernel ActiveCpuKernel();

// ---------------------------------------------------------------------------
// The AdamW kernel

// Hyperparameters of one AdamW update. Plain values, not validated here
// (CpuAdamW validates); preconditions are stated per field.
struct AdamWStepParams {
  double lr = 1e-3;            // learning rate of this step, >= 0
  double beta1 = 0.9;          // first-moment decay, in [0, 1)
  double beta2 = 0.999;        // second-moment decay, in [0, 1)
  double eps = 1e-8;           // added to the bias-corrected sqrt(v), >= 0
  double weight_decay = 0.01;  // decoupled (AdamW) decay coefficient, >= 0
  int64_t step = 1;            // optimizer update count, from 1
  // Multiplies every gradient before use: folds global-norm clipping
  // (ClipCoefficient) and any loss-scale undo into the update, so there is
  // no separate pass over the gradients. Finite, >= 0.
  float grad_scale = 1.0f;
};

// Note [AdamW update]
// Decoupled weight decay, Loshchilov & Hutter, "Decoupled Weight Decay
// Regularization", ICLR 2019, Algorithm 2, in the form PyTorch implements
// (torch/optim/adamw.py `_single_tensor_adamw`; C++ frontend
// torch/csrc/api/src/optim/adamw.cpp), per element, with g = grad*grad_scale:
//
//   p  = p * (1 - lr*wd)
//   m  = beta1*m + (1-beta1)*g
//   v  = beta2*v + (1-beta2)*g*g
//   p  = p - (lr / (1-beta1^t)) * m / (sqrt(v) / sqrt(1-beta2^t) + eps)
//
// The scalar factors (1 - lr*wd, lr/(1-beta1^t), 1/sqrt(1-beta2^t)) are
// computed once in double and rounded to fp32, as PyTorch does when it
// passes double scalars to fp32 tensor ops; per-element arithmetic is fp32,
// with FMA in the vector variants (and a multiply by 1/sqrt(1-beta2^t) in
// place of PyTorch's divide), so results agree with torch::optim::AdamW to
// a few ulp per element rather than bit for bit. The division m/denom is an
// IEEE division, not a reciprocal approximation.
//
// The vector variants run the tail (n not a multiple of the vector width)
// through the same instructions on a zero-padded copy, so every element of a
// variant sees the same arithmetic wherever chunk boundaries fall.

// The per-step fp32 factors of Note [AdamW update], computed once in double
// and rounded to fp32. Shared by every AdamW implementation (the CPU kernels
// here, TensorAdamWStep in tensor_adamw.h) so that they round alike.
struct AdamWCoefficients {
  float decay;  // 1 - lr * weight_decay
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float grad_scale;
};
AdamWCoefficients MakeAdamWCoefficients(const AdamWStepParams& hp);

// Applies one AdamW update (Note [AdamW update]) to `n` elements in place:
// `params`, `exp_avg` (m) and `exp_avg_sq` (v) are read and written, `grads`
// only read; all fp32. When `bf16_out` is not null it also receives the
// updated parameters rounded to bf16 (round to nearest even, NaN kept, i.e.
// exactly FloatToBf16 of each updated fp32 value), in the same pass.
// Single-threaded: runs on the calling thread (CpuAdamW splits the work).
// An unsupported `kernel` runs as kAuto (check CpuKernelSupported first).
// Preconditions: buffers do not overlap each other; n >= 0. Thread-safe for
// disjoint buffers. No errors (no allocation, no failure modes).
void AdamWUpdate(const AdamWStepParams& hp, float* params, const float* grads, float* exp_avg,
                 float* exp_avg_sq, bf16_bits* bf16_out, int64_t n,
                 CpuKernel kernel = CpuKernel::kAuto);

// Writes FloatToBf16(src[i]) (round to nearest even, NaN kept quiet;
// engine/runtime/bf16.h) into dst[i] for i in [0, n), bit for bit the
// scalar function and AdamWUpdate's bf16_out, with the same vector rounding.
// Where `dst` is aligned to the vector's store width the stores are
// non-temporal (the destination is meant for a DMA copy, not the CPU's
// cache), followed by a store fence. Single-threaded; thread-safe for
// disjoint buffers. An unsupported `kernel` runs as kAuto. No errors.
// Preconditions: the buffers do not overlap; n >= 0.
void CastToBf16(const float* src, bf16_bits* dst, int64_t n, CpuKernel kernel = CpuKernel::kAuto);

// ---------------------------------------------------------------------------
// CpuAdamW

// Options of the AdamW optimizer; defaults are torch::optim::AdamW's.
struct AdamWOptions {
  double lr = 1e-3;                     // peak learning rate (the schedule's), >= 0
  double beta1 = 0.9;                   // in [0, 1)
  double beta2 = 0.999;                 // in [0, 1)
  double eps = 1e-8;                    // >= 0
  double weight_decay = 0.01;           // decoupled, >= 0
  CpuKernel kernel = CpuKernel::kAuto;  // must be supported on this CPU
};

// The AdamWStepParams of update number `step` (from 1) with learning rate
// `lr` and gradient multiplier `grad_scale`, the constants from `options`.
AdamWStepParams MakeAdamWStepParams(const AdamWOptions& options, int64_t step, double lr,
                                    float grad_scale);

// Checks `options`. Errors: INVALID_ARGUMENT naming the field and value,
// e.g. "optimizer.beta1: must be in [0, 1), got 1.5"; UNIMPLEMENTED
// "optimizer.kernel: avx512 is not supported by this CPU".
absl::Status ValidateAdamWOptions(const AdamWOptions& options);

// One flat buffer set, e.g. all parameters of one transformer layer laid out
// back to back. Not owned.
struct AdamWBuffers {
  float* params = nullptr;           // [n] fp32, updated in place
  const float* grads = nullptr;      // [n] fp32, read only
  float* exp_avg = nullptr;          // [n] fp32 first moment m, in place
  float* exp_avg_sq = nullptr;       // [n] fp32 second moment v, in place
  bf16_bits* bf16_params = nullptr;  // [n] bf16 copy of the result, or null
  int64_t num_elements = 0;          // n
};

// AdamW over flat host buffers, multithreaded over a ThreadPool.
//
// Ownership: holds the validated options and a non-owning pointer to the
// pool (null = run on the calling thread), which must outlive it. Copyable.
//
// Thread-safety: Step() is const and may run concurrently from several
// threads on disjoint buffers (the pool is thread-safe). The caller keeps
// each layer's step count; moments live in the caller's buffers.
//
// Determinism: elements are split in chunks aligned to 64 elements, and the
// update is elementwise, so the result is bitwise identical for any number
// of threads (for a given kernel variant).
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(CpuAdamW adamw,
//                              CpuAdamW::Create(options, pool.get()));
//   const float clip = ClipCoefficient(std::sqrt(sum_sq), max_grad_norm);
//   MEGATRAIN_RETURN_IF_ERROR(
//       adamw.Step(layer_buffers, step, schedule.LrAt(step), clip));
class CpuAdamW {
 public:
  // Errors: those of ValidateAdamWOptions.
  static absl::StatusOr<CpuAdamW> Create(const AdamWOptions& options, ThreadPool* pool);

  // Updates `buffers` in place with update number `step` (from 1), learning
  // rate `lr` (this step's, e.g. LrSchedule::LrAt(step)) and gradient
  // multiplier `grad_scale` (e.g. ClipCoefficient(...)). Returns when the
  // whole buffer is updated. Errors: INVALID_ARGUMENT for step < 1, a
  // negative or non-finite lr or grad_scale, num_elements < 0, or a null
  // required pointer with num_elements > 0; buffers are untouched then.
  absl::Status Step(const AdamWBuffers& buffers, int64_t step, double lr, float grad_scale) const;

  const AdamWOptions& options() const { return options_; }

  // The variant Step() runs (never kAuto).
  CpuKernel kernel() const { return kernel_; }

 private:
  CpuAdamW(const AdamWOptions& options, CpuKernel kernel, ThreadPool* pool)
      : options_(options), kernel_(kernel), pool_(pool) {}

  AdamWOptions options_;
  CpuKernel kernel_;
  ThreadPool* pool_;  // not owned; may be null
};

// ---------------------------------------------------------------------------
// Gradient norm

// Returns sum(x[i]^2) over `n` fp32 values, accumulated in double (so one
// layer's contribution to the global norm loses nothing to fp32 rounding).
// NaN or inf in `x` yields NaN or inf, returned as is: the caller decides
// (skip the step, report). The sum is formed from fixed blocks of the input
// combined in a fixed order, so it is bitwise identical for any pool size
// (for a given kernel variant). `pool` may be null (calling thread only).
// An unsupported `kernel` runs as kAuto. Thread-safe. n <= 0 returns 0.
double SumOfSquares(const float* x, int64_t n, ThreadPool* pool,
                    CpuKernel kernel = CpuKernel::kAuto);

// The factor to multiply every gradient by for global-norm clipping, as
// torch.nn.utils.clip_grad_norm_ (torch/nn/utils/clip_grad.py):
// min(1, max_norm / (total_norm + 1e-6)). `total_norm` is the L2 norm over
// all gradients (sqrt of the summed SumOfSquares). max_norm <= 0 means no
// clipping and returns 1. Non-finite norms follow torch: NaN gives NaN, +inf
// gives 0; callers that skip non-finite steps check the norm first.
float ClipCoefficient(double total_norm, double max_norm);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_ADAMW_H_
