// The generator of initial weights: splitmix64, small and portable, so the
// initial weights are identical on every platform and rank for one seed.
#pragma once

#include <cstdint>

namespace vtrain::worker {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1): the top 53 bits.
  double unit() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform in [-bound, bound).
  float uniform(float bound) { return static_cast<float>((2.0 * unit() - 1.0) * bound); }

 private:
  uint64_t state_;
};

}  // namespace vtrain::worker
