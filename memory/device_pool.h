// Device memory for every tensor of a network: one reservation from the
// backend, made once, and blocks served from it by offset, so no step ever
// calls the device allocator (cudaMalloc, or the CPU backend's arena).
//
// Two planners place the requests made between begin_step() and end_step():
//  - kPool: best fit over the free ranges (FreeList), as they come;
//  - kStatic: the DSA approach (Sekiyama et al., Sec. 4): the first step is
//    served by the pool while its alloc/free trace is recorded; at its end
//    the best-fit heuristic (dsa.h) gives every request a fixed offset, and
//    the following steps get the k-th request of the step at the k-th
//    offset. A request larger than recorded, or one more than recorded, is
//    served by the pool and the step's new trace is re-planned at its end
//    (Sec. 4.3). Requests outside a step (persistent tensors, evaluation)
//    always go to the pool.
//
// Statistics: bytes in use now, their peak, the last step's peak and
// time-weighted mean, and (when asked, record_timeline) a timeline of every
// allocation and free of the current (or last) step, labelled with what the
// engine was doing (set_label), for plots and traces.
//
// Thread-safety: none; the engine allocates from its compute thread only
// (the memory stream copies, it never allocates).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/name_table.h"
#include "memory/dsa.h"
#include "memory/free_list.h"
#include "worker/device/backend.h"

namespace vtrain::memory {

enum class Planner { kPool, kStatic };
inline constexpr auto kPlannerNames = std::to_array<common::Named<Planner>>(
    {{Planner::kPool, "pool"}, {Planner::kStatic, "static"}});
inline const char* planner_name(Planner planner) { return common::name_of(kPlannerNames, planner); }
// Throws MemoryError listing the known names.
Planner parse_planner(const std::string& name);

struct DevicePoolOptions {
  Planner planner = Planner::kPool;  // how requests inside a step are placed
  bool poison_freed = false;         // fill freed blocks with NaN, so a read after free
                                     // shows in the numbers (tests)
  std::string capacity_note;         // appended to out-of-memory messages, e.g. where the
                                     // capacity came from ("device.memory_limit")
};

struct TimelineSample {
  double seconds = 0;       // since begin_step()
  size_t bytes_in_use = 0;  // after this event
  std::string label;        // what the engine was doing (set_label), e.g. "conv2 forward"
  std::string event;        // "alloc conv2.y" or "free conv2.y"
};

// How the static planner is doing (all zero while the planner is kPool).
struct StaticPlanReport {
  bool active = false;        // steps are being served from fixed offsets
  int blocks = 0;             // requests in the last planned step
  size_t plan_peak = 0;       // bytes the plan spans above the persistent blocks
  size_t lower_bound = 0;     // most bytes alive at once in that step
  size_t pool_span = 0;       // bytes the pool spanned above them for the same step
  int plans = 0;              // solves so far (the first plus re-plans)
  int replans = 0;            // solves caused by a request larger than recorded
  double plan_seconds = 0;    // duration of the last solve
};

class DevicePool {
 public:
  // Reserves `reservation` bytes with backend.allocate_device (throws
  // OutOfMemoryError naming the size when the device refuses).
  DevicePool(worker::Backend& backend, size_t reservation, const DevicePoolOptions& options = {});
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A block of at least `bytes` at an offset that is a multiple of
  // kAlignment (so the pointer keeps the backend's alignment, 64 bytes or
  // more). `name` (the tensor)
  // appears in the timeline and in the OutOfMemoryError thrown when the
  // request does not fit.
  void* allocate(size_t bytes, const std::string& name);
  // Returns a block from allocate(); throws MemoryError for anything else.
  void release(void* ptr);

  // Brackets one training step (see the planners above).
  void begin_step();
  // kStatic only: plans from a trace recorded elsewhere (the simulator's
  // replay of the engine's schedule, which makes the same requests), so that
  // even the first step runs from fixed offsets. Call it after the blocks
  // that live outside steps are allocated.
  // `plan` is that trace's dsa_plan(), already solved there.
  void plan_from_trace(const std::vector<DsaBlock>& trace, const DsaPlan& plan);
  void end_step();
  bool in_step() const { return in_step_; }
  // Keep the labelled timeline of each step (plots, traces, tests); off by
  // default, as it builds text on every request.
  void record_timeline(bool on) { recording_ = on; }
  // Label of the following timeline samples (kept only while recording).
  void set_label(const std::string& label) {
    if (recording_) label_ = label;
  }

  size_t reservation() const { return free_.capacity(); }
  size_t bytes_in_use() const { return free_.bytes_in_use(); }
  size_t peak_bytes() const { return peak_; }
  // The last step's events, while record_timeline(true).
  const std::vector<TimelineSample>& timeline() const { return timeline_; }
  // Of the last finished step: most bytes in use, and their mean over the
  // step's duration (time-weighted).
  size_t step_peak_bytes() const { return step_peak_; }
  double step_average_bytes() const { return step_average_; }
  const StaticPlanReport& static_plan() const { return report_; }
  // The alloc/free trace of the last finished step (blocks still alive at
  // its end end there).
  const std::vector<DsaBlock>& last_step_trace() const { return last_trace_; }

 private:
  struct Block {
    size_t offset;
    std::string name;
    int trace_id;  // in recorder_, -1 outside a step
  };
  void sample(const char* what, const std::string& name);
  void adopt_plan(const std::vector<DsaBlock>& trace, const DsaPlan& plan);

  worker::Backend& backend_;
  DevicePoolOptions options_;
  char* base_ = nullptr;
  FreeList free_;
  size_t peak_ = 0;
  std::unordered_map<void*, Block> blocks_;
  bool recording_ = false;
  std::string label_;
  std::vector<TimelineSample> timeline_;
  std::chrono::steady_clock::time_point step_start_;
  bool in_step_ = false;
  size_t step_peak_ = 0;
  double step_average_ = 0;
  // Bytes in use are piecewise constant between requests: the step's
  // byte-seconds so far, up to the last request, and the bytes since.
  double step_area_ = 0;
  double last_sample_ = 0;
  size_t last_bytes_ = 0;

  // Static planner.
  DsaTraceRecorder recorder_;
  std::vector<DsaBlock> last_trace_;
  size_t step_base_ = 0;       // planned offsets are relative to this (the persistent top)
  bool step_base_set_ = false;
  size_t step_span_ = 0;       // highest byte of the current step (pool-placed) above step_base_
  std::vector<size_t> plan_;   // per request of a step: offset above step_base_
  std::vector<size_t> plan_sizes_;
  std::vector<DsaBlock> rejected_trace_;  // the trace of the last plan that did not fit
  bool deviated_ = false;      // this step made a request the plan could not serve
  bool grew_ = false;          // ... because it was larger (or one more) than recorded
  StaticPlanReport report_;
};

}  // namespace vtrain::memory
