// Random instances shared by the balancer's tests: times that are
// multiples of 1/8 ms, so that sums are exact whatever the order.
#pragma once

#include <cstdint>
#include <random>

namespace vtrain::balancer::test {

inline constexpr uint64_t kMiB = 1024 * 1024;

inline int uniform(std::mt19937& rng, int low, int high) {
  return std::uniform_int_distribution<int>(low, high)(rng);
}

// A random time in [low, high] ms, a multiple of 1/8.
inline double eighths(std::mt19937& rng, int low, int high) {
  return uniform(rng, low * 8, high * 8) / 8.0;
}

}  // namespace vtrain::balancer::test
