// The memory part's storage: the free list against a byte map, the DSA
// planner against brute force and the MIP, the pools on the CPU backend, and
// the trace writer. Schedules, the simulator and the engine on the pool are
// in schedule_test.cpp.
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
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/engine/optimizer.h"

namespace vtrain::memory {
namespace {

using test_support::error_message;

// ----------------------------------------------------------- free list

TEST(FreeList, BestFitCoalescesAndTracksTheHighWater) {
  FreeList f(64 * kAlignment);
  const size_t a = *f.allocate(4 * kAlignment);
  const size_t b = *f.allocate(1);  // rounded up to one unit
  const size_t c = *f.allocate(2 * kAlignment);
  const size_t d = *f.allocate(kAlignment);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 4 * kAlignment);
  EXPECT_EQ(c, 5 * kAlignment);
  EXPECT_EQ(d, 7 * kAlignment);
  EXPECT_EQ(f.high_water(), 8 * kAlignment);
  f.release(a);  // hole of 4 units
  f.release(c);  // hole of 2 units
  // Best fit: the 2-unit hole, not the first (4-unit) one.
  EXPECT_EQ(*f.allocate(2 * kAlignment), 5 * kAlignment);
  f.release(b);  // merges with the 4-unit hole: 5 units at 0
  EXPECT_EQ(*f.allocate(5 * kAlignment), 0u);
  f.release(d);  // the top block: the top falls back
  EXPECT_EQ(f.top(), 7 * kAlignment);
  EXPECT_EQ(f.high_water(), 8 * kAlignment);
  EXPECT_FALSE(f.allocate(60 * kAlignment).has_value());
  EXPECT_EQ(f.largest_free(), 57 * kAlignment);
  EXPECT_THROW(f.release(3 * kAlignment), MemoryError);
}

TEST(FreeList, AllocateAtTakesOnlyFreeRanges) {
  FreeList f(16 * kAlignment);
  EXPECT_TRUE(f.allocate_at(4 * kAlignment, kAlignment));  // above the top: a gap below
  EXPECT_FALSE(f.allocate_at(4 * kAlignment, 1));          // taken
  EXPECT_FALSE(f.allocate_at(3 * kAlignment, 2 * kAlignment));  // overlaps it
  EXPECT_TRUE(f.allocate_at(kAlignment, 2 * kAlignment));  // inside the gap
  EXPECT_FALSE(f.allocate_at(15 * kAlignment, 2 * kAlignment));  // past the capacity
  EXPECT_EQ(*f.allocate(kAlignment), 0u);                  // the rest of the gap
  EXPECT_EQ(*f.allocate(kAlignment), 3 * kAlignment);
  EXPECT_EQ(f.bytes_in_use(), 5 * kAlignment);
}

// Random allocations and frees against a byte map: blocks never overlap,
// the counters agree, and a capacity as large as the high-water mark of an
// unbounded run reproduces its offsets exactly.
TEST(FreeList, RandomOperationsNeverOverlapAndDoNotDependOnTheCapacity) {
  std::mt19937 rng(5);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::pair<bool, size_t>> ops;  // (allocate, size or victim choice)
    for (int k = 0; k < 300; ++k) ops.push_back({rng() % 3 != 0, 1 + rng() % 5000});
    auto run = [&](size_t capacity, std::vector<size_t>* offsets) {
      FreeList f(capacity);
      std::map<size_t, size_t> live;  // offset -> size
      for (const auto& [alloc, value] : ops) {
        if (alloc || live.empty()) {
          const auto off = f.allocate(value);
          if (!off) return f.high_water();
          const size_t size = align_up(value);
          auto next = live.lower_bound(*off);
          if (next != live.end()) {
            EXPECT_LE(*off + size, next->first);
          }
          if (next != live.begin()) {
            auto prev = std::prev(next);
            EXPECT_LE(prev->first + prev->second, *off);
          }
          live[*off] = size;
          offsets->push_back(*off);
        } else {
          auto victim = std::next(live.begin(), static_cast<long>(value % live.size()));
          f.release(victim->first);
          live.erase(victim);
        }
        size_t sum = 0;
        for (const auto& [o, s] : live) sum += s;
        EXPECT_EQ(sum, f.bytes_in_use());
      }
      return f.high_water();
    };
    std::vector<size_t> unbounded, exact;
    const size_t need = run(size_t{1} << 40, &unbounded);
    run(need, &exact);
    EXPECT_EQ(unbounded, exact) << "round " << round;
  }
}

