// The batch split and the solver beneath it: the LP wrapper's error
// handling, reachable totals and the split against brute force on small
// random instances, the GLPK reference against the fast solver, and the
// messages users see when a split is impossible. The workspace plans (WR,
// the Pareto fronts, WD) are in workspace_plan_test.cpp.
//
// Times in random instances are multiples of 1/8 ms, so sums are exact in
// floating point whatever the order of addition and results can be compared
// for equality.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "balancer/batch_split.h"
#include "balancer/internal/reachable_totals.h"
#include "balancer/lp_model.h"
#include "tests/balancer_random.h"
#include "tests/test_support.h"

namespace vtrain::balancer {
namespace {

using test::eighths;
using test::kMiB;
using test::uniform;
using test_support::error_message;
using test_support::TempDir;

// ================================================================ LpModel

TEST(LpModel, SolvesASmallIntegerProgramme) {
  // max x + y  s.t.  2x + 2y <= 7, x - y = 0 (as min -x - y): x = y = 1.
  LpModel model("small");
  const int x = model.add_integer(0, 10, -1);
  const int y = model.add_integer(0, 10, -1);
  model.add_row("capacity", RowSense::kLessEqual, 7, std::vector<Term>{{x, 2}, {y, 2}});
  model.add_row("equal", RowSense::kEqual, 0, std::vector<Term>{{x, 1}, {y, -1}});
  const MipSolution solution = model.solve("unused");
  EXPECT_DOUBLE_EQ(solution.objective, -2);
  EXPECT_NEAR(solution.values[x], 1, 1e-9);
  EXPECT_NEAR(solution.values[y], 1, 1e-9);
}

TEST(LpModel, MixesBinaryAndContinuousColumns) {
  // min t  s.t.  t >= 3 b1 + 5 b2, b1 + b2 = 1: t = 3 with b1.
  LpModel model("mixed");
  const int t = model.add_continuous(0, kUnbounded, 1);
  const int b1 = model.add_binary(0);
  const int b2 = model.add_binary(0);
  model.add_row("time", RowSense::kGreaterEqual, 0, std::vector<Term>{{t, 1}, {b1, -3}, {b2, -5}});
  model.add_row("one", RowSense::kEqual, 1, std::vector<Term>{{b1, 1}, {b2, 1}});
  const MipSolution solution = model.solve("unused");
  EXPECT_NEAR(solution.objective, 3, 1e-9);
  EXPECT_GT(solution.values[b1], 0.5);
  EXPECT_LT(solution.values[b2], 0.5);
}

TEST(LpModel, InfeasibleModelThrowsTheCallersMessage) {
  LpModel model("infeasible");
  const int x = model.add_binary(1);
  const int y = model.add_binary(1);
  model.add_row("too_much", RowSense::kGreaterEqual, 3, std::vector<Term>{{x, 1}, {y, 1}});
  const std::string message = error_message<InfeasibleError>([&] { model.solve("two bits cannot make 3"); });
  EXPECT_EQ(message, "two bits cannot make 3");
}

TEST(LpModel, UnboundedModelIsAnErrorButNotInfeasible) {
  LpModel model("unbounded");
  const int x = model.add_continuous(-kUnbounded, kUnbounded, 1);
  const int n = model.add_integer(0, 1, 0);
  model.add_row("loose", RowSense::kLessEqual, 5, std::vector<Term>{{x, 1}, {n, 1}});
  try {
    model.solve("unused");
    ADD_FAILURE() << "an unbounded model solved";
  } catch (const InfeasibleError& e) {
    ADD_FAILURE() << "unbounded reported as infeasible: " << e.what();
  } catch (const BalancerError& e) {
    EXPECT_CONTAINS(e.what(), "unbounded");
  }
}

TEST(LpModel, RejectsInvalidInputInsteadOfAborting) {
  LpModel model("invalid");
  const int x = model.add_binary(0);
  EXPECT_CONTAINS(error_message<BalancerError>([&] { model.add_row("r", RowSense::kEqual, 1, std::vector<Term>{{7, 1}}); }),
                  "names column 7 of 1");
  EXPECT_CONTAINS(
      error_message<BalancerError>([&] { model.add_row("r", RowSense::kEqual, 1, std::vector<Term>{{x, 1}, {x, 2}}); }),
      "twice");
  // A rejected row leaves no trace: the same column may be named again.
  model.add_row("ok", RowSense::kLessEqual, 1, std::vector<Term>{{x, 1}});
  EXPECT_EQ(model.row_count(), 1);
  EXPECT_CONTAINS(error_message<BalancerError>([&] { model.add_integer(2, 1, 0); }), "not an interval");
  EXPECT_CONTAINS(error_message<BalancerError>([&] { model.add_continuous(0, 1, std::nan("")); }), "not finite");
  EXPECT_CONTAINS(error_message<BalancerError>(
                      [&] { model.add_row("r", RowSense::kEqual, kUnbounded, std::vector<Term>{{x, 1}}); }),
                  "non-finite");
  LpModel empty("empty");
  EXPECT_CONTAINS(error_message<BalancerError>([&] { empty.solve("unused"); }), "no columns");
}

TEST(LpModel, MovesAndWritesAnLpFile) {
  LpModel original("moved");
  const int x = original.add_integer(0, 4, -1);
  original.add_row("cap_row", RowSense::kLessEqual, 2.5, std::vector<Term>{{x, 1}});
  LpModel model = std::move(original);
  EXPECT_NEAR(model.solve("unused").values[x], 2, 1e-9);

  TempDir dir;
  const std::string path = (std::filesystem::path(dir.path()) / "model.lp").string();
  model.write_lp(path);
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_CONTAINS(text.str(), "cap_row");
  EXPECT_CONTAINS(error_message<BalancerError>([&] { model.write_lp("/nonexistent-dir/x.lp"); }), "cannot write");
}

TEST(LpModel, TimeLimitIsAnError) {
  // Even coefficients cannot add up to an odd total, but branch and bound
  // only finds out by enumerating: far more than 50 ms for 40 columns.
  std::mt19937 rng(3);
  LpModel model("hard");
  std::vector<Term> row;
  for (int i = 0; i < 40; ++i) row.push_back({model.add_binary(0), 2.0 * uniform(rng, 100000, 999999)});
  model.add_row("odd", RowSense::kEqual, 2 * 7000001.0 + 1, row);
  try {
    model.solve("no odd total", SolveOptions{std::chrono::milliseconds(50)});
    ADD_FAILURE() << "solved";
  } catch (const InfeasibleError&) {
    GTEST_SKIP() << "GLPK proved infeasibility within the limit; the limit path is not exercised";
  } catch (const BalancerError& e) {
    EXPECT_CONTAINS(e.what(), "time limit of 50 ms");
  }
}

// ========================================================== reachable totals

TEST(ReachableTotals, MatchesNaiveSubsetSums) {
  std::mt19937 rng(11);
  for (int seed = 0; seed < 200; ++seed) {
    const int limit = uniform(rng, 0, 300);
    internal::ReachableTotals totals(limit);
    std::set<int> naive = {0};
    const int devices = uniform(rng, 1, 4);
    for (int device = 0; device < devices; ++device) {
      const bool idle = uniform(rng, 0, 1) == 1;
      internal::ReachableTotals next = idle ? totals : totals.none();
      std::set<int> naive_next = idle ? naive : std::set<int>{};
      const int runs = uniform(rng, 0, 3);
      for (int run = 0; run < runs; ++run) {
        const int low = uniform(rng, 0, 150), high = low + uniform(rng, 0, 90);
        totals.add_shifted(low, high, next);
        for (int t : naive) {
          for (int s = low; s <= high; ++s) {
            if (t + s <= limit) naive_next.insert(t + s);
          }
        }
      }
      totals = next;
      naive = naive_next;
    }
    for (int t = -1; t <= limit + 1; ++t) {
      ASSERT_EQ(totals.contains(t), naive.count(t) == 1) << "seed " << seed << " total " << t;
    }
    EXPECT_EQ(totals.empty(), naive.empty());
  }
}

// ================================================================ batch split

struct TestCandidate {
  int64_t batch;
  double time_ms;   // what the split is chosen on
  double step_ms;   // what the device runs in: compute and input
};

// Candidates the way batch_split.h documents them, written independently.
std::vector<TestCandidate> expected_candidates(const DeviceProfile& device, int64_t global_batch,
                                               const BatchSplitOptions& options) {
  std::vector<StepSample> steps = device.steps;
  std::sort(steps.begin(), steps.end(), [](const StepSample& a, const StepSample& b) { return a.batch < b.batch; });
  std::vector<TestCandidate> out;
  const int64_t g = options.granularity;
  for (int64_t b = g; b <= global_batch; b += g) {
    std::optional<std::pair<double, double>> point;  // time, memory
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].batch == b) point = {steps[i].time_ms, static_cast<double>(steps[i].peak_memory_bytes)};
    }
    if (!point && options.candidates == CandidateSizes::kInterpolated) {
      for (size_t i = 0; i + 1 < steps.size(); ++i) {
        if (steps[i].batch < b && b < steps[i + 1].batch) {
          const double f = double(b - steps[i].batch) / double(steps[i + 1].batch - steps[i].batch);
          const double m0 = double(steps[i].peak_memory_bytes), m1 = double(steps[i + 1].peak_memory_bytes);
          point = {steps[i].time_ms + f * (steps[i + 1].time_ms - steps[i].time_ms), std::ceil(m0 + f * (m1 - m0))};
        }
      }
    }
    if (point && point->second <= double(device.memory_capacity_bytes)) {
      // Input decoded ahead overlaps compute: the slower of the two sets the step.
      const double compute = point->first + device.allreduce_ms;
      // The exchange every step pays overlaps the input too.
      const double input =
          device.input_rate > 0 ? std::max(0.0, 1000.0 * double(b) / device.input_rate - options.allreduce_ms) : 0.0;
      out.push_back({b, options.input_aware ? std::max(compute, input) : compute, std::max(compute, input)});
    }
  }
  return out;
}

