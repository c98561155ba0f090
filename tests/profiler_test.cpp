// The profiler: micro-batch policies, what it records, cache hits, and the
// split of work between identical devices; and the profile/db commands.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "perfdb/perf_db.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/profile/profiler.h"

namespace vtrain::worker {
namespace {

using test_support::TempDir;

Graph small_graph() {
  return Graph::build(preset_layers("lenet", {{1, 1, 16, 16}, 4}), {1, 1, 16, 16});
}

// Profiling `batches`, each timing run once, without warm-up.
ProfileOptions timed_once(std::vector<int64_t> batches) {
  ProfileOptions options;
  options.batches = std::move(batches);
  options.warmup = 0;
  options.repeats = 1;
  return options;
}

TEST(Profiler, MicroBatchPolicyNames) {
  EXPECT_EQ(balancer::parse_micro_batch_policy("powerOfTwo"), MicroBatchPolicy::kPowerOfTwo);
  EXPECT_EQ(balancer::parse_micro_batch_policy("all"), MicroBatchPolicy::kAll);
  EXPECT_EQ(balancer::parse_micro_batch_policy("undivided"), MicroBatchPolicy::kUndivided);
  EXPECT_THROW(balancer::parse_micro_batch_policy("some"), balancer::BalancerError);
}

TEST(Profiler, RecordsEveryKernelAlgorithmAndMicroBatchThenHitsTheCache) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  perfdb::PerfDb db(":memory:");
  const perfdb::DeviceId device = db.upsert_device(perfdb_device(backend->device_info()));
  const Graph graph = small_graph();
  ProfileOptions options;
  options.batches = {4, 6};
  options.micro_batches = MicroBatchPolicy::kPowerOfTwo;
  options.warmup = 0;
  options.repeats = 2;
  // An older profiler's step row (forward + backward only) is not a cache hit.
  const perfdb::StepMeasurement old{.model = model_key(graph, {}),
                                    .batch = 4,
                                    .memory_policy = "none",
                                    .workspace_plan = "auto",
                                    .time_ms = 1.0,
                                    .peak_device_bytes = 1};
  db.record_step_measurements(device, std::span(&old, 1));
  const ProfileReport first = profile(graph, *backend, db, device, options);
  // LeNet: conv1 (Forward, BackwardFilter; its input is the data) and conv2
  // (all three kinds) = 5 kernels; micro-batches {1, 2, 4} u {1, 2, 4, 6}.
  EXPECT_EQ(first.kernel_measured, 5 * 4);
  EXPECT_EQ(first.kernel_cached, 0);
  EXPECT_EQ(first.step_measured, 2);
  const perfdb::Stats stats = db.stats();
  EXPECT_EQ(stats.step_measurements, 3);  // the old row is kept, not used
  // Every measurement is positive and its workspace is what the backend
  // reports for that algorithm and micro-batch.
  const auto steps = profiled_steps(db, device, model_key(graph, {}), memory::Policy::kNone, 0);
  ASSERT_EQ(steps.size(), 2u);
  // The step's peak holds at least the weights, their gradients and the
  // optimizer's velocity, the state a training step keeps.
  const auto state_bytes = static_cast<size_t>(graph.parameter_count()) * 3 * sizeof(float);
  for (const auto& s : steps) {
    EXPECT_GT(s.time_ms, 0);
    EXPECT_GT(s.peak_device_bytes, state_bytes);
  }
  ConvProblem conv2;
  conv2.x = {{6, 20, 6, 6}, backend->preferred_layout(20)};
  conv2.k = 50;
  conv2.window.kernel_h = conv2.window.kernel_w = 5;
  conv2.y = {conv2.output_shape(), backend->preferred_layout(50)};
  const auto measured = db.kernel_measurements(device, kernel_signature(ConvKind::kForward, conv2));
  std::set<int64_t> micro;
  for (const auto& m : measured) {
    micro.insert(m.micro_batch);
    EXPECT_GT(m.time_ms, 0);
    const ConvProblem piece = conv2.with_batch(m.micro_batch);
    for (const ConvAlgoInfo& a : conv_algorithms(*backend, ConvKind::kForward, piece, false)) {
      if (a.name == m.algorithm) {
        EXPECT_EQ(m.workspace_bytes, a.workspace_bytes) << a.name;
      }
    }
  }
  EXPECT_EQ(micro, (std::set<int64_t>{1, 2, 4, 6}));

