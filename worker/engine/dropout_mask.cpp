#include "worker/engine/dropout_mask.h"

namespace vtrain::worker {

void dropout_mask(const DropoutKey& key, float p, int64_t first_sample, int64_t samples,
                  int64_t per_sample, uint8_t* keep) {
  const uint64_t layer = dropout_layer_stream(key);
  const uint32_t threshold = dropout_threshold(p);
  for (int64_t s = 0; s < samples; ++s) {
    const uint64_t stream = dropout_sample_stream(layer, first_sample + s);
    uint8_t* row = keep + s * per_sample;
    for (int64_t e = 0; e < per_sample; ++e) row[e] = dropout_kept(dropout_draw(stream, e), threshold);
  }
}

}  // namespace vtrain::worker