// The optimal step time over every assignment; nullopt when none adds up.
std::optional<double> brute_force_split(const std::vector<std::vector<TestCandidate>>& candidates,
                                        int64_t global_batch, const BatchSplitOptions& options) {
  std::optional<double> best;
  std::function<void(size_t, int64_t, double)> visit = [&](size_t d, int64_t total, double slowest) {
    if (total > global_batch) return;
    if (d == candidates.size()) {
      if (total == global_batch && (!best || slowest < *best)) best = slowest;
      return;
    }
    if (options.allow_idle_devices) visit(d + 1, total, slowest);
    for (const TestCandidate& c : candidates[d]) visit(d + 1, total + c.batch, std::max(slowest, c.time_ms));
  };
  visit(0, 0, 0.0);
  if (best) *best += options.allreduce_ms;
  return best;
}

DeviceProfile random_device(std::mt19937& rng, int index) {
  DeviceProfile device;
  device.name = "dev" + std::to_string(index);
  const double fixed = eighths(rng, 1, 20), per_sample = eighths(rng, 0, 4) + 0.125;
  const uint64_t base = uniform(rng, 100, 400) * kMiB, per_sample_memory = uniform(rng, 5, 30) * kMiB;
  std::set<int64_t> sizes;
  const int count = uniform(rng, 3, 5);
  while (static_cast<int>(sizes.size()) < count) sizes.insert(uniform(rng, 1, 16) * 2);
  for (int64_t b : sizes) {
    // Mostly rising with the batch, sometimes not (measurement noise).
    device.steps.push_back({b, fixed + per_sample * double(b) + eighths(rng, 0, 3), base + per_sample_memory * b});
  }
  device.memory_capacity_bytes = base + per_sample_memory * uniform(rng, 4, 40);
  device.allreduce_ms = uniform(rng, 0, 3) == 0 ? eighths(rng, 0, 4) : 0;
  // Half the devices read input at a rate that binds at some sizes: an
  // input time per sample near the compute's.
  if (uniform(rng, 0, 1) == 1) device.input_rate = 1000.0 / (eighths(rng, 0, 5) + 0.125);
  return device;
}

