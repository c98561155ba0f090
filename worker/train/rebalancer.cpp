#include "worker/train/rebalancer.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "common/text.h"

namespace vtrain::worker {
namespace {

using common::format;

// The device's predicted compute time at `batch` (its allreduce left out:
// the measurement stops before the exchange). Throws where the curve does
// not reach the batch, which a split solved on it never asks.
double predicted_ms(const balancer::DeviceProfile& device, int64_t batch) {
  const std::optional<double> t = balancer::step_time_at(device, batch);
  if (!t) {
    throw std::logic_error("re-balancing: " + device.name + " has no step time at batch " +
                           std::to_string(batch));
  }
  return *t;
}

// "0 1.00x, 1 2.03x": per rank, ranks that do not train (ratio 0) left out.
std::string per_rank_ratios(const std::vector<double>& ratios) {
  std::string text;
  for (size_t r = 0; r < ratios.size(); ++r) {
    if (ratios[r] > 0) text += format("%s%zu %.2fx", text.empty() ? "" : ", ", r, ratios[r]);
  }
  return text;
}

// Scales each rank's curve and input time by its ratio (measured /
// predicted); a rank without one (0: it did not train) keeps its curve.
void scale_curves(std::vector<balancer::DeviceProfile>& profiles, std::span<const double> ratios) {
  for (size_t r = 0; r < profiles.size(); ++r) {
    if (ratios[r] <= 0) continue;
    for (balancer::StepSample& s : profiles[r].steps) s.time_ms *= ratios[r];
    profiles[r].input_rate /= ratios[r];
  }
}

// A rank's measured / predicted time at one step (see the top of
// rebalancer.h): on compute alone, or, where it waited for its input, its
// compute and that wait against its predicted step with input (less the
// exchange every step pays, `exchange_ms`, which the input overlaps and
// the measured compute leaves out).
double step_ratio(const balancer::DeviceProfile& device, int64_t batch, double compute_ms,
                  double input_wait_ms, double exchange_ms) {
  const double compute_pred = std::max(predicted_ms(device, batch), 1e-9);
  if (input_wait_ms <= kInputBoundShare * compute_ms) return compute_ms / compute_pred;
  const double step_pred =
      std::max(compute_pred, balancer::input_ms(device.input_rate, batch) - exchange_ms);
  return (compute_ms + input_wait_ms) / step_pred;
}

}  // namespace

Resolved resolve_split(std::vector<balancer::DeviceProfile>& profiles,
                       std::span<const double> ratios, std::span<const int64_t> current,
                       int64_t batch, const balancer::BatchSplitOptions& options) {
  Resolved out;
  scale_curves(profiles, ratios);
  for (size_t r = 0; r < profiles.size(); ++r) {
    if (current[r] > 0) {
      // The input overlaps the whole step, the exchange every step pays included.
      const double compute = predicted_ms(profiles[r], current[r]) + profiles[r].allreduce_ms;
      const double input = balancer::input_ms(profiles[r].input_rate, current[r]) - options.allreduce_ms;
      out.previous_ms = std::max({out.previous_ms, compute, input});
    }
  }
  out.previous_ms += options.allreduce_ms;
  out.split = balancer::plan_batch_split(profiles, batch, options);
  return out;
}

Rebalancer::Rebalancer(RebalanceOptions options, int rank, int ranks, int64_t batch)
    : options_(std::move(options)),
      rank_(rank),
      ranks_(ranks),
      batch_(batch),
      detector_(options_.settings.window, options_.settings.patience, options_.settings.threshold),
      compute_ms_(static_cast<size_t>(ranks), 0.0),
      input_wait_ms_(static_cast<size_t>(ranks), 0.0) {}

bool Rebalancer::deciding() const {
  return rank_ == 0 && ranks_ > 1 && options_.settings.enabled &&
         static_cast<int>(options_.profiles.size()) == ranks_;
}

bool Rebalancer::probes_at(int64_t step) const {
  return ranks_ > 1 && options_.settings.enabled && options_.settings.probe_every > 0 &&
         step % options_.settings.probe_every == 0;
}

void Rebalancer::contribute(double compute_ms, double probe_ms, std::vector<double>& sums,
                            double input_wait_ms) const {
  const size_t first = sums.size(), n = static_cast<size_t>(ranks_);
  sums.resize(first + 4 * n, 0.0);
  sums[first + static_cast<size_t>(rank_)] = compute_ms;
  sums[first + n + static_cast<size_t>(rank_)] = probe_ms;
  sums[first + 3 * n + static_cast<size_t>(rank_)] = input_wait_ms;
  if (pending_) {
    for (size_t r = 0; r < n; ++r) sums[first + 2 * n + r] = static_cast<double>(pending_->split[r]);
  }
}

std::optional<SplitSwitch> Rebalancer::after_step(std::span<const double> slots,
                                                  const std::vector<int64_t>& split,
                                                  int64_t step) {
  const size_t n = static_cast<size_t>(ranks_);
  compute_ms_.assign(slots.begin(), slots.begin() + ranks_);
  input_wait_ms_.assign(slots.begin() + 3 * ranks_, slots.begin() + 4 * ranks_);
  const std::span<const double> probe_ms = slots.subspan(n, n);
  const std::span<const double> proposal = slots.subspan(2 * n, n);
  if (std::any_of(proposal.begin(), proposal.end(), [](double v) { return v != 0; })) {
    SplitSwitch s = pending_ ? std::move(*pending_) : SplitSwitch{};
    pending_.reset();
    s.split.clear();
    for (double v : proposal) s.split.push_back(static_cast<int64_t>(v));
    detector_.reset();  // the next ratios are of the new split
    probes_.assign(n, {});
    return s;
  }
  if (deciding() && !pending_) {
    decide(split, step);
    if (calibrated_ && !pending_) follow_probes(probe_ms, split, step);
  }
  return std::nullopt;
}

// Rank 0, after every step: feeds the detector and, when it fires,
// re-solves; a split that pays becomes the next step's proposal.
void Rebalancer::decide(const std::vector<int64_t>& split, int64_t step) {
  std::vector<double> ratios(static_cast<size_t>(ranks_), 0.0);
  for (int r = 0; r < ranks_; ++r) {
    if (split[r] > 0) ratios[r] = step_ratio(options_.profiles[r], split[r], compute_ms_[r], input_wait_ms_[r],
                                          options_.split_options.allreduce_ms);
  }
  const bool fired = detector_.add(ratios);
  if (!calibrated_) {
    if (detector_.full()) calibrate();
    return;
  }
  if (!fired) return;
  const std::vector<double> medians = detector_.medians();
  const double drift = detector_.drift();
  detector_.reset();
  // The curves follow what training measured, whether the split changes or not.
  propose(medians, drift, split, step,
          format("the compute times drifted %.0f%% apart", 100 * drift).c_str(), true);
}

// Rank 0, after every step once calibrated: keeps each idle rank's probes
// and, when the last three say it got faster than its first three by over
// the threshold, scales its curve by that and re-solves.
void Rebalancer::follow_probes(std::span<const double> probe_ms,
                               const std::vector<int64_t>& split, int64_t step) {
  constexpr size_t kProbes = 3;  // in each median: one outlier moves nothing
  probes_.resize(static_cast<size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r) {
    std::vector<double>& probes = probes_[static_cast<size_t>(r)];
    if (split[r] > 0) {
      probes.clear();
      continue;
    }
    if (probe_ms[r] <= 0) continue;
    probes.push_back(probe_ms[r]);
    if (probes.size() < 2 * kProbes) continue;
    auto median3 = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[1];
    };
    const double baseline = median3({probes.begin(), probes.begin() + kProbes});
    const double now = median3({probes.end() - kProbes, probes.end()});
    if (baseline / now - 1 <= options_.settings.threshold) {
      probes.erase(probes.begin() + kProbes, probes.end() - (kProbes - 1));  // a sliding "now"
      continue;
    }
    std::vector<double> ratios(static_cast<size_t>(ranks_), 0.0);
    ratios[static_cast<size_t>(r)] = now / baseline;
    // A probe is a short forward pass, noisier than training's steps: the
    // curve follows it only when the split does (the probes then count
    // afresh, as a training rank's would); else they slide on, quietly.
    if (propose(ratios, baseline / now - 1, split, step,
                format("rank %d's probes got %.2fx faster while it had no samples", r,
                       baseline / now).c_str(),
                false)) {
      probes.clear();
      return;
    }
    probes.erase(probes.begin() + kProbes, probes.end() - (kProbes - 1));
  }
}

