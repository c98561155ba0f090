// Per-tensor memory plans in the engine: recomputing, offloading and
// keeping activations under explicit plans and under every planner gives
// bit-identical weights and batch-norm running statistics to policy none,
// with released memory poisoned; recomputation lowers the measured peak;
// recompute calls are labelled in the timeline and the trace.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "memory/chrome_trace.h"
#include "memory/memory_error.h"
#include "memory/planner.h"
#include "memory/vdnn_plan.h"
#include "tests/engine_runs.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"

namespace vtrain::memory {
namespace {

using test_support::bitwise_equal;
using test_support::error_message;
using test_support::TrainRun;

// `action` for every plannable tensor, kKeep elsewhere.
std::vector<TensorAction> every(const MemoryModel& m, TensorAction action) {
  const std::vector<bool> can = plannable(m);
  std::vector<TensorAction> actions(m.layers.size(), TensorAction::kKeep);
  for (size_t l = 0; l < actions.size(); ++l) {
    if (can[l]) actions[l] = action;
  }
  return actions;
}

// `cycle` repeated over the plannable tensors, kKeep elsewhere.
std::vector<TensorAction> cycling(const MemoryModel& m, const std::vector<TensorAction>& cycle) {
  const std::vector<bool> can = plannable(m);
  std::vector<TensorAction> actions(m.layers.size(), TensorAction::kKeep);
  size_t k = 0;
  for (size_t l = 0; l < actions.size(); ++l) {
    if (can[l]) actions[l] = cycle[k++ % cycle.size()];
  }
  return actions;
}

int count(const std::vector<TensorAction>& actions, TensorAction action) {
  return static_cast<int>(std::count(actions.begin(), actions.end(), action));
}

// Made-up but plausible costs: time grows with the bytes a layer writes,
// convolutions cost more per byte than the cheap layers, copies run at
// 1 GB/s each way.
StepCosts synthetic_costs(const MemoryModel& m) {
  StepCosts c;
  for (const LayerNode& l : m.layers) {
    const double per_byte = l.is_input ? 0 : l.cheap ? 1e-10 : 1e-9;
    c.forward_seconds.push_back(per_byte * static_cast<double>(l.output_bytes));
    c.backward_seconds.push_back(2 * per_byte * static_cast<double>(l.output_bytes));
  }
  c.loss_seconds = 1e-6;
  c.to_host_bytes_per_second = c.to_device_bytes_per_second = 1e9;
  return c;
}

struct Preset {
  const char* name;
  int64_t side;
};

class RecomputeTest : public ::testing::TestWithParam<Preset> {
 protected:
  void SetUp() override {
    // One thread: the runs stay fast on a machine busy with other work.
    backend_ = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
    graph_.emplace(test_support::preset_graph(GetParam().name, GetParam().side));
    // The model every policy plans over (conv algorithms fixed: "direct").
    model_ = worker::Network(*graph_, *backend_, options()).memory_model();
    // Policy none's run, once per preset (the tests compare against it).
    static std::map<std::string, TrainRun> bases;
    auto [at, first] = bases.try_emplace(GetParam().name);
    if (first) at->second = train(options(Policy::kNone));
    base_ = at->second;
    for (float v : base_.params) ASSERT_TRUE(std::isfinite(v));
  }

  worker::NetworkOptions options(Policy policy = Policy::kNone) const {
    worker::NetworkOptions o;
    o.max_batch = 4;
    o.conv_algorithm = "direct";
    o.memory_policy = policy;
    o.poison_freed = policy != Policy::kNone;  // a read after release turns into NaN
    return o;
  }
  worker::NetworkOptions explicit_plan(const std::vector<TensorAction>& actions) const {
    worker::NetworkOptions o = options(Policy::kNone);
    o.memory_actions = actions;
    o.poison_freed = true;
    return o;
  }
  TrainRun train(const worker::NetworkOptions& o) {
    return test_support::train_steps(*backend_, *graph_, o);
  }
  void expect_same_numbers(const TrainRun& run, const std::string& what) const {
    EXPECT_TRUE(bitwise_equal(base_.params, run.params)) << what << ": weights differ";
    EXPECT_TRUE(bitwise_equal(base_.buffers, run.buffers)) << what << ": running statistics differ";
  }

