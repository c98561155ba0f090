// A network's input for the C++ benchmark drivers that time training steps.
#pragma once

#include <cstdint>

#include "worker/engine/graph.h"
#include "worker/engine/layer_timing.h"
#include "worker/engine/network.h"

namespace vtrain::bench {

// Uploads the profiler's timing batch (worker::timing_batch: normal images
// of a fixed seed, labels cycling over the classes), so every run of a
// benchmark trains on the same batch as the profiler times.
inline void upload_random_batch(worker::Network& net, const worker::Graph& graph, int64_t batch) {
  const worker::TimingBatch b = worker::timing_batch(graph, batch);
  net.backend().upload(b.images.data(), net.input(batch));
  net.backend().upload_labels(b.labels.data(), net.labels(), batch);
}

}  // namespace vtrain::bench
