// The simulator's costs timed where a training step makes its calls
// (Network::record_call_times, measure_costs_in_steps, median_call_times)
// and the profiler's use of them: every call is timed, their sum is within
// the step, recording changes no number, and the perf DB's layer rows come
// from the step unless it offloaded.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "memory/planner.h"
#include "perfdb/perf_db.h"
#include "tests/engine_runs.h"
#include "tests/engine_support.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/engine/layer_timing.h"
#include "worker/engine/network.h"
#include "worker/profile/profiler.h"
#include "worker/profile/step_costs.h"

namespace vtrain::worker {
namespace {

using Clock = std::chrono::steady_clock;

NetworkOptions keep_everything(int64_t batch) {
  NetworkOptions o;
  o.max_batch = batch;
  o.memory_policy = memory::Policy::kNone;
  return o;
}

TEST(StepCallTimes, EveryCallOfEveryStepIsTimedWithinTheStep) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = test_support::preset_graph("vgg-small", 16);
  Network net(graph, *backend, keep_everything(4));
  net.init_parameters(1);
  std::vector<memory::StepCosts> steps;
  net.train_step(4, 0.25f);
  EXPECT_TRUE(steps.empty());
  net.record_call_times(&steps);
  for (int k = 0; k < 3; ++k) {
    const auto start = Clock::now();
    net.train_step(4, 0.25f);
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    ASSERT_EQ(steps.size(), static_cast<size_t>(k + 1));
    const memory::StepCosts& s = steps.back();
    test_support::expect_every_layer_timed(graph, s);
    double calls = s.loss_seconds;
    for (int i = 0; i < graph.size(); ++i) calls += s.forward_seconds[i] + s.backward_seconds[i];
    EXPECT_GE(s.other_seconds, 0);
    EXPECT_LE(calls + s.other_seconds, wall);
  }
  net.evaluate(4);  // evaluation is not a training step
  net.record_call_times(nullptr);
  net.train_step(4, 0.25f);
  EXPECT_EQ(steps.size(), 3u);
}

TEST(StepCallTimes, RecordingChangesNoNumberUnderARecomputingPlan) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = test_support::preset_graph("resnet18", 8);
  NetworkOptions o = keep_everything(4);
  o.conv_algorithm = "direct";  // auto would choose by timing
  const memory::MemoryModel model = Network(graph, *backend, o).memory_model();
  std::vector<memory::TensorAction> actions(model.layers.size(), memory::TensorAction::kKeep);
  const std::vector<bool> can = memory::plannable(model);
  for (size_t l = 0; l < actions.size(); l += 2) {
    if (can[l]) actions[l] = memory::TensorAction::kRecompute;
  }
  o.memory_actions = actions;
  o.poison_freed = true;
  const test_support::TrainRun plain = test_support::train_steps(*backend, graph, o);

  Network net(graph, *backend, o);
  std::vector<memory::StepCosts> steps;
  net.record_call_times(&steps);
  net.init_parameters(3);
  // The same steps as train_steps makes, recorded.
  const test_support::TrainRun recorded = test_support::train_steps_of(*backend, net, 2, o.max_batch);
  EXPECT_TRUE(test_support::bitwise_equal(plain.params, recorded.params));
  EXPECT_TRUE(test_support::bitwise_equal(plain.buffers, recorded.buffers));
  ASSERT_EQ(steps.size(), 2u);
  test_support::expect_every_layer_timed(graph, steps[0]);
}

TEST(StepCallTimes, MediansPerCall) {
  auto step = [](double f, double b, double loss, double other) {
    memory::StepCosts s;
    s.forward_seconds = {0, f, 2 * f};
    s.backward_seconds = {0, b, 3 * b};
    s.loss_seconds = loss;
    s.other_seconds = other;
    return s;
  };
  const memory::StepCosts m =
      median_call_times({step(1, 5, 9, 2), step(5, 1, 7, 4), step(3, 3, 8, 3)});
  EXPECT_EQ(m.forward_seconds, (std::vector<double>{0, 3, 6}));
  EXPECT_EQ(m.backward_seconds, (std::vector<double>{0, 3, 9}));
  EXPECT_EQ(m.loss_seconds, 8);
  EXPECT_EQ(m.other_seconds, 3);
  EXPECT_EQ(m.to_host_bytes_per_second, 0);
  EXPECT_THROW(median_call_times({}), std::invalid_argument);
  memory::StepCosts shorter = step(1, 1, 1, 1);
  shorter.forward_seconds.pop_back();
  EXPECT_THROW(median_call_times({step(1, 1, 1, 1), shorter}), std::invalid_argument);
}

