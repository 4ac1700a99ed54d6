// Tests for engine/optim/adamw.h (and engine/optim/tensor_adamw.h, against the scalar
// kernel): every kernel variant against torch::optim::AdamW,
// the bf16 copy against FloatToBf16, determinism across thread counts,
// option validation, SumOfSquares and ClipCoefficient (against
// torch::nn::utils::clip_grad_norm_).
#include "engine/optim/adamw.h"
#include "engine/optim/tensor_adamw.h"
#include "engine/runtime/torch_compat.h"

#include <torch/torch.h>  // before torch/optim: also brings clip_grad_norm_
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/runtime/bf16.h"
#include "engine/runtime/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

// ||a - b|| / ||b|| over two equal-length fp32 vectors, in double.
double NormRelativeError(const float* actual, const float* expected, int64_t n) {
  double diff_sq = 0.0, ref_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double diff = static_cast<double>(actual[i]) - expected[i];
    diff_sq += diff * diff;
    ref_sq += static_cast<double>(expected[i]) * expected[i];
  }
  return std::sqrt(diff_sq) / std::sqrt(ref_sq);
}

std::vector<float> ToVector(const torch::Tensor& tensor) {
  const torch::Tensor contiguous = tensor.contiguous();
  const float* data = contiguous.data_ptr<float>();
  return std::vector<float>(data, data + contiguous.numel());
}

float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint32_t FloatToBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// State after some AdamW steps: params, exp_avg (m), exp_avg_sq (v).
struct AdamWState {
  std::vector<float> params, exp_avg, exp_avg_sq;
};

// Runs torch::optim::AdamW for grads.size() steps on a copy of `params`,
// with gradient grads[step-1] * grad_scale (multiplied in fp32, as ours).
AdamWState RunTorchAdamW(const torch::Tensor& params, const std::vector<torch::Tensor>& grads,
                         const AdamWOptions& options, float grad_scale) {
  torch::Tensor param = params.clone().set_requires_grad(true);
  torch::optim::AdamW optimizer(std::vector<torch::Tensor>{param},
                                torch::optim::AdamWOptions(options.lr)
                                    .betas({options.beta1, options.beta2})
                                    .eps(options.eps)
                                    .weight_decay(options.weight_decay));
  for (const torch::Tensor& grad : grads) {
    param.mutable_grad() = grad * grad_scale;
    optimizer.step();
  }
  const auto& state = static_cast<const torch::optim::AdamWParamState&>(
      *optimizer.state().at(compat::OptimizerStateKey(optimizer.state(), param)));
  torch::NoGradGuard no_grad;
  return {ToVector(param.detach()), ToVector(state.exp_avg()), ToVector(state.exp_avg_sq())};
}

