// TEST ONLY (see half_emulation.h): half storage, f32 compute, on a
// backend that lacks the half type.
#include "worker/device/test_only/half_emulation.h"

#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/half_convert.h"
#include "worker/device/op_table.h"

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

  // ------------------------------------------------------------ the ops
  // Descriptors of emulated types are asked of the wrapped backend in f32;
  // run() passes a call through untouched unless its tensors are of an
  // emulated type, and otherwise intercepts it in the kernels below
  // (op_table.h), each widening, running the wrapped op, and rounding.
  std::optional<std::string> supports(const OpDesc& op) const override {
    return inner_->supports(wide(op));
  }
  bool prefers(const OpDesc& op) const override { return inner_->prefers(wide(op)); }
  OpBytes scratch_bytes(const OpDesc& op) override { return inner_->scratch_bytes(wide(op)); }
  std::vector<ConvAlgoInfo> conv_algorithms(const ConvDesc& op) override {
    return inner_->conv_algorithms(std::get<ConvDesc>(wide(op)));
  }
  std::string conv_algorithm_name(ConvKind kind, ConvAlgo algo) const override {
    return inner_->conv_algorithm_name(kind, algo);
  }
  void run(const OpDesc& op, const OpArgs& args) override {
    bool any = false;
    for_each_tensor_desc(op, [&](const TensorDesc& d) { any = any || emulated(d.dtype); });
    if (!any) return inner_->run(op, args);
    run_op(*this, op, args);
  }
  void reserve_scratch(size_t bytes) override { inner_->reserve_scratch(bytes); }
  size_t scratch_reserved() const override { return inner_->scratch_reserved(); }

  // The kernels op_table.h calls for emulated calls.
  void conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const void* w,
                    const void* bias, const Tensor& y, float beta, void* workspace,
                    size_t workspace_bytes) {
    const DataType t = x.desc.dtype;
    Wide y_wide(*this, y, beta != 0);
    const WideArray w_wide(*this, w, t, p.weight_shape().elements());
    const WideArray bias_wide(*this, bias, t, p.k);
    inner_->run(ConvDesc{ConvKind::kForward, wide(p), algo, beta, bias != nullptr},
                ConvArgs{.x = Wide(*this, x).tensor().data,
                         .w = w_wide.data(),
                         .bias = bias_wide.data(),
                         .y = y_wide.tensor().data,
                         .workspace = workspace,
                         .workspace_bytes = workspace_bytes});
    y_wide.store();
  }
  void conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy, const void* w,
                          const Tensor& dx, float beta, void* workspace,
                          size_t workspace_bytes) {
    Wide dx_wide(*this, dx, beta != 0);
    const WideArray w_wide(*this, w, dy.desc.dtype, p.weight_shape().elements());
    inner_->run(ConvDesc{ConvKind::kBackwardData, wide(p), algo, beta},
                ConvArgs{.w = w_wide.data(),
                         .dy = Wide(*this, dy).tensor().data,
                         .dx = dx_wide.tensor().data,
                         .workspace = workspace,
                         .workspace_bytes = workspace_bytes});
    dx_wide.store();
  }
  void conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                            const Tensor& dy, float* dw, float* dbias, float beta,
                            void* workspace, size_t workspace_bytes) {
    inner_->run(ConvDesc{ConvKind::kBackwardFilter, wide(p), algo, beta, dbias != nullptr},
                ConvArgs{.x = Wide(*this, x).tensor().data,
                         .dy = Wide(*this, dy).tensor().data,
                         .dw = dw,
                         .dbias = dbias,
                         .workspace = workspace,
                         .workspace_bytes = workspace_bytes});
  }

  void relu_forward(const Tensor& x, const Tensor& y) { bias_relu_forward(x, nullptr, y); }
  // Forward with or without the bias (null).
  void bias_relu_forward(const Tensor& x, const void* bias, const Tensor& y) {
    Wide y_wide(*this, y, false);
    const Wide x_wide(*this, x);
    const WideArray bias_wide(*this, bias, x.desc.dtype, x.shape().c);
    inner_->run(ActivationDesc{.x = x_wide.tensor().desc,
                               .y = y_wide.tensor().desc,
                               .bias = bias != nullptr},
                ActivationArgs{.x = x_wide.tensor().data, .y = y_wide.tensor().data,
                               .bias = bias_wide.data()});
    y_wide.store();
  }
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
    relu_backward_bias(y, dy, dx, nullptr);
  }
  // Backward with or without the bias gradient (null).
  void relu_backward_bias(const Tensor& y, const Tensor& dy, const Tensor& dx, float* dbias) {
    const Wide dy_wide(*this, dy);
    Wide dx_wide(*this, dx, false);
    const Wide y_wide(*this, y);
    inner_->run(ActivationDesc{.direction = Direction::kBackward,
                               .y = y_wide.tensor().desc,
                               .dy = dy_wide.tensor().desc,
                               .dx = dx_wide.tensor().desc,
                               .bias = dbias != nullptr},
                ActivationArgs{.y = y_wide.tensor().data,
                               .dy = dy_wide.tensor().data,
                               .dx = dx_wide.tensor().data,
                               .dbias = dbias});
    dx_wide.store();
  }

  // silu, gelu, sigmoid, relu6: the backward reads x.
  void activation_forward(ActivationKind kind, const Tensor& x, const Tensor& y) {
    Wide y_wide(*this, y, false);
    const Wide x_wide(*this, x);
    inner_->run(ActivationDesc{.kind = kind, .x = x_wide.tensor().desc, .y = y_wide.tensor().desc},
                ActivationArgs{.x = x_wide.tensor().data, .y = y_wide.tensor().data});
    y_wide.store();
  }
  void activation_backward(ActivationKind kind, const Tensor& x, const Tensor& dy,
                           const Tensor& dx) {
    const Wide dy_wide(*this, dy);
    Wide dx_wide(*this, dx, false);
    const Wide x_wide(*this, x);
    inner_->run(ActivationDesc{.kind = kind,
                               .direction = Direction::kBackward,
                               .x = x_wide.tensor().desc,
                               .dy = dy_wide.tensor().desc,
                               .dx = dx_wide.tensor().desc},
                ActivationArgs{.x = x_wide.tensor().data,
                               .dy = dy_wide.tensor().data,
                               .dx = dx_wide.tensor().data});
    dx_wide.store();
  }

  void pooling_forward(const PoolDesc& p, const Tensor& x, const Tensor& y, void* state) {
    Wide y_wide(*this, y, false);
    const Wide x_wide(*this, x);
    inner_->run(PoolDesc{p.kind, Direction::kForward, x_wide.tensor().desc, y_wide.tensor().desc,
                         p.window},
                PoolArgs{.x = x_wide.tensor().data, .y = y_wide.tensor().data, .state = state});
    y_wide.store();
  }
  void pooling_backward(const PoolDesc& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor& dx, const void* state) {
    Wide dx_wide(*this, dx, false);
    const Wide x_wide(*this, x), y_wide(*this, y), dy_wide(*this, dy);
    inner_->run(PoolDesc{p.kind, Direction::kBackward, x_wide.tensor().desc,
                         y_wide.tensor().desc, p.window, dy_wide.tensor().desc,
                         dx_wide.tensor().desc},
                PoolArgs{.x = x_wide.tensor().data,
                         .y = y_wide.tensor().data,
                         .dy = dy_wide.tensor().data,
                         .dx = dx_wide.tensor().data,
                         .state = const_cast<void*>(state)});
    dx_wide.store();
  }

  void inner_product_forward(const Tensor& x, const void* w, const void* bias, const Tensor& y) {
    const int64_t out = y.shape().c;
    const DataType t = x.desc.dtype;
    Wide y_wide(*this, y, false);
    const Wide x_wide(*this, x);
    const WideArray w_wide(*this, w, t, out * x.shape().per_sample());
    const WideArray bias_wide(*this, bias, t, out);
    inner_->run(InnerProductDesc{InnerProductKind::kForward, x_wide.tensor().desc,
                                 y_wide.tensor().desc, bias != nullptr},
                InnerProductArgs{.x = x_wide.tensor().data,
                                 .w = w_wide.data(),
                                 .bias = bias_wide.data(),
                                 .y = y_wide.tensor().data});
    y_wide.store();
  }
  void inner_product_backward_data(const Tensor& dy, const void* w, const Tensor& dx) {
    const int64_t weights = dy.shape().c * dx.shape().per_sample();
    Wide dx_wide(*this, dx, false);
    const Wide dy_wide(*this, dy);
    const WideArray w_wide(*this, w, dy.desc.dtype, weights);
    inner_->run(InnerProductDesc{InnerProductKind::kBackwardData, dx_wide.tensor().desc,
                                 dy_wide.tensor().desc},
                InnerProductArgs{.w = w_wide.data(),
                                 .dy = dy_wide.tensor().data,
                                 .dx = dx_wide.tensor().data});
    dx_wide.store();
  }
  void inner_product_backward_weights(const Tensor& x, const Tensor& dy, float* dw, float* dbias,
                                      float beta) {
    const Wide x_wide(*this, x), dy_wide(*this, dy);
    inner_->run(InnerProductDesc{InnerProductKind::kBackwardWeights, x_wide.tensor().desc,
                                 dy_wide.tensor().desc, dbias != nullptr, beta},
                InnerProductArgs{.x = x_wide.tensor().data,
                                 .dy = dy_wide.tensor().data,
                                 .dw = dw,
                                 .dbias = dbias});
  }

  void batch_norm_forward_training(const Tensor& x, const Tensor& y, const float* scale_shift,
                                   float* save_mean, float* save_var, float* running_mean,
                                   float* running_var, float momentum, float eps) {
    Wide y_wide(*this, y, false);
    const Wide x_wide(*this, x);
    inner_->run(BatchNormDesc{BatchNormKind::kForwardTraining, x_wide.tensor().desc, eps, momentum,
                              0.0f, y_wide.tensor().desc},
                BatchNormArgs{.x = x_wide.tensor().data,
                              .y = y_wide.tensor().data,
                              .scale_shift = scale_shift,
                              .mean = save_mean,
                              .var = save_var,
                              .running_mean = running_mean,
                              .running_var = running_var});
    y_wide.store();
  }
  void batch_norm_forward_inference(const Tensor& x, const Tensor& y, const float* scale_shift,
                                    const float* mean, const float* var, float eps) {
    Wide y_wide(*this, y, false);
    const Wide x_wide(*this, x);
    inner_->run(BatchNormDesc{BatchNormKind::kForwardInference, x_wide.tensor().desc, eps, 0.0f,
                              0.0f, y_wide.tensor().desc},
                BatchNormArgs{.x = x_wide.tensor().data,
                              .y = y_wide.tensor().data,
                              .scale_shift = scale_shift,
                              .mean = const_cast<float*>(mean),
                              .var = const_cast<float*>(var)});
    y_wide.store();
  }
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const float* scale_shift,
                           const float* save_mean, const float* save_var, const Tensor& dx,
                           float* dscale_shift, float beta, float eps) {
    const Wide dy_wide(*this, dy), x_wide(*this, x);
    Wide dx_wide(*this, dx, false);
    inner_->run(BatchNormDesc{BatchNormKind::kBackward, x_wide.tensor().desc, eps, 0.0f, beta, {},
                              dy_wide.tensor().desc, dx_wide.tensor().desc},
                BatchNormArgs{.x = x_wide.tensor().data,
                              .dy = dy_wide.tensor().data,
                              .dx = dx_wide.tensor().data,
                              .scale_shift = scale_shift,
                              .mean = const_cast<float*>(save_mean),
                              .var = const_cast<float*>(save_var),
                              .dscale_shift = dscale_shift});
    dx_wide.store();
  }
  std::vector<double> batch_norm_sums(const Tensor& x) {
    const Wide x_wide(*this, x);
    std::vector<double> sums;
    inner_->run(BatchNormDesc{BatchNormKind::kSums, x_wide.tensor().desc},
                BatchNormArgs{.x = x_wide.tensor().data, .sums = &sums});
    return sums;
  }
  std::vector<double> batch_norm_backward_sums(const Tensor& x, const Tensor& dy,
                                               const float* mean, const float* var, float eps) {
    const Wide x_wide(*this, x), dy_wide(*this, dy);
    std::vector<double> sums;
    inner_->run(BatchNormDesc{BatchNormKind::kBackwardSums, x_wide.tensor().desc, eps, 0.0f, 0.0f,
                              {}, dy_wide.tensor().desc},
                BatchNormArgs{.x = x_wide.tensor().data,
                              .dy = dy_wide.tensor().data,
                              .mean = const_cast<float*>(mean),
                              .var = const_cast<float*>(var),
                              .sums = &sums});
    return sums;
  }
  void batch_norm_backward_data(const Tensor& x, const Tensor& dy, const float* scale_shift,
                                const float* mean, const float* var, const float* dy_means,
                                const Tensor& dx, float eps) {
    const Wide dy_wide(*this, dy), x_wide(*this, x);
    Wide dx_wide(*this, dx, false);
    inner_->run(BatchNormDesc{BatchNormKind::kBackwardData, x_wide.tensor().desc, eps, 0.0f, 0.0f,
                              {}, dy_wide.tensor().desc, dx_wide.tensor().desc},
                BatchNormArgs{.x = x_wide.tensor().data,
                              .dy = dy_wide.tensor().data,
                              .dx = dx_wide.tensor().data,
                              .scale_shift = scale_shift,
                              .mean = const_cast<float*>(mean),
                              .var = const_cast<float*>(var),
                              .dy_means = dy_means});
    dx_wide.store();
  }

  void add(const Tensor& a, const Tensor& b, const Tensor& y) {
    const Wide a_wide(*this, a), b_wide(*this, b);
    Wide y_wide(*this, y, false);
    inner_->run(BinaryDesc{BinaryKind::kAdd, a_wide.tensor().desc, b_wide.tensor().desc,
                           y_wide.tensor().desc},
                BinaryArgs{a_wide.tensor().data, b_wide.tensor().data, y_wide.tensor().data});
    y_wide.store();
  }
  void accumulate(const Tensor& x, const Tensor& y, float beta) {
    const Wide x_wide(*this, x);
    Wide y_wide(*this, y, beta != 0);
    inner_->run(BinaryDesc{BinaryKind::kAccumulate, x_wide.tensor().desc, y_wide.tensor().desc,
                           y_wide.tensor().desc, beta},
                BinaryArgs{.a = x_wide.tensor().data, .y = y_wide.tensor().data});
    y_wide.store();
  }
  void mul(const Tensor& a, const Tensor& b, const Tensor& y, float beta) {
    wide_product(BinaryKind::kMul, a, b, y, beta);
  }
  void mul_sum(const Tensor& a, const Tensor& b, const Tensor& y, float beta) {
    wide_product(BinaryKind::kMulSum, a, b, y, beta);
  }
  // kMul or kMulSum in f32; y widened first where beta adds to it.
  void wide_product(BinaryKind kind, const Tensor& a, const Tensor& b, const Tensor& y,
                    float beta) {
    const Wide a_wide(*this, a), b_wide(*this, b);
    Wide y_wide(*this, y, beta != 0);
    inner_->run(BinaryDesc{kind, a_wide.tensor().desc, b_wide.tensor().desc,
                           y_wide.tensor().desc, beta},
                BinaryArgs{a_wide.tensor().data, b_wide.tensor().data, y_wide.tensor().data});
    y_wide.store();
  }
  void concat_forward(std::span<const Tensor> xs, const Tensor& y) {
    std::vector<Wide> wides;
    wides.reserve(xs.size());
    ConcatDesc desc;
    std::vector<void*> inputs;
    for (const Tensor& x : xs) {
      const Tensor& t = wides.emplace_back(*this, x).tensor();
      desc.xs.push_back(t.desc);
      inputs.push_back(t.data);
    }
    Wide y_wide(*this, y, false);
    desc.y = y_wide.tensor().desc;
    inner_->run(desc, ConcatArgs{.xs = inputs, .y = y_wide.tensor().data});
    y_wide.store();
  }
  void concat_backward(const Tensor& dy, int64_t channel_offset, const Tensor& dx, float beta) {
    Wide dx_wide(*this, dx, beta != 0);
    const Wide dy_wide(*this, dy);
    inner_->run(ConcatDesc{Direction::kBackward, {dx_wide.tensor().desc}, dy_wide.tensor().desc,
                           channel_offset, beta},
                ConcatArgs{.dy = dy_wide.tensor().data, .dx = dx_wide.tensor().data});
    dx_wide.store();
  }
  LossStats softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float scale,
                                  const Tensor* dlogits, float label_smoothing) {
    const Wide logits_wide(*this, logits);
    std::optional<Wide> d_wide;
    if (dlogits) d_wide.emplace(*this, *dlogits, false);
    LossStats stats;
    inner_->run(SoftmaxCrossEntropyDesc{logits_wide.tensor().desc, dlogits != nullptr, scale,
                                        label_smoothing},
                SoftmaxCrossEntropyArgs{logits_wide.tensor().data, labels,
                                        d_wide ? d_wide->tensor().data : nullptr, &stats});
    if (d_wide) d_wide->store();
    return stats;
  }
  // The mask is drawn from the key on the wrapped backend, in f32.
  void dropout(const DropoutDesc& d, const Tensor& in, const Tensor& out) {
    const Wide in_wide(*this, in);
    Wide out_wide(*this, out, false);
    DropoutDesc wide_desc = d;
    wide_desc.x = in_wide.tensor().desc;
    const bool forward = d.direction == Direction::kForward;
    inner_->run(wide_desc, DropoutArgs{.x = forward ? in_wide.tensor().data : nullptr,
                                       .y = forward ? out_wide.tensor().data : nullptr,
                                       .dy = forward ? nullptr : in_wide.tensor().data,
                                       .dx = forward ? nullptr : out_wide.tensor().data});
    out_wide.store();
  }
  // The optimizers' ops read and write f32 master state and have no tensor
  // of a half type: run() passes them through before the table is reached.
  void sgd_update(float* w, const float* g, float* velocity, int64_t count, const SgdStep& step) {
    inner_->run(SgdDesc{count, step}, SgdArgs{w, g, velocity});
  }
  void adamw_update(float* w, const float* g, float* m, float* v, int64_t count,
                    const AdamWStep& step) {
    inner_->run(AdamWDesc{count, step}, AdamWArgs{w, g, m, v});
  }
  void moving_average(float* average, const float* x, int64_t count, float decay) {
    inner_->run(MovingAverageDesc{count, decay}, MovingAverageArgs{average, x});
  }
  void scale(float* x, int64_t count, float alpha) {
    inner_->run(ScaleDesc{count, alpha}, ScaleArgs{x});
  }
  std::vector<double> sum_squares(const float* x, std::span<const int64_t> offsets) {
    std::vector<double> sums;
    inner_->run(SumSquaresDesc{offsets.size() - 1}, SumSquaresArgs{x, offsets, &sums});
    return sums;
  }
  bool all_finite(const float* x, int64_t count) {
    bool finite = false;
    inner_->run(AllFiniteDesc{count}, AllFiniteArgs{x, &finite});
    return finite;
  }

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
  OpDesc wide(OpDesc op) const {
    for_each_tensor_desc(op, [&](TensorDesc& d) { d = wide(d); });
    return op;
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
