// MXFP4 decoding (see mxfp4.h).
#include "engine/formats/mxfp4.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

float Mxfp4ElementValue(uint8_t code) {
  // transformers integrations/mxfp4.py FP4_VALUES.
  static constexpr float kValues[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 0x0F];
}

absl::Status DequantizeMxfp4(std::string_view name, absl::Span<const uint8_t> blocks,
                             absl::Span<const uint8_t> scales, absl::Span<float> out) {
  const size_t num_blocks = scales.size();
  if (blocks.size() != num_blocks * kMxfp4BlockBytes ||
      out.size() != num_blocks * kMxfp4BlockElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(name), ": MXFP4 needs 16 block bytes and 32 outputs per scale; got ",
        blocks.size(), " bytes, ", out.size(), " outputs for ", num_blocks, " scales"));
  }
  for (size_t b = 0; b < num_blocks; ++b) {
    if (scales[b] == 0xFF) {
      return absl::DataLossError(
          absl::StrCat(std::string(name), ": MXFP4 scale of block ", b, " is 255 (E8M0 NaN)"));
    }
    const int exponent = static_cast<int>(scales[b]) - 127;
    const uint8_t* in = blocks.data() + b * kMxfp4BlockBytes;
    float* dst = out.data() + b * kMxfp4BlockElements;
    for (int64_t i = 0; i < kMxfp4BlockBytes; ++i) {
      dst[2 * i] = std::ldexp(Mxfp4ElementValue(in[i] & 0x0F), exponent);
      dst[2 * i + 1] = std::ldexp(Mxfp4ElementValue(in[i] >> 4), exponent);
      if (std::isinf(dst[2 * i]) || std::isinf(dst[2 * i + 1])) {
        return absl::DataLossError(absl::StrCat(std::string(name), ": MXFP4 block ", b,
                                                " decodes beyond the fp32 range (scale ",
                                                static_cast<int>(scales[b]), ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
