// compat::AddmmIntoFp32 (engine/runtime/torch_compat.h) and the kernel trace
// (engine/runtime/kernel_trace.h), on the CPU and, where present, CUDA.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/runtime/kernel_trace.h"
#include "engine/runtime/torch_compat.h"

namespace megatrain::engine {
namespace {

// Largest |a - b| / max|b| over the elements.
double MaxRelative(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  return ((a.to(at::kDouble) - bd).abs().max() / bd.abs().max()).item<double>();
}

struct Operands {
  at::Tensor acc;   // [M, N] fp32
  at::Tensor mat1;  // [M, K] (a transposed view, as the head's G^T)
  at::Tensor mat2;  // [K, N]
};

Operands MakeOperands(at::ScalarType dtype, const at::Device& device) {
  at::manual_seed(7);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  Operands o;
  o.acc = at::randn({48, 40}, f32);
  o.mat1 = at::randn({96, 48}, f32).to(dtype).t();
  o.mat2 = at::randn({96, 40}, f32).to(dtype);
  return o;
}

TEST(AddmmIntoFp32Test, Fp32InputsAddTheProductInPlace) {
  Operands o = MakeOperands(at::kFloat, at::kCPU);
  const at::Tensor expected =
      o.acc.to(at::kDouble) + o.mat1.to(at::kDouble).mm(o.mat2.to(at::kDouble));
  const void* storage = o.acc.data_ptr();
  EXPECT_TRUE(compat::AddmmIntoFp32(o.acc, o.mat1, o.mat2));
  EXPECT_EQ(o.acc.data_ptr(), storage);  // in place
  EXPECT_EQ(o.acc.scalar_type(), at::kFloat);
  EXPECT_LT(MaxRelative(o.acc, expected), 1e-6);
}

TEST(AddmmIntoFp32Test, Bf16OnTheCpuRoundsTheProductOnceThenAddsInFp32) {
  Operands o = MakeOperands(at::kBFloat16, at::kCPU);
  const at::Tensor expected = o.acc + o.mat1.mm(o.mat2);  // bf16 product, fp32 add
  EXPECT_FALSE(compat::AddmmIntoFp32(o.acc, o.mat1, o.mat2));
  EXPECT_TRUE(at::equal(o.acc, expected));
}

TEST(AddmmIntoFp32Test, Bf16OnCudaAddsTheFp32ProductInTheGemm) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  Operands o = MakeOperands(at::kBFloat16, at::Device(at::kCUDA, 0));
  const at::Tensor exact =
      o.acc.to(at::kDouble) + o.mat1.to(at::kDouble).mm(o.mat2.to(at::kDouble));
  const at::Tensor rounded = o.acc + o.mat1.mm(o.mat2);  // the fallback's arithmetic
  const bool fused = compat::AddmmIntoFp32(o.acc, o.mat1, o.mat2);
#if MEGATRAIN_TORCH_AT_LEAST(2, 8)
  EXPECT_TRUE(fused) << "torch " << TORCH_VERSION << " refused addmm.dtype_out with an fp32 self";
#endif
  if (fused) {
    // No bf16 rounding of the product: much closer to the exact sum.
    EXPECT_LT(MaxRelative(o.acc, exact), 1e-5);
    EXPECT_LT(MaxRelative(o.acc, exact), MaxRelative(rounded, exact));
  } else {
    EXPECT_TRUE(at::equal(o.acc, rounded));
  }
}

TEST(KernelTraceTest, StopWithoutStartIsFailedPrecondition) {
  EXPECT_EQ(StopKernelTrace("/dev/null").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(KernelTraceTest, RecordsAChromeTraceWhereSupported) {
  const absl::Status started = StartKernelTrace();
  if (!KernelTraceSupported()) {
    EXPECT_EQ(started.code(), absl::StatusCode::kUnimplemented);
    return;
  }
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_EQ(StartKernelTrace().code(), absl::StatusCode::kFailedPrecondition);
  const at::Device device = at::hasCUDA() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  at::Tensor x = at::randn({64, 64}, at::TensorOptions().device(device));
  (void)x.mm(x).sum().item<float>();
  const std::string path = ::testing::TempDir() + "/kernel_trace_test.json";
  ASSERT_TRUE(StopKernelTrace(path).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("traceEvents"), std::string::npos);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace megatrain::engine
