// Dropout's mask as a pure function of (seed, step, global sample index,
// layer): whichever rank holds a sample, whether the step runs first or
// after a resume, and whether the layer's forward runs once or again for a
// recomputation, the sample sees the same mask.
//
// The draws are counter-based: element e of a sample is the hash of the
// sample's stream and e (dropout_draw), so a device kernel computes any
// element on its own, in any order, with no state between calls. It is the
// e-th draw of the splitmix64 generator (rng.h) started at the stream.
#pragma once

#include <cstdint>

namespace vtrain::worker {

// What a mask depends on besides the sample.
struct DropoutKey {
  uint64_t seed = 0;  // the run's seed (train.seed)
  int64_t step = 0;   // the optimizer step the forward belongs to
  int layer = 0;      // the layer's index in the graph
};

// The stream of `sample` (its index in the global batch of the step).
uint64_t dropout_stream(const DropoutKey& key, int64_t sample);

// The 64-bit draw of element `element` of a sample's stream.
uint64_t dropout_draw(uint64_t stream, int64_t element);

// Whether a draw keeps its element when elements are zeroed with
// probability p in [0, 1): the draw's top 32 bits against p * 2^32.
bool dropout_keeps(uint64_t draw, float p);

// The factor kept elements are multiplied by (inverted dropout, as
// PyTorch): 1 / (1 - p), so the expected output is the input.
float dropout_scale(float p);

// keep[s * per_sample + e] = 1 if element e of global sample
// first_sample + s is kept, else 0, for s in [0, samples).
void dropout_mask(const DropoutKey& key, float p, int64_t first_sample, int64_t samples,
                  int64_t per_sample, uint8_t* keep);

}  // namespace vtrain::worker