// Checks a split against the candidates it must come from.
void expect_valid_split(const BatchSplit& split, const std::vector<DeviceProfile>& devices,
                        const std::vector<std::vector<TestCandidate>>& candidates, int64_t global_batch,
                        const BatchSplitOptions& options) {
  ASSERT_EQ(split.batch.size(), devices.size());
  int64_t total = 0;
  double slowest = 0;
  std::vector<std::string> idle;
  for (size_t d = 0; d < devices.size(); ++d) {
    total += split.batch[d];
    if (split.batch[d] == 0) {
      EXPECT_TRUE(options.allow_idle_devices);
      EXPECT_EQ(split.time_ms[d], 0);
      idle.push_back(devices[d].name);
      continue;
    }
    const auto it = std::find_if(candidates[d].begin(), candidates[d].end(),
                                 [&](const TestCandidate& c) { return c.batch == split.batch[d]; });
    ASSERT_NE(it, candidates[d].end()) << devices[d].name << " got " << split.batch[d] << ", not a candidate";
    EXPECT_NEAR(split.time_ms[d], it->step_ms, 1e-9);
    slowest = std::max(slowest, split.time_ms[d]);
  }
  EXPECT_EQ(total, global_batch);
  EXPECT_NEAR(split.step_time_ms, slowest + options.allreduce_ms, 1e-9);
  EXPECT_EQ(split.idle_devices, idle);
}

