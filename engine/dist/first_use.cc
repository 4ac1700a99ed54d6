// The serial first use of LibTorch's CUDA state (first_use.h, Note [Serial
// first use]).
#include "engine/dist/first_use.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/const_init.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/runtime/torch_compat.h"

namespace megatrain::engine {
namespace {

// Rows and columns of the warm-up matrices: more than one of each, so
// that cuBLASLt takes the bias epilogue (addmm refuses it for a vector).
constexpr int64_t kWarmUpDim = 16;

ABSL_CONST_INIT absl::Mutex first_use_mu(absl::kConstInit);

// x [n, n] -> [n, n]: a product through cuBLAS and a linear layer with a
// bias through cuBLASLt, each of which makes the calling thread's first
// use of its handle and workspace on the current stream.
at::Tensor Gemms(const at::Tensor& x) {
  const at::Tensor bias = at::zeros({x.size(1)}, x.options());  // [n]
  return at::mm(x, x) + at::linear(x, x, bias);
}

// Gemms forward on the calling thread and again in the backward, which
// autograd runs on its thread for the device (for a CUDA tensor).
struct FirstUseFunction : public torch::autograd::Function<FirstUseFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const at::Tensor& x) {
    return Gemms(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grad_outputs) {
    return {Gemms(grad_outputs[0])};
  }
};

// Causal attention over q, k, v [1, kHeads, kTokens, head_dim] laid out as
// the model's (transposed from [B, T, H, Dh]): forward on this thread,
// backward on autograd's thread for the device.
void Attention(const at::TensorOptions& options, int64_t head_dim) {
  constexpr int64_t kHeads = 2, kTokens = 128;
  std::vector<at::Tensor> leaves;  // [1, kTokens, kHeads, head_dim] each
  std::vector<at::Tensor> qkv;     // [1, kHeads, kTokens, head_dim] each
  for (int i = 0; i < 3; ++i) {
    leaves.push_back(at::full({1, kTokens, kHeads, head_dim}, 0.1, options).requires_grad_(true));
    qkv.push_back(leaves.back().transpose(1, 2));
  }
  const at::Tensor out =
      compat::ScaledDotProductAttention(qkv[0], qkv[1], qkv[2], at::Tensor(), /*is_causal=*/true,
                                        1.0 / std::sqrt(static_cast<double>(head_dim)));
  torch::autograd::grad({out.sum()}, leaves);
}

}  // namespace

absl::Status WarmUpFirstUse(DeviceRuntime& runtime, int64_t head_dim) {
  absl::MutexLock lock(&first_use_mu);
  try {
    auto scope = runtime.Use(StreamKind::kCompute);
    std::vector<at::ScalarType> dtypes{at::kFloat};
    if (runtime.is_cuda()) dtypes.push_back(at::kBFloat16);
    for (const at::ScalarType dtype : dtypes) {
      const auto options = at::TensorOptions().dtype(dtype).device(runtime.device());
      at::Tensor x = at::ones({kWarmUpDim, kWarmUpDim}, options).requires_grad_(true);
      at::Tensor y = FirstUseFunction::apply(x);
      torch::autograd::grad({y.sum()}, {x});
    }
    if (head_dim > 0) {
      const at::ScalarType dtype = runtime.is_cuda() ? at::kBFloat16 : at::kFloat;
      Attention(at::TensorOptions().dtype(dtype).device(runtime.device()), head_dim);
    }
    runtime.Synchronize();
  } catch (const std::exception& e) {
    const std::string message =
        absl::StrCat("first use of LibTorch on ", runtime.name(), ": ", e.what());
    if (compat::IsOutOfMemory(e)) return absl::ResourceExhaustedError(message);
    return absl::InternalError(message);
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
