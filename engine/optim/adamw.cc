// AdamW kernels (scalar, AVX2+FMA, AVX-512F), CpuAdamW and the gradient
// sum of squares. See adamw.h and Note [AdamW update].
//
// The vector variants are GCC `__attribute__((target(...)))` functions with
// intrinsics, so the file builds for baseline x86-64 and picks the variant
// at run time; no function here uses a wide instruction unless the CPU
// reported it (CpuKernelSupported).
#include "engine/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MEGATRAIN_X86_KERNELS 1
#include <immintrin.h>
#else
#define MEGATRAIN_X86_KERNELS 0
#endif

namespace megatrain::engine {

AdamWStepParams MakeAdamWStepParams(const AdamWOptions& options, int64_t step, double lr,
                                    float grad_scale) {
  AdamWStepParams hp;
  hp.lr = lr;
  hp.beta1 = options.beta1;
  hp.beta2 = options.beta2;
  hp.eps = options.eps;
  hp.weight_decay = options.weight_decay;
  hp.step = step;
  hp.grad_scale = grad_scale;
  return hp;
}

AdamWCoefficients MakeAdamWCoefficients(const AdamWStepParams& hp) {
  const double t = static_cast<double>(hp.step);
  const double bias_correction1 = 1.0 - std::pow(hp.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(hp.beta2, t);
  AdamWCoefficients c;
  c.decay = static_cast<float>(1.0 - hp.lr * hp.weight_decay);
  c.beta1 = static_cast<float>(hp.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
  c.beta2 = static_cast<float>(hp.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
  c.step_size = static_cast<float>(hp.lr / bias_correction1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  c.eps = static_cast<float>(hp.eps);
  c.grad_scale = hp.grad_scale;
  return c;
}

namespace {

// ---------------------------------------------------------------------------
// Scalar variant

void AdamWScalar(const AdamWCoefficients& c, float* params, const float* grads, float* exp_avg,
                 float* exp_avg_sq, bf16_bits* bf16_out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grads[i] * c.grad_scale;
    float p = params[i] * c.decay;
    const float m = exp_avg[i] * c.beta1 + c.one_minus_beta1 * g;
    const float v = exp_avg_sq[i] * c.beta2 + (c.one_minus_beta2 * g) * g;
    const float denom = std::sqrt(v) * c.inv_sqrt_bc2 + c.eps;
    p = p - c.step_size * (m / denom);
    params[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (bf16_out != nullptr) bf16_out[i] = FloatToBf16(p);
  }
}

double SumOfSquaresScalar(const float* x, int64_t n) {
  // Four accumulators, like the vector variants, for throughput.
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int lane = 0; lane < 4; ++lane) {
      const double value = x[i + lane];
      acc[lane] += value * value;
    }
  }
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// Copies the last `tail` (< kWidth) elements of each buffer into
// zero-padded vectors, so the vector variants run the tail through the same
// instructions as the body (see Note [AdamW update]). Zero padding is
// harmless: v = 0 gives denom = eps, and padded lanes are discarded.
template <int kWidth>
struct PaddedTail {
  PaddedTail(const float* params, const float* grads, const float* exp_avg, const float* exp_avg_sq,
             int64_t tail)
      : bytes(static_cast<size_t>(tail) * sizeof(float)), count(tail) {
    std::memcpy(p, params, bytes);
    std::memcpy(g, grads, bytes);
    std::memcpy(m, exp_avg, bytes);
    std::memcpy(v, exp_avg_sq, bytes);
  }
  void CopyOut(float* params, float* exp_avg, float* exp_avg_sq, bf16_bits* bf16_out) const {
    std::memcpy(params, p, bytes);
    std::memcpy(exp_avg, m, bytes);
    std::memcpy(exp_avg_sq, v, bytes);
    if (bf16_out != nullptr) {
      std::memcpy(bf16_out, b, static_cast<size_t>(count) * sizeof(bf16_bits));
    }
  }
  float p[kWidth] = {}, g[kWidth] = {}, m[kWidth] = {}, v[kWidth] = {};
  bf16_bits b[kWidth] = {};
  size_t bytes;
  int64_t count;
};

#if MEGATRAIN_X86_KERNELS

// How a vector kernel writes the bf16 streaming copy. kStreaming uses
// non-temporal stores: nothing on the host reads that copy (the GPU's DMA
// does, later), so its cache lines need not be read for ownership first,
// which saves 2 of the 32 bytes of memory traffic per parameter (the gain
// on a memory-bound host is measured in docs/performance.md). The kernel
// fences (_mm_sfence) before returning, so the stores are ordered before
// whatever publishes the update.
enum class Bf16Store { kNone, kPlain, kStreaming };

// Whether `out` can take streaming stores of `alignment` bytes (the store
// arenas are page-aligned and every parameter starts at 64 elements).
inline bool Streamable(const bf16_bits* out, uintptr_t alignment) {
  return out != nullptr && reinterpret_cast<uintptr_t>(out) % alignment == 0;
}

// ---------------------------------------------------------------------------
// AVX2 + FMA variant (8 lanes)

#define MEGATRAIN_TARGET_AVX2 __attribute__((target("avx2,fma")))

// fp32 -> bf16 bits on 8 lanes, bit-for-bit FloatToBf16 (engine/runtime/bf16.h):
// NaN -> (bits >> 16) | 0x40, else (bits + 0x7fff + lsb) >> 16.
MEGATRAIN_TARGET_AVX2 inline __m128i Bf16RoundAvx2(__m256 value) {
  const __m256i bits = _mm256_castps_si256(value);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(value, value, _CMP_UNORD_Q));
  const __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // Every lane is < 2^16 now, so unsigned saturation packs it unchanged.
  return _mm_packus_epi32(_mm256_castsi256_si128(result), _mm256_extracti128_si256(result, 1));
}

// The per-step factors broadcast to 8 lanes.
struct Avx2Coefficients {
  __m256 decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, inv_sqrt_bc2, eps,
      grad_scale;
};

MEGATRAIN_TARGET_AVX2 inline Avx2Coefficients BroadcastAvx2(const AdamWCoefficients& c) {
  return {_mm256_set1_ps(c.decay),           _mm256_set1_ps(c.beta1),
          _mm256_set1_ps(c.one_minus_beta1), _mm256_set1_ps(c.beta2),
          _mm256_set1_ps(c.one_minus_beta2), _mm256_set1_ps(c.step_size),
          _mm256_set1_ps(c.inv_sqrt_bc2),    _mm256_set1_ps(c.eps),
          _mm256_set1_ps(c.grad_scale)};
}

// One AdamW update of 8 elements (Note [AdamW update]).
template <Bf16Store kBf16>
MEGATRAIN_TARGET_AVX2 inline void AdamWVectorAvx2(const Avx2Coefficients& k, float* p_ptr,
                                                  const float* g_ptr, float* m_ptr, float* v_ptr,
                                                  bf16_bits* b_ptr) {
  const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(g_ptr), k.grad_scale);
  const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(p_ptr), k.decay);
  const __m256 m =
      _mm256_fmadd_ps(g, k.one_minus_beta1, _mm256_mul_ps(_mm256_loadu_ps(m_ptr), k.beta1));
  const __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(g, k.one_minus_beta2), g,
                                   _mm256_mul_ps(_mm256_loadu_ps(v_ptr), k.beta2));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), k.inv_sqrt_bc2, k.eps);
  const __m256 p_new = _mm256_fnmadd_ps(k.step_size, _mm256_div_ps(m, denom), p);
  _mm256_storeu_ps(p_ptr, p_new);
  _mm256_storeu_ps(m_ptr, m);
  _mm256_storeu_ps(v_ptr, v);
  if constexpr (kBf16 == Bf16Store::kPlain) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b_ptr), Bf16RoundAvx2(p_new));
  } else if constexpr (kBf16 == Bf16Store::kStreaming) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(b_ptr), Bf16RoundAvx2(p_new));
  }
}