// Runs our AdamW for grads.size() steps on a copy of `params`.
AdamWState RunOurAdamW(const torch::Tensor& params, const std::vector<torch::Tensor>& grads,
                       const AdamWOptions& options, float grad_scale, ThreadPool* pool,
                       std::vector<bf16_bits>* bf16_out = nullptr) {
  const int64_t n = params.numel();
  AdamWState state{ToVector(params), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  if (bf16_out != nullptr) bf16_out->assign(n, 0);
  absl::StatusOr<CpuAdamW> adamw = CpuAdamW::Create(options, pool);
  EXPECT_TRUE(adamw.ok()) << adamw.status();
  if (!adamw.ok()) return state;
  for (size_t step_idx = 0; step_idx < grads.size(); ++step_idx) {
    const std::vector<float> grad = ToVector(grads[step_idx]);
    AdamWBuffers buffers;
    buffers.params = state.params.data();
    buffers.grads = grad.data();
    buffers.exp_avg = state.exp_avg.data();
    buffers.exp_avg_sq = state.exp_avg_sq.data();
    buffers.bf16_params = bf16_out == nullptr ? nullptr : bf16_out->data();
    buffers.num_elements = n;
    const absl::Status status =
        adamw->Step(buffers, static_cast<int64_t>(step_idx) + 1, options.lr, grad_scale);
    EXPECT_TRUE(status.ok()) << status;
  }
  return state;
}

// Fixed-seed parameters and per-step gradients.
struct Problem {
  torch::Tensor params;              // [n] fp32
  std::vector<torch::Tensor> grads;  // steps x [n] fp32
};

Problem MakeProblem(int64_t n, int steps, uint64_t seed) {
  torch::manual_seed(seed);
  Problem problem;
  problem.params = torch::randn({n});
  for (int step = 0; step < steps; ++step) {
    // Gradients of varied magnitude (1e-4 .. 1) so v spans several decades.
    problem.grads.push_back(torch::randn({n}) * torch::pow(10.0, -4.0 * torch::rand({n})));
  }
  return problem;
}

// ---------------------------------------------------------------------------
// Against torch::optim::AdamW, per kernel variant

class AdamWKernelTest : public ::testing::TestWithParam<CpuKernel> {
 protected:
  void SetUp() override {
    if (!CpuKernelSupported(GetParam())) {
      GTEST_SKIP() << CpuKernelName(GetParam()) << " not supported on this CPU";
    }
  }
};

// Tolerance: both compute in fp32 but ours fuses multiply-adds and multiplies
// by 1/sqrt(1 - beta2^t) instead of dividing, so each element may differ by
// a few ulp (~1e-7 relative) per step; 1e-6 norm-relative leaves room for
// three steps of that and would catch any formula error (a wrong bias
// correction or decay is off by >= 1e-4 here).
constexpr double kTorchTolerance = 1e-6;

TEST_P(AdamWKernelTest, MatchesTorchAdamWOverThreeStepsWithWeightDecay) {
  // n = 1003: odd, not a multiple of 8 or 16, so the tail path runs.
  const Problem problem = MakeProblem(1003, 3, /*seed=*/1);
  AdamWOptions options;
  options.lr = 1e-2;
  options.weight_decay = 0.1;
  options.kernel = GetParam();

  const AdamWState expected = RunTorchAdamW(problem.params, problem.grads, options, 1.0f);
  const AdamWState actual =
      RunOurAdamW(problem.params, problem.grads, options, 1.0f, /*pool=*/nullptr);

  const int64_t n = problem.params.numel();
  EXPECT_LT(NormRelativeError(actual.params.data(), expected.params.data(), n), kTorchTolerance);
  EXPECT_LT(NormRelativeError(actual.exp_avg.data(), expected.exp_avg.data(), n), kTorchTolerance);
  EXPECT_LT(NormRelativeError(actual.exp_avg_sq.data(), expected.exp_avg_sq.data(), n),
            kTorchTolerance);
  // The update must have moved the parameters by far more than the
  // tolerance, or the comparison above proves nothing.
  EXPECT_GT(NormRelativeError(actual.params.data(), ToVector(problem.params).data(), n), 1e-3);
}

TEST_P(AdamWKernelTest, MatchesTorchAdamWWhenGradScaleIsApplied) {
  const Problem problem = MakeProblem(517, 3, /*seed=*/2);
  AdamWOptions options;
  options.lr = 3e-3;
  options.beta1 = 0.8;
  options.beta2 = 0.95;
  options.eps = 1e-6;
  options.weight_decay = 0.05;
  options.kernel = GetParam();
  constexpr float kGradScale = 0.37f;  // e.g. a clipping coefficient

  const AdamWState expected = RunTorchAdamW(problem.params, problem.grads, options, kGradScale);
  const AdamWState actual =
      RunOurAdamW(problem.params, problem.grads, options, kGradScale, /*pool=*/nullptr);

  const int64_t n = problem.params.numel();
  EXPECT_LT(NormRelativeError(actual.params.data(), expected.params.data(), n), kTorchTolerance);
  EXPECT_LT(NormRelativeError(actual.exp_avg.data(), expected.exp_avg.data(), n), kTorchTolerance);
  EXPECT_LT(NormRelativeError(actual.exp_avg_sq.data(), expected.exp_avg_sq.data(), n),
            kTorchTolerance);
}

TEST_P(AdamWKernelTest, Bf16OutputEqualsFloatToBf16OfUpdatedParams) {
  const Problem problem = MakeProblem(1003, 2, /*seed=*/3);
  AdamWOptions options;
  options.kernel = GetParam();
  std::vector<bf16_bits> bf16;
  const AdamWState actual =
      RunOurAdamW(problem.params, problem.grads, options, 1.0f, /*pool=*/nullptr, &bf16);
  for (size_t i = 0; i < bf16.size(); ++i) {
    ASSERT_EQ(bf16[i], FloatToBf16(actual.params[i])) << "element " << i;
  }
}

TEST_P(AdamWKernelTest, Bf16OutputRoundsSpecialValuesLikeFloatToBf16) {
  // lr = 0 and zero gradients leave every parameter unchanged (p*1 - 0*0),
  // so the bf16 copy sees exactly these bit patterns: ties to even in both
  // directions, the largest float (rounds to inf), denormals, signed zeros,
  // infinities and NaNs with payloads.
  const std::vector<uint32_t> patterns = {
      0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x7f7fffffu, 0xff7fffffu, 0x00000001u,
      0x00018000u, 0x00008000u, 0x807fffffu, 0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
      0x7fc00000u, 0x7fc00001u, 0xffc12345u, 0x7fffffffu, 0x3f800000u, 0xc0490fdbu};
  // Repeat the patterns so that they land in full vectors and in the tail.
  std::vector<float> params;
  for (int repeat = 0; repeat < 3; ++repeat) {
    for (uint32_t bits : patterns) params.push_back(BitsToFloat(bits));
  }
  const int64_t n = static_cast<int64_t>(params.size());  // 60: 3 full AVX-512 vectors + tail
  std::vector<float> grads(n, 0.0f), exp_avg(n, 0.0f), exp_avg_sq(n, 0.0f);
  std::vector<bf16_bits> bf16(n, 0);
  AdamWStepParams hp;
  hp.lr = 0.0;
  AdamWUpdate(hp, params.data(), grads.data(), exp_avg.data(), exp_avg_sq.data(), bf16.data(), n,
              GetParam());
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t input = patterns[i % patterns.size()];
    if (!std::isnan(params[i])) {
      // Finite and infinite values pass through the update unchanged.
      EXPECT_EQ(FloatToBits(params[i]), input) << "element " << i;
    }
    EXPECT_EQ(bf16[i], FloatToBf16(params[i]))
        << "element " << i << " input bits 0x" << std::hex << input;
  }
}

