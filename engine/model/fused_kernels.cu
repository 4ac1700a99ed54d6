// The fused elementwise kernels (Note [Fused kernels] in fused_math.h):
// the gated MLP product and its backward, residual add + RMSNorm with
// its backward, the rotary embedding (both directions), the fp64 L2 norm
// of an fp32 gradient, the head's cross-entropy in place of its logits,
// and the one-pass bf16 -> fp32 gradient add. Includes only CUDA headers
// and fused_math.h; compiled by
// nvcc in CUDA builds (engine/CMakeLists.txt) and checked by
// deploy/nvcc-check.sh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "engine/model/fused_kernels.h"
#include "engine/model/fused_math.h"

namespace megatrain::engine::fused {
namespace {

// Elements per thread in the vectorised gated kernels: one 16-byte load of
// bf16 per tensor (LDG.128), what saturates HBM on Hopper.
constexpr int kVec = 8;
constexpr int kThreads = 256;
// Threads per RMSNorm row: 256 threads x up to 64 columns each covers
// width 16384 (every preset's hidden size is <= 8192).
constexpr int kNormThreads = 256;
constexpr int kMaxNormWidth = 16384;
// Row blocks of the weight-gradient partial sums: enough blocks to fill
// 132 SMs several times, few enough that the [blocks, C] fp32 partials
// (8 MiB at C = 4096) stay small beside the [rows, C] tensors.
constexpr int64_t kMaxNormBackwardBlocks = 512;

struct alignas(16) Bf16x8 {
  __nv_bfloat162 v[4];
};

__device__ __forceinline__ void Unpack(const Bf16x8& in, float* out) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(in.v[k]);
    out[2 * k] = f.x;
    out[2 * k + 1] = f.y;
  }
}

__device__ __forceinline__ Bf16x8 Pack(const float* in) {
  Bf16x8 out;
#pragma unroll
  for (int k = 0; k < 4; ++k) out.v[k] = __floats2bfloat162_rn(in[2 * k], in[2 * k + 1]);
  return out;
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

int GridFor(int64_t work_items) {
  return static_cast<int>(std::min<int64_t>((work_items + kThreads - 1) / kThreads, 65535 * 8));
}

// p = act(g) * u, kVec elements per thread per step (grid-stride); the
// scalar tail [vec_n * kVec, n) goes to the first threads.
__global__ void GatedForwardKernel(const __nv_bfloat16* __restrict__ gate,
                                   const __nv_bfloat16* __restrict__ up,
                                   __nv_bfloat16* __restrict__ p, int64_t n, int64_t vec_n,
                                   GatedActivation a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < vec_n; i += stride) {
    float g[kVec], u[kVec], out[kVec];
    Unpack(reinterpret_cast<const Bf16x8*>(gate)[i], g);
    Unpack(reinterpret_cast<const Bf16x8*>(up)[i], u);
#pragma unroll
    for (int k = 0; k < kVec; ++k) out[k] = GatedForward(a, g[k], u[k]);
    reinterpret_cast<Bf16x8*>(p)[i] = Pack(out);
  }
  for (int64_t i = vec_n * kVec + first; i < n; i += stride) {
    p[i] = __float2bfloat16_rn(GatedForward(a, __bfloat162float(gate[i]), __bfloat162float(up[i])));
  }
}

__global__ void GatedBackwardKernel(const __nv_bfloat16* __restrict__ gate,
                                    const __nv_bfloat16* __restrict__ up,
                                    const __nv_bfloat16* __restrict__ dp,
                                    __nv_bfloat16* __restrict__ d_gate,
                                    __nv_bfloat16* __restrict__ d_up, int64_t n, int64_t vec_n,
                                    GatedActivation a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < vec_n; i += stride) {
    float g[kVec], u[kVec], d[kVec], dg[kVec], du[kVec];
    Unpack(reinterpret_cast<const Bf16x8*>(gate)[i], g);
    Unpack(reinterpret_cast<const Bf16x8*>(up)[i], u);
    Unpack(reinterpret_cast<const Bf16x8*>(dp)[i], d);
#pragma unroll
    for (int k = 0; k < kVec; ++k) GatedBackward(a, g[k], u[k], d[k], &dg[k], &du[k]);
    reinterpret_cast<Bf16x8*>(d_gate)[i] = Pack(dg);
    reinterpret_cast<Bf16x8*>(d_up)[i] = Pack(du);
  }
  for (int64_t i = vec_n * kVec + first; i < n; i += stride) {
    float dg, du;
    GatedBackward(a, __bfloat162float(gate[i]), __bfloat162float(up[i]), __bfloat162float(dp[i]),
                  &dg, &du);
    d_gate[i] = __float2bfloat16_rn(dg);
    d_up[i] = __float2bfloat16_rn(du);
  }
}

