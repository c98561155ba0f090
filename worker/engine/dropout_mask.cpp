#include "worker/engine/dropout_mask.h"

#include <cmath>

#include "worker/engine/rng.h"

namespace vtrain::worker {
namespace {

// splitmix64's increment: Rng(s).next() advances its state by this first.
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// A hash of (h, value) in which the two do not commute: h is mixed before
// value is added.
uint64_t chain(uint64_t h, uint64_t value) { return Rng(Rng(h).next() + value).next(); }

}  // namespace

uint64_t dropout_stream(const DropoutKey& key, int64_t sample) {
  uint64_t h = chain(key.seed, static_cast<uint64_t>(key.step));
  h = chain(h, static_cast<uint64_t>(key.layer));
  return chain(h, static_cast<uint64_t>(sample));
}

uint64_t dropout_draw(uint64_t stream, int64_t element) {
  // Rng(stream) would reach this state after element + 1 draws.
  return Rng(stream + static_cast<uint64_t>(element) * kGolden).next();
}

bool dropout_keeps(uint64_t draw, float p) {
  // Exact in double: a float times a power of two, below 2^32 for p < 1.
  const auto threshold = static_cast<uint64_t>(std::ldexp(static_cast<double>(p), 32));
  return (draw >> 32) >= threshold;
}

float dropout_scale(float p) { return 1.0f / (1.0f - p); }

void dropout_mask(const DropoutKey& key, float p, int64_t first_sample, int64_t samples,
                  int64_t per_sample, uint8_t* keep) {
  for (int64_t s = 0; s < samples; ++s) {
    const uint64_t stream = dropout_stream(key, first_sample + s);
    uint8_t* row = keep + s * per_sample;
    for (int64_t e = 0; e < per_sample; ++e) row[e] = dropout_keeps(dropout_draw(stream, e), p);
  }
}

}  // namespace vtrain::worker