MEGATRAIN_TARGET_AVX2 void AdamWAvx2(const AdamWCoefficients& c, float* params, const float* grads,
                                     float* exp_avg, float* exp_avg_sq, bf16_bits* bf16_out,
                                     int64_t n) {
  constexpr int kWidth = 8;
  const Avx2Coefficients k = BroadcastAvx2(c);
  int64_t i = 0;
  if (Streamable(bf16_out, 16)) {
    for (; i + kWidth <= n; i += kWidth) {
      AdamWVectorAvx2<Bf16Store::kStreaming>(k, params + i, grads + i, exp_avg + i, exp_avg_sq + i,
                                             bf16_out + i);
    }
    _mm_sfence();  // the streaming stores are visible before the caller's release
  } else if (bf16_out != nullptr) {
    for (; i + kWidth <= n; i += kWidth) {
      AdamWVectorAvx2<Bf16Store::kPlain>(k, params + i, grads + i, exp_avg + i, exp_avg_sq + i,
                                         bf16_out + i);
    }
  } else {
    for (; i + kWidth <= n; i += kWidth) {
      AdamWVectorAvx2<Bf16Store::kNone>(k, params + i, grads + i, exp_avg + i, exp_avg_sq + i,
                                        nullptr);
    }
  }
  if (i == n) return;
  PaddedTail<kWidth> tail(params + i, grads + i, exp_avg + i, exp_avg_sq + i, n - i);
  AdamWVectorAvx2<Bf16Store::kPlain>(k, tail.p, tail.g, tail.m, tail.v, tail.b);
  tail.CopyOut(params + i, exp_avg + i, exp_avg_sq + i,
               bf16_out == nullptr ? nullptr : bf16_out + i);
}

