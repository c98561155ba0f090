// Bulk host conversions between float and the two 16-bit floating-point
// storage types: the bits half.h's one-at-a-time conversions give (a NaN
// stays a NaN, its payload aside), at memory speed. A step's input upload
// in half precision converts every pixel of the batch on the host (9.6 M
// for ResNet-50 at batch 64), where half.h's branchy loop took 29 ms in
// f16. On x86-64 the f16 calls use F16C and the bf16 ones AVX2 where the
// CPU has them (checked at run time); elsewhere the scalar loop.
#pragma once

#include <cstdint>
#include <span>

#include "common/half.h"

namespace vtrain::common {

// The two ways the calls below can convert, for tests and benchmarks:
// kScalar is half.h's loop; kVector (the default) the instructions named
// above, or the scalar loop where this CPU lacks them
// (vector_conversions() says which).
enum class ConvertPath { kScalar, kVector };

// out[i] = in[i] rounded to nearest even; out holds in.size() elements.
void to_f16(std::span<const float> in, F16* out, ConvertPath path = ConvertPath::kVector);
void to_bf16(std::span<const float> in, Bf16* out, ConvertPath path = ConvertPath::kVector);
// out[i] = in[i] widened (exact); out holds in.size() elements.
void to_float(std::span<const F16> in, float* out, ConvertPath path = ConvertPath::kVector);
void to_float(std::span<const Bf16> in, float* out, ConvertPath path = ConvertPath::kVector);
// What kVector runs on this CPU, e.g. "f16 F16C, bf16 AVX2", or "scalar".
const char* vector_conversions();

}  // namespace vtrain::common
