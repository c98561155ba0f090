// Replays a schedule's allocations and frees through the pool's placement
// (FreeList) without touching a device: what a step needs, whether it fits
// a capacity, and where it would run out. The dynamic policy decides "fits"
// with it, so choosing costs no failed training passes; the engine sizes its
// reservations with it; its recorded step trace primes the static planner.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "memory/device_pool.h"
#include "memory/dsa.h"
#include "memory/vdnn_plan.h"

namespace vtrain::memory {

// What one training step's operations cost on a device, at the batch the
// memory model was built for (the profile of the device, or measured in
// place). The copy bandwidths are the memory stream's, each way.
struct StepCosts {
  std::vector<double> forward_seconds;   // per layer (the data's: 0)
  std::vector<double> backward_seconds;  // per layer
  double loss_seconds = 0;
  double other_seconds = 0;  // the step's compute-stream time outside its layer calls and
                             // loss (the engine's memory operations, the pool); measured
                             // in a step (worker/engine/layer_timing.h), else 0
  double to_host_bytes_per_second = 0;
  double to_device_bytes_per_second = 0;
  // The share of a copy's time the compute stream loses to it, in [0, 1]:
  // 0 where a copy engine moves the bytes beside the compute (a GPU), 1
  // where the copies take the cores the compute runs on (a CPU whose
  // threads fill its cores). Measured with the bandwidths.
  double copy_compute_share = 0;
};

// `costs` with every compute time (layer calls, loss, other_seconds)
// multiplied by `factor`; the bandwidths unchanged.
StepCosts scaled(StepCosts costs, double factor);

// The timed replay of a training step: the compute stream runs the layer
// calls in schedule order; the memory stream runs offloads and prefetches
// in issue order, each starting once compute has issued it (it waits for
// what compute produced) and the stream is free, and costing the compute
// stream copy_compute_share of its time (at 1 the copies run one after
// another with the calls); a kSyncMemory makes compute wait for everything
// issued, and that wait is a stall.
struct StepTiming {
  double step_seconds = 0;       // the compute stream's time, stalls and other_seconds included
  double compute_seconds = 0;    // forward, loss and backward calls
  double recompute_seconds = 0;  // kRecompute calls
  double stall_seconds = 0;      // compute waiting for the memory stream
  double copy_seconds = 0;       // the memory stream's busy time
  double copy_contention_seconds = 0;  // compute time lost to the copies (copy_compute_share)
  std::vector<double> stall_per_tensor;  // per layer: the compute time its Y's copies cost
                                         // (stalls, and the copies' share of the compute)
  double mean_bytes = 0;         // device bytes in use over the step, time-weighted
};

struct Simulation {
  bool fits = true;             // every request fitted the capacity
  size_t reservation = 0;       // device bytes the pool must reserve for this schedule
                                // and planner (fragmentation included)
  size_t persistent_bytes = 0;  // bytes allocated once, before any step
  size_t peak_bytes = 0;        // most bytes in use at once (training step or evaluation)
  size_t pool_span = 0;         // training step: bytes the pool spans above the persistent ones
  DsaPlan static_plan;          // kStatic: the best-fit plan of the training step
  size_t lower_bound = 0;       // training step: most bytes alive at once above the persistent
  size_t host_bytes = 0;        // pinned host bytes the offloads need
  size_t offloaded_bytes = 0;   // bytes copied to the host per step
  std::vector<DsaBlock> step_trace;  // the training step's requests (for the static planner)
  bool timed = false;           // costs were given: `timing` holds the step's times
  StepTiming timing;

  // First request that did not fit (fits == false).
  std::string failure;          // "out of memory allocating 'conv2.workspace' (...)"
  TensorId failed_tensor;
  int failed_layer = -1;        // whose forward/backward was being prepared
};

// Replays `schedule` (persistent tensors, one training step, one evaluation)
// against `capacity` bytes (0 = unbounded: only measure). With `costs`
// (one entry per layer, else MemoryError), the training step is also timed.
Simulation simulate(const MemoryModel& model, const Schedule& schedule, size_t capacity,
                    Planner planner, const StepCosts* costs = nullptr);

// The time of one layer call of a schedule under `costs` (kForward,
// kRecompute, kBackward, kLoss; 0 for memory operations).
double call_seconds(const StepCosts& costs, const ScheduleEvent& event);

}  // namespace vtrain::memory
