// Random numbers of the data part (internal): the same on every platform.
#pragma once

#include <array>
#include <cstdint>

namespace vtrain::worker::data_random {

// Random numbers. Everything here is written out by hand instead of using
// <random> distributions, whose algorithms the standard leaves to each
// library: ranks built against different standard libraries must still draw
// the same permutation and the same synthetic data.

// SplitMix64 finaliser: a bijective 64-bit mix.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

inline uint64_t splitmix64(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ULL;
  return mix64(state);
}

// xoshiro256**, keyed by (seed, stream). The stream is added after hashing the
// seed, so the streams of one seed never collide with each other and
// (seed, stream) pairs are not interchangeable.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) {
    uint64_t sm = mix64(mix64(seed) + stream);
    for (uint64_t& word : s_) word = splitmix64(sm);
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, bound), bound > 0, without modulo bias: draws below
  // 2^64 mod bound are rejected so every residue is equally likely.
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

  // Uniform in [0, 1) from the top 53 bits of one draw.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<uint64_t, 4> s_{};
};

}  // namespace vtrain::worker::data_random
