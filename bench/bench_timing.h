// Timing helper shared by the C++ benchmark drivers.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace vtrain::bench {

// Median wall time of `repeats` calls of `run`, in milliseconds.
inline double median_ms(int repeats, const std::function<void()>& run) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace vtrain::bench