  const ProfileReport second = profile(graph, *backend, db, device, options);
  EXPECT_EQ(second.kernel_measured, 0);
  EXPECT_EQ(second.kernel_cached, 20);
  EXPECT_EQ(second.step_measured, 0);
  EXPECT_EQ(second.step_cached, 2);
  EXPECT_EQ(db.stats().kernel_measurements, stats.kernel_measurements);
}

// A depthwise c->c 3x3 convolution and a dense one on the same input are
// different kernels: each is measured and kept in a row of its own (they
// shared one when the kernel key had no groups, the second hitting the
// first's times as a cache).
TEST(Profiler, GroupedAndDenseConvolutionsOnOneInputAreKernelsOfTheirOwn) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  perfdb::PerfDb db(":memory:");
  const perfdb::DeviceId device = db.upsert_device(perfdb_device(backend->device_info()));
  auto conv = [](const std::string& name, const std::string& in, int64_t kernel, int64_t groups) {
    LayerSpec s{.name = name, .type = LayerType::kConv, .inputs = {in}, .out = 8};
    s.kernel_h = s.kernel_w = kernel;
    s.pad_h = s.pad_w = kernel / 2;
    s.groups = groups;
    return s;
  };
  // Both read the stem's output, so their inputs (and outputs) have one
  // shape and one layout.
  const Graph graph = Graph::build(
      {LayerSpec{.name = "data", .type = LayerType::kInput}, conv("stem", "data", 1, 1),
       conv("dense", "stem", 3, 1), conv("depthwise", "stem", 3, 8),
       LayerSpec{.name = "join", .type = LayerType::kAdd, .inputs = {"dense", "depthwise"}},
       LayerSpec{.name = "fc", .type = LayerType::kFc, .inputs = {"join"}, .out = 4}},
      {1, 8, 8, 8});
  ProfileOptions options = timed_once({2});
  options.steps = false;
  options.layer_costs = false;
  const ProfileReport report = profile(graph, *backend, db, device, options);
  // stem: Forward, BackwardFilter (its input is the data); dense and
  // depthwise: all three each, at the one micro-batch 2.
  EXPECT_EQ(report.kernel_cached, 0);
  EXPECT_EQ(db.stats().kernels, 2 + 3 + 3);
  for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
    ConvProblem p;
    p.x = {{2, 8, 8, 8}, backend->preferred_layout(8)};
    p.k = 8;
    p.window = {3, 3, 1, 1, 1, 1};
    p.y = {p.output_shape(), backend->preferred_layout(8)};
    const perfdb::KernelSignature dense = kernel_signature(kind, p);
    p.groups = 8;
    const perfdb::KernelSignature depthwise = kernel_signature(kind, p);
    EXPECT_NE(dense, depthwise) << conv_kind_name(kind);
    EXPECT_FALSE(db.kernel_measurements(device, dense).empty()) << conv_kind_name(kind);
    EXPECT_FALSE(db.kernel_measurements(device, depthwise).empty()) << conv_kind_name(kind);
  }
}