// fp32 -> bf16 over `n` elements, bit-for-bit FloatToBf16 (CastToBf16).
MEGATRAIN_TARGET_AVX2 void CastToBf16Avx2(const float* src, bf16_bits* dst, int64_t n) {
  constexpr int kWidth = 8;
  int64_t i = 0;
  if (Streamable(dst, 16)) {
    for (; i + kWidth <= n; i += kWidth) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                       Bf16RoundAvx2(_mm256_loadu_ps(src + i)));
    }
    _mm_sfence();  // the streaming stores are visible before the caller's release
  } else {
    for (; i + kWidth <= n; i += kWidth) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       Bf16RoundAvx2(_mm256_loadu_ps(src + i)));
    }
  }
  for (; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}

MEGATRAIN_TARGET_AVX2 double SumOfSquaresAvx2(const float* x, int64_t n) {
  // Four independent accumulators of 4 doubles hide the FMA latency.
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  __m256d acc2 = _mm256_setzero_pd(), acc3 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    const __m256d x1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    const __m256d x2 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8));
    const __m256d x3 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
    acc0 = _mm256_fmadd_pd(x0, x0, acc0);
    acc1 = _mm256_fmadd_pd(x1, x1, acc1);
    acc2 = _mm256_fmadd_pd(x2, x2, acc2);
    acc3 = _mm256_fmadd_pd(x3, x3, acc3);
  }
  const __m256d acc = _mm256_add_pd(_mm256_add_pd(acc0, acc1), _mm256_add_pd(acc2, acc3));
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, acc);
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

// ---------------------------------------------------------------------------
// AVX-512F variant (16 lanes)

// GCC 12.2's avx512fintrin.h builds "undefined" vectors as `__m512 __Y = __Y;`
// and then warns about them wherever they are inlined (GCC bug 105593,
// fixed in 12.3). Silence exactly that, for the AVX-512 code only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define MEGATRAIN_TARGET_AVX512 __attribute__((target("avx512f")))

