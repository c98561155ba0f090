#include "worker/engine/layers/relu_layer.h"

#include "worker/engine/layers/layer_registry.h"

namespace vtrain::worker {

void ReluLayer::forward(LayerCall& call, bool) {
  call.backend.run(ActivationDesc{.x = call.in[0].desc, .y = call.out.desc, .bias = conv_ != nullptr},
                   ActivationArgs{.x = call.in[0].data,
                                  .y = call.out.data,
                                  .bias = conv_ ? conv_->compute_bias() : nullptr});
}

// The convolution's output has this layer as its only reader, so dx is all
// of its gradient: the bias gradient is its sum.
void ReluLayer::backward(LayerCall& call) {
  call.emit_grad(0, false, [&](const Tensor& dx, float) {
    call.backend.run(
        ActivationDesc{.direction = Direction::kBackward,
                       .y = call.out.desc,
                       .dy = call.dout.desc,
                       .dx = dx.desc,
                       .bias = conv_ != nullptr},
        ActivationArgs{.y = call.out.data,
                       .dy = call.dout.data,
                       .dx = dx.data,
                       .dbias = conv_ ? conv_->bias_gradient() : nullptr});
  });
}

void ReluLayer::describe_backward(memory::LayerNode& node) const {
  node.backward_reads_output = true;
  node.backward_accumulates = false;
}

std::string ReluLayer::algorithms(Backend&) const {
  return conv_ ? "bias of " + conv_->spec().name + " added here (conv.fuse_relu)" : "";
}

std::unique_ptr<Layer> make_relu_layer(const LayerSite& site) {
  return std::make_unique<ReluLayer>(site.spec());
}

}  // namespace vtrain::worker