// The vector kernels write the bf16 copy with streaming stores when it is
// aligned for them (32 bytes for AVX-512, 16 for AVX2) and with plain
// stores otherwise: the bits are the scalar kernel's at every alignment.
TEST_P(AdamWKernelTest, Bf16CopyIsTheSameAtEveryAlignment) {
  const int64_t n = 1000;  // full vectors and a tail
  const Problem problem = MakeProblem(n, 1, /*seed=*/9);
  const std::vector<float> params0 = ToVector(problem.params);
  const std::vector<float> grads = ToVector(problem.grads[0]);
  AdamWStepParams hp;
  hp.lr = 1e-3;
  hp.weight_decay = 0.1;
  hp.step = 1;
  // Element `offset` of a 64-byte aligned buffer: offsets 0, 8 and 16 take
  // streaming stores (AVX2 at 0, 8, 16; AVX-512 at 0, 16), 1 takes plain ones.
  std::vector<bf16_bits> storage(n + 64);
  auto run = [&](int64_t offset, std::vector<float>* p) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(storage.data());
    bf16_bits* out = storage.data() + (64 - base % 64) % 64 / sizeof(bf16_bits) + offset;
    std::vector<float> m(n, 0.01f), v(n, 0.02f);
    *p = params0;
    AdamWUpdate(hp, p->data(), grads.data(), m.data(), v.data(), out, n, GetParam());
    return std::vector<bf16_bits>(out, out + n);
  };
  std::vector<float> p_plain;
  const std::vector<bf16_bits> plain = run(1, &p_plain);
  for (const int64_t offset : {0, 8, 16}) {
    std::vector<float> p;
    EXPECT_EQ(run(offset, &p), plain) << "offset " << offset;
    EXPECT_EQ(std::memcmp(p.data(), p_plain.data(), n * sizeof(float)), 0);
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(plain[i], FloatToBf16(p_plain[i])) << i;
}

// CastToBf16 (the host cast of Note [Host cast] in engine/step/host_cast.h)
// is FloatToBf16 on every element, bit for bit: ties to even both ways,
// overflow to inf, denormals, signed zeros, infinities, NaNs with payloads
// and random bit patterns, in full vectors and the tail, with streaming
// stores (aligned outputs) and plain ones.
TEST_P(AdamWKernelTest, CastToBf16EqualsFloatToBf16AtEveryAlignment) {
  std::vector<float> src;
  for (const uint32_t bits :
       {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x7f7fffffu, 0xff7fffffu, 0x00000001u,
        0x00018000u, 0x00008000u, 0x807fffffu, 0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
        0x7fc00000u, 0x7fc00001u, 0xffc12345u, 0x7fffffffu, 0x7f800001u}) {
    src.push_back(BitsToFloat(bits));
  }
  std::mt19937 rng(17);
  while (src.size() < 1001) src.push_back(BitsToFloat(static_cast<uint32_t>(rng())));
  const int64_t n = static_cast<int64_t>(src.size());
  std::vector<bf16_bits> expected(n);
  for (int64_t i = 0; i < n; ++i) expected[i] = FloatToBf16(src[i]);
  std::vector<bf16_bits> storage(n + 64);
  const uintptr_t base = reinterpret_cast<uintptr_t>(storage.data());
  for (const int64_t offset : {0, 1, 8, 16}) {
    bf16_bits* out = storage.data() + (64 - base % 64) % 64 / sizeof(bf16_bits) + offset;
    CastToBf16(src.data(), out, n, GetParam());
    EXPECT_EQ(std::vector<bf16_bits>(out, out + n), expected) << "offset " << offset;
  }
}