// Sum of `v` over the block (kNormThreads threads); every thread gets it.
template <typename T>
__device__ T BlockSum(T v) {
  __shared__ T warp_sums[kNormThreads / 32];
  __shared__ T total;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T s = lane < kNormThreads / 32 ? warp_sums[lane] : T(0);
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const T out = total;
  __syncthreads();  // warp_sums and total are reused by the next call
  return out;
}

// One block per row: hidden = residual + delta, then the row's RMS.
__global__ void AddRmsNormForwardKernel(const float* residual, const __nv_bfloat16* delta,
                                        const __nv_bfloat16* __restrict__ weight, float* hidden,
                                        __nv_bfloat16* __restrict__ normed,
                                        float* __restrict__ inv_rms, int width, float eps,
                                        bool one_plus) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * width;
  float sum_sq = 0.0f;
  for (int c = threadIdx.x; c < width; c += kNormThreads) {
    const float h = residual[base + c] + __bfloat162float(delta[base + c]);
    hidden[base + c] = h;
    sum_sq += h * h;
  }
  const float r = InverseRms(BlockSum<float>(sum_sq), width, eps);
  if (threadIdx.x == 0) inv_rms[blockIdx.x] = r;
  // Each thread rereads only what it wrote: no barrier needed.
  for (int c = threadIdx.x; c < width; c += kNormThreads) {
    const float scale = NormScale(one_plus, __bfloat162float(weight[c]));
    normed[base + c] = __float2bfloat16_rn(hidden[base + c] * r * scale);
  }
}

// Block b handles rows [b * rows_per_block, ...): for each row the input
// gradient plus the residual's, and the weight gradient's partial sums in
// d_weight_partial[b, :] (each thread owns its columns: no atomics).
__global__ void AddRmsNormBackwardKernel(const float* __restrict__ hidden,
                                         const float* __restrict__ inv_rms,
                                         const __nv_bfloat16* __restrict__ d_normed,
                                         const float* d_residual,
                                         const __nv_bfloat16* __restrict__ weight, float* d_hidden,
                                         float* __restrict__ d_weight_partial, int64_t rows,
                                         int64_t rows_per_block, int width, bool one_plus) {
  float* partial = d_weight_partial + static_cast<int64_t>(blockIdx.x) * width;
  for (int c = threadIdx.x; c < width; c += kNormThreads) partial[c] = 0.0f;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t row_end = rows < row_begin + rows_per_block ? rows : row_begin + rows_per_block;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t base = row * width;
    const float r = inv_rms[row];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < width; c += kNormThreads) {
      const float x_hat = hidden[base + c] * r;
      const float dy = __bfloat162float(d_normed[base + c]);
      dot += dy * NormScale(one_plus, __bfloat162float(weight[c])) * x_hat;
      partial[c] += dy * x_hat;
    }
    const float mean_gx = BlockSum<float>(dot) / static_cast<float>(width);
    for (int c = threadIdx.x; c < width; c += kNormThreads) {
      const float scale = NormScale(one_plus, __bfloat162float(weight[c]));
      const float dx = RmsNormInputGrad(hidden[base + c], __bfloat162float(d_normed[base + c]),
                                        scale, r, mean_gx);
      d_hidden[base + c] = d_residual[base + c] + dx;
    }
  }
}

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// One block per token (b, t); its threads walk the token's heads x Dr/2
// rotation pairs (i, i + Dr/2), so consecutive threads touch consecutive
// elements, and then its pass-through dimensions. Index math is 32-bit
// within a token; the token's offsets are 64-bit. The explicit _rn
// intrinsics keep every product and sum its own fp32 rounding, as ATen's
// separate mul, sub and add kernels round them (nvcc would otherwise
// contract a * b - c * d into an FMA).
template <typename T>
__global__ void RotaryKernel(const T* __restrict__ x, const float* __restrict__ cos,
                             const float* __restrict__ sin, T* __restrict__ y, RotaryShape s,
                             bool adjoint) {
  const int64_t token = blockIdx.x;  // b * seq + t
  const int64_t b = token / s.seq, t = token % s.seq;
  const T* xt = x + b * s.stride_batch + t * s.stride_seq;
  T* yt = y + token * s.heads * s.head_dim;
  const int64_t table_row = s.per_token_table ? token : t;
  const float* c = cos + table_row * s.rotary_dim;
  const float* sn = sin + table_row * s.rotary_dim;
  const int half = s.rotary_dim / 2;
  const int heads = static_cast<int>(s.heads), head_dim = static_cast<int>(s.head_dim);
  for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const int h = j / half, i = j % half;
    const T* xh = xt + h * s.stride_head;
    const float x1 = ToFloat(xh[i * s.stride_dim]);
    const float x2 = ToFloat(xh[(i + half) * s.stride_dim]);
    const float c1 = c[i], c2 = c[i + half], s1 = sn[i], s2 = sn[i + half];
    T* yh = yt + h * head_dim;
    if (!adjoint) {  // y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2
      yh[i] = FromFloat<T>(__fsub_rn(__fmul_rn(x1, c1), __fmul_rn(x2, s1)));
      yh[i + half] = FromFloat<T>(__fadd_rn(__fmul_rn(x2, c2), __fmul_rn(x1, s2)));
    } else {  // gx1 = g1 c1 + g2 s2, gx2 = g2 c2 - g1 s1
      yh[i] = FromFloat<T>(__fadd_rn(__fmul_rn(x1, c1), __fmul_rn(x2, s2)));
      yh[i + half] = FromFloat<T>(__fsub_rn(__fmul_rn(x2, c2), __fmul_rn(x1, s1)));
    }
  }
  const int pass = head_dim - s.rotary_dim;
  for (int j = threadIdx.x; j < heads * pass; j += blockDim.x) {
    const int h = j / pass, d = s.rotary_dim + j % pass;
    yt[h * head_dim + d] = xt[h * s.stride_head + d * s.stride_dim];
  }
}

