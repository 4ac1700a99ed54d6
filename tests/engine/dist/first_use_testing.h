// Helpers of first_use_test and first_use_cuda_test: one runtime per
// rank, and what a step's first use of LibTorch does on a rank's thread.
#ifndef MEGATRAIN_TESTS_ENGINE_DIST_FIRST_USE_TESTING_H_
#define MEGATRAIN_TESTS_ENGINE_DIST_FIRST_USE_TESTING_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/runtime/device_runtime.h"
#include "engine/runtime/torch_compat.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::engine {

// One runtime per rank on `devices` ("cpu" or "cuda:r").
inline std::vector<std::unique_ptr<DeviceRuntime>> Runtimes(
    const std::vector<std::string>& devices) {
  std::vector<std::unique_ptr<DeviceRuntime>> out;
  for (const std::string& device : devices) {
    auto runtime = DeviceRuntime::Create(device);
    EXPECT_THAT(runtime, ::megatrain::testing::IsOk()) << device;
    if (runtime.ok()) out.push_back(std::move(*runtime));
  }
  return out;
}

// What a step's first use does on rank r's thread, all ranks released
// together: forward GEMMs and attention on the compute stream, their
// backward on autograd's thread.
inline absl::Status FirstStepGemms(DeviceRuntime& runtime, absl::Mutex* mu, int* arrived,
                                   int ranks) {
  {
    absl::MutexLock lock(mu);
    ++*arrived;
    auto all_here = [arrived, ranks] { return *arrived >= ranks; };
    mu->Await(absl::Condition(&all_here));
  }
  auto scope = runtime.Use(StreamKind::kCompute);
  const auto options = at::TensorOptions().dtype(at::kFloat).device(runtime.device());
  at::Tensor x = at::ones({8, 8}, options).requires_grad_(true);
  at::Tensor y = at::linear(at::mm(x, x), x, at::zeros({8}, options));
  const at::Tensor grad = torch::autograd::grad({y.sum()}, {x})[0];
  // S = sum(linear(x x, x, 0)) = sum_ijk (x x)_ik x_jk at x = ones(8, 8):
  // dS/dx_pq = sum_i (x x)_iq (64) + 8 (sum_k x_qk + sum_i x_ip) (128) =
  // 192 for every element; small integers, exact in fp32.
  if (!grad.cpu().eq(192).all().item<bool>()) {
    return absl::InternalError(absl::StrCat(runtime.name(), ": wrong GEMM gradient"));
  }
  // A causal attention of other shapes than the warm-up's (256 tokens): a
  // step's own attention graphs are still built by every rank at once.
  const auto half = options.dtype(runtime.is_cuda() ? at::kBFloat16 : at::kFloat);
  at::Tensor qkv = at::full({1, 256, 2, 128}, 0.1, half).requires_grad_(true);  // [B, T, H, Dh]
  const at::Tensor q = qkv.transpose(1, 2);                                     // [B, H, T, Dh]
  const at::Tensor out = compat::ScaledDotProductAttention(q, q, q, at::Tensor(), true, 0.125);
  const at::Tensor attn_grad = torch::autograd::grad({out.to(at::kFloat).sum()}, {qkv})[0];
  if (!attn_grad.isfinite().all().item<bool>()) {
    return absl::InternalError(absl::StrCat(runtime.name(), ": non-finite attention gradient"));
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_TESTS_ENGINE_DIST_FIRST_USE_TESTING_H_