// Steps are measured and recorded under the configured memory policy, so
// the balancer checks that a batch fits the device under that policy:
// layer-wise allocation with offloading needs less than the baseline.
TEST(Profiler, StepsAreRecordedUnderTheirMemoryPolicy) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  perfdb::PerfDb db(":memory:");
  const perfdb::DeviceId device = db.upsert_device(perfdb_device(backend->device_info()));
  const Graph graph = Graph::build(preset_layers("vgg-small", {{1, 1, 16, 16}, 4}), {1, 1, 16, 16});
  ProfileOptions options = timed_once({16});
  for (memory::Policy policy : {memory::Policy::kNone, memory::Policy::kAll}) {
    options.memory_policy = policy;
    EXPECT_EQ(profile(graph, *backend, db, device, options).step_measured, 1)
        << memory::policy_name(policy);
  }
  const auto none = db.step_measurements(device, model_key(graph, {}), "none");
  const auto all = db.step_measurements(device, model_key(graph, {}), "all");
  ASSERT_EQ(none.size(), 1u);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_LT(all[0].peak_device_bytes, none[0].peak_device_bytes);
  options.memory_policy = memory::Policy::kAll;
  EXPECT_EQ(profile(graph, *backend, db, device, options).step_cached, 1);
}

// A step profiled for a job whose network holds the input staging
// (data.prefetch, ProfileOptions::input_staging) records that in its peak,
// as the balancer checks it against the device: the batch's floats more;
// and its time as training's steps run, the batch copied ahead.
TEST(Profiler, StepPeakCountsTheInputStagingTrainingHolds) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = small_graph();
  constexpr int64_t kBatch = 16;
  size_t peak[2] = {0, 0};
  // The first profile also grows the backend's scratch, which stays: a
  // run before the two compared.
  for (const bool staging : {false, false, true}) {
    perfdb::PerfDb db(":memory:");
    const perfdb::DeviceId device = db.upsert_device(perfdb_device(backend->device_info()));
    // No warm-up asked for: with the staging, a step runs untimed first, so
    // that the one timed has a step before it to copy its batch.
    ProfileOptions options = timed_once({kBatch});
    options.layer_costs = false;
    std::vector<int64_t> asked;
    if (staging) {
      options.input_staging = [&](int64_t b) {
        asked.push_back(b);
        return true;
      };
    }
    const ProfileReport report = profile(graph, *backend, db, device, options);
    ASSERT_EQ(report.step_measured, 1);
    // Timed as training runs it: the batch copied during the step before.
    EXPECT_EQ(report.step_copied_ahead, staging ? 1 : 0);
    const auto steps = db.step_measurements(device, model_key(graph, {}), "none");
    ASSERT_EQ(steps.size(), 1u);
    peak[staging] = steps[0].peak_device_bytes;
    if (staging) {
      EXPECT_EQ(asked, std::vector<int64_t>{kBatch});
    }
  }
  const size_t staging_bytes = kBatch * 16 * 16 * sizeof(float);
  EXPECT_GE(peak[1], peak[0] + staging_bytes);
  EXPECT_LE(peak[1], peak[0] + staging_bytes + 64);  // the pool aligns its blocks to 64 bytes
}

TEST(Profiler, IdenticalDevicesSplitTheWork) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  TempDir dir;
  const Graph graph = small_graph();
  ProfileOptions options = timed_once({4});
  options.micro_batches = MicroBatchPolicy::kAll;
  int64_t measured = 0, steps = 0;
  for (int share = 0; share < 2; ++share) {
    perfdb::PerfDb db(dir.path("split.db"));
    const perfdb::DeviceId device = db.upsert_device(perfdb_device(backend->device_info()));
    options.peers.index = share;
    options.peers.count = 2;
    const ProfileReport r = profile(graph, *backend, db, device, options);
    EXPECT_EQ(r.kernel_cached, 0) << "shares must not overlap";
    measured += r.kernel_measured;
    steps += r.step_measured;
  }
  EXPECT_EQ(measured, 5 * 4);
  EXPECT_EQ(steps, 1);
  perfdb::PerfDb db(dir.path("split.db"));
  const perfdb::DeviceId device = db.upsert_device(perfdb_device(backend->device_info()));
  options.peers = {};
  const ProfileReport all = profile(graph, *backend, db, device, options);
  EXPECT_EQ(all.kernel_measured, 0);
  EXPECT_EQ(all.kernel_cached, 20);
}