// ----------------------------------------------------------------- DSA

std::vector<DsaBlock> random_trace(std::mt19937& rng, int blocks, size_t max_size, bool nested) {
  // Built through the recorder, like a profiled step: allocations and frees
  // interleaved; `nested` frees mostly in LIFO order (a network's shape).
  DsaTraceRecorder rec;
  std::vector<int> live;
  int made = 0;
  while (made < blocks || !live.empty()) {
    const bool alloc = made < blocks && (live.empty() || rng() % 100 < 55);
    if (alloc) {
      live.push_back(rec.allocate(1 + rng() % max_size));
      ++made;
    } else {
      size_t k = nested && rng() % 4 != 0 ? live.size() - 1 : rng() % live.size();
      rec.release(live[k]);
      live.erase(live.begin() + static_cast<long>(k));
    }
  }
  return rec.finish();
}

size_t brute_force_peak(const std::vector<DsaBlock>& blocks) {
  std::vector<int> order(blocks.size());
  std::iota(order.begin(), order.end(), 0);
  size_t best = SIZE_MAX;
  do {
    best = std::min(best, dsa_peak(blocks, dsa_place_in_order(blocks, order)));
  } while (std::next_permutation(order.begin(), order.end()));
  return best;
}

TEST(Dsa, RecorderAndLowerBoundOnAKnownTrace) {
  DsaTraceRecorder rec;
  const int a = rec.allocate(10);  // t0
  const int b = rec.allocate(20);  // t1
  rec.release(a);                  // t2
  const int c = rec.allocate(5);   // t3
  rec.release(b);                  // t4
  const int d = rec.allocate(7);   // t5, never released
  const std::vector<DsaBlock> t = rec.finish();
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[a].start, 0);
  EXPECT_EQ(t[a].end, 2);
  EXPECT_EQ(t[b].end, 4);
  EXPECT_EQ(t[c].start, 3);
  EXPECT_EQ(t[c].end, 6);
  EXPECT_EQ(t[d].end, 6);
  EXPECT_EQ(dsa_lower_bound(t), 30u);  // a + b; b + c = 25; c + d = 12
  EXPECT_THROW(rec.release(a), MemoryError);
  EXPECT_THROW(dsa_best_fit({{0, 0, 1}}), MemoryError);
}

TEST(Dsa, BestFitNeverOverlapsLiveBlocks) {
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    const auto trace = random_trace(rng, 5 + static_cast<int>(rng() % 150), 1 + rng() % 1000,
                                    round % 2 == 0);
    const std::vector<size_t> offsets = dsa_best_fit(trace);
    const auto overlap = dsa_find_overlap(trace, offsets);
    EXPECT_FALSE(overlap.has_value())
        << "round " << round << ": blocks " << overlap->first << " and " << overlap->second;
    EXPECT_GE(dsa_peak(trace, offsets), dsa_lower_bound(trace));
  }
}

TEST(Dsa, FindOverlapDetectsACollision) {
  const std::vector<DsaBlock> t = {{10, 0, 4}, {10, 2, 6}, {10, 4, 8}};
  EXPECT_FALSE(dsa_find_overlap(t, {0, 10, 0}).has_value());  // a and c never meet
  const auto hit = dsa_find_overlap(t, {0, 5, 20});
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, std::make_pair(0, 1));
}

TEST(Dsa, MipMatchesBruteForceOnTinyTraces) {
  std::mt19937 rng(3);
  for (int round = 0; round < 25; ++round) {
    const auto trace = random_trace(rng, 3 + static_cast<int>(rng() % 4), 9, false);
    const DsaMipResult mip = dsa_solve_mip(trace);
    EXPECT_EQ(mip.peak, brute_force_peak(trace)) << "round " << round;
    EXPECT_FALSE(dsa_find_overlap(trace, mip.offsets).has_value());
    EXPECT_GE(mip.peak, dsa_lower_bound(trace));
    EXPECT_LE(mip.peak, dsa_peak(trace, dsa_best_fit(trace)));
  }
}

