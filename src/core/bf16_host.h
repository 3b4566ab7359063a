#pragma once
// bf16 on the host: the bit-level conversions that copy_to_host / copy_from_host apply to
// bf16 activations, that the MPI communicator's bf16 sums use, and that tests use to give
// the CPU reference the same inputs as the GPU. Round to nearest even, as
// __float2bfloat16_rn does on the device; NaN stays NaN.
#include <cstdint>
#include <cstring>

namespace scalestudy {

inline uint16_t bf16_bits_from_float(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float float_from_bf16_bits(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value = 0.0f;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// The bf16 value nearest to `value`, as a float.
inline float round_to_bf16(float value) { return float_from_bf16_bits(bf16_bits_from_float(value)); }

}  // namespace scalestudy