// Together, a process measures every item any member needs (the others
// would otherwise measure it alone, without this one's contention), also
// what its DB holds; an item no member needs is cached; one it cannot
// measure it skips whatever the others need.
// What a process finds of an item, as WorkTurns::take asks for it.
auto look(bool can, bool cached) {
  return [=] { return ItemState{can, cached}; };
}

TEST(Profiler, ProcessesProfilingTogetherMeasureWhatAnyMemberNeeds) {
  ProfilePeers peers{.index = 1, .count = 2, .together = true, .any = {}, .keep_busy = {},
                     .all_texts = {}, .ranks = {}};
  bool other_needs = false;
  int agreements = 0;
  peers.any = [&](bool mine) {
    ++agreements;
    return mine || other_needs;
  };
  // The other member "arrives" after two more runs of what this one
  // measured. This one arrives once per item, right after agreeing on it.
  int arrivals = 0, reruns = 0;
  peers.keep_busy = [&](const std::function<void()>& work) {
    ++arrivals;
    EXPECT_EQ(arrivals, agreements);
    for (int i = 0; i < 2 && work; ++i, ++reruns) work();
  };
  WorkTurns turns(peers);
  EXPECT_EQ(turns.take(look(true, false)), Turn::kMeasure);
  EXPECT_EQ(turns.take(look(true, true)), Turn::kCached);
  other_needs = true;
  EXPECT_EQ(turns.take(look(true, true)), Turn::kMeasure);
  EXPECT_EQ(turns.take(look(false, false)), Turn::kSkip);
  EXPECT_EQ(agreements, 4);  // once per item, whatever this process does with it

  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  TempDir dir;
  const Graph graph = small_graph();
  perfdb::PerfDb db(dir.path("together.db"));
  const perfdb::DeviceId device = db.upsert_device(perfdb_device(backend->device_info()));
  ProfileOptions options = timed_once({4});
  options.micro_batches = MicroBatchPolicy::kAll;
  profile(graph, *backend, db, device, options);  // alone: the DB now holds everything
  options.peers = peers;
  other_needs = false;
  agreements = 0;
  const ProfileReport cached = profile(graph, *backend, db, device, options);
  EXPECT_EQ(cached.kernel_measured + cached.step_measured + cached.layer_costs_measured, 0);
  EXPECT_EQ(cached.kernel_cached, 20);
  const int items = agreements;
  EXPECT_EQ(arrivals, items);  // at the end of every item, measured or not
  EXPECT_EQ(reruns, 0);
  other_needs = true;
  agreements = 0;
  arrivals = 0;
  const ProfileReport again = profile(graph, *backend, db, device, options);
  EXPECT_EQ(again.kernel_measured, 20);
  EXPECT_EQ(again.step_measured, 1);
  EXPECT_EQ(again.layer_costs_measured, 1);
  EXPECT_EQ(again.copy_measured, 1);
  EXPECT_EQ(agreements, items);
  EXPECT_EQ(arrivals, items);
  // Each kernel item and the step keep the cores busy with their own work
  // (the copy bandwidth and the layer costs wait idle).
  EXPECT_EQ(reruns, 2 * (20 + 1));
}

