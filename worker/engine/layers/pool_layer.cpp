// Max or average pooling; its state (max indices, where the backend keeps
// them) lives from forward to backward.
#include "worker/engine/layers/layer_registry.h"
#include "worker/engine/op_scratch.h"

namespace vtrain::worker {
namespace {

class PoolLayer final : public Layer {
 public:
  PoolLayer(const LayerSpec& s, Backend& backend, const TensorDesc& x, const TensorDesc& y)
      : Layer(s), params_(pool_params(s)), state_bytes_(backend.pooling_state_bytes(params_, x, y)) {}
  size_t state_bytes() const override { return state_bytes_; }
  void bind_state(void* state) override { state_ = state; }
  void forward(LayerCall& call, bool) override {
    call.backend.pooling_forward(params_, call.in[0], call.out, state_);
  }
  void backward(LayerCall& call) override {
    call.emit_grad(0, false, [&](const Tensor& dx, float) {
      call.backend.pooling_backward(params_, call.in[0], call.out, call.dout, dx, state_);
    });
  }
  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_inputs = node.backward_reads_output = true;
    node.backward_accumulates = false;
  }

 private:
  PoolParams params_;
  size_t state_bytes_ = 0;
  void* state_ = nullptr;
};

}  // namespace

std::unique_ptr<Layer> make_pool_layer(const LayerSite& site) {
  return std::make_unique<PoolLayer>(site.spec(), site.backend, *site.x, site.y);
}

}  // namespace vtrain::worker