TEST_P(AdamWKernelTest, MultithreadedResultEqualsSingleThreadedBitwise) {
  // Large enough for many chunks: 4 threads x 4 chunks of >= 64Ki elements,
  // plus an odd tail.
  const Problem problem = MakeProblem((int64_t{1} << 20) + 37, 2, /*seed=*/4);
  AdamWOptions options;
  options.kernel = GetParam();
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(4);
  std::vector<bf16_bits> bf16_single, bf16_multi;
  const AdamWState single =
      RunOurAdamW(problem.params, problem.grads, options, 0.5f, nullptr, &bf16_single);
  const AdamWState multi =
      RunOurAdamW(problem.params, problem.grads, options, 0.5f, pool.get(), &bf16_multi);
  const size_t bytes = single.params.size() * sizeof(float);
  EXPECT_EQ(std::memcmp(single.params.data(), multi.params.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(single.exp_avg.data(), multi.exp_avg.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(single.exp_avg_sq.data(), multi.exp_avg_sq.data(), bytes), 0);
  EXPECT_EQ(bf16_single, bf16_multi);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, AdamWKernelTest,
                         ::testing::Values(CpuKernel::kScalar, CpuKernel::kAvx2,
                                           CpuKernel::kAvx512),
                         [](const ::testing::TestParamInfo<CpuKernel>& info) {
                           return std::string(CpuKernelName(info.param));
                         });

// ---------------------------------------------------------------------------
// Kernel selection and validation

// ---------------------------------------------------------------------------
// TensorAdamWStep (the device-resident layers' optimizer), on CPU tensors

TEST(TensorAdamWTest, MatchesTheScalarKernelOverThreeStepsWithClippingAndBf16Copy) {
  const Problem problem = MakeProblem(1003, 3, /*seed=*/11);
  AdamWOptions options;
  options.kernel = CpuKernel::kScalar;
  const float grad_scale = 0.37f;
  std::vector<bf16_bits> bf16;
  const AdamWState expected = RunOurAdamW(problem.params, problem.grads, options, grad_scale,
                                          /*pool=*/nullptr, &bf16);
  const int64_t n = problem.params.numel();
  torch::Tensor params = problem.params.clone();
  torch::Tensor exp_avg = torch::zeros({n}), exp_avg_sq = torch::zeros({n});
  torch::Tensor copy = torch::empty({n}, torch::kBFloat16);
  for (size_t step_idx = 0; step_idx < problem.grads.size(); ++step_idx) {
    const AdamWStepParams hp =
        MakeAdamWStepParams(options, static_cast<int64_t>(step_idx) + 1, options.lr, grad_scale);
    const torch::Tensor grad = problem.grads[step_idx].clone();  // scaled in place
    TensorAdamWStep(hp, params, grad, exp_avg, exp_avg_sq, copy);
  }
  // The same fp32 factors in the same order: a few ulp at most.
  EXPECT_LT(NormRelativeError(ToVector(params).data(), expected.params.data(), n), 1e-7);
  EXPECT_LT(NormRelativeError(ToVector(exp_avg).data(), expected.exp_avg.data(), n), 1e-7);
  EXPECT_LT(NormRelativeError(ToVector(exp_avg_sq).data(), expected.exp_avg_sq.data(), n), 1e-7);
  // The compute copy is the rounding of the updated fp32 parameters.
  const std::vector<float> updated = ToVector(params);
  const torch::Tensor copy_bits = copy.view(torch::kInt16).to(torch::kInt32);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(static_cast<bf16_bits>(copy_bits[i].item<int32_t>() & 0xffff),
              FloatToBf16(updated[i]))
        << "element " << i;
  }
}

// MultiTensorAdamWStep off CUDA (Note [Fused device AdamW]) is
// TensorAdamWStep per set: bit for bit, for sets of different sizes, with a
// bf16 copy, the params as their own copy and no copy.
TEST(MultiTensorAdamWTest, OffCudaIsTensorAdamWStepPerSetBitForBit) {
  const std::vector<int64_t> sizes = {1003, 64, 517};
  const AdamWStepParams hp = MakeAdamWStepParams(AdamWOptions{}, /*step=*/3, 1e-3, 0.37f);
  std::vector<AdamWTensorSet> multi, single;
  torch::manual_seed(5);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    AdamWTensorSet s{torch::randn({n}), torch::randn({n}), torch::randn({n}) * 0.1,
                     torch::rand({n}) * 0.01, torch::Tensor()};
    if (i == 0) s.compute_copy = torch::empty({n}, torch::kBFloat16);
    if (i == 1) s.compute_copy = s.params;
    AdamWTensorSet copy{s.params.clone(), s.grads.clone(), s.exp_avg.clone(), s.exp_avg_sq.clone(),
                        torch::Tensor()};
    if (i == 0) copy.compute_copy = torch::empty({n}, torch::kBFloat16);
    if (i == 1) copy.compute_copy = copy.params;
    multi.push_back(s);
    single.push_back(copy);
  }
  MultiTensorAdamWStep(hp, multi);
  for (const AdamWTensorSet& s : single) {
    TensorAdamWStep(hp, s.params, s.grads, s.exp_avg, s.exp_avg_sq, s.compute_copy);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("set ", i));
    EXPECT_TRUE(torch::equal(multi[i].params, single[i].params));
    EXPECT_TRUE(torch::equal(multi[i].exp_avg, single[i].exp_avg));
    EXPECT_TRUE(torch::equal(multi[i].exp_avg_sq, single[i].exp_avg_sq));
  }
  EXPECT_TRUE(torch::equal(multi[0].compute_copy, single[0].compute_copy));
  EXPECT_TRUE(multi[1].compute_copy.is_same(multi[1].params));
  MultiTensorAdamWStep(hp, {});  // nothing to do, no failure
}