// profile.step_rounds: every round times every batch's step in turn, and
// each batch is recorded once (its median round). Together peers keep step
// in the later rounds with one agreement per batch, as in the first.
TEST(Profiler, StepRoundsRecordEachBatchOnceAndKeepTogetherPeersInStep) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = small_graph();
  ProfileOptions options = timed_once({4, 8});
  options.layer_costs = false;
  int agreements = 0;
  int arrivals = 0;
  options.peers = {.index = 0,
                   .count = 2,
                   .together = true,
                   .any =
                       [&](bool mine) {
                         ++agreements;
                         return mine;
                       },
                   .keep_busy = [&](const std::function<void()>&) {
                     ++arrivals;
                     EXPECT_EQ(arrivals, agreements);
                   },
                   .all_texts = {},
                   .ranks = {}};
  std::map<int, int> agreements_at;  // step_rounds -> agreements
  for (int rounds : {1, 3}) {
    perfdb::PerfDb db(":memory:");
    const perfdb::DeviceId device = db.upsert_device(perfdb_device(backend->device_info()));
    options.step_rounds = rounds;
    agreements = 0;
    arrivals = 0;
    const ProfileReport r = profile(graph, *backend, db, device, options);
    EXPECT_EQ(r.step_measured, 2) << rounds << " rounds";
    const auto steps = db.step_measurements(device, model_key(graph, {}), "none");
    ASSERT_EQ(steps.size(), 2u) << rounds << " rounds";
    for (const auto& step : steps) EXPECT_GT(step.time_ms, 0);
    agreements_at[rounds] = agreements;
  }
  EXPECT_EQ(agreements_at[3] - agreements_at[1], 2 * 2);  // 2 more rounds of 2 batches
}

// A member whose device cannot hold an item (a step at the larger batch
// here) still arrives once for it, without work, as the others measure.
TEST(Profiler, TogetherPeersArriveOnceForAnItemTheirDeviceCannotHold) {
  const Graph graph = small_graph();
  ProfileOptions options = timed_once({4, 64});
  options.layer_costs = false;
  // The peak of each step alone, to set a limit between them (beside the
  // backend's own scratch).
  auto roomy = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  perfdb::PerfDb alone(":memory:");
  const perfdb::DeviceId roomy_id = alone.upsert_device(perfdb_device(roomy->device_info()));
  profile(graph, *roomy, alone, roomy_id, options);
  const auto steps = alone.step_measurements(roomy_id, model_key(graph, {}), "none");
  ASSERT_EQ(steps.size(), 2u);
  const size_t small_peak = std::min(steps[0].peak_device_bytes, steps[1].peak_device_bytes);
  const size_t large_peak = std::max(steps[0].peak_device_bytes, steps[1].peak_device_bytes);
  ASSERT_LT(small_peak, large_peak);

  const size_t limit = roomy->scratch_reserved() + (small_peak + large_peak) / 2;
  auto limited =
      make_backend({.kind = worker::BackendKind::kCpu, .threads = 1, .memory_limit = limit});
  int agreements = 0, arrivals = 0, with_work = 0;
  options.peers = {.index = 1,
                   .count = 2,
                   .together = true,
                   .any =
                       [&](bool) {
                         ++agreements;
                         return true;  // the other member needs every item
                       },
                   .keep_busy = [&](const std::function<void()>& work) {
                     ++arrivals;
                     EXPECT_EQ(arrivals, agreements);
                     if (work) ++with_work;
                   },
                   .all_texts = {},
                   .ranks = {}};
  perfdb::PerfDb db(":memory:");
  const perfdb::DeviceId id = db.upsert_device(perfdb_device(limited->device_info()));
  const ProfileReport r = profile(graph, *limited, db, id, options);
  EXPECT_EQ(r.step_infeasible, std::vector<int64_t>{64});
  EXPECT_EQ(r.step_measured, 1);
  EXPECT_GT(agreements, 0);
  EXPECT_EQ(arrivals, agreements);
  // The kernel items it measured and its one step came with their work.
  EXPECT_EQ(with_work, static_cast<int>(r.kernel_measured) + 1);
}

