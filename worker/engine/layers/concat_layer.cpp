// Channel concatenation of two or more inputs (GoogLeNet joins).
#include "worker/engine/layers/layer_registry.h"
#include "worker/device/op_calls.h"

namespace vtrain::worker {
namespace {

class ConcatLayer final : public Layer {
 public:
  using Layer::Layer;
  void forward(LayerCall& call, bool) override { concat_forward(call.backend, call.in, call.out); }
  void backward(LayerCall& call) override {
    int64_t offset = 0;
    for (int i = 0; i < static_cast<int>(call.in.size()); ++i) {
      call.emit_grad(i, true, [&](const Tensor& dx, float beta) {
        concat_backward(call.backend, call.dout, offset, dx, beta);
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
