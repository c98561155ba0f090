// ReLU activation; its backward reads its own output. Paired with the
// convolution before it (fusion_pass.h, conv.fuse_relu), it also adds that
// convolution's bias in forward and writes its gradient in backward, one
// pass over the activations each way instead of two.
#pragma once

#include "worker/engine/layers/conv_layer.h"
#include "worker/engine/layers/layer.h"

namespace vtrain::worker {

class ReluLayer final : public Layer {
 public:
  using Layer::Layer;
  void forward(LayerCall& call, bool training) override;
  void backward(LayerCall& call) override;
  void describe_backward(memory::LayerNode& node) const override;
  // "bias of conv1 added here (conv.fuse_relu)" when paired, else "".
  std::string algorithms(Backend& backend) const override;
  ReluLayer* as_relu() override { return this; }

  // Takes over `conv`'s bias (this layer being the only reader of conv's
  // output), which conv then leaves out (ConvLayer::leave_bias_to_relu).
  // Not owned.
  void take_bias_of(const ConvLayer& conv) { conv_ = &conv; }

 private:
  const ConvLayer* conv_ = nullptr;
};

}  // namespace vtrain::worker
