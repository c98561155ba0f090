// One sample into a batch: read, decoded and transformed (image files) or
// transformed from memory, normalised, written as floats in NCHW. What the
// batch gatherers and the decoding pool call per sample.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/data/data.h"
#include "worker/data/image_decoder.h"
#include "worker/data/transform.h"

namespace vtrain::worker {

// A thread's buffers for gather_sample: once they have grown to the largest
// sample, gathering allocates nothing.
struct SampleScratch {
  ImageDecoder decoder;
  std::vector<uint8_t> bytes;  // an encoded image
  ResampleScratch resample;
};

// Writes sample `index` of `data` (data.sample.per_sample() floats) into
// `image` and its label into `label`, through data.transform with the
// random choices of (draw, index). Throws DataError naming the file (and
// shard member) of an image that cannot be read or decoded,
// std::out_of_range for an index outside the dataset.
void gather_sample(const Dataset& data, int64_t index, const PixelNorm& norm, SampleDraw draw,
                   float* image, int32_t* label, SampleScratch& scratch);

// channel_stats for image files (see there).
ChannelStats file_channel_stats(const Dataset& data);

// Whether gathering `data` is more than a copy: image files, or a transform.
bool transforms_samples(const Dataset& data);

}  // namespace vtrain::worker
