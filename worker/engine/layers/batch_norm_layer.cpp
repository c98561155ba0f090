// Per-channel batch norm: learned gamma and beta, running mean and variance
// as buffers, the batch's mean and variance as state for backward. The
// state also holds a discard area for a recomputation's running statistics:
// the backend updates running statistics in every training forward, and a
// recomputed forward must leave the step's update as it was.
#include "worker/engine/layers/layer_registry.h"

#include <algorithm>

namespace vtrain::worker {
namespace {

class BatchNormLayer final : public Layer {
 public:
  BatchNormLayer(const LayerSpec& s, int64_t channels) : Layer(s), c_(channels) {}
  int64_t param_count() const override { return 2 * c_; }   // gamma, beta
  int64_t buffer_count() const override { return 2 * c_; }  // running mean, running var
  // Batch mean and variance, then the discard area (2c floats each).
  size_t state_bytes() const override { return 4 * c_ * sizeof(float); }
  void bind_state(void* state) override { saved_ = static_cast<float*>(state); }
  void init(Rng&, Backend& backend) override {
    std::vector<float> ss(2 * c_, 0.0f), running(2 * c_, 0.0f);
    std::fill(ss.begin(), ss.begin() + c_, 1.0f);
    std::fill(running.begin() + c_, running.end(), 1.0f);
    upload_floats(backend, ss, params());
    upload_floats(backend, running, buffers());
  }
  void forward(LayerCall& call, bool training) override {
    float* running = buffers();
    if (training) {
      forward_training(call, running);
    } else {
      call.backend.batch_norm_forward_inference(call.in[0], call.out, params(), running,
                                                running + c_, spec().bn_eps);
    }
  }
  // The batch statistics come out as in the step's forward (same input);
  // the running statistics it computes land in the discard area.
  void recompute(LayerCall& call) override { forward_training(call, saved_ + 2 * c_); }
  void backward(LayerCall& call) override {
    auto op = [&](const Tensor& dx, float) {
      call.backend.batch_norm_backward(call.in[0], call.dout, params(), saved_, saved_ + c_, dx,
                                       grads(), 0.0f, spec().bn_eps);
    };
    // gamma and beta need gradients even where the input does not, and
    // batch norm has no weights-only backward: then dx goes to scratch.
    if (call.needs_grad(0)) {
      call.emit_grad(0, false, op);
    } else {
      op(call.scratch_like(call.in[0]), 0.0f);
    }
    call.gradients_ready();
  }
  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_inputs = true;
    node.backward_accumulates = false;
    node.backward_needs_input_grad = true;
  }

 private:
  // Training-mode forward: batch statistics into the saved state, running
  // statistics (mean, then variance) updated at `running`.
  void forward_training(LayerCall& call, float* running) {
    call.backend.batch_norm_forward_training(call.in[0], call.out, params(), saved_, saved_ + c_,
                                             running, running + c_, spec().bn_momentum,
                                             spec().bn_eps);
  }

  int64_t c_;
  float* saved_ = nullptr;
};

}  // namespace

std::unique_ptr<Layer> make_batch_norm_layer(const LayerSite& site) {
  return std::make_unique<BatchNormLayer>(site.spec(), site.x->shape.c);
}

}  // namespace vtrain::worker