// ||actual - expected|| / ||expected|| < tolerance, or both all zero (a
// zero gradient leaves zero moments).
void ExpectNearState(const std::vector<float>& actual, const std::vector<float>& expected,
                     double tolerance = kTorchTolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  const int64_t n = static_cast<int64_t>(expected.size());
  if (std::all_of(expected.begin(), expected.end(), [](float x) { return x == 0.0f; })) {
    EXPECT_EQ(actual, expected);
    return;
  }
  EXPECT_LT(NormRelativeError(actual.data(), expected.data(), n), tolerance);
}

// exp_avg_sq and the parameters after ATen's fused kernel (Note [Fused
// device AdamW], "Numerics"): exp_avg_sq measured 1.29-1.30e-5
// norm-relative from the scalar kernel after three steps (torch 2.11,
// H200), the relative error of 1 - fp32(0.999) against 1 - 0.999; the
// parameters, whose update reads v, are held to the same bound.
constexpr double kFusedTolerance = 3e-5;

// On CUDA with torch >= 2.1, MultiTensorAdamWStep is ATen's fused kernel
// (Note [Fused device AdamW]): three steps over two sets against the scalar
// CPU kernel, for a clip factor passed as the kernel's grad_scale (0.37),
// one whose reciprocal is not a normal fp32 (0: the gradients are
// multiplied first) and none (1). exp_avg agrees within kTorchTolerance,
// exp_avg_sq and the parameters within kFusedTolerance (the kernel's beta2
// in fp32); the bf16 copy is exactly the rounding of the updated master. On torch 1.13 this checks
// TensorAdamWStep on CUDA instead, within kTorchTolerance.
TEST(MultiTensorAdamWTest, MatchesTheScalarKernelOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<int64_t> sizes = {100003, 4097};
  AdamWOptions options;
  options.kernel = CpuKernel::kScalar;
  options.weight_decay = 0.1;
  for (const float grad_scale : {0.37f, 0.0f, 1.0f}) {
    SCOPED_TRACE(absl::StrCat("grad_scale ", grad_scale));
    std::vector<Problem> problems;
    std::vector<AdamWTensorSet> sets;
    for (size_t i = 0; i < sizes.size(); ++i) {
      problems.push_back(MakeProblem(sizes[i], 3, /*seed=*/20 + i));
      const auto cuda = torch::TensorOptions().device(torch::kCUDA);
      sets.push_back({problems[i].params.to(torch::kCUDA), torch::Tensor(),
                      torch::zeros({sizes[i]}, cuda), torch::zeros({sizes[i]}, cuda),
                      torch::empty({sizes[i]}, cuda.dtype(torch::kBFloat16))});
    }
    for (int step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        sets[i].grads = problems[i].grads[step - 1].to(torch::kCUDA);  // spent
      }
      MultiTensorAdamWStep(MakeAdamWStepParams(options, step, options.lr, grad_scale), sets);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      const AdamWState expected =
          RunOurAdamW(problems[i].params, problems[i].grads, options, grad_scale, nullptr);
      const double fused_tolerance =
          compat::FusedAdamWSupported(sets[i].params.device()) ? kFusedTolerance : kTorchTolerance;
      ExpectNearState(ToVector(sets[i].params.cpu()), expected.params, fused_tolerance);
      ExpectNearState(ToVector(sets[i].exp_avg.cpu()), expected.exp_avg);
      ExpectNearState(ToVector(sets[i].exp_avg_sq.cpu()), expected.exp_avg_sq, fused_tolerance);
      EXPECT_TRUE(
          torch::equal(sets[i].compute_copy.cpu(), sets[i].params.cpu().to(torch::kBFloat16)));
    }
  }
}

