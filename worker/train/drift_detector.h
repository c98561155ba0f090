// When the ranks' measured compute times have drifted apart from what the
// split was planned on: the test online re-balancing (rebalancer.h) runs
// every step. A pure function of the numbers it is fed, so that tests can
// feed it sequences.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

namespace vtrain::worker {

// Fed once per step with each rank's ratio measured / predicted compute
// time. Each rank's ratio is the median over the last `window` steps (so
// an outlier, e.g. a step the OS took a core from, moves nothing); the
// drift is the spread of those medians over the ranks that train,
// max / min - 1. A uniform change (every rank 20% slower) is no drift: it
// leaves the best split where it is. The detector fires when the drift has
// been above `threshold` for `patience` consecutive steps with a full
// window; the caller reads medians() and then reset()s it (until then it
// fires at every step the drift stays above the threshold).
class DriftDetector {
 public:
  // Throws std::invalid_argument when window < 1, patience < 1 or
  // threshold <= 0.
  DriftDetector(int64_t window, int64_t patience, double threshold);

  // One step's ratios, one per rank; a rank that does not train passes a
  // value <= 0 (or NaN) and is left out. The number of ranks is fixed by
  // the first call. True when the detector fires at this step.
  bool add(std::span<const double> ratios);
  // Forgets every step seen (after a switch of split: the ratios start again).
  void reset();

  bool full() const { return !history_.empty() && static_cast<int64_t>(history_.front().size()) == window_; }
  double drift() const { return drift_; }      // at the last step; 0 before the window is full
  // Per rank the median ratio over the window (0 for a rank left out).
  std::vector<double> medians() const;

 private:
  int64_t window_;
  int64_t patience_;
  double threshold_;
  std::vector<std::deque<double>> history_;  // per rank, the last `window` ratios
  double drift_ = 0;
  int64_t above_ = 0;
};

}  // namespace vtrain::worker
