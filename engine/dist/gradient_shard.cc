// Shard arithmetic and the reduction choice (gradient_shard.h).
#include "engine/dist/gradient_shard.h"

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

const char* GradientReductionName(GradientReduction reduction) {
  switch (reduction) {
    case GradientReduction::kAuto:
      return "auto";
    case GradientReduction::kHostAllReduce:
      return "host_all_reduce";
    case GradientReduction::kDeviceReduceScatter:
      return "device_reduce_scatter";
  }
  return "auto";
}

absl::StatusOr<GradientReduction> ParseGradientReduction(const std::string& text,
                                                         const std::string& field) {
  for (const GradientReduction r : {GradientReduction::kAuto, GradientReduction::kHostAllReduce,
                                    GradientReduction::kDeviceReduceScatter}) {
    if (text == GradientReductionName(r)) return r;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": expected auto, host_all_reduce or device_reduce_scatter, got '", text, "'"));
}

GradientReduction SelectGradientReduction(GradientReduction requested, const std::string& backend,
                                          bool has_reduce_scatter) {
  if (requested != GradientReduction::kAuto) return requested;
  return backend == "nccl" && has_reduce_scatter ? GradientReduction::kDeviceReduceScatter
                                                 : GradientReduction::kHostAllReduce;
}

}  // namespace megatrain::engine