// The A/B knob (kUnfusedDeviceAdamWEnv) makes the CUDA sets run
// TensorAdamWStep: bit for bit its result, on the same device.
TEST(MultiTensorAdamWTest, UnfusedKnobRunsTensorAdamWStepOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const AdamWStepParams hp = MakeAdamWStepParams(AdamWOptions{}, /*step=*/2, 1e-3, 0.37f);
  torch::manual_seed(9);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const int64_t n = 70001;
  AdamWTensorSet knob{torch::randn({n}, cuda), torch::randn({n}, cuda),
                      torch::randn({n}, cuda) * 0.1, torch::rand({n}, cuda) * 0.01,
                      torch::empty({n}, cuda.dtype(torch::kBFloat16))};
  AdamWTensorSet single{knob.params.clone(), knob.grads.clone(), knob.exp_avg.clone(),
                        knob.exp_avg_sq.clone(), torch::empty({n}, cuda.dtype(torch::kBFloat16))};
  ASSERT_EQ(setenv(kUnfusedDeviceAdamWEnv, "1", /*overwrite=*/1), 0);
  EXPECT_TRUE(UnfusedDeviceAdamWForced());
  MultiTensorAdamWStep(hp, {knob});
  ASSERT_EQ(unsetenv(kUnfusedDeviceAdamWEnv), 0);
  EXPECT_FALSE(UnfusedDeviceAdamWForced());
  TensorAdamWStep(hp, single.params, single.grads, single.exp_avg, single.exp_avg_sq,
                  single.compute_copy);
  EXPECT_TRUE(torch::equal(knob.params, single.params));
  EXPECT_TRUE(torch::equal(knob.exp_avg, single.exp_avg));
  EXPECT_TRUE(torch::equal(knob.exp_avg_sq, single.exp_avg_sq));
  EXPECT_TRUE(torch::equal(knob.compute_copy, single.compute_copy));
}

TEST(CpuKernelTest, ActiveKernelIsSupportedAndNeverAuto) {
  const CpuKernel active = ActiveCpuKernel();
  EXPECT_NE(active, CpuKernel::kAuto);
  EXPECT_TRUE(CpuKernelSupported(active));
  EXPECT_TRUE(CpuKernelSupported(CpuKernel::kScalar));
}

TEST(CpuKernelTest, ParseAcceptsEveryNameAndRejectsOthers) {
  for (CpuKernel kernel :
       {CpuKernel::kAuto, CpuKernel::kScalar, CpuKernel::kAvx2, CpuKernel::kAvx512}) {
    absl::StatusOr<CpuKernel> parsed = ParseCpuKernel(CpuKernelName(kernel));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kernel);
  }
  absl::StatusOr<CpuKernel> bad = ParseCpuKernel("sse");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("optimizer.kernel: unknown 'sse'"));
}

TEST(CpuAdamWTest, CreateResolvesAutoToActiveKernel) {
  absl::StatusOr<CpuAdamW> adamw = CpuAdamW::Create(AdamWOptions{}, nullptr);
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  EXPECT_EQ(adamw->kernel(), ActiveCpuKernel());
}

struct BadOptionCase {
  std::string name;
  AdamWOptions options;
  std::string message;
};