// fp32 -> bf16 bits on 16 lanes, bit-for-bit FloatToBf16 (engine/runtime/bf16.h).
// Not VCVTNEPS2BF16 (AVX512_BF16): it flushes denormal inputs to zero,
// which FloatToBf16 (and c10::BFloat16) do not.
MEGATRAIN_TARGET_AVX512 inline __m256i Bf16RoundAvx512(__m512 value) {
  const __m512i bits = _mm512_castps_si512(value);
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 is_nan = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
  const __m512i result = _mm512_mask_or_epi32(rounded, is_nan, high, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(result);  // exact: every lane is < 2^16
}

// The per-step factors broadcast to 16 lanes.
struct Avx512Coefficients {
  __m512 decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, inv_sqrt_bc2, eps,
      grad_scale;
};

MEGATRAIN_TARGET_AVX512 inline Avx512Coefficients BroadcastAvx512(const AdamWCoefficients& c) {
  return {_mm512_set1_ps(c.decay),           _mm512_set1_ps(c.beta1),
          _mm512_set1_ps(c.one_minus_beta1), _mm512_set1_ps(c.beta2),
          _mm512_set1_ps(c.one_minus_beta2), _mm512_set1_ps(c.step_size),
          _mm512_set1_ps(c.inv_sqrt_bc2),    _mm512_set1_ps(c.eps),
          _mm512_set1_ps(c.grad_scale)};
}

// One AdamW update of 16 elements (Note [AdamW update]).
template <Bf16Store kBf16>
MEGATRAIN_TARGET_AVX512 inline void AdamWVectorAvx512(const Avx512Coefficients& k, float* p_ptr,
                                                      const float* g_ptr, float* m_ptr,
                                                      float* v_ptr, bf16_bits* b_ptr) {
  const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(g_ptr), k.grad_scale);
  const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(p_ptr), k.decay);
  const __m512 m =
      _mm512_fmadd_ps(g, k.one_minus_beta1, _mm512_mul_ps(_mm512_loadu_ps(m_ptr), k.beta1));
  const __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(g, k.one_minus_beta2), g,
                                   _mm512_mul_ps(_mm512_loadu_ps(v_ptr), k.beta2));
  const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), k.inv_sqrt_bc2, k.eps);
  const __m512 p_new = _mm512_fnmadd_ps(k.step_size, _mm512_div_ps(m, denom), p);
  _mm512_storeu_ps(p_ptr, p_new);
  _mm512_storeu_ps(m_ptr, m);
  _mm512_storeu_ps(v_ptr, v);
  if constexpr (kBf16 == Bf16Store::kPlain) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b_ptr), Bf16RoundAvx512(p_new));
  } else if constexpr (kBf16 == Bf16Store::kStreaming) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(b_ptr), Bf16RoundAvx512(p_new));
  }
}

MEGATRAIN_TARGET_AVX512 void AdamWAvx512(const AdamWCoefficients& c, float* params,
                                         const float* grads, float* exp_avg, float* exp_avg_sq,
                                         bf16_bits* bf16_out, int64_t n) {
  constexpr int kWidth = 16;
  const Avx512Coefficients k = BroadcastAvx512(c);
  int64_t i = 0;
  if (Streamable(bf16_out, 32)) {
    for (; i + kWidth <= n; i += kWidth) {
      AdamWVectorAvx512<Bf16Store::kStreaming>(k, params + i, grads + i, exp_avg + i,
                                               exp_avg_sq + i, bf16_out + i);
    }
    _mm_sfence();  // the streaming stores are visible before the caller's release
  } else if (bf16_out != nullptr) {
    for (; i + kWidth <= n; i += kWidth) {
      AdamWVectorAvx512<Bf16Store::kPlain>(k, params + i, grads + i, exp_avg + i, exp_avg_sq + i,
                                           bf16_out + i);
    }
  } else {
    for (; i + kWidth <= n; i += kWidth) {
      AdamWVectorAvx512<Bf16Store::kNone>(k, params + i, grads + i, exp_avg + i, exp_avg_sq + i,
                                          nullptr);
    }
  }
  if (i == n) return;
  PaddedTail<kWidth> tail(params + i, grads + i, exp_avg + i, exp_avg_sq + i, n - i);
  AdamWVectorAvx512<Bf16Store::kPlain>(k, tail.p, tail.g, tail.m, tail.v, tail.b);
  tail.CopyOut(params + i, exp_avg + i, exp_avg_sq + i,
               bf16_out == nullptr ? nullptr : bf16_out + i);
}

