// Fully connected (inner product, + bias); flattens C x H x W.
#include "worker/engine/layers/layer_registry.h"
#include "worker/device/op_calls.h"

#include <cmath>

namespace vtrain::worker {
namespace {

class FcLayer final : public Layer {
 public:
  FcLayer(const LayerSpec& s, const Shape& x) : Layer(s), in_(x.per_sample()) {}
  bool reads_compute_params() const override { return true; }
  int64_t param_count() const override {
    return spec().out * in_ + (spec().bias ? spec().out : 0);
  }
  void init(Rng& rng, Backend& backend) override {
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
    std::vector<float> host(static_cast<size_t>(param_count()));
    for (float& v : host) v = rng.uniform(bound);
    upload_floats(backend, host, params());
  }
  void forward(LayerCall& call, bool) override {
    inner_product_forward(call.backend, call.in[0], compute_params(), compute_bias(), call.out);
  }
  void backward(LayerCall& call) override {
    inner_product_backward_weights(call.backend, call.in[0], call.dout, grads(), bias(grads()),
                                                0.0f);
    call.gradients_ready();
    call.emit_grad(0, false, [&](const Tensor& dx, float) {
      inner_product_backward_data(call.backend, call.dout, compute_params(), dx);
    });
  }
  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_inputs = true;
    node.backward_accumulates = false;
  }

 private:
  // Where the bias starts in a parameter array: after the weights.
  int64_t bias_offset() const { return spec().out * in_; }
  float* bias(float* base) const { return spec().bias ? base + bias_offset() : nullptr; }
  const void* compute_bias() const { return spec().bias ? compute_params(bias_offset()) : nullptr; }
  int64_t in_;
};

}  // namespace

std::unique_ptr<Layer> make_fc_layer(const LayerSite& site) {
  return std::make_unique<FcLayer>(site.spec(), site.x->shape);
}

}  // namespace vtrain::worker