template <typename T>
cudaError_t LaunchRotary(const T* x, const float* cos, const float* sin, T* y, const RotaryShape& s,
                         bool adjoint, cudaStream_t stream) {
  const int64_t n = s.batch * s.seq * s.heads * s.head_dim;
  if (n <= 0) return cudaSuccess;
  if (s.rotary_dim <= 0 || s.rotary_dim % 2 != 0 || s.rotary_dim > s.head_dim) {
    return cudaErrorInvalidValue;
  }
  const int64_t tokens = s.batch * s.seq;
  if (tokens > 0x7fffffff || s.heads * s.head_dim > 0x7fffffff) return cudaErrorInvalidValue;
  RotaryKernel<T>
      <<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(x, cos, sin, y, s, adjoint);
  return cudaGetLastError();
}

// Blocks of the fp64 norm: up to 1,024 (several per SM), each thread
// summing at least 8 elements.
constexpr int64_t kMaxNormFp64Blocks = 1024;
static_assert(kThreads == kNormThreads, "the fp64 norm's blocks use BlockSum");

__global__ void SquaresFp64Kernel(const float* __restrict__ x, int64_t n,
                                  double* __restrict__ partials) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double sum = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const double v = x[i];
    sum += v * v;  // exact: a 24-bit mantissa squared fits 53 bits
  }
  const double total = BlockSum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void NormFromPartialsKernel(const double* __restrict__ partials, int64_t blocks,
                                       double* __restrict__ norm) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < blocks; i += blockDim.x) sum += partials[i];
  const double total = BlockSum(sum);
  if (threadIdx.x == 0) *norm = sqrt(total);
}

// Threads per cross-entropy row: a 128k-vocabulary row is 16,032 vectors
// of 8 bf16, about 31 per thread.
constexpr int kCrossEntropyThreads = 512;

// A running (max, sum of exp(x - max)) pair of a softmax's denominator.
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  // A side with no elements (sum 0, max -inf) adds nothing; without the
  // test, exp(-inf - -inf) would be NaN.
  const float sa = a.sum == 0.0f ? 0.0f : a.sum * expf(a.max - m);
  const float sb = b.sum == 0.0f ? 0.0f : b.sum * expf(b.max - m);
  return {m, sa + sb};
}

__device__ __forceinline__ MaxSum Push(MaxSum a, float v) {
  if (v > a.max) return {v, (a.sum == 0.0f ? 0.0f : a.sum * expf(a.max - v)) + 1.0f};
  return {a.max, a.sum + expf(v - a.max)};
}

