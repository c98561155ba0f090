#include "worker/engine/layers/relu_layer.h"

#include "worker/engine/layers/layer_registry.h"

namespace vtrain::worker {

void ReluLayer::forward(LayerCall& call, bool) {
  if (conv_) {
    call.backend.bias_relu_forward(call.in[0], conv_->compute_bias(), call.out);
  } else {
    call.backend.relu_forward(call.in[0], call.out);
  }
}

// The convolution's output has this layer as its only reader, so dx is all
// of its gradient: the bias gradient is its sum.
void ReluLayer::backward(LayerCall& call) {
  call.emit_grad(0, false, [&](const Tensor& dx, float) {
    if (conv_) {
      call.backend.relu_backward_bias(call.out, call.dout, dx, conv_->bias_gradient());
    } else {
      call.backend.relu_backward(call.out, call.dout, dx);
    }
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
