// The costs the timed memory simulator needs (memory::StepCosts), measured
// in place on this device at one batch: every layer's forward and backward
// call, timed one layer at a time in temporary device buffers (so it works
// before the network's pool exists, as conv.algorithm auto's tuning does),
// and the memory stream's copy bandwidth each way through pinned memory.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "memory/simulator.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/kernel_timing.h"

namespace vtrain::worker {

class Layer;

// Bytes per second of the backend's memory stream: device -> pinned host and
// pinned host -> device, each the median of `repeats` copies of `bytes`.
struct CopyBandwidth {
  double to_host_bytes_per_second = 0;
  double to_device_bytes_per_second = 0;
};
CopyBandwidth measure_copy_bandwidth(Backend& backend, size_t bytes = size_t{64} << 20,
                                     int repeats = 5);

// Per layer of `graph` (built as `layers`, outputs `out_desc` at batch >=
// n), the median time of its forward (training mode) and backward call at
// batch n, and the loss. Layers' parameters are bound to temporary buffers
// for the measurement and unbound after. Device memory for one layer's
// tensors at a time must be available (else memory::OutOfMemoryError naming
// the layer).
memory::StepCosts measure_step_costs(const Graph& graph,
                                     const std::vector<std::unique_ptr<Layer>>& layers,
                                     const std::vector<TensorDesc>& out_desc, Backend& backend,
                                     int64_t n, const CopyBandwidth& bandwidth,
                                     const KernelTimingOptions& timing = {});

}  // namespace vtrain::worker