void check_split_against_brute_force(BatchSplitSolver solver, uint32_t first_seed, int seeds) {
  int solved = 0, infeasible = 0;
  for (uint32_t seed = first_seed; seed < first_seed + seeds; ++seed) {
    std::mt19937 rng(seed);
    std::vector<DeviceProfile> devices;
    const int count = uniform(rng, 2, 4);
    for (int d = 0; d < count; ++d) devices.push_back(random_device(rng, d));
    BatchSplitOptions options;
    options.solver = solver;
    options.granularity = std::vector<int64_t>{1, 2, 4}[uniform(rng, 0, 2)];
    options.candidates = uniform(rng, 0, 1) ? CandidateSizes::kInterpolated : CandidateSizes::kMeasured;
    options.allow_idle_devices = uniform(rng, 0, 3) != 0;
    options.allreduce_ms = uniform(rng, 0, 1) ? eighths(rng, 0, 5) : 0;
    options.input_aware = uniform(rng, 0, 3) != 0;
    const int64_t global_batch = options.granularity * uniform(rng, 1, 80 / static_cast<int>(options.granularity));
    std::vector<std::vector<TestCandidate>> candidates;
    for (const DeviceProfile& device : devices) candidates.push_back(expected_candidates(device, global_batch, options));
    const std::optional<double> best = brute_force_split(candidates, global_batch, options);
    SCOPED_TRACE("seed " + std::to_string(seed) + ", batch " + std::to_string(global_batch));
    if (!best) {
      error_message<InfeasibleError>([&] { plan_batch_split(devices, global_batch, options); });
      ++infeasible;
      continue;
    }
    const BatchSplit split = plan_batch_split(devices, global_batch, options);
    // Optimal for what it was chosen on (compute and input, or compute alone).
    double chosen_on = 0;
    for (size_t d = 0; d < devices.size(); ++d) {
      for (const TestCandidate& c : candidates[d]) {
        if (split.batch[d] > 0 && c.batch == split.batch[d]) chosen_on = std::max(chosen_on, c.time_ms);
      }
    }
    EXPECT_NEAR(chosen_on + options.allreduce_ms, *best, 1e-9);
    if (options.input_aware) {
      EXPECT_NEAR(split.step_time_ms, *best, 1e-9);
      EXPECT_LE(split.ideal_step_time_ms, split.step_time_ms + 1e-9);  // a bound
    }
    EXPECT_GT(split.ideal_step_time_ms, 0);
    expect_valid_split(split, devices, candidates, global_batch, options);
    ++solved;
  }
  // The generator must exercise both outcomes.
  EXPECT_GT(solved, seeds / 4);
  EXPECT_GT(infeasible, seeds / 20);
}

TEST(BatchSplit, ThresholdSearchMatchesBruteForce) {
  check_split_against_brute_force(BatchSplitSolver::kThresholdSearch, 1, 600);
}

TEST(BatchSplit, GlpkMatchesBruteForce) { check_split_against_brute_force(BatchSplitSolver::kGlpk, 1001, 300); }

TEST(BatchSplit, SolversAgreeOnLargerClusters) {
  for (uint32_t seed = 0; seed < 30; ++seed) {
    std::mt19937 rng(seed);
    std::vector<DeviceProfile> devices;
    for (int d = 0; d < 10; ++d) devices.push_back(random_device(rng, d));
    BatchSplitOptions options;
    options.granularity = 2;
    const int64_t global_batch = 2 * uniform(rng, 40, 120);
    std::optional<double> fast, reference;
    try {
      fast = plan_batch_split(devices, global_batch, options).step_time_ms;
    } catch (const InfeasibleError&) {
    }
    options.solver = BatchSplitSolver::kGlpk;
    try {
      reference = plan_batch_split(devices, global_batch, options).step_time_ms;
    } catch (const InfeasibleError&) {
    }
    ASSERT_EQ(fast.has_value(), reference.has_value()) << "seed " << seed;
    if (fast) {
      EXPECT_NEAR(*fast, *reference, 1e-9) << "seed " << seed;
    }
  }
}

// Two devices measured at 32, 64, 128: `fast` takes 1 ms per sample, `slow`
// 3 ms; both hold any of them.
std::vector<DeviceProfile> two_devices() {
  DeviceProfile fast{"fast", {}, 64 * kMiB, 0};
  DeviceProfile slow{"slow", {}, 64 * kMiB, 0};
  for (int64_t b : {32, 64, 128}) {
    fast.steps.push_back({b, 1.0 * double(b), uint64_t(b) * 256 * 1024});
    slow.steps.push_back({b, 3.0 * double(b), uint64_t(b) * 256 * 1024});
  }
  return {fast, slow};
}

