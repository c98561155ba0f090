// Dropout's mask as a pure function of (seed, step, global sample index,
// layer): whichever rank holds a sample, whether the step runs first or
// after a resume, and whether the layer's forward runs once or again for a
// recomputation, the sample sees the same mask.
//
// The draws (worker/device/dropout_draw.h, which the backends' kernels
// compute element by element) are counter-based: element e of a sample is
// the hash of the sample's stream and e, in any order, with no state
// between calls. This header adds the whole mask on the host, for tests.
#pragma once

#include <cstdint>

#include "worker/device/dropout_draw.h"

namespace vtrain::worker {

// keep[s * per_sample + e] = 1 if element e of global sample
// first_sample + s is kept, else 0, for s in [0, samples).
void dropout_mask(const DropoutKey& key, float p, int64_t first_sample, int64_t samples,
                  int64_t per_sample, uint8_t* keep);

}  // namespace vtrain::worker
