// Host-side conversions between float and the two 16-bit floating-point
// storage types (common/precision.h), rounding to nearest even as the
// devices do. For code that touches half-precision elements one at a time
// (reference ops, fills, per-channel loops); bulk conversions go through
// the backend (Backend::convert) on the device, common/half_convert.h on
// the host.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "common/precision.h"

namespace vtrain::common {

// bfloat16: float's sign and exponent, 7 mantissa bits.
struct Bf16 {
  uint16_t bits = 0;
};
// IEEE 754 binary16: 5 exponent bits, 10 mantissa bits, max 65504.
struct F16 {
  uint16_t bits = 0;
};

inline float to_float(Bf16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16); }

inline Bf16 to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return {static_cast<uint16_t>((u >> 16) | 0x40)};  // stays a (quiet) NaN
  const uint32_t rounding = 0x7fff + ((u >> 16) & 1);
  return {static_cast<uint16_t>((u + rounding) >> 16)};
}

inline float to_float(F16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1f;
  const uint32_t mantissa = h.bits & 0x3ff;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000 | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline F16 to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const float a = std::fabs(f);
  if (std::isnan(f)) return {static_cast<uint16_t>(sign | 0x7e00)};
  if (a >= 65520.0f) return {static_cast<uint16_t>(sign | 0x7c00)};  // rounds to infinity
  if (a < 6.103515625e-05f) {  // below the smallest normal (2^-14): multiples of 2^-24
    const float scaled = a * 16777216.0f;  // exact: a power-of-two scale
    return {static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)))};
  }
  // Normal: drop 13 mantissa bits, rounding to nearest even (a carry into
  // the exponent is the right result).
  const uint32_t magnitude = u & 0x7fffffff;
  const uint32_t rounded = magnitude + 0xfff + ((magnitude >> 13) & 1);
  return {static_cast<uint16_t>(sign | (((rounded >> 13) - (112u << 10)) & 0x7fff))};
}

// f rounded to the nearest value `type` can hold (f itself for kF32).
inline float round_to(DataType type, float f) {
  switch (type) {
    case DataType::kF32: return f;
    case DataType::kBF16: return to_float(to_bf16(f));
    case DataType::kF16: return to_float(to_f16(f));
  }
  return f;
}

}  // namespace vtrain::common
