// Compute precision names shared by the engine, the job spec and the bench.
#ifndef MEGATRAIN_ENGINE_PRECISION_H_
#define MEGATRAIN_ENGINE_PRECISION_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace megatrain::engine {

// Numeric precision of the device compute. Master weights, gradients and
// AdamW state are always fp32 in host memory.
//   kFp32: fp32 weights streamed, fp32 matmuls without TF32 (exact).
//   kTf32: fp32 weights streamed, matmuls on TF32 tensor cores.
//   kBf16: bf16 copy of the weights streamed, bf16 matmuls and attention;
//          residual stream, norms statistics and loss in fp32.
enum class ComputeDtype { kFp32, kTf32, kBf16 };

inline const char* ComputeDtypeName(ComputeDtype d) {
  switch (d) {
    case ComputeDtype::kFp32:
      return "fp32";
    case ComputeDtype::kTf32:
      return "tf32";
    case ComputeDtype::kBf16:
      return "bf16";
  }
  return "?";
}

// "fp32" | "tf32" | "bf16"; INVALID_ARGUMENT naming `field` otherwise.
inline absl::StatusOr<ComputeDtype> ParseComputeDtype(
    absl::string_view name, absl::string_view field = "train.compute_dtype") {
  if (name == "fp32") return ComputeDtype::kFp32;
  if (name == "tf32") return ComputeDtype::kTf32;
  if (name == "bf16") return ComputeDtype::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown '", name, "' (expected fp32, tf32 or bf16)"));
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_PRECISION_H_
