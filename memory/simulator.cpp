#include "memory/simulator.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>

#include "common/text.h"
#include "memory/free_list.h"
#include "memory/memory_error.h"

namespace vtrain::memory {
namespace {

size_t key(const TensorId& id) {
  return (static_cast<size_t>(id.kind) << 32) | static_cast<uint32_t>(id.layer);
}

class Replay {
 public:
  Replay(const MemoryModel& model, size_t capacity)
      : model_(model),
        device_(capacity > 0 ? capacity : std::numeric_limits<size_t>::max() / 2),
        host_(std::numeric_limits<size_t>::max() / 2) {}

  // False (and the failure recorded) when the request does not fit.
  bool alloc(const TensorId& id, Simulation& sim, int layer, bool backward) {
    const size_t bytes = tensor_bytes(model_, id);
    const std::optional<size_t> offset = device_.allocate(bytes);
    if (!offset) {
      sim.fits = false;
      sim.failed_tensor = id;
      sim.failed_layer = layer;
      sim.failure = "out of memory allocating '" + tensor_name(model_, id) + "' (" +
                    common::format_bytes_fixed(bytes) + " = " + std::to_string(bytes) + " bytes) " +
                    (layer >= 0 ? std::string(backward ? "for the backward of '"
                                                       : "for the forward of '") +
                                      model_.layers[layer].name + "'"
                                : std::string("before the first step")) +
                    ": " + common::format_bytes_fixed(device_.bytes_in_use()) + " in use of " +
                    common::format_bytes_fixed(device_.capacity()) + ", largest free range " +
                    common::format_bytes_fixed(device_.largest_free());
      return false;
    }
    device_at_[key(id)] = *offset;
    if (recording_) trace_id_[key(id)] = recorder_.allocate(block_bytes(bytes));
    observe(sim);
    return true;
  }
  void free(const TensorId& id, Simulation& sim) {
    auto it = device_at_.find(key(id));
    if (it == device_at_.end()) {
      throw MemoryError("schedule frees '" + tensor_name(model_, id) + "', which is not allocated");
    }
    device_.release(it->second);
    device_at_.erase(it);
    if (recording_) recorder_.release(trace_id_.at(key(id)));
    observe(sim);
  }
  void offload(const TensorId& id, Simulation& sim) {
    const size_t bytes = tensor_bytes(model_, id);
    host_at_[key(id)] = *host_.allocate(bytes);
    sim.host_bytes = std::max(sim.host_bytes, host_.high_water());
    sim.offloaded_bytes += bytes;
  }
  void free_host(const TensorId& id) {
    auto it = host_at_.find(key(id));
    if (it == host_at_.end()) {
      throw MemoryError("schedule frees the host copy of '" + tensor_name(model_, id) +
                        "', which has none");
    }
    host_.release(it->second);
    host_at_.erase(it);
  }

  void start_recording() { recording_ = true; }
  void stop_recording(Simulation& sim) {
    recording_ = false;
    sim.step_trace = recorder_.finish();
  }
  // Starts measuring the highest byte used from now on.
  void begin_phase() { phase_high_ = device_.top(); }
  size_t phase_high() const { return phase_high_; }
  size_t top() const { return device_.top(); }
  size_t in_use() const { return device_.bytes_in_use(); }

 private:
  void observe(Simulation& sim) {
    sim.peak_bytes = std::max(sim.peak_bytes, device_.bytes_in_use());
    phase_high_ = std::max(phase_high_, device_.top());
  }

  const MemoryModel& model_;
  FreeList device_;
  FreeList host_;
  std::map<size_t, size_t> device_at_, host_at_;
  bool recording_ = false;
  DsaTraceRecorder recorder_;
  std::map<size_t, int> trace_id_;
  size_t phase_high_ = 0;
};

// The two streams' clocks during a timed training step.
class StepClock {
 public:
  StepClock(const MemoryModel& model, const StepCosts& costs, StepTiming& timing)
      : model_(model), costs_(costs), t_(timing) {
    t_ = StepTiming{};
    t_.stall_per_tensor.assign(model.layers.size(), 0.0);
  }

