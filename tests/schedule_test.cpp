// The memory part's schedules: the vDNN schedule checked by executing it
// symbolically on fork/join graphs, the simulator, the dynamic policy, and
// the engine running every policy on the pool (bit-identical weights).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "memory/chrome_trace.h"
#include "memory/device_pool.h"
#include "memory/dsa.h"
#include "memory/dynamic_policy.h"
#include "memory/free_list.h"
#include "memory/memory_error.h"
#include "memory/pinned_pool.h"
#include "memory/simulator.h"
#include "memory/vdnn_plan.h"
#include "tests/engine_runs.h"
#include "tests/memory_models.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/engine/optimizer.h"

namespace vtrain::memory {
namespace {

using test_support::error_message;
using test_models::chain;
using test_models::check_schedule;
using test_models::fork_join;
using test_models::node;

// -------------------------------------------------------- vDNN schedule

TEST(VdnnSchedule, EveryPolicyKeepsWhatLaterLayersRead) {
  for (const MemoryModel& m : {chain(), fork_join()}) {
    for (Policy p : {Policy::kNone, Policy::kAll, Policy::kConv}) {
      SCOPED_TRACE(std::string(policy_name(p)) + " on " + m.layers[1].name);
      const Schedule s = make_schedule(m, p);
      check_schedule(m, s, true);
      check_schedule(m, s, false);
    }
  }
}

TEST(VdnnSchedule, OffloadsAtTheLastForwardConsumerOnly) {
  const MemoryModel m = fork_join();
  const Schedule all = make_schedule(m, Policy::kAll);
  // relu (3) is read by b1, b2pool and add; add is its last consumer.
  EXPECT_EQ(all.offload_layer[3], 9);
  // stem's output is read only by bn (whose backward reads it): offloaded at bn.
  EXPECT_EQ(all.offload_layer[1], 2);
  // bn's output: relu reads only its own output, so nothing reads it in backward.
  EXPECT_EQ(all.offload_layer[2], -1);
  const Schedule conv = make_schedule(m, Policy::kConv);
  EXPECT_EQ(conv.offload_layer[3], -1);  // its last consumer (add) is not a conv
  EXPECT_EQ(conv.offload_layer[5], 6);   // b2pool's output, read by conv b2
  EXPECT_EQ(conv.offload_layer[10], -1);  // add2 is its last consumer
  EXPECT_EQ(conv.offload_layer[1], -1);
  // The baseline moves nothing.
  const Schedule none = make_schedule(m, Policy::kNone);
  EXPECT_TRUE(std::none_of(none.train.begin(), none.train.end(),
                           [](const ScheduleEvent& e) { return e.op == Op::kOffload || e.op == Op::kAlloc; }));
}

TEST(VdnnSchedule, PrefetchWindowStopsAtTheNearestConv) {
  // Fig. 10 on: conv0 relu1 pool2 conv3 relu4 conv5 (indices 1..6 after data).
  std::vector<LayerNode> layers = {node("data", {}, 1, "input"), node("conv0", {0}, 1, "conv"),
                                   node("relu1", {1}, 1, "relu"), node("pool2", {2}, 1, "pool"),
                                   node("conv3", {3}, 1, "conv"), node("relu4", {4}, 1, "relu"),
                                   node("conv5", {5}, 1, "conv")};
  std::vector<bool> offloaded = {false, false, false, true, true, false, true};
  std::vector<bool> prefetched(7, false);
  EXPECT_EQ(find_prefetch_layer(6, layers, offloaded, prefetched), 4);  // conv3 itself
  prefetched[4] = true;
  // From relu4 the window ends at conv3, which is done: nothing.
  EXPECT_EQ(find_prefetch_layer(5, layers, offloaded, prefetched), -1);
  // From conv3: pool2 is the nearest pending one.
  EXPECT_EQ(find_prefetch_layer(4, layers, offloaded, prefetched), 3);
  prefetched[3] = true;
  EXPECT_EQ(find_prefetch_layer(4, layers, offloaded, prefetched), -1);  // stops at conv0
}

TEST(VdnnSchedule, PrefetchesOverlapTheBackwardOfALaterLayer) {
  const MemoryModel m = chain();
  const Schedule s = make_schedule(m, Policy::kConv);
  // conv2's input (relu1's output) is offloaded at conv2 and prefetched by
  // the window during fc's or pool's backward, before conv2's own.
  EXPECT_EQ(s.offload_layer[2], 3);
  int prefetch = -1, conv2_backward = -1;
  for (int k = 0; k < static_cast<int>(s.train.size()); ++k) {
    const ScheduleEvent& e = s.train[k];
    if (e.op == Op::kPrefetch && e.tensor.layer == 2) prefetch = k;
    if (e.op == Op::kBackward && e.tensor.layer == 3) conv2_backward = k;
  }
  ASSERT_GE(prefetch, 0);
  EXPECT_LT(prefetch, conv2_backward);
  // It came from the window of a later layer, not on demand.
  bool windowed = false;
  for (int i = 4; i < 7; ++i) {
    windowed |= std::find(s.prefetch_at[i].begin(), s.prefetch_at[i].end(), 3) !=
                s.prefetch_at[i].end();
  }
  EXPECT_TRUE(windowed);
}

// ------------------------------------------------------------ simulator

TEST(Simulator, LayerWisePoliciesNeedLessThanTheBaseline) {
  for (const MemoryModel& m : {chain(), fork_join()}) {
    const Simulation none = simulate(m, make_schedule(m, Policy::kNone), 0, Planner::kPool);
    const Simulation conv = simulate(m, make_schedule(m, Policy::kConv), 0, Planner::kPool);
    const Simulation all = simulate(m, make_schedule(m, Policy::kAll), 0, Planner::kPool);
    EXPECT_TRUE(none.fits && conv.fits && all.fits);
    EXPECT_LT(conv.peak_bytes, none.peak_bytes);
    EXPECT_LE(all.peak_bytes, conv.peak_bytes);
    EXPECT_GT(all.offloaded_bytes, 0u);
    EXPECT_GE(all.host_bytes, all.offloaded_bytes / 4);
    // The baseline's reservation is the sum of everything, aligned.
    size_t sum = 0;
    for (const TensorId& id : make_schedule(m, Policy::kNone).persistent) {
      sum += align_up(tensor_bytes(m, id));
    }
    EXPECT_EQ(none.reservation, sum);
    EXPECT_EQ(none.step_trace.size(), 0u);
    // A step trace's lower bound never exceeds the pool's span.
    EXPECT_LE(all.lower_bound, all.pool_span);
    const Simulation fixed = simulate(m, make_schedule(m, Policy::kAll), 0, Planner::kStatic);
    EXPECT_GE(fixed.static_plan.peak, fixed.lower_bound);
    EXPECT_LE(fixed.reservation, all.reservation);
  }
}

TEST(Simulator, ReportsTheFirstRequestThatDoesNotFit) {
  const MemoryModel m = chain();
  const Simulation full = simulate(m, make_schedule(m, Policy::kConv), 0, Planner::kPool);
  const Simulation tight =
      simulate(m, make_schedule(m, Policy::kConv), full.reservation - kAlignment, Planner::kPool);
  EXPECT_FALSE(tight.fits);
  EXPECT_GE(tight.failed_layer, 1);
  EXPECT_CONTAINS(tight.failure, "out of memory allocating '");
  EXPECT_TRUE(simulate(m, make_schedule(m, Policy::kConv), full.reservation, Planner::kPool).fits);
}

// -------------------------------------------------------- dynamic policy

std::vector<KernelChoices> kernels_of(const MemoryModel& m, size_t big_workspace) {
  std::vector<KernelChoices> ks;
  for (int i = 0; i < static_cast<int>(m.layers.size()); ++i) {
    if (!m.layers[i].is_conv) continue;
    for (auto kind : {worker::ConvKind::kForward, worker::ConvKind::kBackwardData,
                      worker::ConvKind::kBackwardFilter}) {
      // A fast algorithm with a big workspace, a middling one, and a slow one with none.
      ks.push_back({i, kind, {{"fast", big_workspace, 1.0}, {"mid", big_workspace / 4, 2.0},
                              {"lean", 0, 4.0}}});
    }
  }
  return ks;
}

TEST(DynamicPolicy, PicksTheFastestConfigurationThatFits) {
  const MemoryModel m = chain();
  const auto kernels = kernels_of(m, 64 << 10);
  // Unbounded: no offload with the fastest algorithms.
  DynamicDecision roomy = choose_dynamic(m, kernels, 0, Planner::kPool);
  EXPECT_EQ(roomy.pass, "2: no offload, fastest algorithms");
  EXPECT_EQ(roomy.offload, Offload::kNone);
  EXPECT_EQ(roomy.choice, fastest_choice(kernels));

  // The sizes of the passes' configurations, to pick capacities in between.
  auto need = [&](Offload offload, const std::vector<int>& choice) {
    MemoryModel copy = m;
    apply_choice(copy, kernels, choice);
    return simulate(copy, layer_wise_schedule(copy, offload), 0, Planner::kPool).reservation;
  };
  const size_t lean_all = need(Offload::kAll, memory_optimal_choice(kernels));
  const size_t fast_all = need(Offload::kAll, fastest_choice(kernels));
  ASSERT_LT(lean_all, fast_all);

  // Between the two: the greedy pass downgrades some kernels, not all.
  const size_t between = (lean_all + fast_all) / 2;
  const DynamicDecision squeezed = choose_dynamic(m, kernels, between, Planner::kPool);
  EXPECT_EQ(squeezed.pass.substr(0, 2), "4:") << squeezed.pass;
  EXPECT_LE(squeezed.simulation.reservation, between);
  EXPECT_NE(squeezed.choice, fastest_choice(kernels));
  EXPECT_NE(squeezed.choice, memory_optimal_choice(kernels));

  // Exactly the leanest: pass 5 or a greedy result that reaches it.
  const DynamicDecision tight = choose_dynamic(m, kernels, lean_all, Planner::kPool);
  EXPECT_LE(tight.simulation.reservation, lean_all);

  // Below the leanest: not trainable, and the error says what failed.
  const std::string msg = error_message<OutOfMemoryError>(
      [&] { choose_dynamic(m, kernels, lean_all - 4 * kAlignment, Planner::kPool); });
  EXPECT_CONTAINS(msg, "cannot be trained even with vDNN_all");
  EXPECT_CONTAINS(msg, "out of memory allocating");
}

// ------------------------------------------------------------------ trace

// ------------------------------------------------ the engine on the pool

// Every run uses the same algorithm ("direct"), so only the memory policy
// and planner differ.
using test_support::bitwise_equal;
using test_support::TrainRun;

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 2});
  }

  worker::Graph graph(const std::string& preset, int64_t side) {
    return test_support::preset_graph(preset, side);
  }

  worker::NetworkOptions options(Policy policy, Planner planner, size_t capacity = 0) {
    worker::NetworkOptions o;
    o.max_batch = 4;
    o.conv_algorithm = "direct";
    o.memory_policy = policy;
    o.memory_planner = planner;
    o.memory_capacity = capacity;
    o.poison_freed = policy != Policy::kNone;  // a read after release turns into NaN
    return o;
  }

  TrainRun train(const worker::Graph& g, const worker::NetworkOptions& o) {
    return test_support::train_steps(*backend_, g, o);
  }

  // Trains `preset` under none, all (pool), conv (static) and dyn (a
  // capacity that forces offloading), and with `every_planner` also none and
  // all with the static planner and conv with the pool; expects the weights
  // of all of them bit-identical.
  void expect_bit_identical(const std::string& preset, int64_t side, bool every_planner);

  std::unique_ptr<worker::Backend> backend_;
};

