// Per-tensor memory plans: schedules with recomputation checked by symbolic
// execution, the timed simulator against hand-computed step times, and the
// planners against each other and the exact oracle.
#include <gtest/gtest.h>

#include <random>

#include "memory/memory_error.h"
#include "memory/planner.h"
#include "memory/simulator.h"
#include "memory/vdnn_plan.h"
#include "tests/memory_models.h"
#include "tests/test_support.h"

namespace vtrain::memory {
namespace {

using test_models::chain;
using test_models::check_schedule;
using test_models::fork_join;
using test_models::node;
using test_support::error_message;

// Costs in milliseconds: conv 2, fc 1, everything else 0.25 forward; every
// backward twice its forward; copies at `bandwidth` bytes per second.
StepCosts costs_for(const MemoryModel& m, double bandwidth = 8e6) {
  StepCosts c;
  for (const LayerNode& l : m.layers) {
    const double f = l.is_input ? 0 : l.is_conv ? 2e-3 : l.name == "fc" ? 1e-3 : 0.25e-3;
    c.forward_seconds.push_back(f);
    c.backward_seconds.push_back(2 * f);
  }
  c.loss_seconds = 0.1e-3;
  c.to_host_bytes_per_second = c.to_device_bytes_per_second = bandwidth;
  return c;
}

std::vector<TensorAction> random_actions(const MemoryModel& m, std::mt19937& rng) {
  const std::vector<bool> can = plannable(m);
  std::vector<TensorAction> actions(m.layers.size(), TensorAction::kKeep);
  for (size_t p = 0; p < can.size(); ++p) {
    if (can[p]) actions[p] = static_cast<TensorAction>(rng() % 3);
  }
  return actions;
}

double sum_of_calls(const StepCosts& c, const Schedule& s) {
  double total = 0;
  for (const ScheduleEvent& e : s.train) total += call_seconds(c, e);
  return total;
}

TEST(RecomputeSchedule, RandomPlansNeverTouchAReleasedTensor) {
  std::mt19937 rng(7);
  for (const MemoryModel& m : {chain(), fork_join()}) {
    for (int trial = 0; trial < 200; ++trial) {
      const Schedule s = planned_schedule(m, random_actions(m, rng));
      check_schedule(m, s, true);
      check_schedule(m, s, false);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(RecomputeSchedule, RecomputesEachReleasedTensorFromPresentAncestors) {
  const MemoryModel m = fork_join();
  std::vector<TensorAction> actions(m.layers.size(), TensorAction::kKeep);
  actions[3] = TensorAction::kRecompute;  // relu: read by b1's and b2pool's backward
  const Schedule s = planned_schedule(m, actions);
  // relu's input (bn, 2) has no backward reader: released in forward, so
  // recomputing relu re-runs bn first (from stem, which bn's backward keeps).
  std::vector<int> recomputed;
  for (const ScheduleEvent& e : s.train) {
    if (e.op == Op::kRecompute) recomputed.push_back(e.tensor.layer);
  }
  EXPECT_EQ(recomputed, (std::vector<int>{2, 3}));
  check_schedule(m, s, true);
}

TEST(RecomputeSchedule, ActionsOnlyApplyToPlannableTensors) {
  const MemoryModel m = chain();
  const std::vector<bool> can = plannable(m);
  EXPECT_FALSE(can[0]);                   // the data
  EXPECT_FALSE(can[m.layers.size() - 1]);  // the logits
  std::vector<TensorAction> actions(m.layers.size(), TensorAction::kKeep);
  actions[0] = TensorAction::kRecompute;
  const std::string data = error_message<MemoryError>([&] { planned_schedule(m, actions); });
  EXPECT_NE(data.find("'data' cannot be recomputed"), std::string::npos) << data;
  const std::string short_plan =
      error_message<MemoryError>([&] { planned_schedule(m, {TensorAction::kKeep}); });
  EXPECT_NE(short_plan.find("1 actions for 7"), std::string::npos) << short_plan;
}

TEST(RecomputeSchedule, OffloadActionsReproduceVdnn) {
  for (const MemoryModel& m : {chain(), fork_join()}) {
    for (Offload o : {Offload::kConv, Offload::kAll}) {
      const Schedule a = layer_wise_schedule(m, o);
      const Schedule b = planned_schedule(m, offload_actions(m, o));
      ASSERT_EQ(a.train.size(), b.train.size());
      for (size_t k = 0; k < a.train.size(); ++k) {
        EXPECT_EQ(a.train[k].op, b.train[k].op);
        EXPECT_EQ(a.train[k].tensor, b.train[k].tensor);
      }
    }
  }
}

// data, then `blocks` of conv and relu (no workspaces), pool, fc: the
// activations dominate the step's memory.
MemoryModel deep_chain(int blocks) {
  MemoryModel m;
  m.layers.push_back(node("data", {}, 4096, "input"));
  for (int b = 0; b < blocks; ++b) {
    const int at = static_cast<int>(m.layers.size());
    m.layers.push_back(node("conv" + std::to_string(b), {at - 1}, 16384, "conv"));
    m.layers.push_back(node("relu" + std::to_string(b), {at}, 16384, "relu"));
  }
  for (LayerNode& l : m.layers) l.forward_workspace = l.backward_workspace = 0;
  const int last = static_cast<int>(m.layers.size()) - 1;
  m.layers.push_back(node("pool", {last}, 4096, "pool"));
  m.layers.push_back(node("fc", {last + 1}, 256, "fc"));
  return m;
}

// A recomputed Y is rebuilt from the nearest present ancestor and kept
// until its last backward reader: without kept tensors in between, the
// first backward rebuilds everything (no saving); memonger's kept segment
// ends bound what is rebuilt at once.
TEST(RecomputeSchedule, SegmentsOfRecomputationLowerThePeak) {
  for (const MemoryModel& m : {deep_chain(9), deep_chain(16)}) {
    const std::vector<TensorAction> keep(m.layers.size(), TensorAction::kKeep);
    const StepCosts c = costs_for(m);
    const Simulation kept = simulate(m, planned_schedule(m, keep), 0, Planner::kPool);
    const MemoryPlan memonger = plan_memory(Policy::kMemonger, m, c, 0, Planner::kPool);
    EXPECT_LT(memonger.simulation.peak_bytes, kept.peak_bytes * 3 / 4);
    EXPECT_GT(memonger.simulation.timing.recompute_seconds, 0);
    check_schedule(m, memonger.schedule, true);
  }
}

// -------------------------------------------------------- timed simulator

// data -> a (conv) -> b (conv) -> c (fc): offloading a.y at b overlaps b's
// forward; prefetching it back overlaps c's backward (the window rule).
MemoryModel three_layers() {
  MemoryModel m;
  m.layers = {node("data", {}, 1000, "input"), node("a", {0}, 50000, "conv"),
              node("b", {1}, 1000, "conv"), node("fc", {2}, 100, "fc")};
  for (LayerNode& l : m.layers) l.forward_workspace = l.backward_workspace = 0;
  return m;
}

TEST(TimedSimulator, StepIsTheCallsPlusTheStallsCopiesCause) {
  const MemoryModel m = three_layers();
  StepCosts c = costs_for(m, 1e7);  // a.y: 50000 bytes = 5 ms each way
  std::vector<TensorAction> actions(m.layers.size(), TensorAction::kKeep);
  actions[1] = TensorAction::kOffload;
  const Simulation sim = simulate(m, planned_schedule(m, actions), 0, Planner::kPool, &c);
  ASSERT_TRUE(sim.timed);
  // Forward: the 5 ms copy overlaps b (2 ms): 3 ms stall. Backward: the
  // prefetch overlaps fc's backward (2 ms): 3 ms stall.
  const double calls = 2e-3 + 2e-3 + 1e-3 + 0.1e-3 + 2e-3 + 4e-3 + 4e-3;
  EXPECT_NEAR(sim.timing.compute_seconds, calls, 1e-12);
  EXPECT_NEAR(sim.timing.stall_seconds, 6e-3, 1e-12);
  EXPECT_NEAR(sim.timing.step_seconds, calls + 6e-3, 1e-12);
  EXPECT_NEAR(sim.timing.stall_per_tensor[1], 6e-3, 1e-12);
  EXPECT_NEAR(sim.timing.copy_seconds, 10e-3, 1e-12);
  // Fast copies hide completely.
  c.to_host_bytes_per_second = c.to_device_bytes_per_second = 1e12;
  const Simulation fast = simulate(m, planned_schedule(m, actions), 0, Planner::kPool, &c);
  EXPECT_NEAR(fast.timing.stall_seconds, 0, 1e-12);
  EXPECT_GT(fast.timing.mean_bytes, 0);
  EXPECT_LE(fast.timing.mean_bytes, static_cast<double>(fast.peak_bytes));
}

// Where the copies take the compute's cores (a CPU), the compute stream
// loses copy_compute_share of each copy's time: at 1 the copies run one
// after another with the calls and never stall a sync; at 0.5 each 5 ms
// copy costs compute 2.5 ms and then stalls it 0.5 ms.
TEST(TimedSimulator, CopiesOnTheComputesCoresCostTheirShareOfComputeTime) {
  const MemoryModel m = three_layers();
  StepCosts c = costs_for(m, 1e7);  // a.y: 5 ms each way
  std::vector<TensorAction> actions(m.layers.size(), TensorAction::kKeep);
  actions[1] = TensorAction::kOffload;
  const Schedule s = planned_schedule(m, actions);
  const double calls = 15.1e-3;
  c.copy_compute_share = 1;
  const Simulation serial = simulate(m, s, 0, Planner::kPool, &c);
  EXPECT_NEAR(serial.timing.compute_seconds, calls, 1e-12);
  EXPECT_NEAR(serial.timing.copy_contention_seconds, 10e-3, 1e-12);
  EXPECT_NEAR(serial.timing.stall_seconds, 0, 1e-12);
  EXPECT_NEAR(serial.timing.step_seconds, calls + 10e-3, 1e-12);
  EXPECT_NEAR(serial.timing.stall_per_tensor[1], 10e-3, 1e-12);  // a.y's copies' cost
  c.copy_compute_share = 0.5;
  const Simulation half = simulate(m, s, 0, Planner::kPool, &c);
  EXPECT_NEAR(half.timing.copy_contention_seconds, 5e-3, 1e-12);
  EXPECT_NEAR(half.timing.stall_seconds, 1e-3, 1e-12);
  EXPECT_NEAR(half.timing.step_seconds, calls + 6e-3, 1e-12);
  EXPECT_NEAR(half.timing.stall_per_tensor[1], 6e-3, 1e-12);
  // Keeping everything copies nothing: no share of anything.
  const Simulation kept = simulate(m, planned_schedule(m, std::vector<TensorAction>(
                                                             m.layers.size(), TensorAction::kKeep)),
                                   0, Planner::kPool, &c);
  EXPECT_NEAR(kept.timing.step_seconds, calls, 1e-12);
  c.copy_compute_share = 1.5;
  const std::string message =
      error_message<MemoryError>([&] { simulate(m, s, 0, Planner::kPool, &c); });
  EXPECT_NE(message.find("the copies' share of the compute must be in [0, 1], got 1.5"),
            std::string::npos)
      << message;
}

TEST(TimedSimulator, RecomputationCostsItsForwardCalls) {
  std::mt19937 rng(3);
  for (const MemoryModel& m : {chain(), fork_join()}) {
    const StepCosts c = costs_for(m, 1e15);
    for (int trial = 0; trial < 20; ++trial) {
      const Schedule s = planned_schedule(m, random_actions(m, rng));
      const Simulation sim = simulate(m, s, 0, Planner::kPool, &c);
      EXPECT_NEAR(sim.timing.compute_seconds + sim.timing.recompute_seconds, sum_of_calls(c, s),
                  1e-12);
      EXPECT_NEAR(sim.timing.step_seconds,
                  sim.timing.compute_seconds + sim.timing.recompute_seconds +
                      sim.timing.stall_seconds,
                  1e-12);
    }
  }
}

TEST(TimedSimulator, RefusesCostsOfTheWrongShape) {
  const MemoryModel m = chain();
  StepCosts c = costs_for(m);
  c.forward_seconds.pop_back();
  const std::string message = error_message<MemoryError>(
      [&] { simulate(m, make_schedule(m, Policy::kAll), 0, Planner::kPool, &c); });
  EXPECT_NE(message.find("6 forward and 7 backward times for 7 layers"), std::string::npos)
      << message;
}

// -------------------------------------------------------- planners

// Capacities from the all-keep layer-wise step down to the least: auto
// fits wherever the exact oracle does, is never slower than a baseline that
// fits, and is within 5% of the oracle.
TEST(TimedSimulator, TimeOutsideTheCallsAddsOncePerStep) {
  const MemoryModel m = three_layers();
  StepCosts c = costs_for(m, 1e7);
  std::vector<TensorAction> actions(m.layers.size(), TensorAction::kKeep);
  actions[1] = TensorAction::kOffload;
  const Schedule s = planned_schedule(m, actions);
  const Simulation without = simulate(m, s, 0, Planner::kPool, &c);
  c.other_seconds = 1.5e-3;
  const Simulation with = simulate(m, s, 0, Planner::kPool, &c);
  EXPECT_NEAR(with.timing.step_seconds, without.timing.step_seconds + 1.5e-3, 1e-12);
  EXPECT_EQ(with.timing.compute_seconds, without.timing.compute_seconds);
  EXPECT_EQ(with.timing.stall_seconds, without.timing.stall_seconds);
  c.other_seconds = -1e-3;
  const std::string message =
      error_message<MemoryError>([&] { simulate(m, s, 0, Planner::kPool, &c); });
  EXPECT_NE(message.find("outside layer calls must be >= 0"), std::string::npos) << message;
}

TEST(TimedSimulator, ScalingMultipliesComputeTimesNotBandwidths) {
  StepCosts c = costs_for(three_layers(), 1e7);
  c.other_seconds = 1e-3;
  const StepCosts d = scaled(c, 2.5);
  for (size_t i = 0; i < c.forward_seconds.size(); ++i) {
    EXPECT_DOUBLE_EQ(d.forward_seconds[i], 2.5 * c.forward_seconds[i]);
    EXPECT_DOUBLE_EQ(d.backward_seconds[i], 2.5 * c.backward_seconds[i]);
  }
  EXPECT_DOUBLE_EQ(d.loss_seconds, 2.5 * c.loss_seconds);
  EXPECT_DOUBLE_EQ(d.other_seconds, 2.5e-3);
  EXPECT_EQ(d.to_host_bytes_per_second, c.to_host_bytes_per_second);
  EXPECT_EQ(d.to_device_bytes_per_second, c.to_device_bytes_per_second);
}

TEST(Planner, AutoFitsAndBeatsEveryBaselineAndIsNearTheOracle) {
  for (const MemoryModel& m : {chain(), fork_join(), deep_chain(5)}) {
    for (double bandwidth : {4e6, 1e8}) {
      const StepCosts c = costs_for(m, bandwidth);
      const std::vector<TensorAction> keep(m.layers.size(), TensorAction::kKeep);
      const size_t most = simulate(m, planned_schedule(m, keep), 0, Planner::kPool).reservation;
      const size_t least = least_capacity(m);
      for (double fraction : {1.0, 0.75, 0.5, 0.25, 0.0}) {
        const size_t capacity = least + static_cast<size_t>(fraction * double(most - least));
        SCOPED_TRACE(std::to_string(m.layers.size()) + " layers at " + std::to_string(bandwidth) +
                     " B/s, capacity " + std::to_string(capacity));
        const std::optional<MemoryPlan> oracle = plan_oracle(m, c, capacity, Planner::kPool);
        ASSERT_TRUE(oracle.has_value());
        const std::optional<MemoryPlan> best =
            try_plan_memory(Policy::kAuto, m, c, capacity, Planner::kPool);
        ASSERT_TRUE(best.has_value());
        EXPECT_LE(best->simulation.reservation, capacity);
        for (Policy p : {Policy::kAll, Policy::kConv, Policy::kDyn, Policy::kMemonger,
                         Policy::kSuperNeurons, Policy::kTflms}) {
          if (auto other = try_plan_memory(p, m, c, capacity, Planner::kPool)) {
            EXPECT_LE(best->simulation.timing.step_seconds,
                      other->simulation.timing.step_seconds + 1e-12)
                << policy_name(p);
          }
        }
        EXPECT_LE(oracle->simulation.timing.step_seconds,
                  best->simulation.timing.step_seconds + 1e-12);
        EXPECT_LE(best->simulation.timing.step_seconds,
                  1.05 * oracle->simulation.timing.step_seconds);
      }
    }
  }
}

TEST(Planner, BaselinesTakeTheirNamedActions) {
  const MemoryModel m = fork_join();
  const StepCosts c = costs_for(m);
  const MemoryPlan memonger = plan_memory(Policy::kMemonger, m, c, 0, Planner::kPool);
  const MemoryPlan superneurons = plan_memory(Policy::kSuperNeurons, m, c, 0, Planner::kPool);
  const std::vector<bool> can = plannable(m);
  int kept = 0;
  for (size_t p = 0; p < can.size(); ++p) {
    EXPECT_NE(memonger.actions[p], TensorAction::kOffload);
    if (can[p] && memonger.actions[p] == TensorAction::kKeep) ++kept;
    if (!can[p]) continue;
    const TensorAction want = m.layers[p].is_conv ? TensorAction::kOffload
                              : m.layers[p].cheap  ? TensorAction::kRecompute
                                                   : TensorAction::kKeep;
    EXPECT_EQ(superneurons.actions[p], want) << m.layers[p].name;
  }
  EXPECT_GE(kept, 2);  // segment ends
}

TEST(Planner, TflmsOffloadsTheFewestLargestThatFit) {
  const MemoryModel m = fork_join();
  const StepCosts c = costs_for(m);
  const size_t none = simulate(m, planned_schedule(m, std::vector<TensorAction>(
                                                          m.layers.size(), TensorAction::kKeep)),
                               0, Planner::kPool)
                          .reservation;
  const MemoryPlan plan = plan_memory(Policy::kTflms, m, c, none - 4096, Planner::kPool);
  const PlanSummary s = summarize(m, plan);
  EXPECT_GE(s.offloaded, 1);
  EXPECT_EQ(s.recomputed, 0);
}

TEST(Planner, ACapacityNoPlanMeetsNamesTheTensorAndTheLeastCapacity) {
  const MemoryModel m = fork_join();
  const StepCosts c = costs_for(m);
  const size_t least = least_capacity(m);
  EXPECT_NO_THROW(plan_memory(Policy::kAuto, m, c, least, Planner::kPool));
  const std::string message = error_message<MemoryError>([&] {
    plan_memory(Policy::kAuto, m, c, least / 2, Planner::kPool);
  });
  EXPECT_NE(message.find("out of memory allocating '"), std::string::npos) << message;
  EXPECT_NE(message.find("the least capacity auto finds a plan for is "), std::string::npos)
      << message;
  EXPECT_NE(message.find(std::to_string(least) + " bytes"), std::string::npos) << message;
  EXPECT_THROW(plan_memory(Policy::kAuto, m, c, least / 2, Planner::kPool), OutOfMemoryError);
}

// Where auto fits is decided on sizes: whatever the step's costs (measured
// anew on every run, never twice alike), auto fits at the least capacity
// and not one byte below it, so a capacity fits on every run or on none.
TEST(Planner, WhereAutoFitsDoesNotDependOnTheCosts) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> factor(0.1, 10.0);
  for (const MemoryModel& m : {chain(), fork_join(), deep_chain(5), deep_chain(9)}) {
    const size_t least = least_capacity(m);
    for (int trial = 0; trial < 20; ++trial) {
      StepCosts c = costs_for(m, trial % 2 == 0 ? 4e6 : 1e9);
      for (double& t : c.forward_seconds) t *= factor(rng);
      for (double& t : c.backward_seconds) t *= factor(rng);
      SCOPED_TRACE(std::to_string(m.layers.size()) + " layers, trial " + std::to_string(trial));
      const std::optional<MemoryPlan> at = try_plan_memory(Policy::kAuto, m, c, least,
                                                           Planner::kPool);
      ASSERT_TRUE(at.has_value());
      EXPECT_LE(at->simulation.reservation, least);
      EXPECT_FALSE(try_plan_memory(Policy::kAuto, m, c, least - 1, Planner::kPool).has_value());
    }
  }
}

TEST(Planner, ReportListsEveryPlannableTensor) {
  const MemoryModel m = chain();
  const MemoryPlan plan = plan_memory(Policy::kMemonger, m, costs_for(m), 0, Planner::kPool);
  const std::string report = plan_report(m, plan);
  EXPECT_NE(report.find("memory plan: memonger"), std::string::npos) << report;
  EXPECT_NE(report.find("predicted step"), std::string::npos);
  EXPECT_NE(report.find("relu1.y"), std::string::npos);
  EXPECT_NE(report.find("recompute"), std::string::npos);
}

}  // namespace
}  // namespace vtrain::memory