// Combines every thread's pair in a fixed tree (warp shuffles, then warp
// 0 over the warps' pairs): deterministic; every thread gets the result.
__device__ MaxSum BlockMaxSum(MaxSum v) {
  __shared__ MaxSum warp_pairs[kCrossEntropyThreads / 32];
  __shared__ MaxSum total;
  for (int offset = 16; offset > 0; offset /= 2) {
    v = Combine(v, {__shfl_xor_sync(0xffffffffu, v.max, offset),
                    __shfl_xor_sync(0xffffffffu, v.sum, offset)});
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_pairs[warp] = v;
  __syncthreads();
  if (warp == 0) {
    MaxSum w = lane < kCrossEntropyThreads / 32 ? warp_pairs[lane] : MaxSum{-INFINITY, 0.0f};
    for (int offset = 16; offset > 0; offset /= 2) {
      w = Combine(w, {__shfl_xor_sync(0xffffffffu, w.max, offset),
                      __shfl_xor_sync(0xffffffffu, w.sum, offset)});
    }
    if (lane == 0) total = w;
  }
  __syncthreads();
  return total;
}

// One block per row of logits (Note [Fused cross-entropy] in
// engine/model/layers.cc): pass 1 reads the row once for its log-sum-exp,
// pass 2 reads it again and writes the gradient over it. `vec` rows are
// read as 8-bf16 vectors (vocab % 8 == 0, 16-byte aligned).
__global__ void CrossEntropyKernel(__nv_bfloat16* __restrict__ logits,
                                   const int64_t* __restrict__ labels, int64_t vocab, float scale,
                                   float* __restrict__ row_loss, bool vec) {
  const int64_t row = blockIdx.x;
  __nv_bfloat16* x = logits + row * vocab;
  const int64_t label = labels[row];
  if (label == kIgnoreIndex) {  // no loss, no gradient: zeros, as ATen's
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) x[j] = __float2bfloat16_rn(0.0f);
    if (threadIdx.x == 0) row_loss[row] = 0.0f;
    return;
  }
  const int64_t vec_n = vec ? vocab / kVec : 0;
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t i = threadIdx.x; i < vec_n; i += blockDim.x) {
    float v[kVec];
    Unpack(reinterpret_cast<const Bf16x8*>(x)[i], v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc = Push(acc, v[k]);
  }
  for (int64_t j = vec_n * kVec + threadIdx.x; j < vocab; j += blockDim.x) {
    acc = Push(acc, __bfloat162float(x[j]));
  }
  const MaxSum total = BlockMaxSum(acc);
  const float lse = total.max + logf(total.sum);
  const bool in_range = label >= 0 && label < vocab;
  // Every thread reads the label's logit before any thread overwrites it.
  const float label_logit = in_range ? __bfloat162float(x[label]) : 0.0f;
  __syncthreads();
  if (threadIdx.x == 0) row_loss[row] = in_range ? lse - label_logit : NAN;
  // An out-of-range label (the data checks refuse them at submission)
  // poisons the loss, so the step's non-finite check reports it.
  for (int64_t i = threadIdx.x; i < vec_n; i += blockDim.x) {
    float v[kVec];
    Unpack(reinterpret_cast<const Bf16x8*>(x)[i], v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      v[k] = CrossEntropyGrad(v[k], lse, i * kVec + k == label, scale);
    }
    reinterpret_cast<Bf16x8*>(x)[i] = Pack(v);
  }
  for (int64_t j = vec_n * kVec + threadIdx.x; j < vocab; j += blockDim.x) {
    x[j] = __float2bfloat16_rn(CrossEntropyGrad(__bfloat162float(x[j]), lse, j == label, scale));
  }
}

// dst += float(src), kVec elements per thread per step (grid-stride),
// the scalar tail to the first threads.
__global__ void AddBf16IntoFp32Kernel(const __nv_bfloat16* __restrict__ src,
                                      float* __restrict__ dst, int64_t n, int64_t vec_n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < vec_n; i += stride) {
    float s[kVec];
    Unpack(reinterpret_cast<const Bf16x8*>(src)[i], s);
    float4* d = reinterpret_cast<float4*>(dst) + 2 * i;
    float4 lo = d[0], hi = d[1];
    lo.x += s[0], lo.y += s[1], lo.z += s[2], lo.w += s[3];
    hi.x += s[4], hi.y += s[5], hi.z += s[6], hi.w += s[7];
    d[0] = lo;
    d[1] = hi;
  }
  for (int64_t i = vec_n * kVec + first; i < n; i += stride) dst[i] += __bfloat162float(src[i]);
}

}  // namespace

int64_t NormFp64Blocks(int64_t n) {
  return std::max<int64_t>(1,
                           std::min(kMaxNormFp64Blocks, (n + kThreads * 8 - 1) / (kThreads * 8)));
}

cudaError_t LaunchNormFp64(const float* x, int64_t n, double* partials, double* norm,
                           cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  const int64_t blocks = NormFp64Blocks(n);
  SquaresFp64Kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, n, partials);
  NormFromPartialsKernel<<<1, kThreads, 0, stream>>>(partials, blocks, norm);
  return cudaGetLastError();
}