// Rank 0: re-solves on the curves scaled by `ratios`; a split that pays
// becomes the next step's proposal (true), and the curves stay scaled.
// Where it does not pay, the scaled curves are kept only with
// `scale_when_kept`, which also leaves a note of why the split stays.
bool Rebalancer::propose(const std::vector<double>& ratios, double drift,
                         const std::vector<int64_t>& split, int64_t step, const char* why,
                         bool scale_when_kept) {
  std::vector<balancer::DeviceProfile> scaled = options_.profiles;
  const Resolved solved = resolve_split(scaled, ratios, split, batch_, options_.split_options);
  const double gain = solved.previous_ms / std::max(solved.split.step_time_ms, 1e-9) - 1;
  const double saved_ms = solved.previous_ms - solved.split.step_time_ms;
  if (solved.split.batch == split || gain < options_.settings.min_gain ||
      saved_ms < options_.settings.min_gain_ms) {
    if (!scale_when_kept) return false;
    options_.profiles = std::move(scaled);
    note_ = format("rebalance: at step %lld %s, but the re-solved split %s is only %.1f%% "
                   "(%.2f ms) faster than %s; keeping it",
                   static_cast<long long>(step + 1), why,
                   balancer::join_batches(solved.split.batch).c_str(), 100 * std::max(gain, 0.0),
                   std::max(saved_ms, 0.0), balancer::join_batches(split).c_str());
    return false;
  }
  options_.profiles = std::move(scaled);
  pending_ = SplitSwitch{.split = solved.split.batch,
                         .previous = split,
                         .ratios = ratios,
                         .drift = drift,
                         .reason = why,
                         .previous_ms = solved.previous_ms,
                         .predicted_ms = solved.split.step_time_ms,
                         .rank_ms = solved.split.time_ms,
                         .decided_at = step + 1};
  return true;
}