  std::unique_ptr<worker::Backend> backend_;
  std::optional<worker::Graph> graph_;
  MemoryModel model_;
  TrainRun base_;  // policy none
};

TEST_P(RecomputeTest, ExplicitPlansTrainToBitIdenticalWeights) {
  const std::vector<std::pair<std::string, std::vector<TensorAction>>> plans = {
      {"recompute every tensor", every(model_, TensorAction::kRecompute)},
      {"offload every tensor", every(model_, TensorAction::kOffload)},
      {"keep / offload / recompute",
       cycling(model_, {TensorAction::kKeep, TensorAction::kOffload, TensorAction::kRecompute})}};
  for (const auto& [what, actions] : plans) {
    SCOPED_TRACE(what);
    ASSERT_GT(count(actions, TensorAction::kKeep), 0);  // the data and the logits at least
    ASSERT_LT(count(actions, TensorAction::kKeep), static_cast<int>(actions.size()));
    const TrainRun run = train(explicit_plan(actions));
    expect_same_numbers(run, what);
    EXPECT_EQ(run.stats.policy, "explicit");
    EXPECT_LT(run.stats.reservation, base_.stats.reservation);
    EXPECT_EQ(run.stats.predicted_peak, run.stats.step_peak);
    EXPECT_EQ(run.stats.predicted_step_seconds, 0.0);  // no costs given: untimed
    EXPECT_EQ(run.stats.offloaded_bytes > 0, count(actions, TensorAction::kOffload) > 0);
  }
}

// Each planner halfway between the least capacity any plan fits and what
// keeping every tensor needs (memonger's and superneurons' plans do not
// depend on the capacity: at their own reservation when that is more), in
// any case below what policy none needs.
TEST_P(RecomputeTest, EveryPlannerTrainsToBitIdenticalWeightsUnderATightCapacity) {
  const StepCosts costs = synthetic_costs(model_);
  const size_t keep_all =
      evaluate_plan("keep", every(model_, TensorAction::kKeep), model_, &costs, 0, Planner::kPool)
          .simulation.reservation;
  const size_t least = least_capacity(model_);
  ASSERT_LT(least, keep_all);
  ASSERT_LT(keep_all, base_.stats.reservation);
  const size_t tight = least + (keep_all - least) / 2;
  for (Policy policy : {Policy::kMemonger, Policy::kSuperNeurons, Policy::kTflms, Policy::kAuto}) {
    SCOPED_TRACE(policy_name(policy));
    size_t capacity = tight;
    std::optional<MemoryPlan> plan = try_plan_memory(policy, model_, costs, tight, Planner::kPool);
    if (!plan) {
      plan = plan_memory(policy, model_, costs, 0, Planner::kPool);
      capacity = plan->simulation.reservation;
    }
    ASSERT_LT(capacity, base_.stats.reservation);
    ASSERT_GT(count(plan->actions, TensorAction::kKeep), 0);
    ASSERT_LT(count(plan->actions, TensorAction::kKeep), static_cast<int>(plan->actions.size()));
    worker::NetworkOptions o = options(policy);
    o.memory_capacity = capacity;
    o.memory_costs = costs;
    const TrainRun run = train(o);
    expect_same_numbers(run, policy_name(policy));
    EXPECT_EQ(run.stats.policy.rfind(policy_name(policy), 0), 0u) << run.stats.policy;
    EXPECT_LE(run.stats.reservation, capacity);
    EXPECT_GT(run.stats.predicted_step_seconds, 0.0);
    EXPECT_EQ(run.stats.predicted_peak, run.stats.step_peak);
  }
}

// Recomputing every other tensor from the one kept before it releases
// activations in forward: the pool's measured peak drops below keeping
// them all (layer-wise), and the simulated peak predicts the measured one.
TEST_P(RecomputeTest, RecomputingLowersTheMeasuredPeakAsPredicted) {
  worker::NetworkOptions keep = explicit_plan(every(model_, TensorAction::kKeep));
  worker::NetworkOptions recompute =
      explicit_plan(cycling(model_, {TensorAction::kKeep, TensorAction::kRecompute}));
  keep.poison_freed = recompute.poison_freed = false;
  const TrainRun kept = train(keep);
  const TrainRun recomputed = train(recompute);
  EXPECT_LT(recomputed.stats.step_peak, kept.stats.step_peak);
  // The simulator replays the pool's placement: the prediction is exact.
  EXPECT_EQ(kept.stats.predicted_peak, kept.stats.step_peak);
  EXPECT_EQ(recomputed.stats.predicted_peak, recomputed.stats.step_peak);
}

TEST_P(RecomputeTest, RecomputeCallsAreLabelledInTheTimelineAndTrace) {
  worker::Network net(*graph_, *backend_, explicit_plan(every(model_, TensorAction::kRecompute)));
  const MemoryPlan* plan = net.memory_plan();
  ASSERT_NE(plan, nullptr);
  std::string recomputed;  // the first layer the step recomputes
  for (const ScheduleEvent& e : plan->schedule.train) {
    if (e.op == Op::kRecompute) {
      recomputed = model_.layers[e.tensor.layer].name;
      break;
    }
  }
  ASSERT_FALSE(recomputed.empty());
  ChromeTrace trace(0, "rank 0");
  const std::string json = test_support::traced_step(*backend_, net, trace);
  EXPECT_CONTAINS(json, "\"cat\":\"recompute\"");
  EXPECT_CONTAINS(json, recomputed + " recompute");
  bool in_timeline = false;
  for (const TimelineSample& s : net.memory_timeline()) {
    in_timeline = in_timeline || s.label == recomputed + " recompute";
  }
  EXPECT_TRUE(in_timeline) << recomputed + " recompute";
}

INSTANTIATE_TEST_SUITE_P(Presets, RecomputeTest,
                         ::testing::Values(Preset{"vgg-small", 16}, Preset{"googlenet", 8},
                                           Preset{"resnet18", 8}),
                         [](const auto& info) {
                           std::string name = info.param.name;
                           std::erase(name, '-');
                           return name;
                         });

// ------------------------------------------------------------ options

class PlanOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  }
  worker::NetworkOptions options(Policy policy) const {
    worker::NetworkOptions o;
    o.max_batch = 2;
    o.conv_algorithm = "direct";
    o.memory_policy = policy;
    return o;
  }
  std::unique_ptr<worker::Backend> backend_;
  worker::Graph graph_ = test_support::preset_graph("vgg-small", 16);
};