cudaError_t LaunchRotaryBf16(const __nv_bfloat16* x, const float* cos, const float* sin,
                             __nv_bfloat16* y, const RotaryShape& shape, bool adjoint,
                             cudaStream_t stream) {
  return LaunchRotary(x, cos, sin, y, shape, adjoint, stream);
}

cudaError_t LaunchRotaryFp32(const float* x, const float* cos, const float* sin, float* y,
                             const RotaryShape& shape, bool adjoint, cudaStream_t stream) {
  return LaunchRotary(x, cos, sin, y, shape, adjoint, stream);
}

cudaError_t LaunchGatedForward(const __nv_bfloat16* gate, const __nv_bfloat16* up, __nv_bfloat16* p,
                               int64_t n, int activation, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const bool vec = Aligned16(gate) && Aligned16(up) && Aligned16(p);
  const int64_t vec_n = vec ? n / kVec : 0;
  GatedForwardKernel<<<GridFor(vec ? std::max<int64_t>(vec_n, 1) : n), kThreads, 0, stream>>>(
      gate, up, p, n, vec_n, static_cast<GatedActivation>(activation));
  return cudaGetLastError();
}

cudaError_t LaunchGatedBackward(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                                const __nv_bfloat16* dp, __nv_bfloat16* d_gate, __nv_bfloat16* d_up,
                                int64_t n, int activation, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const bool vec =
      Aligned16(gate) && Aligned16(up) && Aligned16(dp) && Aligned16(d_gate) && Aligned16(d_up);
  const int64_t vec_n = vec ? n / kVec : 0;
  GatedBackwardKernel<<<GridFor(vec ? std::max<int64_t>(vec_n, 1) : n), kThreads, 0, stream>>>(
      gate, up, dp, d_gate, d_up, n, vec_n, static_cast<GatedActivation>(activation));
  return cudaGetLastError();
}

cudaError_t LaunchAddRmsNormForward(const float* residual, const __nv_bfloat16* delta,
                                    const __nv_bfloat16* weight, float* hidden,
                                    __nv_bfloat16* normed, float* inv_rms, int64_t rows, int width,
                                    float eps, bool one_plus, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (width <= 0 || width > kMaxNormWidth || rows > 0x7fffffff) return cudaErrorInvalidValue;
  AddRmsNormForwardKernel<<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(
      residual, delta, weight, hidden, normed, inv_rms, width, eps, one_plus);
  return cudaGetLastError();
}

int64_t FusedRmsNormBackwardBlocks(int64_t rows) {
  return std::max<int64_t>(1, std::min(rows, kMaxNormBackwardBlocks));
}

cudaError_t LaunchAddRmsNormBackward(const float* hidden, const float* inv_rms,
                                     const __nv_bfloat16* d_normed, const float* d_residual,
                                     const __nv_bfloat16* weight, float* d_hidden,
                                     float* d_weight_partial, int64_t rows, int width,
                                     bool one_plus, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (width <= 0 || width > kMaxNormWidth) return cudaErrorInvalidValue;
  const int64_t blocks = FusedRmsNormBackwardBlocks(rows);
  const int64_t rows_per_block = (rows + blocks - 1) / blocks;
  AddRmsNormBackwardKernel<<<static_cast<unsigned>(blocks), kNormThreads, 0, stream>>>(
      hidden, inv_rms, d_normed, d_residual, weight, d_hidden, d_weight_partial, rows,
      rows_per_block, width, one_plus);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyInPlace(__nv_bfloat16* logits, const int64_t* labels, int64_t rows,
                                      int64_t vocab, float scale, float* row_loss,
                                      cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || rows > 0x7fffffff) return cudaErrorInvalidValue;
  const bool vec = vocab % kVec == 0 && Aligned16(logits);
  CrossEntropyKernel<<<static_cast<unsigned>(rows), kCrossEntropyThreads, 0, stream>>>(
      logits, labels, vocab, scale, row_loss, vec);
  return cudaGetLastError();
}

cudaError_t LaunchAddBf16IntoFp32(const __nv_bfloat16* src, float* dst, int64_t n,
                                  cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const bool vec = Aligned16(src) && Aligned16(dst);
  const int64_t vec_n = vec ? n / kVec : 0;
  AddBf16IntoFp32Kernel<<<GridFor(vec ? std::max<int64_t>(vec_n, 1) : n), kThreads, 0, stream>>>(
      src, dst, n, vec_n);
  return cudaGetLastError();
}

}  // namespace megatrain::engine::fused