// The paper's claim (Sec. 5): the heuristic is close to optimal. On small
// network-shaped traces it stays within a few percent of the MIP on average.
TEST(Dsa, BestFitIsWithinAFewPercentOfTheMipOnSmallTraces) {
  std::mt19937 rng(17);
  double ratio_sum = 0;
  const int rounds = 12;
  for (int round = 0; round < rounds; ++round) {
    const auto trace = random_trace(rng, 10, 64, true);
    const size_t heuristic = dsa_peak(trace, dsa_best_fit(trace));
    const size_t optimum = dsa_solve_mip(trace).peak;
    ASSERT_LE(optimum, heuristic);
    ratio_sum += static_cast<double>(heuristic) / static_cast<double>(optimum);
  }
  EXPECT_LE(ratio_sum / rounds, 1.05);
}

// ----------------------------------------------------------------- pools

class PoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = worker::make_backend(
        {.kind = worker::BackendKind::kCpu, .threads = 1, .memory_limit = 8 << 20});
  }
  std::unique_ptr<worker::Backend> backend_;
};

TEST_F(PoolTest, ReservesOnceAndServesByOffset) {
  {
    DevicePool pool(*backend_, 1 << 20);
    EXPECT_EQ(backend_->device_bytes_in_use(), size_t{1} << 20);
    void* a = pool.allocate(1000, "a");
    void* b = pool.allocate(3000, "b");
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);  // the backend's alignment
    EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 1024);
    EXPECT_EQ(pool.bytes_in_use(), 1024u + 3072u);
    pool.release(a);
    EXPECT_EQ(pool.peak_bytes(), 1024u + 3072u);
    EXPECT_EQ(pool.bytes_in_use(), 3072u);
    EXPECT_EQ(backend_->device_bytes_in_use(), size_t{1} << 20);  // no device call per tensor
    EXPECT_THROW(pool.release(a), MemoryError);
    pool.release(b);
  }
  EXPECT_EQ(backend_->device_bytes_in_use(), 0u);
}

TEST_F(PoolTest, OutOfMemoryNamesTheTensorAndTheSizes) {
  DevicePool pool(*backend_, 64 << 10, {.capacity_note = "device.memory_limit 64 KiB"});
  pool.allocate(40 << 10, "conv1.y");
  const std::string msg =
      error_message<OutOfMemoryError>([&] { pool.allocate(30 << 10, "conv2.workspace"); });
  EXPECT_CONTAINS(msg, "conv2.workspace");
  EXPECT_CONTAINS(msg, "30720 bytes");
  EXPECT_CONTAINS(msg, "40.0 KiB in use");
  EXPECT_CONTAINS(msg, "64.0 KiB pool");
  EXPECT_CONTAINS(msg, "largest free range 24.0 KiB");
  EXPECT_CONTAINS(msg, "device.memory_limit");
  // A reservation beyond the device's capacity is refused up front.
  const std::string big =
      error_message<OutOfMemoryError>([&] { DevicePool too_big(*backend_, 64 << 20); });
  EXPECT_CONTAINS(big, "cannot reserve 64.0 MiB");
}

TEST_F(PoolTest, TimelineRecordsEveryEventOfTheStepWithItsLabel) {
  DevicePool pool(*backend_, 1 << 20);
  pool.record_timeline(true);
  void* weights = pool.allocate(4096, "params");  // outside a step: not in the timeline
  pool.begin_step();
  pool.set_label("conv1 forward");
  void* y = pool.allocate(2048, "conv1.y");
  pool.set_label("conv1 backward");
  pool.release(y);
  pool.end_step();
  const auto& t = pool.timeline();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].label, "conv1 forward");
  EXPECT_EQ(t[0].event, "alloc conv1.y");
  EXPECT_EQ(t[0].bytes_in_use, 4096u + 2048u);
  EXPECT_EQ(t[1].event, "free conv1.y");
  EXPECT_EQ(t[1].bytes_in_use, 4096u);
  EXPECT_LE(t[0].seconds, t[1].seconds);
  pool.release(weights);
}

TEST_F(PoolTest, PoisonFillsFreedBlocksWithNan) {
  DevicePoolOptions options;
  options.poison_freed = true;
  DevicePool pool(*backend_, 1 << 20, options);
  auto* p = static_cast<float*>(pool.allocate(1024, "t"));
  backend_->fill(worker::Tensor{{{256, 1, 1, 1}}, p}, 1.0f);
  pool.release(p);
  std::vector<float> host(256);
  backend_->download(worker::Tensor{{{256, 1, 1, 1}}, p}, host.data());
  EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](float v) { return std::isnan(v); }));
}

