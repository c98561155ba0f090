// Max or average pooling; its state (max indices, where the backend keeps
// them) lives from forward to backward.
#include "worker/engine/layers/layer_registry.h"
#include "worker/engine/op_scratch.h"

namespace vtrain::worker {
namespace {

class PoolLayer final : public Layer {
 public:
  PoolLayer(const LayerSpec& s, Backend& backend, const TensorDesc& x, const TensorDesc& y)
      : Layer(s), state_bytes_(backend.scratch_bytes(desc(Direction::kForward, x, y)).state) {}
  size_t state_bytes() const override { return state_bytes_; }
  void bind_state(void* state) override { state_ = state; }
  void forward(LayerCall& call, bool) override {
    call.backend.run(desc(Direction::kForward, call.in[0].desc, call.out.desc),
                     PoolArgs{.x = call.in[0].data, .y = call.out.data, .state = state_});
  }
  void backward(LayerCall& call) override {
    call.emit_grad(0, false, [&](const Tensor& dx, float) {
      PoolDesc backward = desc(Direction::kBackward, call.in[0].desc, call.out.desc);
      backward.dy = call.dout.desc;
      backward.dx = dx.desc;
      call.backend.run(backward,
                       PoolArgs{.x = call.in[0].data,
                                .y = call.out.data,
                                .dy = call.dout.data,
                                .dx = dx.data,
                                .state = state_});
    });
  }
  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_inputs = node.backward_reads_output = true;
    node.backward_accumulates = false;
  }

 private:
  PoolDesc desc(Direction direction, const TensorDesc& x, const TensorDesc& y) const {
    return {spec().pool, direction, x, y, window_of(spec())};
  }

  size_t state_bytes_ = 0;
  void* state_ = nullptr;
};

}  // namespace

std::unique_ptr<Layer> make_pool_layer(const LayerSite& site) {
  return std::make_unique<PoolLayer>(site.spec(), site.backend, *site.x, site.y);
}

}  // namespace vtrain::worker
