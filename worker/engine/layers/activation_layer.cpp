// silu, gelu, sigmoid and relu6: one element-wise op each (ActivationDesc
// of its kind). Their backward reads the layer's input, where relu's
// (relu_layer.cpp) reads its output.
#include "worker/engine/layers/layer_registry.h"

namespace vtrain::worker {
namespace {

class ActivationLayer final : public Layer {
 public:
  explicit ActivationLayer(const LayerSpec& spec)
      : Layer(spec), kind_(activation_kind(spec.type)) {}

  void forward(LayerCall& call, bool) override {
    call.backend.run(ActivationDesc{.kind = kind_, .x = call.in[0].desc, .y = call.out.desc},
                     ActivationArgs{.x = call.in[0].data, .y = call.out.data});
  }

  void backward(LayerCall& call) override {
    call.emit_grad(0, false, [&](const Tensor& dx, float) {
      call.backend.run(
          ActivationDesc{.kind = kind_,
                         .direction = Direction::kBackward,
                         .x = call.in[0].desc,
                         .dy = call.dout.desc,
                         .dx = dx.desc},
          ActivationArgs{.x = call.in[0].data, .dy = call.dout.data, .dx = dx.data});
    });
  }

  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_inputs = true;
    node.backward_accumulates = false;
  }

 private:
  ActivationKind kind_;
};

}  // namespace

ActivationKind activation_kind(LayerType type) {
  switch (type) {
    case LayerType::kRelu: return ActivationKind::kRelu;
    case LayerType::kSilu: return ActivationKind::kSilu;
    case LayerType::kGelu: return ActivationKind::kGelu;
    case LayerType::kSigmoid: return ActivationKind::kSigmoid;
    case LayerType::kRelu6: return ActivationKind::kRelu6;
    default: break;
  }
  throw std::logic_error(std::string("activation_kind: ") + layer_type_name(type) +
                         " is not an activation");
}

std::unique_ptr<Layer> make_activation_layer(const LayerSite& site) {
  return std::make_unique<ActivationLayer>(site.spec());
}

}  // namespace vtrain::worker
