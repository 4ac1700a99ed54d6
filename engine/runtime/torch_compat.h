// The one place where LibTorch versions differ. The project builds against
// Debian's LibTorch 1.13 (CPU, in CI) and pip's torch 2.x with CUDA (GPU
// machines); every version test lives here.
#ifndef MEGATRAIN_ENGINE_TORCH_COMPAT_H_
#define MEGATRAIN_ENGINE_TORCH_COMPAT_H_

#include <ATen/ATen.h>
#include <torch/version.h>

#include <c10/util/Exception.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <optional>
#include <vector>

#define MEGATRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10d (engine/dist/): the class process-group backends (ProcessGroupGloo,
// ProcessGroupNCCL) derive from, whose allreduce/broadcast take tensor
// vectors and return a c10d::Work: c10d::ProcessGroup on 1.13, c10d::Backend
// from 2.0 on (where ProcessGroup became a dispatcher over backends).
namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace megatrain::engine::compat {

#if MEGATRAIN_TORCH_AT_LEAST(2, 0)
using DistBackend = ::c10d::Backend;
#else
using DistBackend = ::c10d::ProcessGroup;
#endif

// c10d's reduce-scatter of one flat tensor: `input` [world * S] (on every
// rank, the same dtype and device) summed over the ranks, rank r receiving
// elements [r * S, (r + 1) * S) of the sum in `output` [S]. The method is
// `_reduce_scatter_base` on 1.13's ProcessGroup and on 2.x's Backend (the
// Python name reduce_scatter_tensor dispatches to it); ProcessGroupNCCL
// implements it on every version; 1.13's ProcessGroupGloo throws ("does
// not support _reduce_scatter_base"), hence
// kGlooHasReduceScatterBase. A template so that this header needs no c10d
// header: `Backend` is DistBackend, `Options` c10d::ReduceScatterOptions.
// Returns the c10d work (wait() it).
template <typename Backend, typename Options>
auto ReduceScatterBase(Backend& backend, at::Tensor& output, at::Tensor& input,
                       const Options& options) {
  return backend._reduce_scatter_base(output, input, options);
}

// Whether ProcessGroupGloo has a flat reduce-scatter on this LibTorch. False
// on 1.13 (it throws); kept false on 2.x too, where it was not checked, so
// that gloo groups take the host all-reduce (GradientReduction).
inline constexpr bool kGlooHasReduceScatterBase = false;

// softmax(q k^T * scale + mask) v for q [B, H, T, Dh] and k, v [B, H, S, Dh]
// (same head count: callers repeat kv heads first). `mask` is boolean
// [T, S] or [B, 1, T, S] (true = attend; every query must see a key) or
// undefined; `is_causal` applies the causal mask
// when `mask` is undefined. Uses the fused kernel (flash / memory-efficient
// / cuDNN) on torch >= 2.1; the math path on 1.13, whose SDPA is private.
inline at::Tensor ScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& mask,
                                            bool is_causal, double scale) {
#if MEGATRAIN_TORCH_AT_LEAST(2, 1)
  std::optional<at::Tensor> attn_mask;
  if (mask.defined()) attn_mask = mask;
  return at::scaled_dot_product_attention(q, k, v, attn_mask, /*dropout_p=*/0.0,
                                          /*is_causal=*/is_causal && !mask.defined(), scale);
#else
  // Scores and softmax in fp32 (as the fused kernels accumulate), the
  // probabilities back in the input dtype for the PV matmul.
  at::Tensor scores =
      at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-2, -1)) * scale;  // [B, H, T, S]
  at::Tensor allowed = mask;
  if (!allowed.defined() && is_causal) {
    allowed = at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).tril();
  }
  if (allowed.defined()) {
    scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  }
  at::Tensor probs = at::softmax(scores, -1).to(q.scalar_type());
  return at::matmul(probs, v);
#endif
}

