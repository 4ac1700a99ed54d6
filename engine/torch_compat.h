// The one place where LibTorch versions differ. The project builds against
// Debian's LibTorch 1.13 (CPU, in CI) and pip's torch 2.x with CUDA (GPU
// machines); every version test lives here.
#ifndef MEGATRAIN_ENGINE_TORCH_COMPAT_H_
#define MEGATRAIN_ENGINE_TORCH_COMPAT_H_

#include <ATen/ATen.h>
#include <torch/version.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <exception>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <optional>

#define MEGATRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace megatrain::engine::compat {

// softmax(q k^T * scale + mask) v for q [B, H, T, Dh] and k, v [B, H, S, Dh]
// (same head count: callers repeat kv heads first). `mask` is boolean
// [T, S] (true = attend) or undefined; `is_causal` applies the causal mask
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

}  // namespace megatrain::engine::compat

#endif  // MEGATRAIN_ENGINE_TORCH_COMPAT_H_
