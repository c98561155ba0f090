// Channel concatenation of two or more inputs (GoogLeNet joins).
#include "worker/engine/layers/layer_registry.h"

namespace vtrain::worker {
namespace {

class ConcatLayer final : public Layer {
 public:
  using Layer::Layer;
  void forward(LayerCall& call, bool) override { call.backend.concat_forward(call.in, call.out); }
  void backward(LayerCall& call) override {
    int64_t offset = 0;
    for (int i = 0; i < static_cast<int>(call.in.size()); ++i) {
      call.emit_grad(i, true, [&](const Tensor& dx, float beta) {
        call.backend.concat_backward(call.dout, offset, dx, beta);
      });
      offset += call.in[i].shape().c;
    }
  }
};

}  // namespace

std::unique_ptr<Layer> make_concat_layer(const LayerSite& site) {
  return std::make_unique<ConcatLayer>(site.spec());
}

}  // namespace vtrain::worker
