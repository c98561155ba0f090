// cuDNN graph-API convolutions without a CudaBackend: what
// CudaBackend::graph_algorithms and graph_plan are made of (see "cuDNN
// graph-API convolution engines" in cuda_backend_impl.h), for a GPU through
// its cuDNN handle or, host-side, for a device described by its properties
// (cuDNN 9.8 and newer plan without a GPU that way: cuda_graph_plan_test
// plans for an H100 on machines that have none).
#pragma once

#include <string>
#include <vector>

#include "worker/device/cuda/cuda_backend_impl.h"

namespace vtrain::worker::cuda {

// Where plans are made for: a GPU's handle, or a finalized
// CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR (one of the two).
struct GraphTarget {
  cudnnHandle_t handle = nullptr;
  cudnnBackendDescriptor_t device = nullptr;
};

// The engine configurations cuDNN's heuristics (mode A) rank for `kind` on
// p (in its call's layout, conv_layout) in `variant`, best first, as
// registry entries: those that compile at run time, and for f32 compute
// those that reduce in half, left out, as are results whose attributes
// cannot be read. Throws BackendError where the graph itself is refused.
std::vector<GraphEngine> ranked_graph_engines(const GraphTarget& target, ConvKind kind,
                                              const ConvProblem& p,
                                              const ConvVariantInfo& variant);

// Engine configuration e finalized for p with `beta` (out = conv + beta *
// out): GraphPlan::plan null, with cuDNN's reason in `refused`, where it
// does not finalize. Throws BackendError where the graph is refused.
GraphPlan graph_plan_for(const GraphTarget& target, ConvKind kind, const ConvProblem& p,
                         const GraphEngine& e, float beta);

}  // namespace vtrain::worker::cuda