// Offloading, releasing and planning never change the numbers: every policy
// and planner gives bit-identical weights, on a chain (vgg-small) and on
// fork/join nets (GoogLeNet's concats, ResNet's adds), with released memory
// poisoned so that a layer reading a released tensor would show.
void EngineTest::expect_bit_identical(const std::string& preset, int64_t side, bool every_planner) {
  {
    SCOPED_TRACE(preset);
    const worker::Graph g = graph(preset, side);
    const TrainRun base = train(g, options(Policy::kNone, Planner::kPool));
    const TrainRun all = train(g, options(Policy::kAll, Planner::kPool));
    for (float v : base.params) ASSERT_TRUE(std::isfinite(v));
    EXPECT_TRUE(bitwise_equal(base.params, all.params)) << "all";
    EXPECT_TRUE(bitwise_equal(base.buffers, all.buffers)) << "all";
    EXPECT_GT(all.stats.offloaded_bytes, 0u);
    EXPECT_LT(all.stats.step_peak, base.stats.step_peak);
    EXPECT_LT(all.stats.reservation, base.stats.reservation);
    const TrainRun conv = train(g, options(Policy::kConv, Planner::kStatic));
    EXPECT_TRUE(bitwise_equal(base.params, conv.params)) << "conv, static";
    EXPECT_TRUE(conv.stats.static_plan.active);
    EXPECT_EQ(conv.stats.static_plan.plans, 1);  // planned once, never re-planned
    // dyn under a capacity the no-offload pass exceeds: it has to offload.
    const TrainRun dyn =
        train(g, options(Policy::kDyn, Planner::kPool, all.stats.reservation + 4096));
    EXPECT_TRUE(bitwise_equal(base.params, dyn.params)) << dyn.stats.policy;
    EXPECT_NE(dyn.stats.offload, "none") << dyn.stats.policy;
    EXPECT_LE(dyn.stats.reservation, all.stats.reservation + 4096);
    if (!every_planner) return;
    const TrainRun none_static = train(g, options(Policy::kNone, Planner::kStatic));
    EXPECT_TRUE(bitwise_equal(base.params, none_static.params)) << "none, static";
    const TrainRun all_static = train(g, options(Policy::kAll, Planner::kStatic));
    EXPECT_TRUE(bitwise_equal(base.params, all_static.params)) << "all, static";
    EXPECT_LE(all_static.stats.reservation, all.stats.reservation);
    const TrainRun conv_pool = train(g, options(Policy::kConv, Planner::kPool));
    EXPECT_TRUE(bitwise_equal(base.params, conv_pool.params)) << "conv, pool";
  }
}

