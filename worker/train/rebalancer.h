// Online re-balancing: every rank measures its compute time per step (up to
// the gradient exchange, Backend::end_compute_span_ms); the times ride on
// the step's existing allreduce (loss, accuracy, stop) as 4 x ranks more
// doubles: each rank's time in its own slot, an idle rank's probe time,
// rank 0's decision (a new split or zeros), and each rank's wait for its
// input. Rank 0 compares the times with the plan's predictions
// (DriftDetector). The first window of steps calibrates: a profiled step
// and a step in training differ by a per-device factor (the data upload,
// caches, the other ranks profiling beside it), so each rank's median
// ratio there scales its curve, and drift counts from there on; the split
// stays (it is the plan's). When they drift apart it re-solves the split on the
// profiled step-time curves scaled by what was measured, and proposes it in
// the next step's allreduce, after which every rank switches at the same
// step boundary. No collective of its own.
//
// Input counts as compute does: a rank that waited for its input this step
// (more than kInputBoundShare of its compute time) was input-bound, and
// its ratio is its compute plus that wait over its predicted step, the
// larger of its predicted compute and input (balancer::DeviceProfile::
// input_rate). A re-solve scales that rank's curve and its input time by
// its ratio, so a rank whose input slowed down gets fewer samples, as one
// whose compute did. A rank that did not wait is compared on compute
// alone: input that does not bind says nothing of its speed.
//
// A rank without samples has no step time to compare, so every
// `probe_every` steps it times a probe instead: a forward pass in inference
// mode on a fixed batch (no collective, no state changed). Its first three
// probes are its baseline (the speed its curve was last scaled to); when
// the median of its last three is faster than that by over the threshold,
// rank 0 re-solves with its curve scaled by the two medians' ratio, and
// switches where that pays as above (the curve then stays scaled), so a
// device that recovers from a slowdown gets samples back.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "balancer/batch_split.h"
#include "worker/train/drift_detector.h"
#include "worker/train/metrics.h"

namespace vtrain::worker {

// balance.rebalance in the config.
struct RebalanceSettings {
  bool enabled = true;      // re-balance under balance.split: auto (other splits are kept)
  double threshold = 0.25;  // drift that counts: spread of the ranks' measured / predicted
                            // compute times (DriftDetector), 0.25 = one rank 25% off
  int64_t window = 15;      // steps in each rank's median ratio
  int64_t patience = 5;     // consecutive steps above the threshold before a re-solve
  double min_gain = 0.1;    // switch only when the re-solved split is predicted at least
                            // this much faster (0.1 = 10%) under the measured times
  double min_gain_ms = 2;   // ... and at least this many ms a step faster: below the
                            // scheduler's time slice, contention looks like drift
  int64_t probe_every = 10;  // steps between an idle rank's probes (0: no probes)
};

// The share of a rank's compute time its input wait must exceed for the
// step to count as input-bound (a wait below it is the gather's own time
// or noise).
inline constexpr double kInputBoundShare = 0.05;

struct RebalanceOptions {
  RebalanceSettings settings;
  // Rank 0: per rank, the step-time curves the split was solved on
  // (worker/profile/planning.h device_profiles) and the solve's options.
  // Empty: nothing to re-solve with, no re-balancing (the split was not
  // auto). Other ranks leave it empty: they follow rank 0.
  std::vector<balancer::DeviceProfile> profiles;
  balancer::BatchSplitOptions split_options;
};

// A change of split every rank makes at the same step boundary.
struct SplitSwitch {
  std::vector<int64_t> split;  // the new per-rank batches
  // Rank 0 only (what it decided on; empty or 0 on other ranks):
  std::vector<int64_t> previous;  // the split it replaces
  std::vector<double> ratios;     // per rank, median measured / predicted compute time
  double drift = 0;               // the detector's drift when it fired, or an idle rank's
                                  // speed-up - 1 seen by its probes
  std::string reason;             // what fired, in words
  double previous_ms = 0;         // the old split's step, predicted on the measured times
  double predicted_ms = 0;        // the new split's
  std::vector<double> rank_ms;    // per rank, its predicted step on the new split
  int64_t decided_at = 0;         // the step whose measurements decided it
};

// The re-solve on its own: scales each training rank's step times by its
// ratio (measured / predicted; ranks with ratio <= 0 keep theirs), in
// place, then solves the split of `batch` again with the same options.
// `previous_ms` is the predicted step of `current` on the scaled curves.
struct Resolved {
  balancer::BatchSplit split;
  double previous_ms = 0;
};
Resolved resolve_split(std::vector<balancer::DeviceProfile>& profiles,
                       std::span<const double> ratios, std::span<const int64_t> current,
                       int64_t batch, const balancer::BatchSplitOptions& options);

// One rank's side of online re-balancing; see the top of the file.
class Rebalancer {
 public:
  Rebalancer(RebalanceOptions options, int rank, int ranks, int64_t batch);

  // Rank 0, enabled, several ranks, and curves to re-solve on.
  bool deciding() const;
  // Whether a rank without samples times a probe before `step` (every rank
  // knows: the settings are the job's).
  bool probes_at(int64_t step) const;
  // Appends this rank's 4 x ranks slots to the step's allreduce; probe_ms
  // is 0 where this rank timed no probe; input_wait_ms is how long the
  // step waited for its batch (0 when it was ready).
  void contribute(double compute_ms, double probe_ms, std::vector<double>& sums,
                  double input_wait_ms = 0) const;
  // After the allreduce, with the summed slots: the switch every rank makes
  // now (rank 0's decision of the step before), or nullopt. On rank 0 it
  // also feeds the detector and may decide a switch for the next step.
  std::optional<SplitSwitch> after_step(std::span<const double> slots,
                                        const std::vector<int64_t>& split, int64_t step);
  // Every rank's compute time at the last step, in ms.
  const std::vector<double>& compute_ms() const { return compute_ms_; }
  // Every rank's input wait at the last step, in ms.
  const std::vector<double>& input_wait_ms() const { return input_wait_ms_; }
  // Rank 0: the calibration, or a drift that did not pay to re-balance, for
  // the log; "" if none.
  std::string take_note();

 private:
  void decide(const std::vector<int64_t>& split, int64_t step);
  void follow_probes(std::span<const double> probe_ms, const std::vector<int64_t>& split,
                     int64_t step);
  bool propose(const std::vector<double>& ratios, double drift, const std::vector<int64_t>& split,
               int64_t step, const char* why, bool scale_when_kept);
  void calibrate();

  RebalanceOptions options_;
  int rank_, ranks_;
  int64_t batch_;
  DriftDetector detector_;
  std::vector<double> compute_ms_;
  std::vector<double> input_wait_ms_;
  bool calibrated_ = false;              // rank 0: the first window has scaled the curves
  std::optional<SplitSwitch> pending_;  // rank 0: decided, to propose in the next step
  std::vector<std::vector<double>> probes_;  // rank 0: per idle rank, its probes' ms since
                                             // its curve was last scaled
  std::string note_;
};

// The progress line of a switch (rank 0): the new split and why.
std::string describe_switch(const SplitSwitch& s, int64_t step);
// The metrics file's "rebalance" record of a switch.
JsonRecord switch_record(const SplitSwitch& s, int64_t step);

}  // namespace vtrain::worker
