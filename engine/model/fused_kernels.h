// Launchers of the fused elementwise kernels (fused_kernels.cu; Note
// [Fused kernels] in fused_math.h). Raw pointers, sizes and a stream in, a
// cudaError_t out: no ATen here, so the .cu file compiles with nvcc alone
// (deploy/nvcc-check.sh). The ATen-facing wrappers are fused_ops.h.
//
// Conventions: tensors are contiguous, row-major, on the device of
// `stream`; bf16 is __nv_bfloat16 (2 bytes); math is fp32, rounded once to
// bf16 on store. Every launcher only enqueues on `stream` and returns the
// launch's error (cudaGetLastError); it never synchronises.
#ifndef MEGATRAIN_ENGINE_MODEL_FUSED_KERNELS_H_
#define MEGATRAIN_ENGINE_MODEL_FUSED_KERNELS_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace megatrain::engine::fused {

// p[i] = act(gate[i]) * up[i] for i in [0, n); `activation` is a
// GatedActivation (fused_math.h) as int. gate, up, p: bf16 [n].
cudaError_t LaunchGatedForward(const __nv_bfloat16* gate, const __nv_bfloat16* up, __nv_bfloat16* p,
                               int64_t n, int activation, cudaStream_t stream);

// d_gate[i] = dp[i] * up[i] * act'(gate[i]), d_up[i] = dp[i] * act(gate[i]).
// All bf16 [n]; d_gate and d_up may not alias the inputs.
cudaError_t LaunchGatedBackward(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                                const __nv_bfloat16* dp, __nv_bfloat16* d_gate, __nv_bfloat16* d_up,
                                int64_t n, int activation, cudaStream_t stream);

// Residual add + RMSNorm over `rows` rows of `width` (<= 16384):
//   hidden = residual + delta                        fp32 [rows, width]
//   r      = rsqrt(mean(hidden^2) + eps)             fp32 [rows] (inv_rms)
//   normed = bf16(hidden * r * scale(weight))        bf16 [rows, width]
// residual fp32, delta bf16 [rows, width], weight bf16 [width]; scale is w
// or 1 + w (`one_plus`, Gemma). `hidden` may alias `residual`.
cudaError_t LaunchAddRmsNormForward(const float* residual, const __nv_bfloat16* delta,
                                    const __nv_bfloat16* weight, float* hidden,
                                    __nv_bfloat16* normed, float* inv_rms, int64_t rows, int width,
                                    float eps, bool one_plus, cudaStream_t stream);

// RMSNorm backward fused with the residual gradient add:
//   d_hidden = d_residual + r * (g - x_hat * mean(g * x_hat)),
//   g = d_normed * scale(weight), x_hat = hidden * r
// and the weight gradient's per-row-block partial sums
//   d_weight_partial[b, c] = sum over the rows of block b of d_normed * x_hat
// (fp32 [blocks, width], blocks = FusedRmsNormBackwardBlocks(rows); the
// caller sums over b). hidden, d_residual, d_hidden fp32 [rows, width];
// d_normed bf16; inv_rms from the forward. d_hidden may alias d_residual.
cudaError_t LaunchAddRmsNormBackward(const float* hidden, const float* inv_rms,
                                     const __nv_bfloat16* d_normed, const float* d_residual,
                                     const __nv_bfloat16* weight, float* d_hidden,
                                     float* d_weight_partial, int64_t rows, int width,
                                     bool one_plus, cudaStream_t stream);

// Row blocks of LaunchAddRmsNormBackward's weight-gradient partial sums.
int64_t FusedRmsNormBackwardBlocks(int64_t rows);

// Shape and strides of a rotary embedding's input x, logically
// [batch, seq, heads, head_dim], in elements (any strides: the gradient
// that reaches the backward is often a transposed view).
struct RotaryShape {
  int64_t batch, seq, heads, head_dim;
  int64_t stride_batch, stride_seq, stride_head, stride_dim;
  int rotary_dim;        // Dr: the first Dr of head_dim rotate (even, <= head_dim)
  bool per_token_table;  // cos, sin are [batch, seq, Dr] (else [seq, Dr])
};

// Rotary position embedding, one kernel (Note [RoPE kernels] in
// engine/model/layers.cc): with the halves x1, x2 of x's first Dr
// dimensions and cos, sin fp32 contiguous ([seq, Dr] or [batch, seq, Dr]),
//   forward  (adjoint false): y1 = x1 c1 - x2 s1,  y2 = x2 c2 + x1 s2
//   adjoint  (adjoint true):  y1 = x1 c1 + x2 s2,  y2 = x2 c2 - x1 s1
// each product and sum rounded to fp32 separately (no contraction into an
// FMA), then once to y's dtype: bit for bit the ATen composite's result.
// The dimensions past Dr are copied. y is contiguous [batch, seq, heads,
// head_dim]; x and y have one dtype, bf16 or fp32, and may not alias.
cudaError_t LaunchRotaryBf16(const __nv_bfloat16* x, const float* cos, const float* sin,
                             __nv_bfloat16* y, const RotaryShape& shape, bool adjoint,
                             cudaStream_t stream);
cudaError_t LaunchRotaryFp32(const float* x, const float* cos, const float* sin, float* y,
                             const RotaryShape& shape, bool adjoint, cudaStream_t stream);

// The L2 norm of x fp32 [n], accumulated in fp64, into *norm (fp64, on
// the device): each thread sums its elements' exact squares in fp64, the
// blocks' sums land in partials[0, NormFp64Blocks(n)) (fp64 scratch), and
// one block adds them in index order and takes the square root. The grid
// depends on n only, so a given x always gives the same bits. Reads x
// once; ATen's linalg_vector_norm with an fp64 dtype first writes an fp64
// copy of x (12 bytes per element more).
cudaError_t LaunchNormFp64(const float* x, int64_t n, double* partials, double* norm,
                           cudaStream_t stream);

// Entries of LaunchNormFp64's `partials` scratch for n elements (>= 1).
int64_t NormFp64Blocks(int64_t n);

// Token cross-entropy of `rows` rows of bf16 logits [rows, vocab] with
// labels int64 [rows] (kIgnoreIndex -100: no loss, zero gradient), in
// place (Note [Fused cross-entropy] in engine/model/layers.cc): one block
// per row reads the row for its log-sum-exp lse (fp32, a running max and
// sum combined in a fixed order), then again to overwrite each logit x_j
// with bf16(scale * (exp(x_j - lse) - [j == label])), the gradient of
// scale * loss. row_loss fp32 [rows] gets lse - x[label] (nats, unscaled;
// 0 for ignored rows; NaN for a label outside [0, vocab)). 6 bytes of
// traffic per logit. rows <= 2^31 - 1.
cudaError_t LaunchCrossEntropyInPlace(__nv_bfloat16* logits, const int64_t* labels, int64_t rows,
                                      int64_t vocab, float scale, float* row_loss,
                                      cudaStream_t stream);

// dst[i] += float(src[i]) for i in [0, n): dst fp32 [n], src bf16 [n], in
// one pass (10 bytes per element; ATen's add_(src.to(float)) is two
// kernels and 18 bytes). The same fp32 sums as that: the widening is
// exact and each element is one fp32 add.
cudaError_t LaunchAddBf16IntoFp32(const __nv_bfloat16* src, float* dst, int64_t n,
                                  cudaStream_t stream);

}  // namespace megatrain::engine::fused

#endif  // MEGATRAIN_ENGINE_MODEL_FUSED_KERNELS_H_
