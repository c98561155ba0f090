// The three kernels of a convolution, as the device runs them, the perf DB
// stores them and a plan names them: one enum and one name table for all.
#pragma once

#include <array>

#include "common/name_table.h"

namespace vtrain::common {

enum class ConvKind { kForward, kBackwardData, kBackwardFilter };

inline constexpr auto kConvKindNames = std::to_array<Named<ConvKind>>(
    {{ConvKind::kForward, "Forward"},
     {ConvKind::kBackwardData, "BackwardData"},
     {ConvKind::kBackwardFilter, "BackwardFilter"}});

// "Forward", "BackwardData", "BackwardFilter".
inline const char* conv_kind_name(ConvKind kind) { return name_of(kConvKindNames, kind); }

}  // namespace vtrain::common