TEST_F(EngineTest, ChainTrainsToBitIdenticalWeightsUnderEveryPolicyAndPlanner) {
  expect_bit_identical("vgg-small", 16, true);
}
TEST_F(EngineTest, GoogLeNetTrainsToBitIdenticalWeightsUnderEveryPolicy) {
  expect_bit_identical("googlenet", 8, false);
}
TEST_F(EngineTest, ResNetTrainsToBitIdenticalWeightsUnderEveryPolicy) {
  expect_bit_identical("resnet18", 8, false);
}
// The same on a memory stream whose copies happen only when waited for
// (BackendOptions::lazy_memory_stream), as on a device whose copies are
// slow: a prefetch the backward did not wait for, or an offload a release
// did not, would read what was there before.
TEST_F(EngineTest, EveryPolicyAndPlannerWaitsForItsCopies) {
  backend_ = worker::make_backend(
      {.kind = worker::BackendKind::kCpu, .threads = 2, .lazy_memory_stream = true});
  expect_bit_identical("vgg-small", 16, true);
  expect_bit_identical("resnet18", 8, false);
}

// The schedules of the real presets (their fork/join graphs as the engine
// models them) keep every tensor a later layer reads.
TEST_F(EngineTest, PresetSchedulesKeepWhatLaterLayersRead) {
  for (const char* preset : {"alexnet", "googlenet", "resnet50", "vgg16"}) {
    SCOPED_TRACE(preset);
    const worker::Graph g = graph(preset, 32);
    worker::Network net(g, *backend_, options(Policy::kAll, Planner::kPool));
    const MemoryModel& m = net.memory_model();
    for (Policy p : {Policy::kNone, Policy::kAll, Policy::kConv}) {
      SCOPED_TRACE(policy_name(p));
      const Schedule s = make_schedule(m, p);
      check_schedule(m, s, true);
      check_schedule(m, s, false);
    }
  }
}

