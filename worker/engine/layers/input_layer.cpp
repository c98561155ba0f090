// The data: its output is what the caller uploads; nothing to compute.
#include "worker/engine/layers/layer_registry.h"

namespace vtrain::worker {
namespace {

class InputLayer final : public Layer {
 public:
  using Layer::Layer;
  void forward(LayerCall&, bool) override {}
  void backward(LayerCall&) override {}
};

}  // namespace

std::unique_ptr<Layer> make_input_layer(const LayerSite& site) {
  return std::make_unique<InputLayer>(site.spec());
}

}  // namespace vtrain::worker