// fp32 -> bf16 over `n` elements, bit-for-bit FloatToBf16 (CastToBf16).
MEGATRAIN_TARGET_AVX512 void CastToBf16Avx512(const float* src, bf16_bits* dst, int64_t n) {
  constexpr int kWidth = 16;
  int64_t i = 0;
  if (Streamable(dst, 32)) {
    for (; i + kWidth <= n; i += kWidth) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                          Bf16RoundAvx512(_mm512_loadu_ps(src + i)));
    }
    _mm_sfence();  // the streaming stores are visible before the caller's release
  } else {
    for (; i + kWidth <= n; i += kWidth) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                          Bf16RoundAvx512(_mm512_loadu_ps(src + i)));
    }
  }
  for (; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}

MEGATRAIN_TARGET_AVX512 double SumOfSquaresAvx512(const float* x, int64_t n) {
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  __m512d acc2 = _mm512_setzero_pd(), acc3 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512d x0 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    const __m512d x1 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    const __m512d x2 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 16));
    const __m512d x3 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 24));
    acc0 = _mm512_fmadd_pd(x0, x0, acc0);
    acc1 = _mm512_fmadd_pd(x1, x1, acc1);
    acc2 = _mm512_fmadd_pd(x2, x2, acc2);
    acc3 = _mm512_fmadd_pd(x3, x3, acc3);
  }
  const __m512d acc = _mm512_add_pd(_mm512_add_pd(acc0, acc1), _mm512_add_pd(acc2, acc3));
  double sum = _mm512_reduce_add_pd(acc);
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

#pragma GCC diagnostic pop

#endif  // MEGATRAIN_X86_KERNELS

CpuKernel DetectBestKernel() {
#if MEGATRAIN_X86_KERNELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return CpuKernel::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return CpuKernel::kAvx2;
  }
#endif
  return CpuKernel::kScalar;
}

// kAuto and unsupported variants resolve to the best supported one.
CpuKernel Resolve(CpuKernel kernel) {
  if (kernel == CpuKernel::kAuto || !CpuKernelSupported(kernel)) {
    return ActiveCpuKernel();
  }
  return kernel;
}

// CpuAdamW::Step splits buffers at multiples of this many elements: one
// AVX-512 vector is 16, so chunks never split a vector (see the
// determinism contract), and 64 fp32 = 4 cache lines, so two threads never
// write the same cache line of params/m/v, nor of the bf16 copy (128 B).
constexpr int64_t kAlignElements = 64;

// Smallest chunk handed to one thread, in elements: ~2 MB of traffic
// (30 bytes/element), well above the ~10 us it costs to wake a worker, so
// small buffers (norm weights, biases) stay on the calling thread.
constexpr int64_t kMinChunkElements = int64_t{1} << 16;

// SumOfSquares sums fixed blocks of this many elements (256 KiB of fp32)
// into per-block partials combined in order, so the result does not depend
// on the thread count.
constexpr int64_t kSumBlockElements = int64_t{1} << 16;

