// The one routine that times device work: conv.algorithm auto's tuning
// (the fastest of two runs) and the profiler (median and interquartile
// range of options.repeats runs) both time through it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "worker/device/backend.h"

namespace vtrain::worker {

enum class TimingStatistic {
  kMin,     // the fastest timed run (tuning: noise only ever adds time)
  kMedian,  // the median timed run (the profiler's perf DB rows)
};

struct KernelTimingOptions {
  int warmup = 1;   // untimed runs first (primitive creation, caches), then one sync
  int repeats = 5;  // timed runs, at least 1; each is timed from its issue to a sync
  TimingStatistic statistic = TimingStatistic::kMedian;
};

struct KernelTime {
  double seconds = 0;      // the options' statistic of the timed runs
  double iqr_seconds = 0;  // their interquartile range (75th less 25th percentile)
};

// Runs `run` options.warmup times, synchronizes backend's compute stream,
// then times options.repeats runs, each until the compute stream is idle.
// Whatever `run` throws propagates.
KernelTime time_kernel(Backend& backend, const KernelTimingOptions& options,
                       const std::function<void()>& run);

// One convolution algorithm's time, or why it did not run.
struct AlgorithmTime {
  ConvAlgoInfo algo;
  std::optional<KernelTime> time;  // nullopt: it refused to run
  std::string error;               // then the backend's message
};

// time_kernel of run(a.algo) for each of `algos`, in order. An algorithm
// the backend offers may still refuse the problem when it runs (cuDNN's
// heuristics list algorithms that then return NOT_SUPPORTED, e.g.
// BackwardFilter ALGO_0 for an f16 filter of odd size): its BackendError is
// caught and the algorithm comes back without a time, so that tuning and
// the profiler leave it out instead of ending the job. Anything else
// propagates.
std::vector<AlgorithmTime> time_algorithms(Backend& backend,
                                           const std::vector<ConvAlgoInfo>& algos,
                                           const KernelTimingOptions& options,
                                           const std::function<void(ConvAlgo)>& run);

// "<name> (<error>)" of each algorithm of `times` that did not run, or
// nothing when all ran.
std::vector<std::string> refusals(const std::vector<AlgorithmTime>& times);

}  // namespace vtrain::worker
