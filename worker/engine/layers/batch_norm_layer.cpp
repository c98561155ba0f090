// Per-channel batch norm: learned gamma and beta, running mean and variance
// as buffers, the batch's mean and variance as state for backward. The
// state also holds a second area of 2c floats: a local recomputation's
// running statistics go there to be discarded (the backend updates running
// statistics in every training forward, and a recomputed forward must leave
// the step's update as it was); a synchronised backward keeps the global
// means of dy and dy * xhat there.
//
// Synchronised (LayerCall::sum_over_ranks set: model.batch_norm: sync over
// several ranks), the statistics are those of the global batch: forward adds
// up every rank's per-channel sums, sums of squares and element count, and
// normalises with the global mean and variance; backward adds up the sums of
// dy and dy * xhat that dx depends on. Every rank then holds the same
// statistics, and so the same running statistics.
#include "worker/engine/layers/layer_registry.h"

#include <algorithm>

namespace vtrain::worker {
namespace {

class BatchNormLayer final : public Layer {
 public:
  BatchNormLayer(const LayerSpec& s, int64_t channels, Backend& backend)
      : Layer(s), c_(channels), backend_(backend) {}
  int64_t param_count() const override { return 2 * c_; }   // gamma, beta
  int64_t buffer_count() const override { return 2 * c_; }  // running mean, running var
  // Batch mean and variance, then the second area (2c floats each).
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
    if (!training) {
      normalise(call, running);
      return;
    }
    synchronised_ = static_cast<bool>(call.sum_over_ranks);
    if (synchronised_) {
      forward_synchronised(call);
    } else {
      forward_training(call, running);
    }
  }
  // The batch statistics come out as in the step's forward (same input);
  // the running statistics it computes land in the discard area. A
  // synchronised layer normalises with the global statistics its forward
  // saved: no collective (recomputations differ between ranks).
  void recompute(LayerCall& call) override {
    if (synchronised_) {
      normalise(call);
    } else {
      forward_training(call, saved_ + 2 * c_);
    }
  }
  void backward(LayerCall& call) override {
    const Tensor& x = call.in[0];
    std::function<void(const Tensor&, float)> op;
    // Both backwards read x, dy, gamma and the saved statistics.
    const auto args = [&](const Tensor& dx) {
      return BatchNormArgs{.x = x.data, .dy = call.dout.data, .dx = dx.data,
                           .scale_shift = params(), .mean = saved_, .var = saved_ + c_};
    };
    if (synchronised_) {
      const float* dy_means = global_dy_means(call);
      op = [&, dy_means](const Tensor& dx, float) {
        BatchNormArgs a = args(dx);
        a.dy_means = dy_means;
        call.backend.run(desc(BatchNormKind::kBackwardData, x.desc, dx.desc, call.dout.desc), a);
      };
    } else {
      op = [&](const Tensor& dx, float) {
        BatchNormArgs a = args(dx);
        a.dscale_shift = grads();
        call.backend.run(desc(BatchNormKind::kBackward, x.desc, dx.desc, call.dout.desc), a);
      };
    }
    // gamma and beta need gradients even where the input does not, and
    // batch norm has no weights-only backward: then dx goes to scratch.
    if (call.needs_grad(0)) {
      call.emit_grad(0, false, op);
    } else {
      op(call.scratch_like(x), 0.0f);
    }
    call.gradients_ready();
  }
  void train_without_samples(const SumOverRanks& sum_over_ranks, bool backward) override {
    std::vector<double> zeros(backward ? 2 * c_ : 2 * c_ + 1, 0.0);
    sum_over_ranks(zeros);
    if (!backward) global_statistics(zeros);
  }
  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_inputs = true;
    node.backward_accumulates = false;
    node.backward_needs_input_grad = true;
  }

 private:
  // This layer's batch norm of `kind` from x to y (forward) or dy to dx
  // (beta 0: the gradients are overwritten).
  BatchNormDesc desc(BatchNormKind kind, const TensorDesc& x, const TensorDesc& y_or_dx = {},
                     const TensorDesc& dy = {}) const {
    const bool forward =
        kind == BatchNormKind::kForwardTraining || kind == BatchNormKind::kForwardInference;
    return {kind,       x,  spec().bn_eps, spec().bn_momentum, 0.0f, forward ? y_or_dx : TensorDesc{},
            dy,         forward ? TensorDesc{} : y_or_dx};
  }