TEST(BatchSplit, BeatsTheEvenSplitAndReportsIt) {
  const std::vector<DeviceProfile> devices = two_devices();
  const BatchSplit split = plan_batch_split(devices, 128, {});
  // Even: 64 each, the slow one takes 192 ms. Best measured: 128 on fast.
  EXPECT_EQ(split.batch, (std::vector<int64_t>{128, 0}));
  EXPECT_DOUBLE_EQ(split.step_time_ms, 128);
  ASSERT_TRUE(split.even_split_time_ms.has_value());
  EXPECT_DOUBLE_EQ(*split.even_split_time_ms, 192);
  EXPECT_EQ(split.idle_devices, std::vector<std::string>{"slow"});

  // Interpolated at granularity 8: 96 + 32 gives max(96, 96) = 96 ms.
  BatchSplitOptions interpolated;
  interpolated.candidates = CandidateSizes::kInterpolated;
  interpolated.granularity = 8;
  const BatchSplit finer = plan_batch_split(devices, 128, interpolated);
  EXPECT_EQ(finer.batch, (std::vector<int64_t>{96, 32}));
  EXPECT_DOUBLE_EQ(finer.step_time_ms, 96);
  EXPECT_TRUE(finer.idle_devices.empty());
}

// Isotonic regression of a step-time curve against known answers: adjacent
// violators pooled into their mean, the rest untouched, sorted by batch.
TEST(BatchSplit, MakeMonotonePoolsAdjacentViolators) {
  const auto times = [](std::vector<StepSample> steps) {
    make_monotone(steps);
    std::vector<std::pair<int64_t, double>> out;
    for (const StepSample& s : steps) out.emplace_back(s.batch, s.time_ms);
    return out;
  };
  using Curve = std::vector<std::pair<int64_t, double>>;
  EXPECT_EQ(times({{4, 5, 0}, {8, 12, 0}, {12, 10, 0}, {16, 14, 0}}),
            (Curve{{4, 5}, {8, 11}, {12, 11}, {16, 14}}));
  EXPECT_EQ(times({{16, 14, 0}, {4, 5, 0}, {12, 10, 0}, {8, 12, 0}}),
            (Curve{{4, 5}, {8, 11}, {12, 11}, {16, 14}}));
  EXPECT_EQ(times({{1, 1, 0}, {2, 2, 0}, {3, 3, 0}}), (Curve{{1, 1}, {2, 2}, {3, 3}}));
  EXPECT_EQ(times({{1, 3, 0}, {2, 2, 0}, {3, 1, 0}}), (Curve{{1, 2}, {2, 2}, {3, 2}}));
  // A late violation pulls back across an earlier pool.
  EXPECT_EQ(times({{1, 1, 0}, {2, 4, 0}, {3, 2, 0}, {4, 0, 0}}),
            (Curve{{1, 1}, {2, 2}, {3, 2}, {4, 2}}));
  EXPECT_TRUE(times({}).empty());
  // Two identical devices whose one profile read t(12) < t(8): uneven
  // splits no longer beat the even one.
  DeviceProfile noisy{"a", {{4, 5, 0}, {8, 12, 0}, {12, 10, 0}, {16, 14, 0}}};
  EXPECT_LT(plan_batch_split(std::vector<DeviceProfile>{noisy, noisy}, 16, {}).step_time_ms, 12);
  make_monotone(noisy.steps);
  const BatchSplit split = plan_batch_split(std::vector<DeviceProfile>{noisy, noisy}, 16, {});
  EXPECT_DOUBLE_EQ(split.step_time_ms, 11);
  EXPECT_EQ(split.batch, (std::vector<int64_t>{8, 8}));  // of equal steps, the solver keeps this
}

TEST(BatchSplit, TheIdealBoundSumsEachDevicesBestThroughput) {
  std::vector<DeviceProfile> devices = two_devices();
  // 1 and 1/3 samples per ms: 128 samples in 96 ms at best.
  EXPECT_DOUBLE_EQ(plan_batch_split(devices, 128, {}).ideal_step_time_ms, 96);
  // A device's best is its best candidate, not its last: the slow one
  // does 64 in 100 ms (0.64 per ms) but 128 in 384.
  devices[1].steps = {{32, 80, 0}, {64, 100, 0}, {128, 384, 0}};
  EXPECT_DOUBLE_EQ(plan_batch_split(devices, 128, {}).ideal_step_time_ms, 128 / 1.64);
  // Exposed exchange: the constant and the least per-device allreduce.
  devices[0].allreduce_ms = 7;
  devices[1].allreduce_ms = 3;
  BatchSplitOptions options;
  options.allreduce_ms = 5;
  EXPECT_DOUBLE_EQ(plan_batch_split(devices, 128, options).ideal_step_time_ms, 128 / 1.64 + 8);
}