// Members whose settings give other items (here another profile.batches)
// are stopped before the first item, every one with the same message
// naming the setting and both ranks; the same settings pass.
TEST(Profiler, TogetherPeersWithOtherItemsAreRefusedNamingTheSetting) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = small_graph();
  ProfileOptions options = timed_once({4, 8});
  std::string other;  // the other member's settings; empty: this one's
  int exchanges = 0;
  options.peers = {.index = 0,
                   .count = 2,
                   .together = true,
                   .any = [](bool mine) { return mine; },
                   .keep_busy = {},
                   .all_texts =
                       [&](const std::string& mine) {
                         ++exchanges;
                         return std::vector<std::string>{mine, other.empty() ? mine : other};
                       },
                   .ranks = {1, 2}};
  perfdb::PerfDb db(":memory:");
  const perfdb::DeviceId device = db.upsert_device(perfdb_device(backend->device_info()));
  ProfileOptions others = options;
  others.batches = {4, 8, 16};
  // What that member passes: its own settings, as profile() writes them.
  others.peers.all_texts = [&](const std::string& mine) {
    other = mine;
    throw std::runtime_error("taken");
    return std::vector<std::string>{};
  };
  EXPECT_THROW(profile(graph, *backend, db, device, others), std::runtime_error);
  ASSERT_NE(other.find("profile.batches: 4, 8, 16"), std::string::npos) << other;
  try {
    profile(graph, *backend, db, device, options);
    ADD_FAILURE() << "other profile.batches were not refused";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ranks 1, 2"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1 has profile.batches: 4, 8 where rank 2 has profile.batches: "
                        "4, 8, 16"),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(db.stats().step_measurements, 0);  // refused before any item
  other.clear();
  exchanges = 0;
  const ProfileReport same = profile(graph, *backend, db, device, options);
  EXPECT_EQ(exchanges, 1);
  EXPECT_EQ(same.step_measured, 2);
}