TEST_F(PlanOptionsTest, PlanOfTheWrongLengthIsAClearError) {
  worker::NetworkOptions o = options(Policy::kNone);
  o.memory_actions = {TensorAction::kKeep, TensorAction::kRecompute};
  const std::string msg = error_message<std::invalid_argument>(
      [&] { worker::Network net(graph_, *backend_, o); });
  EXPECT_CONTAINS(msg, "NetworkOptions.memory_actions: 2 actions for the " +
                           std::to_string(graph_.size()) + " layers");
  o = options(Policy::kAuto);
  o.memory_costs.forward_seconds = {1.0};
  const std::string costs = error_message<std::invalid_argument>(
      [&] { worker::Network net(graph_, *backend_, o); });
  EXPECT_CONTAINS(costs, "NetworkOptions.memory_costs: 1 forward and 0 backward times");
}

TEST_F(PlanOptionsTest, ACapacityNoPlanMeetsIsAClearError) {
  worker::NetworkOptions o = options(Policy::kAuto);
  o.memory_capacity = 64 << 10;
  o.memory_costs =
      synthetic_costs(worker::Network(graph_, *backend_, options(Policy::kNone)).memory_model());
  const std::string msg = error_message<OutOfMemoryError>(
      [&] { worker::Network net(graph_, *backend_, o); });
  EXPECT_CONTAINS(msg, "memory.policy auto: no plan fits 64.0 KiB");
  EXPECT_CONTAINS(msg, "out of memory allocating '");
  EXPECT_CONTAINS(msg, "the least capacity auto finds a plan for is ");
  EXPECT_CONTAINS(msg, "; memory capacity 64.0 KiB");
}

// Without memory_costs a per-tensor planner measures them on this device
// (binding the layers' parameters and state to buffers of its own for the
// while): the plan is timed and training after it gives policy none's
// numbers.
TEST_F(PlanOptionsTest, AutoMeasuresTheCostsItIsNotGiven) {
  const worker::Graph resnet = test_support::preset_graph("resnet18", 8);
  worker::NetworkOptions o = options(Policy::kAuto);
  o.poison_freed = true;
  const TrainRun run = test_support::train_steps(*backend_, resnet, o);
  EXPECT_EQ(run.stats.policy.rfind("auto", 0), 0u) << run.stats.policy;
  EXPECT_GT(run.stats.predicted_step_seconds, 0.0);  // timed
  EXPECT_EQ(run.stats.predicted_peak, run.stats.step_peak);
  const TrainRun base = test_support::train_steps(*backend_, resnet, options(Policy::kNone));
  EXPECT_TRUE(bitwise_equal(base.params, run.params));
  EXPECT_TRUE(bitwise_equal(base.buffers, run.buffers));
}

}  // namespace
}  // namespace vtrain::memory
