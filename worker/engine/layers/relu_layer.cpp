// ReLU activation; its backward reads its own output.
#include "worker/engine/layers/layer_registry.h"

namespace vtrain::worker {
namespace {

class ReluLayer final : public Layer {
 public:
  using Layer::Layer;
  void forward(LayerCall& call, bool) override {
    call.backend.relu_forward(call.in[0], call.out);
  }
  void backward(LayerCall& call) override {
    call.emit_grad(0, false, [&](const Tensor& dx, float) {
      call.backend.relu_backward(call.out, call.dout, dx);
    });
  }
  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_output = true;
    node.backward_accumulates = false;
  }
};

}  // namespace

std::unique_ptr<Layer> make_relu_layer(const LayerSite& site) {
  return std::make_unique<ReluLayer>(site.spec());
}

}  // namespace vtrain::worker