TEST(CpuAdamWTest, CreateReturnsInvalidArgumentNamingFieldWhenOptionIsBad) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<BadOptionCase> cases;
  AdamWOptions options;
  options.beta1 = 1.5;
  cases.push_back({"beta1", options, "optimizer.beta1: must be in [0, 1), got 1.5"});
  options = {};
  options.beta1 = 1.0;
  cases.push_back({"beta1=1", options, "optimizer.beta1: must be in [0, 1)"});
  options = {};
  options.beta2 = -0.1;
  cases.push_back({"beta2", options, "optimizer.beta2: must be in [0, 1), got -0.1"});
  options = {};
  options.lr = -1e-3;
  cases.push_back({"lr", options, "optimizer.lr: must be finite and >= 0"});
  options = {};
  options.eps = -1.0;
  cases.push_back({"eps", options, "optimizer.eps: must be finite and >= 0"});
  options = {};
  options.weight_decay = nan;
  cases.push_back(
      {"weight_decay", options, "optimizer.weight_decay: must be finite and >= 0, got nan"});
  for (const BadOptionCase& bad : cases) {
    absl::StatusOr<CpuAdamW> adamw = CpuAdamW::Create(bad.options, nullptr);
    EXPECT_EQ(adamw.status().code(), absl::StatusCode::kInvalidArgument) << bad.name;
    EXPECT_THAT(std::string(adamw.status().message()), HasSubstr(bad.message)) << bad.name;
  }
}

TEST(CpuAdamWTest, CreateReturnsUnimplementedWhenKernelIsUnsupported) {
  for (CpuKernel kernel : {CpuKernel::kAvx2, CpuKernel::kAvx512}) {
    if (CpuKernelSupported(kernel)) continue;
    AdamWOptions options;
    options.kernel = kernel;
    absl::StatusOr<CpuAdamW> adamw = CpuAdamW::Create(options, nullptr);
    EXPECT_EQ(adamw.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(adamw.status().message()), HasSubstr("optimizer.kernel"));
    return;
  }
  GTEST_SKIP() << "every variant is supported on this CPU";
}

TEST(CpuAdamWTest, StepReturnsInvalidArgumentAndLeavesBuffersWhenArgsAreBad) {
  absl::StatusOr<CpuAdamW> adamw = CpuAdamW::Create(AdamWOptions{}, nullptr);
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  std::vector<float> params(8, 1.0f), grads(8, 1.0f), m(8, 0.0f), v(8, 0.0f);
  AdamWBuffers buffers;
  buffers.params = params.data();
  buffers.grads = grads.data();
  buffers.exp_avg = m.data();
  buffers.exp_avg_sq = v.data();
  buffers.num_elements = 8;

  absl::Status status = adamw->Step(buffers, /*step=*/0, 1e-3, 1.0f);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("step: must be >= 1"));

  status = adamw->Step(buffers, 1, std::numeric_limits<double>::infinity(), 1.0f);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("lr:"));

  status = adamw->Step(buffers, 1, 1e-3, -1.0f);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("grad_scale:"));

  AdamWBuffers null_grads = buffers;
  null_grads.grads = nullptr;
  status = adamw->Step(null_grads, 1, 1e-3, 1.0f);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("non-null"));

  EXPECT_EQ(params, std::vector<float>(8, 1.0f));
  EXPECT_EQ(m, std::vector<float>(8, 0.0f));
}

// ---------------------------------------------------------------------------
// SumOfSquares

class SumOfSquaresTest : public ::testing::TestWithParam<CpuKernel> {
 protected:
  void SetUp() override {
    if (!CpuKernelSupported(GetParam())) {
      GTEST_SKIP() << CpuKernelName(GetParam()) << " not supported on this CPU";
    }
  }
};

