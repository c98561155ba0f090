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

  // First request that did not fit (fits == false).
  std::string failure;          // "out of memory allocating 'conv2.workspace' (...)"
  TensorId failed_tensor;
  int failed_layer = -1;        // whose forward/backward was being prepared
};

// Replays `schedule` (persistent tensors, one training step, one evaluation)
// against `capacity` bytes (0 = unbounded: only measure).
Simulation simulate(const MemoryModel& model, const Schedule& schedule, size_t capacity,
                    Planner planner);

}  // namespace vtrain::memory
