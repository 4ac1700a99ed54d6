// MXFP4 (OCP Microscaling Formats v1.0, section 5: E2M1 elements sharing one
// E8M0 scale per block of 32) as GPT-OSS checkpoints store their experts:
// `<name>_blocks` [..., G, 16] uint8, two E2M1 values per byte, the low
// nibble first, and `<name>_scales` [..., G] uint8, the power-of-two
// exponent biased by 127. Decoding follows transformers'
// integrations/mxfp4.py convert_moe_packed_tensors (FP4_VALUES lookup,
// ldexp by scale - 127), which is exact in fp32 whenever the value fits:
// the smallest, 0.5 * 2^-127, is a subnormal; values past FLT_MAX (a scale
// of 253 or more with a large element) would become infinities, and are
// refused instead (no real checkpoint has them).
#ifndef MEGATRAIN_ENGINE_MXFP4_H_
#define MEGATRAIN_ENGINE_MXFP4_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace megatrain::engine {

// Elements per MXFP4 block (one shared scale) and bytes per block.
inline constexpr int64_t kMxfp4BlockElements = 32;
inline constexpr int64_t kMxfp4BlockBytes = 16;

// The E2M1 value of a 4-bit code (bit 3 sign, bits 2-1 exponent, bit 0
// mantissa): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (-0 for 8).
float Mxfp4ElementValue(uint8_t code);

// Decodes `scales.size()` blocks: blocks holds 16 bytes per scale, `out`
// receives 32 fp32 values per scale, in order (block b's values at
// out[32*b, 32*b + 32), element 2i from the low nibble of byte i, 2i+1 from
// the high nibble). `name` names the tensor in errors.
// Errors: INVALID_ARGUMENT when blocks.size() != 16 * scales.size() or
// out.size() != 32 * scales.size(); DATA_LOSS for a scale of 255 (E8M0 NaN)
// or a value beyond fp32's range, naming the tensor and the block index.
absl::Status DequantizeMxfp4(std::string_view name, absl::Span<const uint8_t> blocks,
                             absl::Span<const uint8_t> scales, absl::Span<float> out);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_MXFP4_H_
