// The one routine that times device work: conv.algorithm auto's tuning
// (the fastest of two runs) and the profiler (median and interquartile
// range of options.repeats runs) both time through it.
#pragma once

#include <functional>

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

}  // namespace vtrain::worker
