#include "worker/engine/kernel_timing.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace vtrain::worker {

KernelTime time_kernel(Backend& backend, const KernelTimingOptions& options,
                       const std::function<void()>& run) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < options.warmup; ++i) run();
  backend.synchronize(StreamKind::kCompute);
  std::vector<double> seconds;
  for (int i = 0; i < std::max(options.repeats, 1); ++i) {
    const auto start = Clock::now();
    run();
    backend.synchronize(StreamKind::kCompute);
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  auto quantile = [&](double q) {
    return seconds[static_cast<size_t>(q * (seconds.size() - 1) + 0.5)];
  };
  const double value =
      options.statistic == TimingStatistic::kMin ? seconds.front() : quantile(0.5);
  return {value, quantile(0.75) - quantile(0.25)};
}

std::vector<AlgorithmTime> time_algorithms(Backend& backend,
                                           const std::vector<ConvAlgoInfo>& algos,
                                           const KernelTimingOptions& options,
                                           const std::function<void(ConvAlgo)>& run) {
  std::vector<AlgorithmTime> times;
  for (const ConvAlgoInfo& a : algos) {
    AlgorithmTime t{a, std::nullopt, {}};
    try {
      t.time = time_kernel(backend, options, [&] { run(a.algo); });
    } catch (const BackendError& e) {
      // Its work, if any was issued, must not run into the next one's.
      backend.synchronize(StreamKind::kCompute);
      t.error = e.what();
    }
    times.push_back(std::move(t));
  }
  return times;
}

std::vector<std::string> refusals(const std::vector<AlgorithmTime>& times) {
  std::vector<std::string> out;
  for (const AlgorithmTime& t : times) {
    if (!t.time) out.push_back(t.algo.name + " (" + t.error + ")");
  }
  return out;
}

}  // namespace vtrain::worker