TEST_F(EngineTest, TooSmallACapacityIsAClearErrorNamingTheTensor) {
  const worker::Graph g = graph("vgg-small", 16);
  const std::string msg = error_message<OutOfMemoryError>(
      [&] { worker::Network net(g, *backend_, options(Policy::kConv, Planner::kPool, 64 << 10)); });
  EXPECT_CONTAINS(msg, "memory.policy conv");
  EXPECT_CONTAINS(msg, "out of memory allocating '");
  EXPECT_CONTAINS(msg, " bytes)");
  EXPECT_CONTAINS(msg, "memory capacity 64.0 KiB");
  const std::string dyn = error_message<OutOfMemoryError>(
      [&] { worker::Network net(g, *backend_, options(Policy::kDyn, Planner::kPool, 64 << 10)); });
  EXPECT_CONTAINS(dyn, "cannot be trained even with vDNN_all");
}

// conv.algorithm auto under a device too small for some algorithms'
// workspace (im2col_gemm's grows with the batch) times only those that fit,
// instead of failing to allocate the largest; dyn then picks what fits
// together with the rest of the step.
TEST_F(EngineTest, AutoTuningUnderAMemoryLimitSkipsAlgorithmsThatCannotFit) {
  const worker::Graph g = graph("vgg-small", 16);
  worker::NetworkOptions o = options(Policy::kDyn, Planner::kPool);
  o.max_batch = 64;
  o.poison_freed = false;
  size_t need = 0, tuning_peak = 0;
  {
    auto fresh = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 2});
    o.conv_algorithm = "direct";
    need = worker::Network(g, *fresh, o).memory_stats().reservation;
    fresh->reset_peak();
    o.conv_algorithm = "auto";
    const worker::Network tuned(g, *fresh, o);
    tuning_peak = fresh->device_bytes_peak();  // timing every candidate, unlimited
  }
  const size_t limit = need + need / 2;
  ASSERT_GT(tuning_peak, limit) << "the test needs an algorithm whose workspace cannot fit";
  auto small = worker::make_backend(
      {.kind = worker::BackendKind::kCpu, .threads = 2, .memory_limit = limit});
  worker::Network net(g, *small, o);
  net.init_parameters(1);
  small->fill(net.input(64), 0.5f);
  std::vector<int32_t> labels(64, 1);
  small->upload_labels(labels.data(), net.labels(), 64);
  EXPECT_TRUE(std::isfinite(net.train_step(64, 1.0f / 64).loss_sum));
  EXPECT_LE(small->device_bytes_peak(), limit);
}