TEST(StepCallTimes, MeasuredInStepsWithTheGivenBandwidthAndParametersKept) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = test_support::preset_graph("lenet", 16);
  Network net(graph, *backend, keep_everything(4));
  net.init_parameters(1);
  const std::vector<float> before = net.download_parameters();
  const memory::StepCosts costs = measure_costs_in_steps(net, 4, 3, {1e9, 2e9, 4096});
  test_support::expect_every_layer_timed(graph, costs);
  EXPECT_EQ(costs.to_host_bytes_per_second, 1e9);
  EXPECT_EQ(costs.to_device_bytes_per_second, 2e9);
  EXPECT_TRUE(test_support::bitwise_equal(before, net.download_parameters()));
  EXPECT_THROW(measure_costs_in_steps(net, 4, 0, {}), std::invalid_argument);
}

// Costs measured in place for a per-tensor plan: in steps (every layer
// timed, the copy bandwidth the network measured kept) on a network that
// is freed again; each layer alone where the plan offloads; refused where
// there is nothing to measure.
TEST(StepCallTimes, InPlaceCostsAreTimedInStepsUnlessThePlanOffloads) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = test_support::preset_graph("vgg-small", 16);
  NetworkOptions o = keep_everything(4);
  o.memory_policy = memory::Policy::kAuto;
  o.conv_algorithm = "direct";
  const InPlaceCosts roomy = measure_costs_in_place(graph, *backend, o);
  EXPECT_TRUE(roomy.in_steps);
  test_support::expect_every_layer_timed(graph, roomy.costs);
  EXPECT_GT(roomy.costs.to_host_bytes_per_second, 0);
  EXPECT_GT(roomy.costs.to_device_bytes_per_second, 0);
  // Only the ops' scratch, which the backend keeps for the next network,
  // stays: a second measurement leaves the device as the first did.
  const size_t in_use = backend->device_bytes_in_use();
  measure_costs_in_place(graph, *backend, o);
  EXPECT_EQ(backend->device_bytes_in_use(), in_use);

  // TFLMS swaps the largest tensors out to fit: 128 KiB under what keeping
  // everything peaks at (parameters included), it offloads.
  const size_t keep_all = Network(graph, *backend, o).memory_stats().predicted_peak;
  NetworkOptions tight = o;
  tight.memory_policy = memory::Policy::kTflms;
  tight.memory_capacity = keep_all - (size_t{128} << 10);
  const InPlaceCosts swapped = measure_costs_in_place(graph, *backend, tight);
  EXPECT_FALSE(swapped.in_steps);
  test_support::expect_every_layer_timed(graph, swapped.costs);

  NetworkOptions none = o;
  none.memory_policy = memory::Policy::kNone;
  EXPECT_THROW(measure_costs_in_place(graph, *backend, none), std::invalid_argument);
  NetworkOptions given = o;
  given.memory_costs = roomy.costs;
  EXPECT_THROW(measure_costs_in_place(graph, *backend, given), std::invalid_argument);
}

// The profiler's layer rows come from its measured step (they then hold
// the time outside the calls) where the step offloads nothing; under vDNN
// "all" (every activation offloaded) they stay the layers timed alone.
TEST(StepCallTimes, TheProfilerRecordsTheStepsCallsUnlessItOffloaded) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = test_support::preset_graph("lenet", 16);
  for (memory::Policy policy : {memory::Policy::kNone, memory::Policy::kAll}) {
    perfdb::PerfDb db(":memory:");
    const perfdb::DeviceId device = db.upsert_device(perfdb_device(backend->device_info()));
    ProfileOptions o;
    o.batches = {4};
    o.warmup = 0;
    o.repeats = 3;
    o.memory_policy = policy;
    profile(graph, *backend, db, device, o);
    const StepCostsLookup found = profiled_step_costs(db, device, graph, {}, 4);
    ASSERT_TRUE(found.costs) << found.missing;
    test_support::expect_every_layer_timed(graph, *found.costs);
    bool outside = false;
    for (const perfdb::LayerMeasurement& row :
         db.layer_measurements(device, model_key(graph, {}), 4)) {
      outside = outside || row.layer_index == perfdb::kOutsideCallsLayer;
    }
    EXPECT_EQ(outside, policy == memory::Policy::kNone) << memory::policy_name(policy);
    EXPECT_EQ(found.costs->other_seconds > 0, policy == memory::Policy::kNone);
  }
}

}  // namespace
}  // namespace vtrain::worker