TEST(BatchSplit, EvenSplitIsAbsentWhenNotRepresentable) {
  const std::vector<DeviceProfile> devices = two_devices();
  // 96 / 2 = 48 was not measured.
  EXPECT_FALSE(plan_batch_split(devices, 96, {}).even_split_time_ms.has_value());
  // 3 devices do not divide 128.
  std::vector<DeviceProfile> three = devices;
  three.push_back(devices[0]);
  three.back().name = "fast2";
  EXPECT_FALSE(plan_batch_split(three, 128, {}).even_split_time_ms.has_value());
  // 64 each is measured but does not fit the slow device's memory.
  std::vector<DeviceProfile> small = devices;
  small[1].memory_capacity_bytes = 10 * kMiB;
  EXPECT_FALSE(plan_batch_split(small, 128, {}).even_split_time_ms.has_value());
}

TEST(BatchSplit, CandidatesThatDoNotFitMemoryAreNeverChosen) {
  std::vector<DeviceProfile> devices = two_devices();
  // The fast device can hold 32 samples (8 MiB) but not 64 (16 MiB).
  devices[0].memory_capacity_bytes = 12 * kMiB;
  const BatchSplit split = plan_batch_split(devices, 96, {});
  EXPECT_EQ(split.batch, (std::vector<int64_t>{32, 64}));
  EXPECT_DOUBLE_EQ(split.step_time_ms, 192);
}

TEST(BatchSplit, AllreduceTimesAreAdded) {
  std::vector<DeviceProfile> devices = two_devices();
  devices[0].allreduce_ms = 100;  // the fast device sits behind a slow link
  BatchSplitOptions options;
  options.allreduce_ms = 5;
  const BatchSplit split = plan_batch_split(devices, 128, options);
  // 128 on fast: 228; 64 + 64: max(164, 192) = 192; 32 fast + 96: not
  // measured. So 64 + 64, plus the constant 5.
  EXPECT_EQ(split.batch, (std::vector<int64_t>{64, 64}));
  EXPECT_DOUBLE_EQ(split.time_ms[0], 164);
  EXPECT_DOUBLE_EQ(split.step_time_ms, 197);
  EXPECT_DOUBLE_EQ(*split.even_split_time_ms, 197);
}

TEST(BatchSplit, WithoutIdleDevicesEveryDeviceTrains) {
  const std::vector<DeviceProfile> devices = two_devices();
  BatchSplitOptions options;
  options.allow_idle_devices = false;
  const BatchSplit split = plan_batch_split(devices, 160, options);
  EXPECT_EQ(split.batch, (std::vector<int64_t>{128, 32}));
  EXPECT_TRUE(split.idle_devices.empty());
}

TEST(BatchSplit, TooLargeABatchSaysWhatTheDevicesHold) {
  std::vector<DeviceProfile> devices = two_devices();
  devices[1].memory_capacity_bytes = 20 * kMiB;  // 64 samples need 16 MiB, 128 need 32
  const std::string message = error_message<InfeasibleError>([&] { plan_batch_split(devices, 256, {}); });
  EXPECT_CONTAINS(message, "batch 256 does not fit: the devices can hold at most 192 samples");
  EXPECT_CONTAINS(message, "fast 128, slow 64");
}

TEST(BatchSplit, BatchBelowTheMeasuredSizesNamesTheCandidates) {
  // Both fit 4 and 8 in memory; candidates above the batch are left out.
  DeviceProfile a{"a", {{4, 4.0, kMiB}, {8, 8.0, 2 * kMiB}}, 64 * kMiB, 0};
  DeviceProfile b{"b", {{8, 8.0, 2 * kMiB}}, 64 * kMiB, 0};
  const std::vector<DeviceProfile> devices = {a, b};
  const std::string message = error_message<InfeasibleError>([&] { plan_batch_split(devices, 5, {}); });
  EXPECT_EQ(message,
            "batch 5 does not fit the devices' candidate sizes: each device takes one size of at most 5 (a "
            "multiple of 1 that fits its memory), and the largest add up to 4 (a 4, b 0); their sizes that "
            "fit memory are a 4, 8; b 8 (profile smaller per-device batches, profile.batches, or use a larger "
            "batch)");
  EXPECT_EQ(message.find("can hold"), std::string::npos) << "blames memory: " << message;
}

TEST(BatchSplit, BatchAboveTheMeasuredSizesSaysSo) {
  // Memory holds every measured size: the measurements are what is too small.
  const std::string message = error_message<InfeasibleError>([] { plan_batch_split(two_devices(), 512, {}); });
  EXPECT_EQ(message,
            "batch 512 does not fit the devices' candidate sizes: the largest add up to 256 (fast 128, slow "
            "128), and every measured size fits memory (profile larger per-device batches, profile.batches, or "
            "use a smaller batch); the candidates are fast 32, 64, 128; slow 32, 64, 128");
}

