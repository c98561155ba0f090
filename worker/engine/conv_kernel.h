// Convolution kernels as the engine runs them: a conv layer's Forward,
// BackwardData or BackwardFilter, possibly as several calls on micro-batches,
// each with its own algorithm, inside its own segment of the network's
// workspace (mu-cuDNN; the balancer's WR / WD plans).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "worker/device/backend.h"
#include "worker/device/op_calls.h"
#include "worker/engine/graph.h"

namespace vtrain::worker {

// One call: an algorithm (the backend's stable name) on `size` images.
struct ConvCall {
  std::string algorithm;
  int64_t size = 1;
  friend bool operator==(const ConvCall&, const ConvCall&) = default;
};

// How one kernel runs: its calls in order, sizes summing to the rank's
// batch, within [workspace_offset, workspace_offset + workspace_bytes) of the
// network's workspace.
struct ConvKernelExecution {
  std::vector<ConvCall> calls;
  uint64_t workspace_offset = 0;
  uint64_t workspace_bytes = 0;
  friend bool operator==(const ConvKernelExecution&, const ConvKernelExecution&) = default;
};

// A conv layer's three kernels, indexed by ConvKind.
struct ConvLayerExecution {
  std::string layer;  // the conv layer's name
  std::array<ConvKernelExecution, 3> kernels;
  friend bool operator==(const ConvLayerExecution&, const ConvLayerExecution&) = default;
};

// A call resolved to the backend's algorithm id.
struct ConvStep {
  ConvAlgo algo = 0;
  int64_t size = 1;
};

// The tensors a kernel reads and writes (the ones its kind uses).
struct ConvOperands {
  Tensor x, y;    // Forward: y = conv(x, w) (+ bias); BackwardFilter reads x
  Tensor dy, dx;  // BackwardData: dx from dy; BackwardFilter reads dy
  const void* w = nullptr;     // weights and bias in the activations' type
  const void* bias = nullptr;
  float* dw = nullptr;         // their gradients in f32
  float* dbias = nullptr;
};

// The two reasons a kernel runs with beta 1 (adds to what its output holds),
// which the backend's conv_algorithms / conv_workspace call `accumulate`:
//
// BackwardData adds its share into an input gradient that another consumer
// of the same input wrote first (a fork in the graph).
inline bool adds_to_shared_input_gradient(ConvKind kind) {
  return kind == ConvKind::kBackwardData;
}
// BackwardFilter run as micro-batches sums dW and dbias over them: beta 1
// after the first call.
inline bool sums_over_micro_batches(ConvKind kind) { return kind == ConvKind::kBackwardFilter; }

// Runs `kind` of problem p (p.x.shape.n images) as the calls `steps`, in
// order, each on its slice of the samples; when the steps cover fewer images
// than p has (a larger batch than planned) they repeat, and the last call is
// cut to what is left. Forward and BackwardData write disjoint slices with
// `beta`; BackwardFilter sums over micro-batches: `beta` on the first call,
// 1 after it, so dW and dbias sum over every micro-batch. Throws
// BackendError when a call's workspace exceeds workspace_bytes.
void run_conv_kernel(Backend& backend, ConvKind kind, const ConvProblem& p,
                     std::span<const ConvStep> steps, const ConvOperands& operands, float beta,
                     void* workspace, size_t workspace_bytes);

// One call of `kind` with algorithm `algo` on the samples
// [first, first + q.x.shape.n) of the operands, unchecked (run_conv_kernel
// checks the workspace first).
void run_conv_call(Backend& backend, ConvKind kind, const ConvProblem& q, ConvAlgo algo,
                   const ConvOperands& operands, int64_t first, float beta, void* workspace,
                   size_t workspace_bytes);

// The convolution a conv layer runs, between activations x and y.
ConvProblem conv_problem(const LayerSpec& conv, const TensorDesc& x, const TensorDesc& y);

// The kernels conv layer `layer` of `graph` runs in a training step:
// Forward, BackwardData (unless its input is the data, which needs no
// gradient) and BackwardFilter.
std::vector<ConvKind> conv_kernels_of(const Graph& graph, int layer);

// One kernel a conv layer runs in a step, with its problem.
struct ConvKernelSite {
  int layer = 0;  // index in the graph
  ConvKind kind = ConvKind::kForward;
  ConvProblem problem;
};

// Every conv kernel of `graph` in order (conv_kernels_of per conv layer),
// its problem between the activations `descs` (activation_descs()).
std::vector<ConvKernelSite> conv_kernel_sites(const Graph& graph,
                                              const std::vector<TensorDesc>& descs);

}  // namespace vtrain::worker
