// train.precision in the config, and the element types it stores tensors
// in: one enum and one name table for the config, the trainer, the backends
// and the perf DB.
//
//   fp32  everything in float (the default)
//   tf32  float storage; a GPU's tensor cores may multiply in TF32
//   bf16  activations, their gradients and the weights the kernels read in
//         bfloat16; fp32 master weights, gradients, optimizer and
//         batch-norm statistics
//   fp16  as bf16 in IEEE half, with dynamic loss scaling
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "common/name_table.h"

namespace vtrain::common {

// How a tensor's elements are stored.
enum class DataType : uint8_t { kF32, kBF16, kF16 };

inline constexpr auto kDataTypeNames = std::to_array<Named<DataType>>(
    {{DataType::kF32, "f32"}, {DataType::kBF16, "bf16"}, {DataType::kF16, "f16"}});

// "f32", "bf16", "f16" (the perf DB's kernels.dtype column).
inline const char* dtype_name(DataType type) { return name_of(kDataTypeNames, type); }
inline constexpr size_t element_bytes(DataType type) { return type == DataType::kF32 ? 4 : 2; }

enum class Precision { kFp32, kTf32, kBf16, kFp16 };

inline constexpr auto kPrecisionNames = std::to_array<Named<Precision>>(
    {{Precision::kFp32, "fp32"},
     {Precision::kTf32, "tf32"},
     {Precision::kBf16, "bf16"},
     {Precision::kFp16, "fp16"}});

inline const char* precision_name(Precision p) { return name_of(kPrecisionNames, p); }

// The type activations, their gradients and the compute copy of the
// weights are stored in under `p`.
inline constexpr DataType storage_type(Precision p) {
  switch (p) {
    case Precision::kBf16: return DataType::kBF16;
    case Precision::kFp16: return DataType::kF16;
    case Precision::kFp32:
    case Precision::kTf32: return DataType::kF32;
  }
  return DataType::kF32;
}

// Whether `p` keeps a half-precision compute copy of fp32 master weights.
inline constexpr bool is_half(Precision p) { return storage_type(p) != DataType::kF32; }

}  // namespace vtrain::common
