// Online re-balancing's parts on their own: the drift detector fed
// sequences, the re-solve on scaled curves, the proposal riding on the
// step's allreduce (summed here by hand, as the allreduce would).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "worker/train/drift_detector.h"
#include "worker/train/job_shape.h"
#include "worker/train/rebalancer.h"

namespace vtrain::worker {
namespace {

// Steps of two ranks with ratios a and b, until the detector fires; the
// step it fired at (1-based), or 0 if it never did.
int64_t fires_at(DriftDetector& d, const std::vector<std::pair<double, double>>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    const double ratios[] = {steps[i].first, steps[i].second};
    if (d.add(ratios)) return static_cast<int64_t>(i) + 1;
  }
  return 0;
}

TEST(DriftDetector, FiresAfterPatienceStepsWithAFullWindow) {
  DriftDetector d(/*window=*/5, /*patience=*/3, /*threshold=*/0.25);
  // Rank 1 is 2x off from the start: the window fills at step 5, the drift
  // is above the threshold at steps 5, 6, 7.
  EXPECT_EQ(fires_at(d, std::vector<std::pair<double, double>>(20, {1.0, 2.0})), 7);
  EXPECT_NEAR(d.drift(), 1.0, 1e-12);
  EXPECT_EQ(d.medians(), (std::vector<double>{1.0, 2.0}));
}

TEST(DriftDetector, ASlowdownCountsOnceItHoldsHalfTheWindow) {
  DriftDetector d(5, 3, 0.25);
  std::vector<std::pair<double, double>> steps(10, {1.0, 1.0});
  steps.resize(30, {1.0, 2.0});  // rank 1 2x slower from step 11
  // The median turns at the 3rd slow step (13), then 3 steps of patience.
  EXPECT_EQ(fires_at(d, steps), 15);
}

TEST(DriftDetector, OutliersAndNoiseNeverFire) {
  DriftDetector d(15, 5, 0.25);
  std::mt19937 rng(3);
  std::normal_distribution<double> noise(1.0, 0.05);
  std::vector<std::pair<double, double>> steps;
  for (int i = 0; i < 10000; ++i) {
    // 5% noise on both, and one step in 10 a rank is 5x slower (a core taken).
    steps.emplace_back(noise(rng) * (i % 10 == 3 ? 5 : 1), noise(rng) * (i % 10 == 7 ? 5 : 1));
  }
  EXPECT_EQ(fires_at(d, steps), 0) << "drift " << d.drift();
}

TEST(DriftDetector, AUniformChangeIsNoDrift) {
  DriftDetector d(5, 2, 0.25);
  std::vector<std::pair<double, double>> steps(10, {1.0, 1.1});
  steps.resize(40, {3.0, 3.3});  // both 3x slower: the best split is where it was
  EXPECT_EQ(fires_at(d, steps), 0);
}

TEST(DriftDetector, IdleRanksAreLeftOutAndAShortBurstResetsPatience) {
  DriftDetector d(3, 3, 0.25);
  // Rank 1 idle (0) throughout, rank 0 varies: no spread over one rank.
  EXPECT_EQ(fires_at(d, std::vector<std::pair<double, double>>(10, {5.0, 0.0})), 0);
  d.reset();
  // Bursts of 2 slow steps: the median is above for 2 steps each time, then
  // back, so patience 3 is never reached.
  std::vector<std::pair<double, double>> steps;
  for (int burst = 0; burst < 10; ++burst) {
    steps.insert(steps.end(), {{1, 1}, {1, 1}, {1, 1}, {1, 2}, {1, 2}});
  }
  EXPECT_EQ(fires_at(d, steps), 0);
}

TEST(DriftDetector, RejectsBadSettingsAndRankCounts) {
  EXPECT_THROW(DriftDetector(0, 1, 0.1), std::invalid_argument);
  EXPECT_THROW(DriftDetector(1, 0, 0.1), std::invalid_argument);
  EXPECT_THROW(DriftDetector(1, 1, 0.0), std::invalid_argument);
  DriftDetector d(2, 1, 0.1);
  const double two[] = {1, 1}, three[] = {1, 1, 1};
  d.add(two);
  EXPECT_THROW(d.add(three), std::invalid_argument);
}

// Step time linear in the batch: t = per_sample * b, measured at 8..48.
balancer::DeviceProfile linear_device(const char* name, double per_sample_ms) {
  balancer::DeviceProfile p;
  p.name = name;
  p.memory_capacity_bytes = 1 << 30;
  for (int64_t b = 8; b <= 48; b += 8) p.steps.push_back({b, per_sample_ms * b, 1000});
  return p;
}

TEST(ResolveSplit, AHalvedDeviceGetsFewerSamples) {
  std::vector<balancer::DeviceProfile> devices{linear_device("a", 1), linear_device("b", 1)};
  balancer::BatchSplitOptions options;
  options.granularity = 8;
  options.candidates = balancer::CandidateSizes::kInterpolated;
  const std::vector<int64_t> current{24, 24};
  const double ratios[] = {1.0, 2.0};
  const Resolved r = resolve_split(devices, ratios, current, 48, options);
  EXPECT_EQ(r.split.batch, (std::vector<int64_t>{32, 16}));
  EXPECT_DOUBLE_EQ(r.previous_ms, 48);  // b at 24 samples, 2x
  EXPECT_DOUBLE_EQ(r.split.step_time_ms, 32);
  EXPECT_DOUBLE_EQ(devices[1].steps.front().time_ms, 16) << "scaled in place";
}

// Two ranks' sides of the protocol, the allreduce done by hand: rank 0
// calibrates on the first window, then detects rank 1's slowdown, proposes
// a split in the next step's slots, and both switch at the same step.
TEST(Rebalancer, RankZeroDecidesAndEveryRankSwitchesAtTheSameStep) {
  RebalanceOptions o;
  o.settings.window = 3;
  o.settings.patience = 2;
  o.profiles = {linear_device("a", 1), linear_device("b", 1)};
  o.split_options.granularity = 8;
  Rebalancer zero(o, 0, 2, 48), one({}, 1, 2, 48);
  EXPECT_TRUE(zero.deciding());
  EXPECT_FALSE(one.deciding());
  std::vector<int64_t> split{24, 24};
  int64_t switched_at = -1;
  for (int64_t step = 0; step < 30 && switched_at < 0; ++step) {
    // Training runs at half the profiled times; rank 1 2x slower from step 6.
    const double t0 = 12, t1 = step >= 6 ? 24 : 12;
    std::vector<double> a, b;
    zero.contribute(t0, 0, a);
    one.contribute(t1, 0, b);
    ASSERT_EQ(a.size(), 8u);  // per rank: compute, probe, proposal, input wait
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    const auto s0 = zero.after_step(a, split, step);
    const auto s1 = one.after_step(a, split, step);
    EXPECT_EQ(zero.compute_ms(), (std::vector<double>{t0, t1}));
    ASSERT_EQ(s0.has_value(), s1.has_value()) << "step " << step;
    if (step == 2) {
      EXPECT_NE(zero.take_note().find("calibrated"), std::string::npos);
    }
    if (!s0) continue;
    EXPECT_EQ(s0->split, s1->split);
    EXPECT_EQ(s0->split, (std::vector<int64_t>{32, 16}));
    EXPECT_NE(s0->reason.find("drifted"), std::string::npos) << s0->reason;
    EXPECT_EQ(s0->previous, split);
    EXPECT_TRUE(s1->previous.empty()) << "only rank 0 knows why";
    switched_at = step;
  }
  // The median turns at step 7, patience 2: decided at 8, switched at 9.
  EXPECT_EQ(switched_at, 9);
}

// Two ranks where rank 1 has no samples and times a probe every step
// (`probe_ms(step)`); rank 0 trains its 48 as predicted. The step (0-based)
// after which both switched, or -1; the switch in *out.
int64_t run_with_idle_rank(const std::function<double(int64_t)>& probe_ms, int64_t steps,
                           SplitSwitch* out) {
  RebalanceOptions o;
  o.settings.window = 3;
  o.settings.patience = 2;
  o.settings.probe_every = 1;
  o.profiles = {linear_device("a", 1), linear_device("b", 1)};
  o.split_options.granularity = 8;
  RebalanceOptions others;  // the settings only: other ranks have no curves
  others.settings = o.settings;
  Rebalancer zero(o, 0, 2, 48), one(others, 1, 2, 48);
  const std::vector<int64_t> split{48, 0};
  for (int64_t step = 0; step < steps; ++step) {
    EXPECT_TRUE(one.probes_at(step));
    std::vector<double> a, b;
    zero.contribute(48, 0, a);
    one.contribute(0.5, probe_ms(step), b);  // an idle rank's compute time means nothing
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    const auto s0 = zero.after_step(a, split, step);
    const auto s1 = one.after_step(a, split, step);
    EXPECT_EQ(s0.has_value(), s1.has_value()) << "step " << step;
    if (!s0 || !s1) continue;
    EXPECT_EQ(s0->split, s1->split);
    *out = *s0;
    return step;
  }
  return -1;
}

// A rank that went idle while slow (its probes take 30 ms) speeds up 3x at
// step 10: the median of its last three probes turns at step 11, rank 0
// scales its curve by 1/3 and re-solves, and both switch a step later with
// samples for rank 1 again.
TEST(Rebalancer, AnIdleRankThatSpeedsUpGetsSamplesBack) {
  SplitSwitch s;
  const int64_t at = run_with_idle_rank([](int64_t step) { return step < 10 ? 30.0 : 10.0; }, 40, &s);
  EXPECT_EQ(at, 12);
  ASSERT_EQ(s.split.size(), 2u);
  EXPECT_GT(s.split[1], 0);
  EXPECT_EQ(s.split[0] + s.split[1], 48);
  EXPECT_NE(s.reason.find("rank 1's probes got 3.00x faster"), std::string::npos) << s.reason;
  EXPECT_NEAR(s.ratios[1], 1.0 / 3, 1e-12);
  EXPECT_NE(describe_switch(s, at + 1).find(s.reason), std::string::npos);
}

// Probes that scatter +-15% around one speed (and a single fast outlier)
// give no rank back its samples.
TEST(Rebalancer, NoisyProbesOfAnIdleRankChangeNothing) {
  SplitSwitch s;
  const auto noisy = [](int64_t step) {
    if (step == 20) return 5.0;  // one probe the OS favoured
    return 30.0 * (1 + 0.15 * std::sin(static_cast<double>(step) * 1.7));
  };
  EXPECT_EQ(run_with_idle_rank(noisy, 200, &s), -1) << s.reason;
}

// Probes are the job's: off at probe_every 0, for one rank, or when
// re-balancing is off.
TEST(Rebalancer, ProbesFollowTheSettings) {
  RebalanceOptions o;
  o.settings.probe_every = 5;
  EXPECT_TRUE(Rebalancer(o, 1, 2, 48).probes_at(10));
  EXPECT_FALSE(Rebalancer(o, 1, 2, 48).probes_at(11));
  EXPECT_FALSE(Rebalancer(o, 0, 1, 48).probes_at(10));
  o.settings.probe_every = 0;
  EXPECT_FALSE(Rebalancer(o, 1, 2, 48).probes_at(10));
  o.settings.probe_every = 5;
  o.settings.enabled = false;
  EXPECT_FALSE(Rebalancer(o, 1, 2, 48).probes_at(10));
}

// A rank's network is built for max(its batch, its evaluation chunk): the
// chunk must not exceed the batch the split chose for it (a memory-limited
// device would run out of memory), and a rank without samples builds for
// one sample when the job does not evaluate.
TEST(JobShape, EvaluationChunksNeverOutgrowTheTrainingBatch) {
  JobShape job;
  job.ranks = 3;
  job.batch = 96;
  for (int rank = 0; rank < 3; ++rank) {
    job.rank = rank;
    const JobShape shaped = with_split(job, {0, 32, 64});
    EXPECT_EQ(shaped.eval_chunk, rank == 0 ? 64 : shaped.my_batch);
  }
  job.rank = 0;
  job.evaluates = false;
  EXPECT_EQ(with_split(job, {0, 32, 64}).eval_chunk, 1);
}

}  // namespace
}  // namespace vtrain::worker