TEST(BatchSplit, UnreachableTotalsNameTheNearestOnes) {
  const std::vector<DeviceProfile> devices = two_devices();
  const std::string message = error_message<InfeasibleError>([&] { plan_batch_split(devices, 200, {}); });
  EXPECT_CONTAINS(message, "no combination of their candidate sizes");
  EXPECT_CONTAINS(message, "the nearest totals are 192 and 256");
  BatchSplitOptions coarse;
  coarse.granularity = 64;
  EXPECT_CONTAINS(error_message<InfeasibleError>([&] { plan_batch_split(devices, 100, coarse); }),
                  "batch 100 is not a multiple of the granularity 64");
}

TEST(BatchSplit, DevicesThatCannotTrainAreExplained) {
  std::vector<DeviceProfile> devices = two_devices();
  devices[1].memory_capacity_bytes = 1 * kMiB;
  BatchSplitOptions options;
  options.allow_idle_devices = false;
  EXPECT_CONTAINS(error_message<InfeasibleError>([&] { plan_batch_split(devices, 64, options); }),
                  "device slow cannot train (idle devices are not allowed): no measured batch fits its memory "
                  "(batch 32 needs 8 MiB, it has 1 MiB)");
  // Allowed to idle, the slow device simply does not train.
  options.allow_idle_devices = true;
  EXPECT_EQ(plan_batch_split(devices, 64, options).idle_devices, std::vector<std::string>{"slow"});
  // Too small a batch for every device to get its smallest size.
  options.allow_idle_devices = false;
  EXPECT_CONTAINS(error_message<InfeasibleError>([&] { plan_batch_split(two_devices(), 32, options); }),
                  "batch 32 is too small to give every device work: their smallest candidate sizes add up to 64");
}

TEST(BatchSplit, RejectsMalformedInput) {
  std::vector<DeviceProfile> devices = two_devices();
  EXPECT_CONTAINS(error_message<BalancerError>([&] { plan_batch_split({}, 64, {}); }), "no devices");
  EXPECT_CONTAINS(error_message<BalancerError>([&] { plan_batch_split(devices, 0, {}); }), "not positive");
  devices[0].steps.push_back(devices[0].steps[0]);
  EXPECT_CONTAINS(error_message<BalancerError>([&] { plan_batch_split(devices, 64, {}); }),
                  "device fast: step at batch 32: measured twice");
  devices = two_devices();
  devices[1].steps[0].time_ms = -1;
  EXPECT_CONTAINS(error_message<BalancerError>([&] { plan_batch_split(devices, 64, {}); }), "finite non-negative");
}

// Two devices of equal compute (1 ms a sample, measured at 16..112); the
// second one's input delivers 500 images/s (2 ms a sample), decoded ahead.
std::vector<DeviceProfile> equal_compute_slow_input() {
  std::vector<DeviceProfile> devices(2);
  for (size_t d = 0; d < 2; ++d) {
    devices[d].name = d == 0 ? "fed" : "starved";
    devices[d].memory_capacity_bytes = 64 * kMiB;
    for (int64_t b = 16; b <= 112; b += 16) devices[d].steps.push_back({b, double(b), uint64_t(b) * kMiB / 4});
  }
  devices[1].input_rate = 500;
  return devices;
}

// The input tests' options: granularity 16, the split chosen on compute
// alone (balance.input_aware: false).
BatchSplitOptions compute_only(BatchSplitSolver solver) {
  BatchSplitOptions options;
  options.solver = solver;
  options.granularity = 16;
  options.input_aware = false;
  return options;
}

