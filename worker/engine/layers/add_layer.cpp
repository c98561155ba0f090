// Element-wise sum of two or more inputs (ResNet joins).
#include "worker/engine/layers/layer_registry.h"
#include "worker/device/op_calls.h"

namespace vtrain::worker {
namespace {

class AddLayer final : public Layer {
 public:
  using Layer::Layer;
  void forward(LayerCall& call, bool) override {
    add(call.backend, call.in[0], call.in[1], call.out);
    for (size_t i = 2; i < call.in.size(); ++i) add(call.backend, call.out, call.in[i], call.out);
  }
  void backward(LayerCall& call) override {
    for (int i = 0; i < static_cast<int>(call.in.size()); ++i) {
      call.emit_grad(i, true, [&](const Tensor& dx, float beta) {
        accumulate(call.backend, call.dout, dx, beta);
      });
    }
  }
};

}  // namespace

std::unique_ptr<Layer> make_add_layer(const LayerSite& site) {
  return std::make_unique<AddLayer>(site.spec());
}

}  // namespace vtrain::worker
