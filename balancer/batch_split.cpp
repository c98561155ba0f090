#include "balancer/batch_split.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "common/text.h"
#include "balancer/internal/reachable_totals.h"
#include "balancer/lp_model.h"

namespace vtrain::balancer {
namespace {

using common::format_bytes;
using internal::ReachableTotals;

// One size a device may get, with its predicted step time: what the
// split is chosen on (compute and input, or compute alone when the split
// is not input-aware) and its parts.
struct Candidate {
  int64_t batch = 0;
  double time_ms = 0;     // what the solvers minimise the slowest of
  double compute_ms = 0;  // compute at this size, the device's allreduce included
  double input_ms = 0;    // input at this size (0: unlimited), less the exchange every
                          // step pays (options.allreduce_ms), which it overlaps
  double step_ms() const { return std::max(compute_ms, input_ms); }  // what it runs in
};

// Devices listed in a message at most; a 1024-device list helps nobody.
constexpr size_t kListedDevices = 8;

std::vector<StepSample> sorted_samples(const DeviceProfile& device) {
  const std::string where = "device " + device.name + ": ";
  if (!std::isfinite(device.allreduce_ms) || device.allreduce_ms < 0) {
    throw BalancerError(where + "allreduce time is not a finite non-negative number");
  }
  if (!std::isfinite(device.input_rate) || device.input_rate < 0) {
    throw BalancerError(where + "input rate is not a finite non-negative number of images/s");
  }
  std::vector<StepSample> steps = device.steps;
  std::sort(steps.begin(), steps.end(),
            [](const StepSample& a, const StepSample& b) { return a.batch < b.batch; });
  for (size_t i = 0; i < steps.size(); ++i) {
    auto fail = [&](const char* problem) {
      throw BalancerError(where + "step at batch " + std::to_string(steps[i].batch) + ": " + problem);
    };
    if (steps[i].batch < 1) fail("batch is not positive");
    if (!std::isfinite(steps[i].time_ms) || steps[i].time_ms < 0) fail("time is not a finite non-negative number");
    if (i > 0 && steps[i].batch == steps[i - 1].batch) fail("measured twice");
  }
  return steps;
}

// The step at `batch`, linear between the measured `low` and `high` around it.
StepSample interpolate(const StepSample& low, const StepSample& high, int64_t batch) {
  const double w = static_cast<double>(batch - low.batch) / static_cast<double>(high.batch - low.batch);
  const double memory = static_cast<double>(low.peak_memory_bytes) +
                        w * (static_cast<double>(high.peak_memory_bytes) -
                             static_cast<double>(low.peak_memory_bytes));
  return {batch, low.time_ms + w * (high.time_ms - low.time_ms),
          static_cast<uint64_t>(std::ceil(memory))};
}

// The device's candidate sizes (see batch_split.h), ascending; sizes above
// `limit` are left out since no split can use them.
std::vector<Candidate> candidates_of(const DeviceProfile& device, int64_t limit,
                                     const BatchSplitOptions& options) {
  const std::vector<StepSample> steps = sorted_samples(device);
  const auto capacity = static_cast<double>(device.memory_capacity_bytes);
  const int64_t g = options.granularity;
  std::vector<Candidate> out;
  auto offer = [&](int64_t batch, double time_ms, double memory_bytes) {
    if (memory_bytes > capacity) return;
    const double compute = time_ms + device.allreduce_ms;
    // Decoding runs beside the whole step, the exchange every step pays
    // (added to T after the solve) included.
    const double input = std::max(0.0, input_ms(device.input_rate, batch) - options.allreduce_ms);
    out.push_back({batch, options.input_aware ? std::max(compute, input) : compute, compute, input});
  };
  if (options.candidates == CandidateSizes::kMeasured) {
    for (const StepSample& step : steps) {
      if (step.batch % g == 0 && step.batch <= limit) {
        offer(step.batch, step.time_ms, static_cast<double>(step.peak_memory_bytes));
      }
    }
    return out;
  }
  if (steps.empty()) return out;
  size_t segment = 0;  // steps[segment] <= batch <= steps[segment + 1]
  const int64_t first = (steps.front().batch + g - 1) / g * g;
  for (int64_t batch = first; batch <= std::min(steps.back().batch, limit); batch += g) {
    while (steps[segment].batch < batch && steps[segment + 1].batch <= batch) ++segment;
    const StepSample& low = steps[segment];
    if (low.batch == batch) {
      offer(batch, low.time_ms, static_cast<double>(low.peak_memory_bytes));
      continue;
    }
    const StepSample at = interpolate(low, steps[segment + 1], batch);
    offer(batch, at.time_ms, static_cast<double>(at.peak_memory_bytes));
  }
  return out;
}

// "a 128, b 256, c 0" for the first few devices.
std::string per_device_list(std::span<const DeviceProfile> devices, const std::vector<int64_t>& values) {
  std::string text;
  for (size_t d = 0; d < devices.size() && d < kListedDevices; ++d) {
    if (!text.empty()) text += ", ";
    text += devices[d].name + " " + std::to_string(values[d]);
  }
  if (devices.size() > kListedDevices) text += ", ...";
  return text;
}

// Why a device has no candidate at all.
std::string why_no_candidate(const DeviceProfile& device, int64_t global_batch, const BatchSplitOptions& options) {
  if (device.steps.empty()) return "it has no step measurements";
  const StepSample* smallest = nullptr;
  for (const StepSample& step : device.steps) {
    if (smallest == nullptr || step.peak_memory_bytes < smallest->peak_memory_bytes) smallest = &step;
  }
  // Interpolated memory lies between its neighbours' measurements, so the
  // smallest measurement bounds every candidate's.
  if (smallest->peak_memory_bytes > device.memory_capacity_bytes) {
    return "no measured batch fits its memory (batch " + std::to_string(smallest->batch) + " needs " +
           format_bytes(smallest->peak_memory_bytes) + ", it has " +
           format_bytes(device.memory_capacity_bytes) + ")";
  }
  const std::string multiples = "a multiple of " + std::to_string(options.granularity) + " up to " +
                                std::to_string(global_batch);
  if (options.candidates == CandidateSizes::kMeasured) {
    return "none of its measured sizes that fit in memory is " + multiples;
  }
  return "no size between its smallest and largest measured batch that is " + multiples + " fits in memory";
}

// The totals (in units of the granularity) reachable after one more device,
// given those reachable before it: the device takes one of its candidates
// no slower than `slowest_ms`, or nothing when it may be idle.
ReachableTotals add_device(const ReachableTotals& before, const std::vector<Candidate>& candidates,
                           int64_t granularity, double slowest_ms, bool may_be_idle) {
  ReachableTotals after = may_be_idle ? before : before.none();
  // Candidates ascend by batch; runs of consecutive units are added at once.
  int64_t low = -1, high = -1;
  for (const Candidate& c : candidates) {
    if (c.time_ms > slowest_ms) continue;
    const int64_t unit = c.batch / granularity;
    if (low >= 0 && unit == high + 1) {
      high = unit;
      continue;
    }
    if (low >= 0) before.add_shifted(low, high, after);
    low = high = unit;
  }
  if (low >= 0) before.add_shifted(low, high, after);
  return after;
}

constexpr double kAnyTime = std::numeric_limits<double>::infinity();

// Upper limit on the threshold search's tables (see solve_by_threshold_search).
constexpr double kMaxTableBytes = 1024.0 * 1024 * 1024;

// Throws InfeasibleError unless some choice of one candidate (or nothing,
// when allowed) per device adds up to global_batch exactly.
void check_reachable(std::span<const DeviceProfile> devices,
                     const std::vector<std::vector<Candidate>>& candidates, int64_t global_batch,
                     const BatchSplitOptions& options) {
  const int64_t g = options.granularity;
  const int64_t target = global_batch / g;
  // Up to twice the batch, so that the message can name the nearest total above.
  ReachableTotals totals(2 * target);
  for (const std::vector<Candidate>& device : candidates) {
    totals = add_device(totals, device, g, kAnyTime, options.allow_idle_devices);
  }
  if (totals.contains(target)) return;
  std::string nearest;
  for (int64_t u = target - 1; u >= 0 && nearest.empty(); --u) {
    if (totals.contains(u)) nearest = std::to_string(u * g);
  }
  for (int64_t u = target + 1; u <= totals.limit(); ++u) {
    if (totals.contains(u)) {
      nearest += (nearest.empty() ? "" : " and ") + std::to_string(u * g);
      break;
    }
  }
  throw InfeasibleError("batch " + std::to_string(global_batch) + " cannot be split over the " +
                        std::to_string(devices.size()) + " devices: no combination of their candidate " +
                        "sizes (multiples of " + std::to_string(g) + " that fit in memory) adds up to it" +
                        (nearest.empty() ? std::string() : "; the nearest totals are " + nearest));
}

// "fast 32, 64, 128; slow none" for the first few devices.
std::string per_device_sizes(std::span<const DeviceProfile> devices,
                             const std::vector<std::vector<Candidate>>& candidates) {
  std::string text;
  for (size_t d = 0; d < devices.size() && d < kListedDevices; ++d) {
    std::vector<int64_t> sizes;
    for (const Candidate& c : candidates[d]) sizes.push_back(c.batch);
    text += (text.empty() ? "" : "; ") + devices[d].name + " " +
            (sizes.empty() ? std::string("none") : common::format_list(sizes));
  }
  if (devices.size() > kListedDevices) text += "; ...";
  return text;
}

// Why the devices' largest candidates add up to less than the batch: their
// memory, or the sizes they were measured at (too small, or, for a batch
// below them, too large: a candidate is at most the batch).
std::string capacity_shortfall(std::span<const DeviceProfile> devices,
                               const std::vector<std::vector<Candidate>>& candidates,
                               const std::vector<int64_t>& largest, int64_t most, int64_t global_batch,
                               const BatchSplitOptions& options) {
  const std::string batch = "batch " + std::to_string(global_batch);
  const std::string multiple = "a multiple of " + std::to_string(options.granularity);
  std::vector<std::vector<Candidate>> fitting;  // candidates of any size
  int64_t fitting_most = 0;
  bool memory_bound = false;
  for (const DeviceProfile& device : devices) {
    fitting.push_back(candidates_of(device, std::numeric_limits<int64_t>::max(), options));
    if (!fitting.back().empty()) fitting_most += fitting.back().back().batch;
    for (const StepSample& step : device.steps) memory_bound |= step.peak_memory_bytes > device.memory_capacity_bytes;
  }
  if (fitting_most >= global_batch) {
    return batch + " does not fit the devices' candidate sizes: each device takes one size of at most " +
           std::to_string(global_batch) + " (" + multiple + " that fits its memory), and the largest add up to " +
           std::to_string(most) + " (" + per_device_list(devices, largest) + "); their sizes that fit memory are " +
           per_device_sizes(devices, fitting) + " (profile smaller per-device batches, profile.batches, or use a " +
           "larger batch)";
  }
  if (memory_bound) {
    return batch + " does not fit: the devices can hold at most " + std::to_string(most) +
           " samples together (largest batch per device that fits its memory, " + multiple + ": " +
           per_device_list(devices, largest) + ")";
  }
  return batch + " does not fit the devices' candidate sizes: the largest add up to " + std::to_string(most) + " (" +
         per_device_list(devices, largest) + "), and every measured size fits memory (profile larger per-device " +
         "batches, profile.batches, or use a smaller batch); the candidates are " +
         per_device_sizes(devices, candidates);
}

void check_capacity(std::span<const DeviceProfile> devices,
                    const std::vector<std::vector<Candidate>>& candidates, int64_t global_batch,
                    const BatchSplitOptions& options) {
  std::vector<int64_t> largest(devices.size(), 0), smallest(devices.size(), 0);
  int64_t most = 0, least = 0;
  for (size_t d = 0; d < devices.size(); ++d) {
    if (candidates[d].empty()) {
      if (!options.allow_idle_devices) {
        throw InfeasibleError("device " + devices[d].name + " cannot train (idle devices are not allowed): " +
                              why_no_candidate(devices[d], global_batch, options));
      }
      continue;
    }
    largest[d] = candidates[d].back().batch;
    smallest[d] = candidates[d].front().batch;
    most += largest[d];
    least += smallest[d];
  }
  if (most < global_batch) {
    throw InfeasibleError(capacity_shortfall(devices, candidates, largest, most, global_batch, options));
  }
  if (!options.allow_idle_devices && least > global_batch) {
    throw InfeasibleError("batch " + std::to_string(global_batch) + " is too small to give every device " +
                          "work: their smallest candidate sizes add up to " + std::to_string(least) + " (" +
                          per_device_list(devices, smallest) + ")");
  }
}

std::optional<double> even_split_time(const std::vector<std::vector<Candidate>>& candidates,
                                      int64_t global_batch, const BatchSplitOptions& options) {
  const auto n = static_cast<int64_t>(candidates.size());
  if (global_batch % n != 0) return std::nullopt;
  const int64_t share = global_batch / n;
  double slowest = 0;
  for (const std::vector<Candidate>& device : candidates) {
    const auto it = std::find_if(device.begin(), device.end(),
                                 [&](const Candidate& c) { return c.batch == share; });
    if (it == device.end()) return std::nullopt;  // also covers a share that is not a multiple of g
    slowest = std::max(slowest, it->step_ms());
  }
  return slowest + options.allreduce_ms;
}

double ideal_step_time(std::span<const DeviceProfile> devices,
                       const std::vector<std::vector<Candidate>>& candidates, int64_t global_batch,
                       const BatchSplitOptions& options) {
  double per_ms = 0;  // samples per ms of all devices together
  double exchange = std::numeric_limits<double>::infinity();
  for (size_t d = 0; d < devices.size(); ++d) {
    double best = 0;
    for (const Candidate& c : candidates[d]) {
      const double compute = c.compute_ms - devices[d].allreduce_ms;
      const double alone = options.input_aware ? std::max(compute, c.input_ms) : compute;
      if (alone > 0) best = std::max(best, static_cast<double>(c.batch) / alone);
    }
    per_ms += best;
    exchange = std::min(exchange, devices[d].allreduce_ms);
  }
  if (per_ms <= 0) return 0;
  return static_cast<double>(global_batch) / per_ms + exchange + options.allreduce_ms;
}

// A split of `target` units with every device within `best` ms, read back
// from the reachable-totals tables (tables[d]: totals of devices 0..d-1),
// last device first. Every choice that keeps the rest feasible is optimal; among those,
// each device takes the size nearest its share of what is left in
// proportion to the largest size it may take, so the slack below the step
// time is spread evenly instead of piling up on the first or last devices.
std::vector<int64_t> read_back_split(const std::vector<std::vector<Candidate>>& candidates,
                                     const std::vector<ReachableTotals>& tables, int64_t target,
                                     double best, const BatchSplitOptions& options) {
  const int64_t g = options.granularity;
  std::vector<int64_t> largest(candidates.size(), 0);
  int64_t largest_total = 0;
  for (size_t d = 0; d < candidates.size(); ++d) {
    for (const Candidate& c : candidates[d]) {
      if (c.time_ms <= best) largest[d] = std::max(largest[d], c.batch / g);
    }
    largest_total += largest[d];
  }
  std::vector<int64_t> batch(candidates.size(), 0);
  int64_t left = target;
  for (size_t d = candidates.size(); d-- > 0;) {
    const double share = largest_total > 0 ? static_cast<double>(left) * static_cast<double>(largest[d]) /
                                                 static_cast<double>(largest_total)
                                           : 0.0;
    largest_total -= largest[d];
    int64_t chosen = -1;
    auto consider = [&](int64_t unit) {
      if (unit > left || !tables[d].contains(left - unit)) return;
      const double distance = std::abs(static_cast<double>(unit) - share);
      const double chosen_distance = std::abs(static_cast<double>(chosen) - share);
      if (chosen < 0 || distance < chosen_distance || (distance == chosen_distance && unit > chosen)) chosen = unit;
    };
    if (options.allow_idle_devices) consider(0);
    for (const Candidate& c : candidates[d]) {
      if (c.time_ms <= best) consider(c.batch / g);
    }
    // tables[d + 1] contains `left`, so some choice keeps the rest feasible.
    batch[d] = chosen * g;
    left -= chosen;
  }
  return batch;
}

// The exact optimum without an ILP. The optimal step time T* is one of the
// candidates' times, and "is there a split with every device at most tau?"
// is a subset-sum question the reachable-totals table answers in a few
// bit-parallel passes. T* is the smallest candidate time for which the
// answer is yes (binary search: the answer only turns from no to yes as
// tau grows); the split is read back from the tables at T*.
std::vector<int64_t> solve_by_threshold_search(const std::vector<std::vector<Candidate>>& candidates,
                                               int64_t global_batch, const BatchSplitOptions& options) {
  const int64_t g = options.granularity;
  const int64_t target = global_batch / g;
  // One table per device is kept for the read-back; refuse sizes whose
  // tables would not fit comfortably in host memory.
  const double table_bytes = static_cast<double>(candidates.size() + 1) * static_cast<double>(target / 64 + 1) * 8;
  if (table_bytes > kMaxTableBytes) {
    throw BalancerError("batch split: batch " + std::to_string(global_batch) + " over " +
                        std::to_string(candidates.size()) + " devices at granularity " + std::to_string(g) +
                        " needs " + format_bytes(static_cast<uint64_t>(table_bytes)) +
                        " of subset-sum tables; use a coarser granularity");
  }
  auto tables_within = [&](double slowest_ms, bool keep_all) {
    std::vector<ReachableTotals> tables = {ReachableTotals(target)};
    for (const std::vector<Candidate>& device : candidates) {
      ReachableTotals next = add_device(tables.back(), device, g, slowest_ms, options.allow_idle_devices);
      if (keep_all) {
        tables.push_back(std::move(next));
      } else {
        tables.back() = std::move(next);
      }
    }
    return tables;
  };

  std::vector<double> times;
  for (const std::vector<Candidate>& device : candidates) {
    for (const Candidate& c : device) times.push_back(c.time_ms);
  }
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  // check_reachable has shown that the slowest time admits a split.
  size_t low = 0, high = times.size() - 1;
  while (low < high) {
    const size_t mid = low + (high - low) / 2;
    if (tables_within(times[mid], false).back().contains(target)) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  return read_back_split(candidates, tables_within(times[low], true), target, times[low], options);
}

// The paper's ILP as GLPK solves it, with a device's input as a second
// lower bound on T beside its compute (see batch_split.h). A reference:
// fine for a few dozen devices, minutes for hundreds (the min-max objective
// gives branch and bound a weak LP bound and many equivalent splits).
std::vector<int64_t> solve_with_glpk(std::span<const DeviceProfile> devices,
                                     const std::vector<std::vector<Candidate>>& candidates, int64_t global_batch,
                                     const BatchSplitOptions& options) {
  LpModel model("batch split");
  const int step_time = model.add_continuous(0, kUnbounded, 1.0);
  std::vector<std::vector<int>> columns(devices.size());
  std::vector<Term> batch_row;
  for (size_t d = 0; d < devices.size(); ++d) {
    if (candidates[d].empty()) continue;
    std::vector<Term> time_row = {{step_time, 1.0}};
    std::vector<Term> input_row = {{step_time, 1.0}};
    std::vector<Term> choice_row;
    for (const Candidate& c : candidates[d]) {
      const int x = model.add_binary(0);
      columns[d].push_back(x);
      time_row.push_back({x, -c.compute_ms});
      input_row.push_back({x, -c.input_ms});
      choice_row.push_back({x, 1.0});
      batch_row.push_back({x, static_cast<double>(c.batch)});
    }
    model.add_row("time_" + devices[d].name, RowSense::kGreaterEqual, 0, time_row);
    if (options.input_aware && devices[d].input_rate > 0) {
      model.add_row("input_" + devices[d].name, RowSense::kGreaterEqual, 0, input_row);
    }
    model.add_row("one_size_" + devices[d].name,
                  options.allow_idle_devices ? RowSense::kLessEqual : RowSense::kEqual, 1, choice_row);
  }
  model.add_row("global_batch", RowSense::kEqual, static_cast<double>(global_batch), batch_row);
  const MipSolution solution =
      model.solve("no split of batch " + std::to_string(global_batch) + " over the devices' candidate sizes exists",
                  SolveOptions{options.time_limit});
  std::vector<int64_t> batch(devices.size(), 0);
  int64_t total = 0;
  for (size_t d = 0; d < devices.size(); ++d) {
    for (size_t c = 0; c < columns[d].size(); ++c) {
      if (solution.values[columns[d][c]] > 0.5) batch[d] = candidates[d][c].batch;
    }
    total += batch[d];
  }
  if (total != global_batch) {
    throw BalancerError("batch split: GLPK's split adds up to " + std::to_string(total) + ", not " +
                        std::to_string(global_batch));
  }
  return batch;
}

// Each host's bound on the step (host_ms, see batch_split.h) at the
// split: the devices of a host whose bound exceeds their own step (less
// the exchange every step pays, which the decoding overlaps) are predicted
// at it and bind on its cores.
void apply_host_cores(std::span<const DeviceProfile> devices, const std::vector<std::vector<Candidate>>& candidates,
                      const BatchSplitOptions& options, BatchSplit& split) {
  std::map<int, double> host_ms;  // per host: the CPU time of its devices' steps over its cores
  for (size_t d = 0; d < devices.size(); ++d) {
    const HostShare& share = devices[d].host_share;
    if (share.host < 0 || split.batch[d] == 0) continue;
    if (!(share.cores > 0) || !std::isfinite(share.compute_cores) || share.compute_cores < 0 ||
        !std::isfinite(share.input_cpu_ms_per_image) || share.input_cpu_ms_per_image < 0) {
      throw BalancerError("device " + devices[d].name +
                          ": host share needs cores > 0 and finite non-negative compute cores and CPU time per image");
    }
    for (const Candidate& c : candidates[d]) {
      if (c.batch != split.batch[d]) continue;
      const double compute = c.compute_ms - devices[d].allreduce_ms;
      host_ms[share.host] += (share.compute_cores * compute +
                              static_cast<double>(c.batch) * share.input_cpu_ms_per_image) /
                             share.cores;
    }
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    const auto host = host_ms.find(devices[d].host_share.host);
    if (host == host_ms.end() || split.batch[d] == 0) continue;
    const double bound = host->second - options.allreduce_ms;
    if (bound > split.time_ms[d]) {
      split.time_ms[d] = bound;
      split.binding[d] = Binding::kCores;
    }
  }
}

}  // namespace

BatchSplit plan_batch_split(std::span<const DeviceProfile> devices, int64_t global_batch,
                            const BatchSplitOptions& options) {
  if (devices.empty()) throw BalancerError("batch split: no devices");
  if (global_batch < 1) throw BalancerError("batch split: batch " + std::to_string(global_batch) + " is not positive");
  if (options.granularity < 1) {
    throw BalancerError("batch split: granularity " + std::to_string(options.granularity) + " is not positive");
  }
  if (!std::isfinite(options.allreduce_ms) || options.allreduce_ms < 0) {
    throw BalancerError("batch split: allreduce time is not a finite non-negative number");
  }
  if (global_batch % options.granularity != 0) {
    throw InfeasibleError("batch " + std::to_string(global_batch) + " is not a multiple of the granularity " +
                          std::to_string(options.granularity));
  }

  std::vector<std::vector<Candidate>> candidates;
  candidates.reserve(devices.size());
  for (const DeviceProfile& device : devices) candidates.push_back(candidates_of(device, global_batch, options));
  check_capacity(devices, candidates, global_batch, options);
  check_reachable(devices, candidates, global_batch, options);

  const std::vector<int64_t> batch = options.solver == BatchSplitSolver::kGlpk
                                         ? solve_with_glpk(devices, candidates, global_batch, options)
                                         : solve_by_threshold_search(candidates, global_batch, options);
  BatchSplit split;
  split.batch = batch;
  split.time_ms.assign(devices.size(), 0);
  split.input_ms.assign(devices.size(), 0);
  split.binding.assign(devices.size(), Binding::kCompute);
  for (size_t d = 0; d < devices.size(); ++d) {
    if (batch[d] == 0) {
      split.idle_devices.push_back(devices[d].name);
      continue;
    }
    for (const Candidate& c : candidates[d]) {
      if (c.batch != batch[d]) continue;
      // What the device runs in, input included even when the split was
      // chosen without it.
      split.time_ms[d] = c.step_ms();
      split.input_ms[d] = input_ms(devices[d].input_rate, c.batch);
      if (c.input_ms > c.compute_ms) split.binding[d] = Binding::kInput;
    }
  }
  apply_host_cores(devices, candidates, options, split);
  split.step_time_ms = *std::max_element(split.time_ms.begin(), split.time_ms.end()) + options.allreduce_ms;
  split.even_split_time_ms = even_split_time(candidates, global_batch, options);
  split.ideal_step_time_ms = ideal_step_time(devices, candidates, global_batch, options);
  return split;
}

std::string join_batches(const std::vector<int64_t>& batches, char separator) {
  std::string text;
  for (int64_t b : batches) {
    if (!text.empty()) text += separator;
    text += std::to_string(b);
  }
  return text;
}

void make_monotone(std::vector<StepSample>& steps) {
  std::sort(steps.begin(), steps.end(),
            [](const StepSample& a, const StepSample& b) { return a.batch < b.batch; });
  struct Block {
    double sum = 0;
    size_t count = 0;
    double mean() const { return sum / static_cast<double>(count); }
  };
  std::vector<Block> blocks;  // pooled runs, means non-decreasing
  for (const StepSample& s : steps) {
    blocks.push_back({s.time_ms, 1});
    while (blocks.size() > 1 && blocks[blocks.size() - 2].mean() > blocks.back().mean()) {
      const Block last = blocks.back();
      blocks.pop_back();
      blocks.back().sum += last.sum;
      blocks.back().count += last.count;
    }
  }
  size_t at = 0;
  for (const Block& b : blocks) {
    for (size_t k = 0; k < b.count; ++k) steps[at++].time_ms = b.mean();
  }
}

std::optional<double> step_time_at(const DeviceProfile& device, int64_t batch) {
  const std::vector<StepSample> steps = sorted_samples(device);
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].batch == batch) return steps[i].time_ms;
    if (i + 1 < steps.size() && steps[i].batch < batch && batch < steps[i + 1].batch) {
      return interpolate(steps[i], steps[i + 1], batch).time_ms;
    }
  }
  return std::nullopt;
}

double input_ms(double input_rate, int64_t batch) {
  return input_rate > 0 ? 1e3 * static_cast<double>(batch) / input_rate : 0.0;
}

std::vector<int64_t> even_split(int64_t batch, int ranks) {
  std::vector<int64_t> split(static_cast<size_t>(ranks), batch / ranks);
  for (int64_t r = 0; r < batch % ranks; ++r) ++split[r];
  return split;
}

}  // namespace vtrain::balancer