// Causal softmax(q k^T * scale) v with fewer key/value heads than query
// heads: q [B, H, T, Dh], k, v [B, KV, T, Dh] (H divisible by KV), each
// group of H / KV query heads reading one kv head, without materialising
// the repeated k and v (SDPA's enable_gqa: cuDNN's kernels read the kv
// head of each query head and sum the groups' gradients themselves).
// Returns [B, H, T, Dh]; the same values as repeating first (measured
// equal on an H200, torch 2.11, docs/performance.md "Fused RoPE").
// Taken only where GqaAttentionApplies: CUDA, bf16 or fp16, head_dim 64
// or 128, the cases where cuDNN's kernel was seen to take it (a backend
// without enable_gqa would fall to SDPA's math path, which materialises
// the [B, H, T, T] scores). Enqueued on the current stream.
inline bool GqaAttentionApplies(const at::Tensor& q) {
#if MEGATRAIN_TORCH_AT_LEAST(2, 5)
  const int64_t dh = q.size(-1);
  return q.is_cuda() && (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf) &&
         (dh == 64 || dh == 128);
#else
  (void)q;
  return false;
#endif
}

inline at::Tensor CausalGqaAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     double scale) {
#if MEGATRAIN_TORCH_AT_LEAST(2, 5)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0,
                                          /*is_causal=*/true, scale, /*enable_gqa=*/true);
#else
  (void)q, (void)k, (void)v, (void)scale;
  TORCH_CHECK(false, "CausalGqaAttention needs torch >= 2.5 (check GqaAttentionApplies first)");
#endif
}

// Note [Document attention] in engine/model/layers.h: causal attention
// within each of S packed documents, by flash attention's variable-length
// kernel (ATen's _flash_attention_forward with cumulative sequence
// lengths; differentiable: autograd's formula is
// _flash_attention_backward). q, k, v [N, H, Dh] (N tokens of the
// flattened micro-batch; kv heads repeated or not, H divisible by k's);
// cu_seqlens [S + 1] int32 on q's device, 0 first and N last; max_seqlen
// the longest document; `window` > 0 keeps query i to keys (i - window, i]
// (HF's sliding window: flash's window_size_left = window - 1). Returns
// [N, H, Dh] in q's dtype, or an undefined tensor where the kernel is not
// taken: torch < 2.5 (no window arguments), the CPU, dtypes other than
// bf16 / fp16, Dh not a multiple of 8 or above 256 (the kernel's limits),
// or after the kernel refused a call once (remembered process-wide,
// thread-safe); callers then use ScaledDotProductAttention with a mask.
// Out-of-memory errors propagate. Enqueued on the current stream.
inline at::Tensor VarlenCausalAttention(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& cu_seqlens,
                                        int64_t max_seqlen, double scale, int64_t window) {
#if MEGATRAIN_TORCH_AT_LEAST(2, 5)
  static std::atomic<bool> refused{false};
  const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  const int64_t head_dim = q.size(-1);
  if (q.is_cuda() && half && head_dim % 8 == 0 && head_dim <= 256 &&
      !refused.load(std::memory_order_relaxed)) {
    std::optional<int64_t> window_left;
    std::optional<int64_t> window_right;
    if (window > 0) {
      window_left = window - 1;
      window_right = 0;
    }
    try {
      auto result = at::_flash_attention_forward(
          q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens, cu_seqlens, max_seqlen,
          max_seqlen, /*dropout_p=*/0.0, /*is_causal=*/true, /*return_debug_mask=*/false, scale,
          window_left, window_right);
      return std::get<0>(result);
    } catch (const c10::OutOfMemoryError&) {
      throw;
    } catch (const c10::Error& e) {
      if (!refused.exchange(true)) {
        std::fprintf(stderr,
                     "megatrain: flash attention's varlen kernel refused packed documents (%s); "
                     "using SDPA with a document mask instead\n",
                     e.what_without_backtrace());
      }
    }
  }
#else
  (void)q, (void)k, (void)v, (void)cu_seqlens, (void)max_seqlen, (void)scale, (void)window;
#endif
  return at::Tensor();
}

// True when `e` reports device (or host) memory exhaustion: c10's
// OutOfMemoryError on torch 2.x; the message on 1.13.
inline bool IsOutOfMemory(const std::exception& e) {
#if MEGATRAIN_TORCH_AT_LEAST(2, 0)
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
#endif
  return std::string(e.what()).find("out of memory") != std::string::npos;
}

