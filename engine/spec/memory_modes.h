// How a job lays out its state in host memory: the job fields
// `memory.weight_stream` and `memory.gradient_landing` (docs/job-spec.md,
// docs/operations.md's sizing table). Shared by the job spec, the plan,
// the bench and the trainer; torch-free, header-only.
#ifndef MEGATRAIN_ENGINE_SPEC_MEMORY_MODES_H_
#define MEGATRAIN_ENGINE_SPEC_MEMORY_MODES_H_

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/spec/keyword.h"

namespace megatrain::engine {

// What the device reads for each streamed block under bf16 compute (Note
// [Weight streaming] in engine/step/weight_slots.h). fp32/tf32 compute
// always streams the fp32 master; the field changes nothing there.
enum class WeightStream {
  kBf16,      // a bf16 copy of the master in host memory (2 bytes/param),
              // streamed; the default
  kFp32,      // the fp32 master streamed and cast to bf16 on the device: no
              // copy, twice the weight H2D bytes; bit-identical results
  kHostCast,  // the fp32 master cast to bf16 by CPU threads into a pinned
              // staging ring just before its H2D copy (Note [Host cast] in
              // engine/step/host_cast.h): no copy, the bf16 H2D bytes;
              // bit-identical results
};

// memory.weight_stream's keywords (engine/spec/keyword.h): "bf16", "fp32",
// "host_cast", the spelling of job files, JSON, flags and docs.
inline constexpr Keyword<WeightStream> kWeightStreamKeywords[] = {
    {"bf16", WeightStream::kBf16},
    {"fp32", WeightStream::kFp32},
    {"host_cast", WeightStream::kHostCast},
};

inline absl::string_view WeightStreamName(WeightStream mode) {
  const char* name = KeywordName(kWeightStreamKeywords, mode);
  return name != nullptr ? name : "bf16";
}

// Whether bf16 compute under `mode` keeps a bf16 copy of the master in host
// memory (HostStoreOptions::streaming_bf16): kBf16 only.
inline bool KeepsBf16Copy(WeightStream mode) { return mode == WeightStream::kBf16; }

// Bytes that cross PCIe per streamed parameter under bf16 compute: 4 for
// the fp32 master, 2 for the bf16 copy or the host cast.
inline int WeightStreamH2dBytesPerParam(WeightStream mode) {
  return mode == WeightStream::kFp32 ? 4 : 2;
}

// Inverse of WeightStreamName; INVALID_ARGUMENT "<field>: must be bf16,
// fp32 or host_cast, got '<name>'" otherwise.
inline absl::StatusOr<WeightStream> ParseWeightStream(
    absl::string_view name, absl::string_view field = "memory.weight_stream") {
  return ParseKeyword(kWeightStreamKeywords, name, field);
}

// Where block gradients land in host memory (Note [Gradient ring] in
// engine/step/grad_lander.h).
enum class GradientLanding {
  kArena,  // a full fp32 gradient arena (4 bytes/param), the default
  kRing,   // a bounded pinned ring consumed by the optimizer as gradients
           // land; needs max_grad_norm 0 and final landed gradients
  kAuto,   // kRing where it is allowed, else kArena
};

// Note [Gradient ring] in engine/step/grad_lander.h: clipping needs the
// whole gradient's norm before any update, so the ring lands gradients
// only with clipping off (max_grad_norm 0). The one statement of the rule:
// the job spec refuses ring with clipping (ValidateJobSpec), the trainer
// refuses or (auto) declines it, the footprint does not count it.
inline bool ClippingForbidsGradientRing(double max_grad_norm) { return max_grad_norm > 0; }

// Why, for the messages of the refusals above.
inline constexpr char kGradientRingClippingReason[] =
    "clipping needs the whole gradient's norm before any update";

// memory.gradient_landing's keywords (engine/spec/keyword.h).
inline constexpr Keyword<GradientLanding> kGradientLandingKeywords[] = {
    {"arena", GradientLanding::kArena},
    {"ring", GradientLanding::kRing},
    {"auto", GradientLanding::kAuto},
};

// "arena", "ring", "auto".
inline absl::string_view GradientLandingName(GradientLanding mode) {
  const char* name = KeywordName(kGradientLandingKeywords, mode);
  return name != nullptr ? name : "arena";
}

// Inverse of GradientLandingName; INVALID_ARGUMENT "<field>: must be arena,
// ring or auto, got '<name>'" otherwise.
inline absl::StatusOr<GradientLanding> ParseGradientLanding(
    absl::string_view name, absl::string_view field = "memory.gradient_landing") {
  return ParseKeyword(kGradientLandingKeywords, name, field);
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_SPEC_MEMORY_MODES_H_
