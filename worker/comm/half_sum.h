// The reduction of a gradient bucket that travels in half precision
// (train.gradient_allreduce: half): what the MPI communicator's
// user-defined operation runs on each pair of partial sums. Plain host
// code, no MPI, so that it can be tested on its own.
#pragma once

#include <cstdint>

#include "common/precision.h"

namespace vtrain::worker {

// inout[i] = in[i] + inout[i] for `count` 16-bit elements of `type` (kBF16
// or kF16): each pair converted to float, added, and the sum rounded once
// to `type` (to nearest even), so a sum over R ranks rounds R - 1 times
// instead of accumulating the rounding of every partial sum in half.
// Throws std::invalid_argument for kF32.
void add_half_elements(const void* in, void* inout, int64_t count, common::DataType type);

}  // namespace vtrain::worker