  // Before event `e` changes the bytes in use (`in_use` until now).
  void at(const ScheduleEvent& e, size_t in_use) {
    const double seconds = call_seconds(costs_, e);
    if (seconds > 0) {
      bytes_time_ += static_cast<double>(in_use) * seconds;
      compute_ += seconds;
      (e.op == Op::kRecompute ? t_.recompute_seconds : t_.compute_seconds) += seconds;
    } else if (e.op == Op::kOffload || e.op == Op::kPrefetch) {
      const double bandwidth = e.op == Op::kOffload ? costs_.to_host_bytes_per_second
                                                    : costs_.to_device_bytes_per_second;
      const double start = std::max(compute_, memory_);
      const double length = static_cast<double>(tensor_bytes(model_, e.tensor)) / bandwidth;
      memory_ = start + length;
      t_.copy_seconds += length;
      copies_.push_back({e.tensor.layer, start, memory_});
      // The compute stream's loss to the copy; at a share of 1 the copy
      // ends when compute resumes, so it never stalls a sync.
      const double lost = costs_.copy_compute_share * length;
      bytes_time_ += static_cast<double>(in_use) * lost;
      compute_ += lost;
      t_.copy_contention_seconds += lost;
      t_.stall_per_tensor[e.tensor.layer] += lost;
    } else if (e.op == Op::kSyncMemory && memory_ > compute_) {
      // The wait, charged to the copies by how much of it each covers.
      for (const Copy& c : copies_) {
        const double overlap = std::min(c.end, memory_) - std::max(c.start, compute_);
        if (overlap > 0) t_.stall_per_tensor[c.layer] += overlap;
      }
      bytes_time_ += static_cast<double>(in_use) * (memory_ - compute_);
      t_.stall_seconds += memory_ - compute_;
      compute_ = memory_;
      copies_.clear();
    } else if (e.op == Op::kSyncMemory) {
      copies_.clear();
    }
  }
  void finish() {
    t_.step_seconds = compute_ + costs_.other_seconds;
    t_.mean_bytes = compute_ > 0 ? bytes_time_ / compute_ : 0;
  }

