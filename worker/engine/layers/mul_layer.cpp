// The product of two inputs (squeeze-excitation's gate): y = a * b, b shaped
// like a or one factor per sample and channel, broadcast over H and W
// (BinaryKind kMul). Backward reads both inputs: da = dy * b, and db = dy * a,
// summed over H and W where b is broadcast (kMulSum). Both add into a
// gradient another consumer wrote (beta 1). Forward is a pure function of
// the inputs, so a recomputation repeats it exactly.
#include "worker/device/op_calls.h"
#include "worker/engine/layers/layer_registry.h"

namespace vtrain::worker {
namespace {

class MulLayer final : public Layer {
 public:
  using Layer::Layer;

  void forward(LayerCall& call, bool) override {
    mul(call.backend, call.in[0], call.in[1], call.out);
  }

  void backward(LayerCall& call) override {
    const Tensor& a = call.in[0];
    const Tensor& b = call.in[1];
    call.emit_grad(0, true, [&](const Tensor& da, float beta) {
      mul(call.backend, call.dout, b, da, beta);
    });
    call.emit_grad(1, true, [&](const Tensor& db, float beta) {
      mul_factor_gradient(call.backend, call.dout, a, db, beta);
    });
  }

  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_inputs = true;
  }
};

}  // namespace

std::unique_ptr<Layer> make_mul_layer(const LayerSite& site) {
  return std::make_unique<MulLayer>(site.spec());
}

}  // namespace vtrain::worker
