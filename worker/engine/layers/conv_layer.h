// Convolution (+ bias). Each of its kernels (Forward, BackwardData,
// BackwardFilter) runs either undivided with a chosen algorithm in the
// network's workspace (ConvAlgorithmChoice: conv.algorithm, tuned for
// auto) or as a plan's micro-batched calls in the kernel's segment of the
// plan's workspace (ConvPlan).
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "worker/engine/layers/conv_algorithm_choice.h"
#include "worker/engine/layers/conv_plan.h"
#include "worker/engine/layers/layer_registry.h"

namespace vtrain::worker {

class ConvLayer final : public Layer {
 public:
  explicit ConvLayer(const LayerSite& site);

  int64_t param_count() const override;
  bool reads_compute_params() const override { return true; }
  void init(Rng& rng, Backend& backend) override;
  void forward(LayerCall& call, bool training) override;
  void backward(LayerCall& call) override;
  void describe_backward(memory::LayerNode& node) const override;
  // "Forward=direct BackwardData=[2xdirect 5xgemm] BackwardFilter=-".
  std::string algorithms(Backend& backend) const override;
  ConvLayer* as_conv() override { return this; }
  const ConvLayer* as_conv() const override { return this; }

  // The kernels a training step runs (conv_kernels_of()).
  const std::vector<ConvKind>& kernels() const { return kernels_; }
  bool runs(ConvKind kind) const;
  // Whether a plan fixes the kernels' calls (then there is no choice).
  bool planned() const { return plan_.has_value(); }
  // The algorithm choice of an unplanned layer (tuned times, dynamic
  // policy's downgrade). Throws std::logic_error when planned.
  ConvAlgorithmChoice& choice();

  // The bias and its gradient left to the relu after it (ReluLayer::
  // take_bias_of): forward adds no bias, backward writes no bias gradient.
  void leave_bias_to_relu() { bias_to_relu_ = true; }
  bool has_bias() const { return spec().bias; }
  const void* compute_bias() const;  // the bias as kernels read it; null without one
  float* bias_gradient() const { return bias(grads()); }

  // conv.algorithm auto: times every candidate of every kernel the layer
  // runs on buffers of its own, x and y at the layer's max batch, and keeps
  // the fastest. Candidates needing more workspace than room() (called once
  // the data buffers are allocated) are dropped first. Throws BackendError
  // naming the layer when the buffers do not fit on the device.
  void tune(Backend& backend, const TensorDesc& x, const TensorDesc& y,
            const std::function<size_t()>& room);

 private:
  // The kind's workspace with its chosen algorithm (0 when planned: its
  // segment lies in the plan's buffer).
  size_t kernel_workspace(ConvKind kind) const;
  // Where the bias starts in a parameter array: after the weights.
  int64_t bias_offset() const { return problem_.weight_shape().elements(); }
  float* bias(float* base) const;
  // Runs one kernel: undivided with the chosen algorithm in the call's
  // workspace, or as the plan's calls in the kernel's segment of it.
  void run(LayerCall& call, ConvKind kind, const ConvOperands& o, float beta);

  ConvProblem problem_;            // at the layer's max batch
  std::vector<ConvKind> kernels_;  // the kinds a step runs
  std::optional<ConvAlgorithmChoice> choice_;  // unplanned
  std::optional<ConvPlan> plan_;               // planned
  bool bias_to_relu_ = false;
};

}  // namespace vtrain::worker