absl::Status CheckProbability(absl::string_view field, double value) {
  if (!(value >= 0.0 && value < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must be in [0, 1), got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegative(absl::string_view field, double value) {
  if (!(value >= 0.0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be finite and >= 0, got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// Kernel selection

std::string_view CpuKernelName(CpuKernel kernel) {
  switch (kernel) {
    case CpuKernel::kAuto:
      return "auto";
    case CpuKernel::kScalar:
      return "scalar";
    case CpuKernel::kAvx2:
      return "avx2";
    case CpuKernel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

absl::StatusOr<CpuKernel> ParseCpuKernel(std::string_view name) {
  for (CpuKernel kernel :
       {CpuKernel::kAuto, CpuKernel::kScalar, CpuKernel::kAvx2, CpuKernel::kAvx512}) {
    if (name == CpuKernelName(kernel)) return kernel;
  }
  return absl::InvalidArgumentError(absl::StrCat("optimizer.kernel: unknown '", std::string(name),
                                                 "' (expected auto|scalar|avx2|avx512)"));
}

bool CpuKernelSupported(CpuKernel kernel) {
  switch (kernel) {
    case CpuKernel::kAuto:
    case CpuKernel::kScalar:
      return true;
    case CpuKernel::kAvx2:
      return ActiveCpuKernel() == CpuKernel::kAvx2 || ActiveCpuKernel() == CpuKernel::kAvx512;
    case CpuKernel::kAvx512:
      return ActiveCpuKernel() == CpuKernel::kAvx512;
  }
  return false;
}

CpuKernel ActiveCpuKernel() {
  // Thread-safe one-time initialisation (C++11 magic statics).
  static const CpuKernel kBest = DetectBestKernel();
  return kBest;
}

// ---------------------------------------------------------------------------
// AdamW

void AdamWUpdate(const AdamWStepParams& hp, float* params, const float* grads, float* exp_avg,
                 float* exp_avg_sq, bf16_bits* bf16_out, int64_t n, CpuKernel kernel) {
  if (n <= 0) return;
  const AdamWCoefficients c = MakeAdamWCoefficients(hp);
  switch (Resolve(kernel)) {
#if MEGATRAIN_X86_KERNELS
    case CpuKernel::kAvx512:
      AdamWAvx512(c, params, grads, exp_avg, exp_avg_sq, bf16_out, n);
      return;
    case CpuKernel::kAvx2:
      AdamWAvx2(c, params, grads, exp_avg, exp_avg_sq, bf16_out, n);
      return;
#endif
    default:
      AdamWScalar(c, params, grads, exp_avg, exp_avg_sq, bf16_out, n);
      return;
  }
}

void CastToBf16(const float* src, bf16_bits* dst, int64_t n, CpuKernel kernel) {
  if (n <= 0) return;
  switch (Resolve(kernel)) {
#if MEGATRAIN_X86_KERNELS
    case CpuKernel::kAvx512:
      CastToBf16Avx512(src, dst, n);
      return;
    case CpuKernel::kAvx2:
      CastToBf16Avx2(src, dst, n);
      return;
#endif
    default:
      for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
      return;
  }
}

absl::Status ValidateAdamWOptions(const AdamWOptions& options) {
  if (absl::Status s = CheckNonNegative("optimizer.lr", options.lr); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckProbability("optimizer.beta1", options.beta1); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckProbability("optimizer.beta2", options.beta2); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckNonNegative("optimizer.eps", options.eps); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckNonNegative("optimizer.weight_decay", options.weight_decay); !s.ok()) {
    return s;
  }
  if (!CpuKernelSupported(options.kernel)) {
    return absl::UnimplementedError(absl::StrCat(
        "optimizer.kernel: ", std::string(CpuKernelName(options.kernel)),
        " is not supported by this CPU (best: ", std::string(CpuKernelName(ActiveCpuKernel())),
        ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CpuAdamW> CpuAdamW::Create(const AdamWOptions& options, ThreadPool* pool) {
  if (absl::Status s = ValidateAdamWOptions(options); !s.ok()) return s;
  return CpuAdamW(options, Resolve(options.kernel), pool);
}

absl::Status CpuAdamW::Step(const AdamWBuffers& buffers, int64_t step, double lr,
                            float grad_scale) const {
  if (step < 1) {
    return absl::InvalidArgumentError(absl::StrCat("step: must be >= 1, got ", step));
  }
  if (absl::Status s = CheckNonNegative("lr", lr); !s.ok()) return s;
  if (absl::Status s = CheckNonNegative("grad_scale", grad_scale); !s.ok()) {
    return s;
  }
  const int64_t n = buffers.num_elements;
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_elements: must be >= 0, got ", n));
  }
  if (n == 0) return absl::OkStatus();
  if (buffers.params == nullptr || buffers.grads == nullptr || buffers.exp_avg == nullptr ||
      buffers.exp_avg_sq == nullptr) {
    return absl::InvalidArgumentError(
        "buffers: params, grads, exp_avg and exp_avg_sq must be non-null");
  }

  const AdamWStepParams hp = MakeAdamWStepParams(options_, step, lr, grad_scale);

  // Work in units of kAlignElements so that every chunk but the last one
  // holds whole vectors (see the determinism contract in adamw.h).
  const int64_t num_blocks = (n + kAlignElements - 1) / kAlignElements;
  auto update_blocks = [&](int64_t block_begin, int64_t block_end) {
    const int64_t begin = block_begin * kAlignElements;
    const int64_t end = std::min(n, block_end * kAlignElements);
    AdamWUpdate(hp, buffers.params + begin, buffers.grads + begin, buffers.exp_avg + begin,
                buffers.exp_avg_sq + begin,
                buffers.bf16_params == nullptr ? nullptr : buffers.bf16_params + begin, end - begin,
                kernel_);
  };
  if (pool_ == nullptr) {
    update_blocks(0, num_blocks);
  } else {
    pool_->ParallelFor(num_blocks, kMinChunkElements / kAlignElements, update_blocks);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Gradient norm

double SumOfSquares(const float* x, int64_t n, ThreadPool* pool, CpuKernel kernel) {
  if (n <= 0) return 0.0;
  const CpuKernel resolved = Resolve(kernel);
  auto sum_range = [resolved](const float* data, int64_t count) -> double {
    switch (resolved) {
#if MEGATRAIN_X86_KERNELS
      case CpuKernel::kAvx512:
        return SumOfSquaresAvx512(data, count);
      case CpuKernel::kAvx2:
        return SumOfSquaresAvx2(data, count);
#endif
      default:
        return SumOfSquaresScalar(data, count);
    }
  };
  const int64_t num_blocks = (n + kSumBlockElements - 1) / kSumBlockElements;
  std::vector<double> partials(num_blocks, 0.0);
  auto sum_blocks = [&](int64_t block_begin, int64_t block_end) {
    for (int64_t block_idx = block_begin; block_idx < block_end; ++block_idx) {
      const int64_t begin = block_idx * kSumBlockElements;
      const int64_t end = std::min(n, begin + kSumBlockElements);
      partials[block_idx] = sum_range(x + begin, end - begin);
    }
  };
  if (pool == nullptr) {
    sum_blocks(0, num_blocks);
  } else {
    // Reading is cheaper than the AdamW update (4 bytes/element), so give
    // each thread at least 4 blocks (1 MiB).
    pool->ParallelFor(num_blocks, 4, sum_blocks);
  }
  double total = 0.0;
  for (double partial : partials) total += partial;
  return total;
}

float ClipCoefficient(double total_norm, double max_norm) {
  if (!(max_norm > 0.0)) return 1.0f;
  if (std::isnan(total_norm)) return std::numeric_limits<float>::quiet_NaN();
  // Same expression and epsilon as torch.nn.utils.clip_grad_norm_:
  // clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1.
  const double coefficient = max_norm / (total_norm + 1e-6);
  return static_cast<float>(std::min(1.0, coefficient));
}

}  // namespace megatrain::engine
