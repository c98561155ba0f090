// Timing helper shared by the C++ benchmark drivers.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>
#include <vector>

namespace vtrain::bench {

// The median of `values` (the upper one of an even count); not empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Median wall time of `repeats` calls of `run`, in milliseconds.
inline double median_ms(int repeats, const std::function<void()>& run) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return median(std::move(times));
}

}  // namespace vtrain::bench
