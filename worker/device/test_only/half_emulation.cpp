// TEST ONLY (see half_emulation.h): half storage, f32 compute, on a
// backend that lacks the half type.
#include "worker/device/test_only/half_emulation.h"

#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "common/half_convert.h"

namespace vtrain::worker {
namespace {

using common::DataType;

// Widens `count` elements of `type` at `src` into `dst` (floats).
void widen(const void* src, DataType type, int64_t count, float* dst) {
  const auto n = static_cast<size_t>(count);
  switch (type) {
    case DataType::kF32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DataType::kBF16: common::to_float({static_cast<const common::Bf16*>(src), n}, dst); return;
    case DataType::kF16: common::to_float({static_cast<const common::F16*>(src), n}, dst); return;
  }
}

// Rounds `count` floats at `src` to `type` into `dst`, once, to nearest even.
void narrow(const float* src, int64_t count, DataType type, void* dst) {
  const std::span<const float> in(src, static_cast<size_t>(count));
  switch (type) {
    case DataType::kF32: std::memcpy(dst, src, in.size_bytes()); return;
    case DataType::kBF16: common::to_bf16(in, static_cast<common::Bf16*>(dst)); return;
    case DataType::kF16: common::to_f16(in, static_cast<common::F16*>(dst)); return;
  }
}

class HalfEmulation final : public Backend {
 public:
  explicit HalfEmulation(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {
    info_ = inner_->device_info();
    info_.name += kHalfEmulationSuffix;
    emulated_bf16_ = inner_->precision_unavailable(common::Precision::kBf16).has_value();
    emulated_f16_ = inner_->precision_unavailable(common::Precision::kFp16).has_value();
  }

  DeviceInfo device_info() const override { return info_; }
  std::optional<std::string> precision_unavailable(common::Precision p) const override {
    if (common::is_half(p)) return std::nullopt;
    return inner_->precision_unavailable(p);
  }

  void* allocate_device(size_t bytes) override { return inner_->allocate_device(bytes); }
  void free_device(void* ptr) override { inner_->free_device(ptr); }
  size_t allocation_bytes(size_t bytes) const override { return inner_->allocation_bytes(bytes); }
  size_t device_bytes_in_use() const override { return inner_->device_bytes_in_use(); }
  size_t device_bytes_peak() const override { return inner_->device_bytes_peak(); }
  void reset_peak() override { inner_->reset_peak(); }
  void* allocate_pinned(size_t bytes) override { return inner_->allocate_pinned(bytes); }
  void free_pinned(void* ptr) override { inner_->free_pinned(ptr); }
  Layout preferred_layout(int64_t channels) const override {
    return inner_->preferred_layout(channels);
  }

  Event record_event(StreamKind stream) override { return inner_->record_event(stream); }
  void wait_event(StreamKind stream, const Event& event) override {
    inner_->wait_event(stream, event);
  }
  void synchronize(const Event& event) override { inner_->synchronize(event); }
  void synchronize(StreamKind stream) override { inner_->synchronize(stream); }
  void begin_compute_span() override { inner_->begin_compute_span(); }
  double end_compute_span_ms() override { return inner_->end_compute_span_ms(); }
  void copy_async(void* dst, const void* src, size_t bytes, StreamKind stream) override {
    inner_->copy_async(dst, src, bytes, stream);
  }

  void upload(const float* host, const Tensor& dst) override {
    Wide d(*this, dst, false);
    inner_->upload(host, d.tensor());
    d.store();
  }
  void download(const Tensor& src, float* host) override {
    inner_->download(Wide(*this, src).tensor(), host);
  }
  void convert(const Tensor& src, const Tensor& dst) override {
    if (!emulated(src.desc.dtype) && !emulated(dst.desc.dtype)) return inner_->convert(src, dst);
    Wide s(*this, src);
    Wide d(*this, dst, false);
    inner_->convert(s.tensor(), d.tensor());
    d.store();
  }
  void fill(const Tensor& dst, float value) override {
    Wide d(*this, dst, false);
    inner_->fill(d.tensor(), value);
    d.store();
  }
  void upload_labels(const int32_t* host, int32_t* device, int64_t count) override {
    inner_->upload_labels(host, device, count);
  }

  std::vector<ConvAlgoInfo> conv_algorithms(ConvKind kind, const ConvProblem& p,
                                            bool accumulate) override {
    return inner_->conv_algorithms(kind, wide(p), accumulate);
  }
  std::string conv_algorithm_name(ConvKind kind, ConvAlgo algo) const override {
    return inner_->conv_algorithm_name(kind, algo);
  }
  size_t conv_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                        bool accumulate) override {
    return inner_->conv_workspace(kind, algo, wide(p), accumulate);
  }
  void conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const void* w,
                    const void* bias, const Tensor& y, float beta, void* workspace,
                    size_t workspace_bytes) override {
    const DataType t = x.desc.dtype;
    Wide y_wide(*this, y, beta != 0);
    inner_->conv_forward(algo, wide(p), Wide(*this, x).tensor(),
                         WideArray(*this, w, t, p.weight_shape().elements()).data(),
                         WideArray(*this, bias, t, p.k).data(), y_wide.tensor(), beta, workspace,
                         workspace_bytes);
    y_wide.store();
  }
  void conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy, const void* w,
                          const Tensor& dx, float beta, void* workspace,
                          size_t workspace_bytes) override {
    Wide dx_wide(*this, dx, beta != 0);
    inner_->conv_backward_data(algo, wide(p), Wide(*this, dy).tensor(),
                               WideArray(*this, w, dy.desc.dtype, p.weight_shape().elements()).data(),
                               dx_wide.tensor(), beta, workspace, workspace_bytes);
    dx_wide.store();
  }
  void conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                            const Tensor& dy, float* dw, float* dbias, float beta,
                            void* workspace, size_t workspace_bytes) override {
    inner_->conv_backward_filter(algo, wide(p), Wide(*this, x).tensor(), Wide(*this, dy).tensor(),
                                 dw, dbias, beta, workspace, workspace_bytes);
  }

  void relu_forward(const Tensor& x, const Tensor& y) override {
    Wide y_wide(*this, y, false);
    inner_->relu_forward(Wide(*this, x).tensor(), y_wide.tensor());
    y_wide.store();
  }
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override {
    const Wide dy_wide(*this, dy);
    Wide dx_wide(*this, dx, false);
    inner_->relu_backward(Wide(*this, y).tensor(), dy_wide.tensor(), dx_wide.tensor());
    dx_wide.store();
  }
  void bias_relu_forward(const Tensor& x, const void* bias, const Tensor& y) override {
    Wide y_wide(*this, y, false);
    inner_->bias_relu_forward(Wide(*this, x).tensor(),
                              WideArray(*this, bias, x.desc.dtype, x.shape().c).data(),
                              y_wide.tensor());
    y_wide.store();
  }
  void relu_backward_bias(const Tensor& y, const Tensor& dy, const Tensor& dx,
                          float* dbias) override {
    const Wide dy_wide(*this, dy);
    Wide dx_wide(*this, dx, false);
    inner_->relu_backward_bias(Wide(*this, y).tensor(), dy_wide.tensor(), dx_wide.tensor(), dbias);
    dx_wide.store();
  }
  bool pairs_bias_with_relu() const override { return inner_->pairs_bias_with_relu(); }

  size_t pooling_state_bytes(const PoolParams& p, const TensorDesc& x,
                             const TensorDesc& y) override {
    return inner_->pooling_state_bytes(p, wide(x), wide(y));
  }
  void pooling_forward(const PoolParams& p, const Tensor& x, const Tensor& y,
                       void* state) override {
    Wide y_wide(*this, y, false);
    inner_->pooling_forward(p, Wide(*this, x).tensor(), y_wide.tensor(), state);
    y_wide.store();
  }
  void pooling_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor& dx, const void* state) override {
    Wide dx_wide(*this, dx, false);
    inner_->pooling_backward(p, Wide(*this, x).tensor(), Wide(*this, y).tensor(),
                             Wide(*this, dy).tensor(), dx_wide.tensor(), state);
    dx_wide.store();
  }

  void inner_product_forward(const Tensor& x, const void* w, const void* bias,
                             const Tensor& y) override {
    const int64_t out = y.shape().c;
    const DataType t = x.desc.dtype;
    Wide y_wide(*this, y, false);
    inner_->inner_product_forward(Wide(*this, x).tensor(),
                                  WideArray(*this, w, t, out * x.shape().per_sample()).data(),
                                  WideArray(*this, bias, t, out).data(), y_wide.tensor());
    y_wide.store();
  }
  void inner_product_backward_data(const Tensor& dy, const void* w, const Tensor& dx) override {
    const int64_t weights = dy.shape().c * dx.shape().per_sample();
    Wide dx_wide(*this, dx, false);
    inner_->inner_product_backward_data(Wide(*this, dy).tensor(),
                                        WideArray(*this, w, dy.desc.dtype, weights).data(),
                                        dx_wide.tensor());
    dx_wide.store();
  }
  void inner_product_backward_weights(const Tensor& x, const Tensor& dy, float* dw, float* dbias,
                                      float beta) override {
    inner_->inner_product_backward_weights(Wide(*this, x).tensor(), Wide(*this, dy).tensor(), dw,
                                           dbias, beta);
  }

  void batch_norm_forward_training(const Tensor& x, const Tensor& y, const float* scale_shift,
                                   float* save_mean, float* save_var, float* running_mean,
                                   float* running_var, float momentum, float eps) override {
    Wide y_wide(*this, y, false);
    inner_->batch_norm_forward_training(Wide(*this, x).tensor(), y_wide.tensor(), scale_shift,
                                        save_mean, save_var, running_mean, running_var, momentum,
                                        eps);
    y_wide.store();
  }
  void batch_norm_forward_inference(const Tensor& x, const Tensor& y, const float* scale_shift,
                                    const float* running_mean, const float* running_var,
                                    float eps) override {
    Wide y_wide(*this, y, false);
    inner_->batch_norm_forward_inference(Wide(*this, x).tensor(), y_wide.tensor(), scale_shift,
                                         running_mean, running_var, eps);
    y_wide.store();
  }
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const float* scale_shift,
                           const float* save_mean, const float* save_var, const Tensor& dx,
                           float* dscale_shift, float beta, float eps) override {
    const Wide dy_wide(*this, dy);
    Wide dx_wide(*this, dx, false);
    inner_->batch_norm_backward(Wide(*this, x).tensor(), dy_wide.tensor(), scale_shift, save_mean,
                                save_var, dx_wide.tensor(), dscale_shift, beta, eps);
    dx_wide.store();
  }
  std::vector<double> batch_norm_sums(const Tensor& x) override {
    return inner_->batch_norm_sums(Wide(*this, x).tensor());
  }
  std::vector<double> batch_norm_backward_sums(const Tensor& x, const Tensor& dy,
                                               const float* mean, const float* var,
                                               float eps) override {
    return inner_->batch_norm_backward_sums(Wide(*this, x).tensor(), Wide(*this, dy).tensor(),
                                            mean, var, eps);
  }
  void batch_norm_backward_data(const Tensor& x, const Tensor& dy, const float* scale_shift,
                                const float* mean, const float* var, const float* dy_means,
                                const Tensor& dx, float eps) override {
    const Wide dy_wide(*this, dy);
    Wide dx_wide(*this, dx, false);
    inner_->batch_norm_backward_data(Wide(*this, x).tensor(), dy_wide.tensor(), scale_shift, mean,
                                     var, dy_means, dx_wide.tensor(), eps);
    dx_wide.store();
  }

  void add(const Tensor& a, const Tensor& b, const Tensor& y) override {
    const Wide a_wide(*this, a), b_wide(*this, b);
    Wide y_wide(*this, y, false);
    inner_->add(a_wide.tensor(), b_wide.tensor(), y_wide.tensor());
    y_wide.store();
  }
  void accumulate(const Tensor& x, const Tensor& y, float beta) override {
    const Wide x_wide(*this, x);
    Wide y_wide(*this, y, beta != 0);
    inner_->accumulate(x_wide.tensor(), y_wide.tensor(), beta);
    y_wide.store();
  }
  void concat_forward(std::span<const Tensor> xs, const Tensor& y) override {
    std::vector<Wide> wides;
    wides.reserve(xs.size());
    std::vector<Tensor> inputs;
    for (const Tensor& x : xs) inputs.push_back(wides.emplace_back(*this, x).tensor());
    Wide y_wide(*this, y, false);
    inner_->concat_forward(inputs, y_wide.tensor());
    y_wide.store();
  }
  void concat_backward(const Tensor& dy, int64_t channel_offset, const Tensor& dx,
                       float beta) override {
    Wide dx_wide(*this, dx, beta != 0);
    inner_->concat_backward(Wide(*this, dy).tensor(), channel_offset, dx_wide.tensor(), beta);
    dx_wide.store();
  }
  LossStats softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float scale,
                                  const Tensor* dlogits, float label_smoothing) override {
    if (dlogits == nullptr) {
      return inner_->softmax_cross_entropy(Wide(*this, logits).tensor(), labels, scale, nullptr,
                                           label_smoothing);
    }
    Wide d_wide(*this, *dlogits, false);
    const LossStats s = inner_->softmax_cross_entropy(Wide(*this, logits).tensor(), labels, scale,
                                                      &d_wide.tensor(), label_smoothing);
    d_wide.store();
    return s;
  }
  // The optimizer's ops read and write f32 master state: passed through.
  void sgd_update(float* w, const float* g, float* velocity, int64_t count,
                  const SgdStep& step) override {
    inner_->sgd_update(w, g, velocity, count, step);
  }
  void adamw_update(float* w, const float* g, float* m, float* v, int64_t count,
                    const AdamWStep& step) override {
    inner_->adamw_update(w, g, m, v, count, step);
  }
  void moving_average(float* average, const float* x, int64_t count, float decay) override {
    inner_->moving_average(average, x, count, decay);
  }
  std::vector<double> sum_squares(const float* x, std::span<const int64_t> offsets) override {
    return inner_->sum_squares(x, offsets);
  }
  size_t sum_squares_scratch_bytes(size_t segments) override {
    return inner_->sum_squares_scratch_bytes(segments);
  }
  void scale(float* x, int64_t count, float alpha) override { inner_->scale(x, count, alpha); }
  bool all_finite(const float* x, int64_t count) override { return inner_->all_finite(x, count); }

  size_t relu_scratch_bytes(const TensorDesc& x) override {
    return inner_->relu_scratch_bytes(wide(x));
  }
  size_t pooling_scratch_bytes(const PoolParams& p, const TensorDesc& x,
                               const TensorDesc& y) override {
    return inner_->pooling_scratch_bytes(p, wide(x), wide(y));
  }
  size_t inner_product_scratch_bytes(const TensorDesc& x, int64_t out, bool bias) override {
    return inner_->inner_product_scratch_bytes(wide(x), out, bias);
  }
  size_t batch_norm_scratch_bytes(const TensorDesc& x, float eps) override {
    return inner_->batch_norm_scratch_bytes(wide(x), eps);
  }
  size_t add_scratch_bytes(const TensorDesc& a, const TensorDesc& b,
                           const TensorDesc& y) override {
    return inner_->add_scratch_bytes(wide(a), wide(b), wide(y));
  }
  size_t concat_scratch_bytes(std::span<const TensorDesc> xs, const TensorDesc& y) override {
    std::vector<TensorDesc> inputs;
    for (const TensorDesc& x : xs) inputs.push_back(wide(x));
    return inner_->concat_scratch_bytes(inputs, wide(y));
  }
  size_t softmax_scratch_bytes(const TensorDesc& logits) override {
    return inner_->softmax_scratch_bytes(wide(logits));
  }
  void reserve_scratch(size_t bytes) override { inner_->reserve_scratch(bytes); }
  size_t scratch_bytes() const override { return inner_->scratch_bytes(); }

 private:
  bool emulated(DataType type) const {
    return (type == DataType::kBF16 && emulated_bf16_) || (type == DataType::kF16 && emulated_f16_);
  }
  // The descriptor the wrapped backend computes on.
  TensorDesc wide(TensorDesc d) const {
    if (emulated(d.dtype)) d.dtype = DataType::kF32;
    return d;
  }
  ConvProblem wide(ConvProblem p) const {
    p.x = wide(p.x);
    p.y = wide(p.y);
    return p;
  }

  // A tensor as the wrapped backend computes on it: itself, or for an
  // emulated type its f32 twin (same shape and layout) in host memory,
  // loaded from it unless `load` is false; store() rounds the twin back.
  class Wide {
   public:
    Wide(const HalfEmulation& owner, const Tensor& t, bool load = true) : half_(t), wide_(t) {
      if (!owner.emulated(t.desc.dtype)) return;
      data_.resize(static_cast<size_t>(t.desc.storage_elements()));
      wide_ = {owner.wide(t.desc), data_.data()};
      if (load) widen(t.data, t.desc.dtype, t.desc.storage_elements(), data_.data());
    }
    const Tensor& tensor() const { return wide_; }
    void store() const {
      if (!data_.empty()) narrow(data_.data(), half_.desc.storage_elements(), half_.desc.dtype, half_.data);
    }

   private:
    Tensor half_;
    Tensor wide_;
    std::vector<float> data_;
  };

  // Weights or a bias an op reads (`count` elements of `type`, may be
  // null), widened where `type` is emulated.
  class WideArray {
   public:
    WideArray(const HalfEmulation& owner, const void* p, DataType type, int64_t count) : p_(p) {
      if (p == nullptr || !owner.emulated(type)) return;
      data_.resize(static_cast<size_t>(count));
      widen(p, type, count, data_.data());
      p_ = data_.data();
    }
    const void* data() const { return p_; }

   private:
    const void* p_;
    std::vector<float> data_;
  };

  std::unique_ptr<Backend> inner_;
  DeviceInfo info_;
  bool emulated_bf16_ = false;
  bool emulated_f16_ = false;
};

}  // namespace

bool half_emulation_requested() {
  const char* v = std::getenv(kEmulateHalfEnv);
  return v != nullptr && std::string(v) == "1";
}

std::unique_ptr<Backend> emulate_half(std::unique_ptr<Backend> inner) {
  return std::make_unique<HalfEmulation>(std::move(inner));
}

}  // namespace vtrain::worker