  // Training-mode forward: batch statistics into the saved state, running
  // statistics (mean, then variance) updated at `running`.
  void forward_training(LayerCall& call, float* running) {
    call.backend.run(desc(BatchNormKind::kForwardTraining, call.in[0].desc, call.out.desc),
                     BatchNormArgs{.x = call.in[0].data,
                                   .y = call.out.data,
                                   .scale_shift = params(),
                                   .mean = saved_,
                                   .var = saved_ + c_,
                                   .running_mean = running,
                                   .running_var = running + c_});
  }

  void forward_synchronised(LayerCall& call) {
    const Shape& s = call.in[0].shape();
    std::vector<double> sums;
    call.backend.run(desc(BatchNormKind::kSums, call.in[0].desc),
                     BatchNormArgs{.x = call.in[0].data, .sums = &sums});
    sums.push_back(static_cast<double>(s.n * s.h * s.w));
    call.sum_over_ranks(sums);
    upload_floats(call.backend, global_statistics(sums), saved_);
    normalise(call);
  }

  // y from x with the mean and variance at `stats` (then the variance):
  // the saved (global) ones by default, or the running ones.
  void normalise(LayerCall& call, float* stats = nullptr) {
    if (!stats) stats = saved_;
    call.backend.run(desc(BatchNormKind::kForwardInference, call.in[0].desc, call.out.desc),
                     BatchNormArgs{.x = call.in[0].data,
                                   .y = call.out.data,
                                   .scale_shift = params(),
                                   .mean = stats,
                                   .var = stats + c_});
  }

  // From the sums over all ranks (of x, of x^2, then the element count):
  // the global mean and biased variance (2c floats), which the running
  // statistics also take in, as the backend's training forward does.
  std::vector<float> global_statistics(const std::vector<double>& sums) {
    count_ = sums[2 * c_];
    std::vector<float> stats(2 * c_);
    for (int64_t i = 0; i < c_; ++i) {
      const double mean = sums[i] / count_;
      stats[i] = static_cast<float>(mean);
      stats[c_ + i] = static_cast<float>(std::max(0.0, sums[c_ + i] / count_ - mean * mean));
    }
    const float momentum = spec().bn_momentum;
    const float unbias = count_ > 1 ? static_cast<float>(count_ / (count_ - 1)) : 1.0f;
    std::vector<float> running = download_floats(backend_, buffers(), 2 * c_);
    for (int64_t i = 0; i < c_; ++i) {
      running[i] = (1.0f - momentum) * running[i] + momentum * stats[i];
      running[c_ + i] = (1.0f - momentum) * running[c_ + i] + momentum * stats[c_ + i] * unbias;
    }
    upload_floats(backend_, running, buffers());
    return stats;
  }

  // This rank's d gamma and d beta into the gradients (the gradient
  // allreduce adds the ranks' up), and the global batch's means of dy and
  // dy * xhat into the second state area, which it returns.
  const float* global_dy_means(LayerCall& call) {
    std::vector<double> sums;
    call.backend.run(desc(BatchNormKind::kBackwardSums, call.in[0].desc, {}, call.dout.desc),
                     BatchNormArgs{.x = call.in[0].data,
                                   .dy = call.dout.data,
                                   .mean = saved_,
                                   .var = saved_ + c_,
                                   .sums = &sums});
    std::vector<float> local(2 * c_);
    for (int64_t i = 0; i < c_; ++i) {
      local[i] = static_cast<float>(sums[c_ + i]);  // d gamma: sum of dy * xhat
      local[c_ + i] = static_cast<float>(sums[i]);  // d beta: sum of dy
    }
    upload_floats(call.backend, local, grads());
    call.sum_over_ranks(sums);
    std::vector<float> means(2 * c_);
    for (int64_t i = 0; i < 2 * c_; ++i) means[i] = static_cast<float>(sums[i] / count_);
    upload_floats(call.backend, means, saved_ + 2 * c_);
    return saved_ + 2 * c_;
  }

  int64_t c_;
  Backend& backend_;  // for the running statistics (the same as every call's)
  float* saved_ = nullptr;
  bool synchronised_ = false;  // the step's forward added up the ranks' statistics
  double count_ = 0;           // elements per channel in the global batch (synchronised)
};

}  // namespace

std::unique_ptr<Layer> make_batch_norm_layer(const LayerSite& site) {
  return std::make_unique<BatchNormLayer>(site.spec(), site.x->shape.c, site.backend);
}

}  // namespace vtrain::worker