TEST_P(SumOfSquaresTest, MatchesLongDoubleReference) {
  torch::manual_seed(5);
  const std::vector<float> x = ToVector(torch::randn({300'007}));
  long double reference = 0.0L;
  for (float value : x) reference += static_cast<long double>(value) * value;
  const double actual = SumOfSquares(x.data(), static_cast<int64_t>(x.size()), nullptr, GetParam());
  // Squares of floats are exact in double; only the ~3e5 double additions
  // round, each by <= 2^-53 relative: far below 1e-12.
  EXPECT_NEAR(actual, static_cast<double>(reference), 1e-12 * static_cast<double>(reference));
}

TEST_P(SumOfSquaresTest, SqrtMatchesTorchNorm) {
  torch::manual_seed(6);
  const torch::Tensor x = torch::randn({100'003}) * 3.0;
  const std::vector<float> values = ToVector(x);
  const double norm = std::sqrt(
      SumOfSquares(values.data(), static_cast<int64_t>(values.size()), nullptr, GetParam()));
  // torch::norm reduces in fp32 (pairwise), good to ~1e-6 relative.
  EXPECT_NEAR(norm, x.norm().item<double>(), 1e-5 * norm);
}

TEST_P(SumOfSquaresTest, ResultIsBitwiseIdenticalForAnyThreadCount) {
  torch::manual_seed(7);
  const std::vector<float> x = ToVector(torch::randn({(1 << 21) + 11}));
  const int64_t n = static_cast<int64_t>(x.size());
  const double single = SumOfSquares(x.data(), n, nullptr, GetParam());
  for (int threads : {2, 3, 4}) {
    std::unique_ptr<ThreadPool> pool = ThreadPool::Create(threads);
    EXPECT_EQ(SumOfSquares(x.data(), n, pool.get(), GetParam()), single) << threads << " threads";
  }
}

TEST_P(SumOfSquaresTest, ReturnsNanOrInfWhenInputIsNotFinite) {
  std::vector<float> x(1001, 1.0f);
  x[500] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(SumOfSquares(x.data(), 1001, nullptr, GetParam())));
  x[999] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(SumOfSquares(x.data(), 1001, nullptr, GetParam())));
}

TEST_P(SumOfSquaresTest, ReturnsZeroWhenEmpty) {
  EXPECT_EQ(SumOfSquares(nullptr, 0, nullptr, GetParam()), 0.0);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, SumOfSquaresTest,
                         ::testing::Values(CpuKernel::kScalar, CpuKernel::kAvx2,
                                           CpuKernel::kAvx512),
                         [](const ::testing::TestParamInfo<CpuKernel>& info) {
                           return std::string(CpuKernelName(info.param));
                         });

// ---------------------------------------------------------------------------
// ClipCoefficient

// The coefficient torch::nn::utils::clip_grad_norm_ applied: the ratio of the
// gradient after clipping to before, for a gradient of n equal elements
// `grad_scale` (choose one exact in fp32 for an exact ratio).
double TorchClipCoefficient(double grad_scale, int64_t n, double max_norm) {
  torch::Tensor param = torch::zeros({n}).set_requires_grad(true);
  param.mutable_grad() = torch::full({n}, grad_scale);
  torch::nn::utils::clip_grad_norm_(param, max_norm);
  return param.grad()[0].item<double>() / grad_scale;
}

TEST(ClipCoefficientTest, MatchesTorchClipGradNormWhenClipping) {
  // Gradient of 10'000 elements of 0.5: norm 50.
  const double norm = std::sqrt(10'000 * 0.25);
  const float ours = ClipCoefficient(norm, 1.0);
  // torch forms max_norm / (norm + 1e-6) in fp32: ~1e-7 relative.
  EXPECT_NEAR(ours, TorchClipCoefficient(0.5, 10'000, 1.0), 1e-6 * ours);
  EXPECT_NEAR(ours, 1.0 / (50.0 + 1e-6), 1e-7);
}

TEST(ClipCoefficientTest, ReturnsOneWhenNormIsBelowMax) {
  EXPECT_EQ(ClipCoefficient(0.5, 1.0), 1.0f);
  // 1/256 is exact in fp32, so torch's ratio is exactly 1; norm 10/256.
  EXPECT_EQ(TorchClipCoefficient(1.0 / 256.0, 100, 1.0), 1.0);
  EXPECT_EQ(ClipCoefficient(0.0, 1.0), 1.0f);
}

TEST(ClipCoefficientTest, ReturnsOneWhenMaxNormIsNotPositive) {
  EXPECT_EQ(ClipCoefficient(123.0, 0.0), 1.0f);
  EXPECT_EQ(ClipCoefficient(123.0, -1.0), 1.0f);
}

TEST(ClipCoefficientTest, FollowsTorchWhenNormIsNotFinite) {
  EXPECT_TRUE(std::isnan(ClipCoefficient(std::numeric_limits<double>::quiet_NaN(), 1.0)));
  EXPECT_EQ(ClipCoefficient(std::numeric_limits<double>::infinity(), 1.0), 0.0f);
  // torch: max_norm / (inf + 1e-6) = 0, clamp(0, max=1) = 0.
  torch::Tensor coef = torch::clamp(1.0 / (torch::full({}, INFINITY) + 1e-6), c10::nullopt, 1.0);
  EXPECT_EQ(coef.item<float>(), 0.0f);
  // torch: NaN stays NaN through the clamp.
  coef = torch::clamp(1.0 / (torch::full({}, NAN) + 1e-6), c10::nullopt, 1.0);
  EXPECT_TRUE(std::isnan(coef.item<float>()));
}

}  // namespace
}  // namespace megatrain::engine