// Devices that share a host's cores (HostShare) cannot run faster than
// the CPU time their compute and decoding need together over those cores:
// the split's prediction says so, and those devices bind on "cores".
TEST(BatchSplit, DevicesSharingAHostsCoresArePredictedAtTheirCpuTime) {
  std::vector<DeviceProfile> devices = equal_compute_slow_input();
  // Both on one host of 2 cores, 1 compute core each; the starved one's
  // decoding costs 4 ms of CPU a sample (2 threads at 500 images/s), the
  // other's is in memory.
  for (DeviceProfile& d : devices) d.host_share = {.host = 0, .cores = 2, .compute_cores = 1};
  devices[1].host_share.input_cpu_ms_per_image = 4;
  for (BatchSplitSolver solver : {BatchSplitSolver::kThresholdSearch, BatchSplitSolver::kGlpk}) {
    BatchSplitOptions options = compute_only(solver);
    // 64 + 64: compute 64 ms each, decoding 256 ms of CPU: (64 + 64 + 256) / 2.
    const BatchSplit blind = plan_batch_split(devices, 128, options);
    ASSERT_EQ(blind.batch, (std::vector<int64_t>{64, 64}));
    EXPECT_DOUBLE_EQ(blind.step_time_ms, 192);
    EXPECT_EQ(blind.binding, (std::vector<Binding>{Binding::kCores, Binding::kCores}));
    // The exchange every step pays: decoding overlaps it, so the bound is
    // on the whole step.
    options.allreduce_ms = 10;
    EXPECT_DOUBLE_EQ(plan_batch_split(devices, 128, options).step_time_ms, 192);
    // Where the cores suffice (the starved one on a host of its own with 4
    // cores: (64 + 256) / 4 = 80 ms), nothing changes.
    devices[1].host_share.host = 1;
    devices[1].host_share.cores = 4;
    options.allreduce_ms = 0;
    const BatchSplit apart = plan_batch_split(devices, 128, options);
    EXPECT_DOUBLE_EQ(apart.step_time_ms, 128);
    EXPECT_EQ(apart.binding, (std::vector<Binding>{Binding::kCompute, Binding::kInput}));
    devices[1].host_share.host = 0;
    devices[1].host_share.cores = 2;
  }
  devices[0].host_share.cores = 0;
  EXPECT_CONTAINS(error_message<BalancerError>([&] { plan_batch_split(devices, 128, {}); }), "cores > 0");
}

TEST(BatchSplit, InputThatBindsMovesWorkAwayFromTheDevice) {
  const std::vector<DeviceProfile> devices = equal_compute_slow_input();
  for (BatchSplitSolver solver : {BatchSplitSolver::kThresholdSearch, BatchSplitSolver::kGlpk}) {
    // Compute alone sees two equal devices: 64 + 64, and the starved one
    // then waits 128 ms for its input.
    BatchSplitOptions options = compute_only(solver);
    const BatchSplit blind = plan_batch_split(devices, 128, options);
    EXPECT_EQ(blind.batch, (std::vector<int64_t>{64, 64}));
    EXPECT_DOUBLE_EQ(blind.step_time_ms, 128);
    EXPECT_DOUBLE_EQ(blind.input_ms[1], 128);
    EXPECT_EQ(blind.binding, (std::vector<Binding>{Binding::kCompute, Binding::kInput}));
    // Input-aware: the starved device takes less (32 or 48: 96 ms either way).
    options.input_aware = true;
    const BatchSplit aware = plan_batch_split(devices, 128, options);
    EXPECT_LT(aware.batch[1], 64);
    EXPECT_DOUBLE_EQ(aware.step_time_ms, 96);
    EXPECT_EQ(aware.binding[1], Binding::kInput);
    EXPECT_DOUBLE_EQ(aware.input_ms[0], 0);  // unlimited input
    // Decoding overlaps the exchange every step pays: 64 + 64 with 10 ms of
    // it takes max(64 + 10, 128) ms, not 128 + 10.
    options.input_aware = false;
    options.allreduce_ms = 10;
    EXPECT_DOUBLE_EQ(plan_batch_split(devices, 128, options).step_time_ms, 128);
  }
}

TEST(BatchSplit, RejectsAMalformedInputRate) {
  std::vector<DeviceProfile> devices = equal_compute_slow_input();
  devices[1].input_rate = -1;
  EXPECT_EQ(error_message<BalancerError>([&] { plan_batch_split(devices, 64, {}); }),
            "device starved: input rate is not a finite non-negative number of images/s");
}

TEST(BatchSplit, SpreadsSlackInsteadOfIdlingDevices) {
  // Eight identical devices, interpolated at granularity 1: 200 samples fit
  // as 25 each; every device must train and no device may exceed 25.
  std::vector<DeviceProfile> devices;
  for (int d = 0; d < 8; ++d) {
    devices.push_back({"device", {{1, 1, 1 * kMiB}, {64, 64, 64 * kMiB}}, 1024 * kMiB, 0});
    devices.back().name += std::to_string(d);
  }
  BatchSplitOptions options;
  options.candidates = CandidateSizes::kInterpolated;
  const BatchSplit split = plan_batch_split(devices, 196, options);
  EXPECT_DOUBLE_EQ(split.step_time_ms, 25);  // ceil(196 / 8)
  for (int64_t b : split.batch) EXPECT_GE(b, 24);
  EXPECT_TRUE(split.idle_devices.empty());
}

}  // namespace
}  // namespace vtrain::balancer