// The static planner: step 1 is recorded, step 2 runs from the best-fit
// plan (the same offsets every step), a larger request re-plans (Sec. 4.3).
TEST_F(PoolTest, StaticPlannerReplaysFixedOffsetsAndReplansOnGrowth) {
  DevicePoolOptions options;
  options.planner = Planner::kStatic;
  DevicePool pool(*backend_, 1 << 20, options);
  void* persistent = pool.allocate(1000, "params");
  auto step = [&](size_t grow) {
    pool.begin_step();
    void* a = pool.allocate(8192, "a");
    void* b = pool.allocate(4096 + grow, "b");
    pool.release(a);
    void* c = pool.allocate(8192, "c");  // fits where a was
    pool.release(b);
    pool.release(c);
    pool.end_step();
    return std::vector<void*>{a, b, c};
  };
  step(0);
  EXPECT_TRUE(pool.static_plan().active);
  EXPECT_EQ(pool.static_plan().plans, 1);
  EXPECT_EQ(pool.static_plan().blocks, 3);
  EXPECT_EQ(pool.static_plan().lower_bound, 8192u + 4096u);
  EXPECT_EQ(pool.static_plan().plan_peak, 8192u + 4096u);
  const auto second = step(0);
  const auto third = step(0);
  EXPECT_EQ(second, third);
  EXPECT_EQ(pool.static_plan().plans, 1);
  // The planned offsets sit above the persistent block.
  EXPECT_GE(static_cast<char*>(second[0]), static_cast<char*>(persistent) + 1024);
  // A smaller request is served from the plan; a larger one re-plans.
  step(4096);
  EXPECT_EQ(pool.static_plan().plans, 2);
  EXPECT_EQ(pool.static_plan().replans, 1);
  EXPECT_EQ(pool.static_plan().lower_bound, 8192u + 8192u);
  const auto after = step(4096);
  EXPECT_EQ(after, step(4096));
  EXPECT_EQ(pool.static_plan().plans, 2);
  pool.release(persistent);
}

TEST_F(PoolTest, PinnedPoolReservesOnce) {
  PinnedPool host(*backend_, 64 << 10);
  void* a = host.allocate(10000, "conv1.y");
  void* b = host.allocate(10000, "conv2.y");
  EXPECT_NE(a, b);
  host.release(a);
  EXPECT_EQ(host.allocate(10000, "conv3.y"), a);
  const std::string msg =
      error_message<OutOfMemoryError>([&] { host.allocate(60 << 10, "fc1.y"); });
  EXPECT_CONTAINS(msg, "fc1.y");
}

TEST(ChromeTraceWriter, WritesSpansCountersAndOneProcessPerRank) {
  ChromeTrace a(0, "rank 0 (cpu)"), b(1, "rank 1 (cpu)");
  a.span("compute", "conv1 forward", "compute", 10, 5);
  a.span("memory", "offload data.y", "offload", 11, 3, "4096 bytes");
  a.instant("memory", "free conv1.y", "release", 16);
  a.counter("device bytes", 16, 8192);
  b.span("compute", "conv1 \"fwd\"", "compute", 0, 1);
  EXPECT_EQ(a.event_count(), 4u);
  const std::string json = merge_chrome_traces({a.events_json(), b.events_json()});
  EXPECT_CONTAINS(json, "\"traceEvents\"");
  EXPECT_CONTAINS(json, "\"name\":\"process_name\",\"args\":{\"name\":\"rank 1 (cpu)\"}");
  EXPECT_CONTAINS(json, "\"thread_name\",\"args\":{\"name\":\"memory\"}");
  EXPECT_CONTAINS(json, "\"ph\":\"X\",\"pid\":0,\"tid\":2,\"name\":\"offload data.y\"");
  EXPECT_CONTAINS(json, "\"ph\":\"C\",\"pid\":0,\"name\":\"device bytes\"");
  EXPECT_CONTAINS(json, "conv1 \\\"fwd\\\"");
  test_support::TempDir dir;
  a.write(dir.path("t.json"));
  std::string out;
  ASSERT_EQ(test_support::run_command("python3 -c \"import json,sys; d=json.load(open('" +
                                          dir.path("t.json") +
                                          "')); print(len(d['traceEvents']))\"",
                                      &out),
            0)
      << out;
  EXPECT_EQ(out, "7\n");  // process name, 2 track names, 4 events
}


}  // namespace
}  // namespace vtrain::memory