// Profiling groups: CPU processes on one host that share a core (whatever
// their device: a quota or a thread count of their own), and identical GPUs.
TEST(Profiler, ProcessesSharingACoreProfileAsOneGroup) {
  const auto cpu = [](std::vector<int> cpus, std::string host = "a") {
    return DeviceInfo{.backend = "cpu", .name = "EPYC (quota)", .memory_bytes = 1, .threads = 1,
                      .library_version = "oneDNN", .host = std::move(host), .device_key = "",
                      .cpus = std::move(cpus)};
  };
  const auto gpu = [](std::string name) {
    return DeviceInfo{.backend = "cuda", .name = std::move(name), .memory_bytes = 1, .threads = 1,
                      .library_version = "cuDNN", .host = "a", .device_key = "", .cpus = {}};
  };
  // Rank 0 on core 0 alone; ranks 1 and 2 share core 1, under other quotas.
  DeviceInfo slow = cpu({1});
  slow.name = "EPYC (other quota)";
  slow.threads = 2;
  EXPECT_EQ(profile_group_colours({cpu({0}), cpu({1}), slow}), (std::vector<int>{0, 1, 1}));
  // A chain of overlaps is one group; an unbound process shares every core.
  EXPECT_EQ(profile_group_colours({cpu({2, 3}), cpu({0, 1}), cpu({1, 2})}),
            (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(profile_group_colours({cpu({0}), cpu({1}), cpu({})}), (std::vector<int>{0, 0, 0}));
  // Other hosts share nothing.
  EXPECT_EQ(profile_group_colours({cpu({}, "a"), cpu({}, "b"), cpu({0}, "a")}),
            (std::vector<int>{0, 1, 0}));
  // GPUs group by device; a CPU process never joins them.
  EXPECT_EQ(profile_group_colours({gpu("H100"), gpu("A100"), gpu("H100"), cpu({})}),
            (std::vector<int>{0, 1, 0, 3}));
}

// Split, the items are dealt in turn whether or not the DB holds them.
TEST(Profiler, SplitPeersTakeItemsInTurn) {
  const ProfilePeers second{.index = 1, .count = 2, .together = false, .any = {}, .keep_busy = {},
                     .all_texts = {}, .ranks = {}};
  WorkTurns turns(second);
  EXPECT_EQ(turns.take(look(true, false)), Turn::kSkip);
  EXPECT_EQ(turns.take(look(true, true)), Turn::kCached);
  EXPECT_EQ(turns.take(look(true, false)), Turn::kSkip);
  EXPECT_EQ(turns.take(look(true, false)), Turn::kMeasure);
  EXPECT_EQ(turns.take(look(false, false)), Turn::kSkip);
  EXPECT_EQ(turns.take(look(false, false)), Turn::kSkip);
}

// play(): an item this process measures goes to `measure`, which ends the
// turn; every other turn ends at once. replay(): together, one agreement
// per item again; only this process's items are measured.
TEST(Profiler, PlayAndReplayEndEveryTurnOnce) {
  std::string log;
  ProfilePeers peers{.index = 0, .count = 2, .together = true, .any = {}, .keep_busy = {},
                     .all_texts = {}, .ranks = {}};
  peers.any = [&](bool mine) {
    log += mine ? "any(1) " : "any(0) ";
    return mine;
  };
  peers.keep_busy = [&](const std::function<void()>& work) { log += work ? "wait+work\n" : "wait\n"; };
  WorkTurns turns(peers);
  const auto measure = [&] {
    log += "measure ";
    turns.done([] {});
  };
  EXPECT_EQ(turns.play(look(true, false), measure), Turn::kMeasure);
  EXPECT_EQ(turns.play(look(true, true), measure), Turn::kCached);
  EXPECT_EQ(turns.play(look(false, false), measure), Turn::kSkip);
  turns.replay(true, measure);
  turns.replay(false, measure);
  EXPECT_EQ(log,
            "any(1) measure wait+work\n"
            "any(0) wait\n"
            "any(0) wait\n"
            "any(0) measure wait+work\n"
            "any(0) wait\n");
}

TEST(ProfileCli, ProfileStatsAndExport) {
  TempDir dir;
  const std::string vtrain = test_support::vtrain_binary();
  const std::string cfg = test_support::source_dir() + "/configs/synthetic-lenet.yaml";
  std::string out;
  ASSERT_EQ(test_support::run_command(vtrain + " profile " + cfg + " --db " + dir.path("p.db") +
                                          " --set profile.repeats=1 --set profile.batches=[8]",
                                      &out),
            0)
      << out;
  EXPECT_CONTAINS(out, "kernel items measured");
  EXPECT_CONTAINS(out, "layer times at 1 batches measured, 0 cached; copy bandwidth measured");
  ASSERT_EQ(test_support::run_command(vtrain + " db stats --db " + dir.path("p.db"), &out), 0)
      << out;
  EXPECT_CONTAINS(out, "1 devices, 5 kernels");
  // LeNet's 8 layers, the loss, and the step's time outside the calls.
  EXPECT_CONTAINS(out, "2 copy bandwidths, 10 layer measurements");
  ASSERT_EQ(test_support::run_command(vtrain + " db export --db " + dir.path("p.db") +
                                          " --table layer_measurements --format jsonl",
                                      &out),
            0)
      << out;
  EXPECT_CONTAINS(out, "\"layer_index\":-1,\"layer_name\":\"loss\"");
  EXPECT_CONTAINS(out, "\"layer_index\":-2,\"layer_name\":\"outside layer calls\"");
  ASSERT_EQ(test_support::run_command(vtrain + " db export --db " + dir.path("p.db") +
                                          " --table step_measurements --format jsonl",
                                      &out),
            0)
      << out;
  EXPECT_CONTAINS(out, "\"batch\":8");
  EXPECT_EQ(test_support::run_command(vtrain + " db export --db " + dir.path("p.db") +
                                          " --table nope",
                                      &out),
            2)
      << out;
  EXPECT_CONTAINS(out, "unknown table 'nope' (known: devices, kernels");
  EXPECT_EQ(test_support::run_command(vtrain + " db stats --db " + dir.path("missing.db"), &out), 1);
  EXPECT_CONTAINS(out, "missing.db does not exist");
  EXPECT_EQ(test_support::run_command(vtrain + " db stats", &out), 2);
  EXPECT_CONTAINS(out, "needs --db FILE");
}

}  // namespace
}  // namespace vtrain::worker
