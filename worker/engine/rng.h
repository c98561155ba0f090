// The generator of initial weights: splitmix64 (worker/device/dropout_draw.h,
// whose draws dropout's masks are), small and portable, so the initial
// weights are identical on every platform and rank for one seed.
#pragma once

#include <cstdint>

#include "worker/device/dropout_draw.h"

namespace vtrain::worker {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return splitmix64(state_); }
  // Uniform in [0, 1): the top 53 bits.
  double unit() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform in [-bound, bound).
  float uniform(float bound) { return static_cast<float>((2.0 * unit() - 1.0) * bound); }

 private:
  uint64_t state_;
};

}  // namespace vtrain::worker