// Scales every training rank's curve by its median ratio over the first
// window, so that the predictions are of steps in training.
void Rebalancer::calibrate() {
  const std::vector<double> medians = detector_.medians();
  detector_.reset();
  calibrated_ = true;
  scale_curves(options_.profiles, medians);
  note_ = "rebalance: calibrated the profiled step times to training's, measured / profiled "
          "per rank " + per_rank_ratios(medians);
}

std::string Rebalancer::take_note() { return std::exchange(note_, std::string()); }

std::string describe_switch(const SplitSwitch& s, int64_t step) {
  return format("rebalance: from step %lld, split %s -> %s: %s at step %lld (measured / "
                "predicted compute time per rank %s); predicted step %.2f ms -> %.2f ms",
                static_cast<long long>(step), balancer::join_batches(s.previous).c_str(),
                balancer::join_batches(s.split).c_str(), s.reason.c_str(),
                static_cast<long long>(s.decided_at), per_rank_ratios(s.ratios).c_str(),
                s.previous_ms, s.predicted_ms);
}

JsonRecord switch_record(const SplitSwitch& s, int64_t step) {
  return JsonRecord()
      .add("event", "rebalance")
      .add("step", step)
      .add("decided_at", s.decided_at)
      .add("split", std::span<const int64_t>(s.split))
      .add("previous_split", std::span<const int64_t>(s.previous))
      .add("ratios", s.ratios)
      .add("drift", s.drift)
      .add("reason", s.reason)
      .add("previous_ms", s.previous_ms)
      .add("predicted_ms", s.predicted_ms);
}

}  // namespace vtrain::worker
