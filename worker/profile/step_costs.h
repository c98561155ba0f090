// The timed memory simulator's costs (memory::StepCosts) through the perf
// DB: the profiler measures a device's copy bandwidth and a model's layers
// at each batch into it (perfdb's copy_bandwidth and layer_measurements),
// and profiled_step_costs() reads them back for a planner.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memory/simulator.h"
#include "perfdb/perf_db.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/kernel_timing.h"

namespace vtrain::worker {

// What the perf DB keys `graph`'s step and layer times on when it is
// computed under `settings`: its signature and the settings, each a column.
perfdb::ModelKey model_key(const Graph& graph, const ComputeSettings& settings);

// The perf DB rows of measured costs: one per layer (forward and backward
// in ms), one for the loss (perfdb::kLossLayer, named "loss") and, when
// the costs were timed in training steps, one for the time outside the
// calls (perfdb::kOutsideCallsLayer).
std::vector<perfdb::LayerMeasurement> layer_rows(const Graph& graph,
                                                 const memory::StepCosts& costs);

// What the perf DB holds of `graph`'s costs under `settings` at per-rank
// `batch` on `device`.
struct StepCostsLookup {
  std::optional<memory::StepCosts> costs;  // set when every row is there
  std::string missing;                     // else what is not, for a message: "the copy
                                           // bandwidth to_host; layers conv2, relu2 at batch 64"
};
StepCostsLookup profiled_step_costs(perfdb::PerfDb& db, perfdb::DeviceId device,
                                    const Graph& graph, const ComputeSettings& settings,
                                    int64_t batch);

// Whether `db` holds `device`'s copy bandwidth both ways, with the
// copies' compute share (rows from before schema version 6 lack it).
bool holds_copy_bandwidth(perfdb::PerfDb& db, perfdb::DeviceId device);
// Measures `backend`'s copy bandwidth into `db`.
void record_copy_bandwidth(Backend& backend, perfdb::PerfDb& db, perfdb::DeviceId device,
                           const KernelTimingOptions& timing);

// Whether `db` holds the time of every layer of `graph` under `settings`
// and the loss at `batch` on `device`.
bool holds_layer_costs(perfdb::PerfDb& db, perfdb::DeviceId device, const Graph& graph,
                       const ComputeSettings& settings, int64_t batch);
// Measures every layer of `graph` and the loss at `batch`, each alone
// (conv layers with their fastest algorithm, undivided), into `db`; one
// transaction. memory::OutOfMemoryError when a layer does not fit.
void record_layer_costs(const Graph& graph, const ComputeSettings& settings, Backend& backend,
                        perfdb::PerfDb& db,
                        perfdb::DeviceId device, int64_t batch,
                        const KernelTimingOptions& timing);

}  // namespace vtrain::worker
