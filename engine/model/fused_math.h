// Per-element math of the fused kernels (engine/model/fused_kernels.cu):
// the gated activations' forward and derivative, and RMSNorm's row
// formulas, written once for the device kernels (compiled by nvcc) and the
// host (CPU tests check them against ATen's reference ops in
// tests/engine/model/fused_math_test.cc). No ATen, no CUDA runtime: only
// <cmath> and <cstdint>, so both compilers accept it.
//
// Note [Fused kernels]
// The engine's dense layer runs its elementwise ops as separate ATen kernels
// (engine/model/layers.cc): act(gate) * up is two kernels forward and about
// five backward (autograd of act and of the product), each one reading and
// writing a whole [B*T, F] tensor. With ExecutorOptions::fused_kernels on a
// CUDA build, bf16 compute, the gated product runs as one forward kernel
// (reads gate and up, writes the product) and one backward kernel (reads
// gate, up and dP, writes dG and dU), computing in fp32 and rounding once
// to bf16; and the residual add before the MLP with its RMSNorm
// (h = x + attn; n2 = RMSNorm(h) in bf16) runs as one kernel forward and
// one backward (plus a sum of the weight gradient's per-block partials)
// instead of the add, the norm, the cast and their backwards. The layer's
// input norm (no add before it in the layer) and the final norm are not
// fused. The rotary embedding has its own kernel (Note [RoPE kernels] in
// layers.cc), and so does the head's cross-entropy (Note [Fused
// cross-entropy] in layers.cc). The formulas are HF's ACT2FN (activations.py): silu(x) = x
// sigmoid(x); gelu_pytorch_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x +
// 0.044715 x^3))); gelu(x) = 0.5 x (1 + erf(x / sqrt(2))), and their
// derivatives as ATen's silu_backward / gelu_backward compute them.
// RMSNorm (HF LlamaRMSNorm, Gemma2RMSNorm): y = x * rsqrt(mean(x^2) + eps)
// * w, or * (1 + w) for NormKind::kRmsOnePlusWeight; its input gradient is
// dx = r (g_hat - x_hat mean(g_hat x_hat)) with r = rsqrt(mean(x^2) + eps),
// x_hat = x r and g_hat = dy * w (or (1 + w)). The cross-entropy's
// gradient (Note [Fused cross-entropy] in layers.cc) is softmax minus the
// one-hot target, times the loss scale.
#ifndef MEGATRAIN_ENGINE_MODEL_FUSED_MATH_H_
#define MEGATRAIN_ENGINE_MODEL_FUSED_MATH_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MEGATRAIN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MEGATRAIN_HOST_DEVICE inline
#endif

namespace megatrain::engine::fused {

// The gated activations, numbered as MlpActivation (model_config.h) so that
// the kernels need not include it: kSilu 0, kGeluTanh 1, kGelu 2.
enum class GatedActivation : int { kSilu = 0, kGeluTanh = 1, kGelu = 2 };

// sqrt(2 / pi) and 1 / sqrt(2), as ATen's gelu kernels spell them (M_SQRT2,
// M_2_SQRTPI products), in fp32.
inline constexpr float kSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluTanhCoeff = 0.044715f;
inline constexpr float kInvSqrt2 = 0.7071067811865476f;
// 1 / sqrt(2 pi): the normal density's factor in gelu's derivative.
inline constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// act(x) in fp32.
MEGATRAIN_HOST_DEVICE float ActivationForward(GatedActivation a, float x) {
  switch (a) {
    case GatedActivation::kGeluTanh: {
      const float inner = kSqrt2OverPi * (x + kGeluTanhCoeff * x * x * x);
      return 0.5f * x * (1.0f + tanhf(inner));
    }
    case GatedActivation::kGelu:
      return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
    case GatedActivation::kSilu:
    default:
      return x / (1.0f + expf(-x));
  }
}

// d act(x) / dx in fp32 (ATen silu_backward, gelu_backward "tanh" / "none").
MEGATRAIN_HOST_DEVICE float ActivationDerivative(GatedActivation a, float x) {
  switch (a) {
    case GatedActivation::kGeluTanh: {
      const float x2 = x * x;
      const float inner = kSqrt2OverPi * (x + kGeluTanhCoeff * x2 * x);
      const float t = tanhf(inner);
      const float d_inner = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCoeff * x2);
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * d_inner;
    }
    case GatedActivation::kGelu: {
      const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
      return cdf + x * pdf;
    }
    case GatedActivation::kSilu:
    default: {
      const float s = 1.0f / (1.0f + expf(-x));
      return s * (1.0f + x * (1.0f - s));
    }
  }
}

// The gated product p = act(g) * u.
MEGATRAIN_HOST_DEVICE float GatedForward(GatedActivation a, float g, float u) {
  return ActivationForward(a, g) * u;
}

// Its gradients from dp: dG = dp * u * act'(g), dU = dp * act(g).
MEGATRAIN_HOST_DEVICE void GatedBackward(GatedActivation a, float g, float u, float dp, float* dg,
                                         float* du) {
  *dg = dp * u * ActivationDerivative(a, g);
  *du = dp * ActivationForward(a, g);
}

// RMSNorm's scale of weight w: w (kRms) or 1 + w (Gemma's kRmsOnePlusWeight).
MEGATRAIN_HOST_DEVICE float NormScale(bool one_plus, float w) { return one_plus ? 1.0f + w : w; }

// r = rsqrt(sum_sq / width + eps): the row's inverse RMS.
MEGATRAIN_HOST_DEVICE float InverseRms(float sum_sq, int width, float eps) {
  return 1.0f / sqrtf(sum_sq / static_cast<float>(width) + eps);
}

// One element's input gradient, given the row's r and
// mean_gx = mean over the row of (dy * scale) * (x * r):
// dx = r * (dy * scale - x * r * mean_gx).
MEGATRAIN_HOST_DEVICE float RmsNormInputGrad(float x, float dy, float scale, float r,
                                             float mean_gx) {
  return r * (dy * scale - x * r * mean_gx);
}

// Cross-entropy's ignored label (torch.nn.functional.cross_entropy's
// default ignore_index; HF's label masking).
inline constexpr int64_t kIgnoreIndex = -100;

// One logit's gradient of `scale` * the row's token cross-entropy
// (loss = lse - x[label], lse = log sum_j exp(x_j)):
// scale * (softmax_j - [j == label]) = scale * (exp(x - lse) - target).
// ATen computes the same quantity as log_softmax's backward of nll's
// gradient (scale * (target - exp(log_softmax) * 1), negated); the two
// differ only in fp32 rounding.
MEGATRAIN_HOST_DEVICE float CrossEntropyGrad(float x, float lse, bool is_label, float scale) {
  return (expf(x - lse) - (is_label ? 1.0f : 0.0f)) * scale;
}

}  // namespace megatrain::engine::fused

#endif  // MEGATRAIN_ENGINE_MODEL_FUSED_MATH_H_
