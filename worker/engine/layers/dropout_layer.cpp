// dropout: the identity in evaluation; in training inverted dropout
// (DropoutDesc), its mask drawn on the device from (train.seed, the step,
// the layer's graph index, each sample's index in the step's global batch)
// and never stored: the backward draws it again, and so does a
// recomputation of the forward, so the layer keeps no state and its
// backward reads neither its input nor its output.
#include "worker/engine/layers/layer_registry.h"

namespace vtrain::worker {
namespace {

class DropoutLayer final : public Layer {
 public:
  DropoutLayer(const LayerSpec& spec, int index) : Layer(spec), index_(index) {}

  void forward(LayerCall& call, bool training) override {
    if (!training) {
      call.backend.convert(call.in[0], call.out);  // same descriptor: a copy
      return;
    }
    call.backend.run(desc(call, Direction::kForward, call.in[0].desc),
                     DropoutArgs{.x = call.in[0].data, .y = call.out.data});
  }

  // The default recompute() runs forward(call, true): same step context,
  // same mask.

  void backward(LayerCall& call) override {
    call.emit_grad(0, false, [&](const Tensor& dx, float) {
      call.backend.run(desc(call, Direction::kBackward, dx.desc),
                       DropoutArgs{.dy = call.dout.data, .dx = dx.data});
    });
  }

  void describe_backward(memory::LayerNode& node) const override {
    node.backward_accumulates = false;  // writes its input's gradient (beta 0)
  }

 private:
  DropoutDesc desc(const LayerCall& call, Direction direction, const TensorDesc& x) const {
    return DropoutDesc{.direction = direction,
                       .x = x,
                       .p = spec().dropout_p,
                       .key = {call.step.seed, call.step.step, index_},
                       .first_sample = call.step.first_sample};
  }

  int index_;  // the layer's graph index: part of its mask's key
};

}  // namespace

std::unique_ptr<Layer> make_dropout_layer(const LayerSite& site) {
  return std::make_unique<DropoutLayer>(site.spec(), site.index);
}

}  // namespace vtrain::worker
