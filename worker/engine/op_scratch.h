// The backend scratch a network's ops need, asked of the backend before the
// network sizes its pool (see Backend::reserve_scratch).
#pragma once

#include <cstddef>
#include <vector>

#include "worker/device/backend.h"
#include "worker/engine/graph.h"

namespace vtrain::worker {

// The most bytes of backend scratch any one op of a training or evaluation
// step needs: each layer's forward and backward, the accumulation of a
// gradient from several consumers, and the loss on the last layer's output.
// `out` are the layers' output descriptors at the network's largest batch.
size_t op_scratch_bytes(const Graph& graph, const std::vector<TensorDesc>& out, Backend& backend);

}  // namespace vtrain::worker
