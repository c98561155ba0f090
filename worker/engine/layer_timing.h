// The costs the timed memory simulator needs (memory::StepCosts), measured
// in place on this device at one batch: every layer's forward and backward
// call, timed one layer at a time in temporary device buffers (so it works
// before the network's pool exists, as conv.algorithm auto's tuning does),
// and the memory stream's copy bandwidth each way through pinned memory.
#pragma once

#include <cstdint>
#include <memory>
#include <memory_resource>
#include <string>
#include <vector>

#include "memory/simulator.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/kernel_timing.h"

namespace vtrain::worker {

class Layer;
class Network;
struct NetworkOptions;

// Bytes per second of the backend's memory stream, each way, and what the
// copies cost the compute stream when both run.
struct CopyBandwidth {
  double to_host_bytes_per_second = 0;    // device -> pinned host
  double to_device_bytes_per_second = 0;  // pinned host -> device
  size_t bytes = 0;                       // bytes per timed copy
  double compute_share = 0;               // memory::StepCosts::copy_compute_share
};
// Each way the median of `repeats` copies of `bytes` after one untimed
// copy. Then the compute share: in each of `repeats` rounds, a matrix
// product (64 rows of 16 to 128 features, as many as half the free device
// memory holds; the backend's scratch may grow by its weights' 70 KiB)
// timed alone and again with copies of about its length
// issued on the memory stream just before it; the time it lost over the
// copies' time, the median round's, within [0, 1]. Under a small
// device.memory_limit the copies shrink to the memory free beside the
// product. Throws std::invalid_argument for bytes 0 or repeats < 1,
// memory::OutOfMemoryError when the device has no room for 4 KiB of copies
// and the smallest product (tens of KiB, by the ISA's weight format).
CopyBandwidth measure_copy_bandwidth(Backend& backend, size_t bytes = size_t{64} << 20,
                                     int repeats = 5);
// The ops' scratch measure_copy_bandwidth leaves at most: its largest
// product's, or the scratch as it is when that is larger. (With more free
// memory the product is larger: what a device.memory_limit must hold
// counts this one.)
size_t copy_measurement_scratch(Backend& backend);

// `costs` with the copy bandwidths and compute share of `bandwidth`, and
// back: the copy bandwidths and compute share that `costs` carry.
memory::StepCosts with_copies(memory::StepCosts costs, const CopyBandwidth& bandwidth);
CopyBandwidth copies_of(const memory::StepCosts& costs);

// Per layer of `graph` (built as `layers`, outputs `out_desc` at batch >=
// n), the median time of its forward (training mode) and backward call at
// batch n, and the loss; the data's entries are 0. Each call runs as in a
// training step: backward writes an input's gradient with beta 0 unless a
// later consumer's backward (which runs first) wrote it already, and then
// adds as the layer's emit_grad asks. Layers' parameters and state are
// bound to temporary buffers for the measurement and unbound after (bind
// them again before running the layers). Planned conv layers run in their
// segments of one buffer of `plan_workspace_bytes` (NetworkOptions::
// conv_workspace_bytes; std::invalid_argument naming the layer when 0).
// Device memory for one layer's tensors at a time must be available, else
// memory::OutOfMemoryError naming the layer and the bytes; everything
// allocated is returned, also on errors.
memory::StepCosts measure_step_costs(const Graph& graph,
                                     const std::vector<std::unique_ptr<Layer>>& layers,
                                     const std::vector<TensorDesc>& out_desc, Backend& backend,
                                     int64_t n, const CopyBandwidth& bandwidth,
                                     const KernelTimingOptions& timing = {},
                                     uint64_t plan_workspace_bytes = 0);

// The same for a graph with no network (the profiler): its layers are made
// at batch n as a network makes them under `settings`, conv layers with
// `conv_algorithm` (tuned, when "auto", within the device memory free
// now), then measured.
memory::StepCosts measure_graph_step_costs(const Graph& graph, const ComputeSettings& settings,
                                           Backend& backend, int64_t n,
                                           const CopyBandwidth& bandwidth,
                                           const std::string& conv_algorithm = "auto",
                                           const KernelTimingOptions& timing = {});

// Samples to time steps on: seeded standard-normal images and labels
// cycling over the classes, spread as real data is. (Constant images give
// batch norm a batch variance of 0 and send tiny values down the net;
// ResNet-50's steps then ran 30% slower on a Xeon than on real data.)
// The images in `host` memory (PinnedMemory, for a step that copies them
// as training's does).
struct TimingBatch {
  std::pmr::vector<float> images;  // n samples of the graph's input
  std::vector<int32_t> labels;     // n
};
TimingBatch timing_batch(const Graph& graph, int64_t n,
                         std::pmr::memory_resource* host = std::pmr::get_default_resource());

// The costs as a training step meets them: `net` runs `steps` training
// steps at batch n (1..its max batch) on timing_batch's data, after
// one untimed, and each call is timed where its step makes it
// (Network::record_call_times), so it finds the caches as the calls before
// it left them. Layers timed alone (above) find their own data warm and
// come out faster: ResNet-50 at 32x32, batch 16, on a 2-core Xeon, 7% in
// sum, small memory-bound layers up to 2x. Per call the median over the
// steps (median_call_times), with `bandwidth`. The layers' running
// statistics change; the parameters do not (no update is made). Under a
// plan that offloads, the calls overlapping copies are slowed by them.
memory::StepCosts measure_costs_in_steps(Network& net, int64_t n, int steps,
                                         const CopyBandwidth& bandwidth);

// A per-tensor policy's costs where no profile holds them, measured in
// place as a step meets them: a network on `options` (no memory_costs:
// it plans with each layer timed alone) runs measure_costs_in_steps at
// its max batch (parameters initialised, no update) and is freed before
// this returns. Where that plan offloads, the layers timed alone stand
// (in_steps false): on a device whose copies share its cores, the calls
// that overlap copies come out slowed. Throws what the network throws (a
// capacity no plan fits: memory::OutOfMemoryError naming the tensor).
struct InPlaceCosts {
  memory::StepCosts costs;
  bool in_steps = false;  // timed in steps (else each layer alone)
};
InPlaceCosts measure_costs_in_place(const Graph& graph, Backend& backend,
                                    const NetworkOptions& options, int steps = 3);

// Per entry the median over `steps` (each with the same layer count, else
// std::invalid_argument; at least one); the bandwidths are 0.
memory::StepCosts median_call_times(const std::vector<memory::StepCosts>& steps);

}  // namespace vtrain::worker