// L2 norm of `x` (any shape, fp32), accumulated in fp64: a 0-dim fp64
// tensor on x's device, computed on its current stream.
inline at::Tensor VectorNormFp64(const at::Tensor& x) {
  return at::linalg_vector_norm(x, 2, c10::nullopt, /*keepdim=*/false, at::kDouble);
}

// Allows or forbids TF32 tensor-core math for fp32 matmuls and convolutions.
inline void SetAllowTf32(bool allow) {
  at::globalContext().setAllowTF32CuBLAS(allow);
  at::globalContext().setAllowTF32CuDNN(allow);
}

// Key of a parameter in torch::optim::Optimizer::state(): a string of the
// TensorImpl address on 1.13, the address itself on 2.x. Deduced from the
// map's key type, so no version test is needed.
template <typename StateMap>
typename StateMap::key_type OptimizerStateKey(const StateMap&, const at::Tensor& param) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // what c10::guts::to_string(void*) produced
    key << param.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// Grouped GEMM over row ranges: a [M, K] whose rows [offsets[g-1],
// offsets[g]) belong to group g, b [G, K, N] -> [M, N], out rows of group g
// = a rows of g @ b[g]. `offsets` [G] int32 on a's device (cumulative ends);
// `group_rows` the same counts on the host. at::_grouped_mm on CUDA bf16
// with torch >= 2.9 (its supported case); elsewhere, and on 1.13, a loop of
// one matmul per group, concatenated in group order (an empty group adds no
// rows and gives b[g] a zero gradient). Both are differentiable.
inline at::Tensor GroupedMm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offsets,
                            const std::vector<int64_t>& group_rows) {
#if MEGATRAIN_TORCH_AT_LEAST(2, 9)
  if (a.is_cuda() && a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16) {
    return at::_grouped_mm(a, b, offsets);
  }
#else
  (void)offsets;
#endif
  std::vector<at::Tensor> pieces;
  pieces.reserve(group_rows.size());
  int64_t start = 0;
  for (size_t g = 0; g < group_rows.size(); ++g) {
    pieces.push_back(at::matmul(a.narrow(0, start, group_rows[g]), b[static_cast<int64_t>(g)]));
    start += group_rows[g];
  }
  return at::cat(pieces, 0);
}

// Whether FusedAdamW runs on tensors on `device`: with torch >= 2.1 on
// CUDA; never with 1.13 (which has only the L2-coupled _fused_adam_).
inline bool FusedAdamWSupported(const at::Device& device) {
#if MEGATRAIN_TORCH_AT_LEAST(2, 1)
  return device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

// One AdamW update of every params[i] with grads[i], exp_avgs[i] (m) and
// exp_avg_sqs[i] (v), in place: ATen's multi-tensor _fused_adamw_, the
// kernel of torch.optim.AdamW(fused=True) (its arithmetic:
// aten/src/ATen/native/cuda/fused_adam_utils.cuh, `adam_math`, ADAMW mode;
// amsgrad and maximize off). Every list has one entry per tensor; the
// tensors are fp32, contiguous, on one CUDA device, params[i] and the
// others of the same shape. `steps[i]`: a 0-dim fp32 tensor on that device
// holding the update count t (from 1), read, not incremented.
// `grad_scale`: undefined, or a 0-dim fp32 tensor s on that device that
// every gradient is divided by (g / s, in double, rounded to fp32), and
// grads[i] is then overwritten with g / s. Enqueued on the current stream,
// no host synchronisation. Precondition: FusedAdamWSupported(device)
// (otherwise throws c10::Error).
inline void FusedAdamW(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                       at::TensorList exp_avg_sqs, at::TensorList steps, double lr, double beta1,
                       double beta2, double weight_decay, double eps,
                       const at::Tensor& grad_scale) {
#if MEGATRAIN_TORCH_AT_LEAST(2, 1)
  std::optional<at::Tensor> scale;
  if (grad_scale.defined()) scale = grad_scale;
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/at::TensorList(),
                    steps, lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false,
                    /*maximize=*/false, scale, /*found_inf=*/std::nullopt);
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps, (void)lr;
  (void)beta1, (void)beta2, (void)weight_decay, (void)eps, (void)grad_scale;
  TORCH_CHECK(false, "FusedAdamW needs torch >= 2.1 (check FusedAdamWSupported first)");
#endif
}