TEST_F(EngineTest, TraceAndTimelineShowTheMemoryStream) {
  const worker::Graph g = graph("vgg-small", 16);
  worker::Network net(g, *backend_, options(Policy::kAll, Planner::kPool));
  ChromeTrace trace(0, "rank 0");
  const std::string json = test_support::traced_step(*backend_, net, trace);
  EXPECT_CONTAINS(json, "\"cat\":\"offload\"");
  EXPECT_CONTAINS(json, "\"cat\":\"prefetch\"");
  EXPECT_CONTAINS(json, "\"cat\":\"release\"");
  EXPECT_CONTAINS(json, "conv1_1 forward");
  EXPECT_CONTAINS(json, "device bytes in use");
  const auto& timeline = net.memory_timeline();
  ASSERT_FALSE(timeline.empty());
  EXPECT_EQ(timeline.front().label, "conv1_1 forward");
  // The releases after the last backward belong to it.
  EXPECT_EQ(timeline.back().label, "conv1_1 backward");
  EXPECT_EQ(timeline.back().bytes_in_use, net.memory_stats().persistent_bytes);
  const worker::MemoryStats st = net.memory_stats();
  EXPECT_GE(st.step_peak, static_cast<size_t>(st.step_average));
  EXPECT_GT(st.step_average, static_cast<double>(st.persistent_bytes));
}

}  // namespace
}  // namespace vtrain::memory
