// The fused elementwise kernels (Note [Fused kernels] in fused_math.h):
// the gated MLP product and its backward, and residual add + RMSNorm with
// its backward. Includes only CUDA headers and fused_math.h; compiled by
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
__device__ float BlockSum(float v) {
  __shared__ float warp_sums[kNormThreads / 32];
  __shared__ float total;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < kNormThreads / 32 ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const float out = total;
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
  const float r = InverseRms(BlockSum(sum_sq), width, eps);
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
    const float mean_gx = BlockSum(dot) / static_cast<float>(width);
    for (int c = threadIdx.x; c < width; c += kNormThreads) {
      const float scale = NormScale(one_plus, __bfloat162float(weight[c]));
      const float dx = RmsNormInputGrad(hidden[base + c], __bfloat162float(d_normed[base + c]),
                                        scale, r, mean_gx);
      d_hidden[base + c] = d_residual[base + c] + dx;
    }
  }
}

}  // namespace

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

}  // namespace megatrain::engine::fused
