// bfloat16 <-> float conversion on raw bits, for host code that must not
// depend on LibTorch (the host store, the CPU optimizer, safetensors I/O).
// bf16 is the upper 16 bits of an IEEE-754 binary32; conversion from float
// rounds to nearest, ties to even, and keeps NaN a (quiet) NaN. This matches
// c10::BFloat16's round_to_nearest_even.
#ifndef MEGATRAIN_ENGINE_BF16_H_
#define MEGATRAIN_ENGINE_BF16_H_

#include <cstdint>
#include <cstring>

namespace megatrain::engine {

// Raw bf16 storage type (no arithmetic).
using bf16_bits = uint16_t;

// float -> bf16 bits, round to nearest even; NaN stays NaN.
inline bf16_bits FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_bits>((bits >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16_bits>((bits + rounding_bias) >> 16);
}

// bf16 bits -> float (exact).
inline float Bf16ToFloat(bf16_bits value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_BF16_H_