 private:
  struct Copy {
    int layer;
    double start, end;
  };
  const MemoryModel& model_;
  const StepCosts& costs_;
  StepTiming& t_;
  double compute_ = 0, memory_ = 0, bytes_time_ = 0;
  std::vector<Copy> copies_;  // issued since the last sync
};

// Replays one event list; false at the first request that does not fit.
bool replay(const std::vector<ScheduleEvent>& events, Replay& r, Simulation& sim,
            StepClock* clock = nullptr) {
  // The layer an allocation serves is the next compute event's.
  const std::vector<int> owner = event_owners(events);
  for (size_t k = 0; k < events.size(); ++k) {
    const ScheduleEvent& e = events[k];
    if (clock) clock->at(e, r.in_use());
    switch (e.op) {
      case Op::kAlloc:
      case Op::kPrefetch: {
        const ScheduleEvent* call = owner[k] >= 0 ? &events[owner[k]] : nullptr;
        if (!r.alloc(e.tensor, sim, call ? call->tensor.layer : -1,
                     call && call->op == Op::kBackward)) {
          return false;
        }
        break;
      }
      case Op::kFree: r.free(e.tensor, sim); break;
      case Op::kOffload: r.offload(e.tensor, sim); break;
      case Op::kFreeHost: r.free_host(e.tensor); break;
      case Op::kSyncMemory:
      case Op::kForward:
      case Op::kRecompute:
      case Op::kLoss:
      case Op::kBackward: break;
    }
  }
  if (clock) clock->finish();
  return true;
}

}  // namespace

namespace {

// One replay: persistent tensors, a training step, an evaluation.
Simulation run(const MemoryModel& model, const Schedule& schedule, size_t capacity,
               Planner planner, const StepCosts* costs) {
  Simulation sim;
  std::optional<StepClock> clock;
  if (costs) {
    sim.timed = true;
    clock.emplace(model, *costs, sim.timing);
  }
  Replay r(model, capacity);
  for (const TensorId& id : schedule.persistent) {
    if (!r.alloc(id, sim, -1, false)) return sim;
  }
  sim.persistent_bytes = r.in_use();
  const size_t base = r.top();
  r.begin_phase();
  r.start_recording();
  const bool step_ok = replay(schedule.train, r, sim, clock ? &*clock : nullptr);
  r.stop_recording(sim);
  const size_t step_need = r.phase_high();
  sim.pool_span = step_need - base;
  if (!step_ok) return sim;
  sim.lower_bound = dsa_lower_bound(sim.step_trace);
  r.begin_phase();
  if (!replay(schedule.evaluate, r, sim)) return sim;
  const size_t evaluate_need = r.phase_high();
  size_t need = std::max(step_need, evaluate_need);
  if (planner == Planner::kStatic) {
    sim.static_plan = dsa_plan(sim.step_trace);
    // The pool serves the steps when the plan would span more than it does
    // (DevicePool adopts a plan only if it fits the reservation).
    need = std::max(evaluate_need, std::min(step_need, base + sim.static_plan.peak));
  }
  sim.reservation = std::max(need, base);
  return sim;
}

}  // namespace

StepCosts scaled(StepCosts costs, double factor) {
  for (double& t : costs.forward_seconds) t *= factor;
  for (double& t : costs.backward_seconds) t *= factor;
  costs.loss_seconds *= factor;
  costs.other_seconds *= factor;
  return costs;
}

double call_seconds(const StepCosts& costs, const ScheduleEvent& e) {
  switch (e.op) {
    case Op::kForward:
    case Op::kRecompute: return costs.forward_seconds[e.tensor.layer];
    case Op::kBackward: return costs.backward_seconds[e.tensor.layer];
    case Op::kLoss: return costs.loss_seconds;
    default: return 0;
  }
}

Simulation simulate(const MemoryModel& model, const Schedule& schedule, size_t capacity,
                    Planner planner, const StepCosts* costs) {
  if (costs) {
    const size_t n = model.layers.size();
    if (costs->forward_seconds.size() != n || costs->backward_seconds.size() != n) {
      throw MemoryError("step costs: " + std::to_string(costs->forward_seconds.size()) +
                        " forward and " + std::to_string(costs->backward_seconds.size()) +
                        " backward times for " + std::to_string(n) + " layers");
    }
    if (!(costs->to_host_bytes_per_second > 0) || !(costs->to_device_bytes_per_second > 0)) {
      throw MemoryError("step costs: the copy bandwidths must be positive");
    }
    if (!(costs->copy_compute_share >= 0 && costs->copy_compute_share <= 1)) {
      throw MemoryError("step costs: the copies' share of the compute must be in [0, 1], got " +
                        common::format("%g", costs->copy_compute_share));
    }
    if (!(costs->other_seconds >= 0)) {
      throw MemoryError("step costs: the time outside layer calls must be >= 0");
    }
  }
  Simulation sim = run(model, schedule, 0, planner, costs);
  if (capacity == 0 || sim.reservation <= capacity) return sim;
  // Locate the first request that does not fit under the pool's placement.
  const Simulation bounded = run(model, schedule, capacity, Planner::kPool, nullptr);
  sim.fits = false;
  if (!bounded.fits) {
    sim.failure = bounded.failure;
    sim.failed_tensor = bounded.failed_tensor;
    sim.failed_layer = bounded.failed_layer;
  } else {
    sim.failure = "the plan needs " + common::format_bytes_fixed(sim.reservation) + " = " +
                  std::to_string(sim.reservation) + " bytes of a capacity of " +
                  common::format_bytes_fixed(capacity);
  }
  return sim;
}

}  // namespace vtrain::memory
