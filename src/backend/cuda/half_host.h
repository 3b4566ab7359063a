#pragma once
// fp16 on the host, and the 16-bit storage of either precision by name: the bit-level
// conversions that copy_to_host / copy_from_host apply to 16-bit activations, and that
// tests use to give the CPU reference the same inputs as the GPU. (bf16's own functions
// are in bf16_host.h.)
//
// fp16 (IEEE binary16): 1 sign, 5 exponent, 10 mantissa bits; normal numbers from 2^-14,
// subnormals down to 2^-24, largest finite 65504. fp16_bits_from_float rounds to nearest
// even, as __float2half_rn does on the device, including into the subnormals and at the
// top: magnitudes from 65520 (half-way to 2^16) up become +-inf. Nothing is clamped: an
// overflow has to reach the trainer's non-finite gradient check. NaN stays NaN.
#include <cstdint>
#include <cstring>

#include "core/bf16_host.h"
#include "core/precision.h"

namespace scalestudy {

inline uint16_t fp16_bits_from_float(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  // NaN: quiet, with the top of the payload.
  if (magnitude > 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x03ffu));
  // 65520 = 0x1.ffep15 and above (inf included) round to inf.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude >= 0x38800000u) {
    // Normal in fp16 (>= 2^-14): rebias the exponent (127 -> 15) and round the 23-bit
    // mantissa to 10 bits, to nearest even; a carry moves into the exponent correctly.
    uint32_t rebiased = magnitude - 0x38000000u;
    rebiased += 0x0fffu + ((rebiased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rebiased >> 13));
  }
  // Below 2^-25 (and exactly 2^-25, a tie to the even 0) rounds to zero.
  if (magnitude <= 0x33000000u) return sign;
  // Subnormal: the result is k * 2^-24 with k = round(value * 2^24), at most 0x400 (which
  // is the smallest normal's bit pattern, so rounding up into it needs nothing special).
  const uint32_t exponent = magnitude >> 23;             // 102 .. 112
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;                // 14 .. 24
  const uint32_t half = 1u << (shift - 1);
  const uint32_t remainder = mantissa & ((1u << shift) - 1u);
  uint32_t k = mantissa >> shift;
  if (remainder > half || (remainder == half && (k & 1u) != 0)) ++k;
  return static_cast<uint16_t>(sign | k);
}

inline float float_from_fp16_bits(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x03ffu;
  uint32_t wide = 0;
  if (exponent == 0x1fu) {
    wide = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    wide = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float value = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -value : value;
  }
  float value = 0.0f;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// The fp16 value nearest to `value`, as a float (+-inf beyond the range).
inline float round_to_fp16(float value) {
  return float_from_fp16_bits(fp16_bits_from_float(value));
}

// ---- by precision: bf16 or fp16 storage ------------------------------------------------

// precision must be bf16 or fp16.
inline uint16_t half_bits_from_float(Precision precision, float value) {
  return precision == Precision::fp16 ? fp16_bits_from_float(value) : bf16_bits_from_float(value);
}
inline float float_from_half_bits(Precision precision, uint16_t bits) {
  return precision == Precision::fp16 ? float_from_fp16_bits(bits) : float_from_bf16_bits(bits);
}

// The value that `precision`'s activation storage holds for `value`: rounded to bf16 or
// fp16, unchanged for fp32.
inline float round_to_storage(Precision precision, float value) {
  switch (precision) {
    case Precision::bf16: return round_to_bf16(value);
    case Precision::fp16: return round_to_fp16(value);
    case Precision::fp32: break;
  }
  return value;
}

}  // namespace scalestudy