// acc += mat1 @ mat2 with acc [M, N] fp32 and mat1 [M, K], mat2 [K, N]
// of one dtype, on one device: one GEMM whose fp32 epilogue adds the
// product (accumulated in fp32 by the GEMM, never rounded to mat1's dtype)
// into acc (beta 1). For bf16 or fp16 inputs this needs ATen's
// addmm.dtype_out with an fp32 `self` (CUDA, recent torch 2.x; the
// CPU's BLAS has no such GEMM): when that overload is missing or refuses
// the call, the product is rounded to the input dtype and added in fp32
// (acc.add_(mat1.mm(mat2)), exact widening then one fp32 rounding per
// element). Returns whether the fused GEMM ran. fp32 inputs: acc.addmm_.
// Enqueued on the current stream; the first refusal is remembered
// process-wide (thread-safe) so it is tried once.
inline bool AddmmIntoFp32(at::Tensor& acc, const at::Tensor& mat1, const at::Tensor& mat2) {
  if (mat1.scalar_type() == at::kFloat) {
    acc.addmm_(mat1, mat2);
    return true;
  }
#if MEGATRAIN_TORCH_AT_LEAST(2, 8)
  static std::atomic<bool> refused{false};
  if (acc.is_cuda() && !refused.load(std::memory_order_relaxed)) {
    try {
      at::addmm_out(acc, acc, mat1, mat2, at::kFloat, /*beta=*/1, /*alpha=*/1);
      return true;
    } catch (const c10::Error&) {
      refused.store(true, std::memory_order_relaxed);
    }
  }
#endif
  acc.add_(mat1.mm(mat2));
  return false;
}

// Note [Fused RMSNorm]
// HF LlamaRMSNorm on an fp32 x [..., D] with weight [D] (any float dtype):
// x * rsqrt(mean(x^2, -1) + eps) * weight, all in fp32. On CUDA with torch
// >= 2.9, at::rms_norm runs it as one fused kernel each way
// (_fused_rms_norm and its backward) where the composite form launches
// about five kernels forward and ten backward, each a full [.., D] fp32
// pass: the largest elementwise cost of the decoder layer at 8B
// (docs/performance-history.md, "2026-11-24 (CUDA-graphs)"). The fused kernel sums x^2 in its
// own order, so rstd, and the output, can differ from the composite's in
// the last bit; it is one function for every schedule, tier and resume, so
// those stay bit-identical to each other. Returns an undefined tensor where
// the fused path is not taken (CPU, other dtypes, older torch): callers then
// compute the composite form, bit for bit HF's.
inline at::Tensor FusedRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
#if MEGATRAIN_TORCH_AT_LEAST(2, 9)
  if (x.is_cuda() && x.scalar_type() == at::kFloat) {
    return at::rms_norm(x, {x.size(-1)}, weight.to(at::kFloat), eps);
  }
#endif
  (void)x;
  (void)weight;
  (void)eps;
  return at::Tensor();
}

// Note [Expandable segments]
// Asks the CUDA caching allocator for expandable segments
// (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) unless the operator
// has set PYTORCH_CUDA_ALLOC_CONF, which then wins. The executor's device
// plan leaves a margin for the allocator's rounding, not for
// fragmentation: with fixed-size segments, llama-3b at 8 x 2048 x
// accumulation 4 with 20 resident layers on an 80 GB H100 failed with
// 9.9 GiB reserved but unallocated; with expandable segments it ran
// (docs/performance-history.md, "2026-11-24 (head-GEMM)"). torch >= 2.1 (older versions
// reject the key, so nothing is set there). Call from main() before any
// thread starts and before the first CUDA allocation: the allocator reads
// the variable once, and setenv is not thread-safe.
inline void PreferExpandableSegments() {
#if MEGATRAIN_TORCH_AT_LEAST(2, 1)
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", /*overwrite=*/0);
#endif
}

}  // namespace megatrain::engine::compat

#endif  // MEGATRAIN_ENGINE_TORCH_COMPAT_H_
