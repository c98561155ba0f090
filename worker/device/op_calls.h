// The common op calls as functions of Tensors, each building its
// descriptor (ops.h) from the tensors and running it: for callers that hold
// tensors, not descriptors (the optimizer, the interpreter's gradient sums,
// the profiler's own network, tests). They add nothing a descriptor does not
// say; a layer that keeps its descriptor calls Backend::run() itself. A new
// op needs no function here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "worker/device/backend.h"

namespace vtrain::worker {

// ------------------------------------------------------------ convolution
// The backend's algorithms for `kind` of `p`, each with its workspace,
// `accumulate` where calls may run with beta 1.
inline std::vector<ConvAlgoInfo> conv_algorithms(Backend& b, ConvKind kind, const ConvProblem& p,
                                                 bool accumulate) {
  return b.conv_algorithms(ConvDesc{kind, p, 0, accumulate ? 1.0f : 0.0f});
}
inline void conv_forward(Backend& b, ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                         const void* w, const void* bias, const Tensor& y, float beta,
                         void* workspace, size_t workspace_bytes) {
  b.run(ConvDesc{ConvKind::kForward, p, algo, beta, bias != nullptr},
        ConvArgs{.x = x.data, .w = w, .bias = bias, .y = y.data, .workspace = workspace,
                 .workspace_bytes = workspace_bytes});
}
inline void conv_backward_data(Backend& b, ConvAlgo algo, const ConvProblem& p, const Tensor& dy,
                               const void* w, const Tensor& dx, float beta, void* workspace,
                               size_t workspace_bytes) {
  b.run(ConvDesc{ConvKind::kBackwardData, p, algo, beta},
        ConvArgs{.w = w, .dy = dy.data, .dx = dx.data, .workspace = workspace,
                 .workspace_bytes = workspace_bytes});
}
inline void conv_backward_filter(Backend& b, ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                                 const Tensor& dy, float* dw, float* dbias, float beta,
                                 void* workspace, size_t workspace_bytes) {
  b.run(ConvDesc{ConvKind::kBackwardFilter, p, algo, beta, dbias != nullptr},
        ConvArgs{.x = x.data, .dy = dy.data, .dw = dw, .dbias = dbias, .workspace = workspace,
                 .workspace_bytes = workspace_bytes});
}

// ------------------------------------------------------------- activation
inline void relu_forward(Backend& b, const Tensor& x, const Tensor& y) {
  b.run(ActivationDesc{.x = x.desc, .y = y.desc}, ActivationArgs{.x = x.data, .y = y.data});
}
inline void relu_backward(Backend& b, const Tensor& y, const Tensor& dy, const Tensor& dx) {
  b.run(ActivationDesc{.direction = Direction::kBackward, .y = y.desc, .dy = dy.desc, .dx = dx.desc},
        ActivationArgs{.y = y.data, .dy = dy.data, .dx = dx.data});
}
inline void bias_relu_forward(Backend& b, const Tensor& x, const void* bias, const Tensor& y) {
  b.run(ActivationDesc{.x = x.desc, .y = y.desc, .bias = true},
        ActivationArgs{.x = x.data, .y = y.data, .bias = bias});
}
inline void relu_backward_bias(Backend& b, const Tensor& y, const Tensor& dy, const Tensor& dx,
                               float* dbias) {
  b.run(ActivationDesc{.direction = Direction::kBackward,
                       .y = y.desc,
                       .dy = dy.desc,
                       .dx = dx.desc,
                       .bias = true},
        ActivationArgs{.y = y.data, .dy = dy.data, .dx = dx.data, .dbias = dbias});
}

// ----------------------------------------------------------- inner product
inline void inner_product_forward(Backend& b, const Tensor& x, const void* w, const void* bias,
                                  const Tensor& y) {
  b.run(InnerProductDesc{InnerProductKind::kForward, x.desc, y.desc, bias != nullptr},
        InnerProductArgs{.x = x.data, .w = w, .bias = bias, .y = y.data});
}
inline void inner_product_backward_data(Backend& b, const Tensor& dy, const void* w,
                                        const Tensor& dx) {
  b.run(InnerProductDesc{InnerProductKind::kBackwardData, dx.desc, dy.desc},
        InnerProductArgs{.w = w, .dy = dy.data, .dx = dx.data});
}
inline void inner_product_backward_weights(Backend& b, const Tensor& x, const Tensor& dy,
                                           float* dw, float* dbias, float beta) {
  b.run(InnerProductDesc{InnerProductKind::kBackwardWeights, x.desc, dy.desc, dbias != nullptr,
                         beta},
        InnerProductArgs{.x = x.data, .dy = dy.data, .dw = dw, .dbias = dbias});
}

// ------------------------------------------------------------- elementwise
inline void add(Backend& b, const Tensor& x0, const Tensor& x1, const Tensor& y) {
  b.run(BinaryDesc{BinaryKind::kAdd, x0.desc, x1.desc, y.desc},
        BinaryArgs{.a = x0.data, .b = x1.data, .y = y.data});
}
inline void accumulate(Backend& b, const Tensor& x, const Tensor& y, float beta) {
  b.run(BinaryDesc{BinaryKind::kAccumulate, x.desc, y.desc, y.desc, beta},
        BinaryArgs{.a = x.data, .y = y.data});
}
// y = a * b + beta * y (b shaped like a, or {n, c, 1, 1} broadcast):
// BinaryKind kMul.
inline void mul(Backend& b, const Tensor& x0, const Tensor& x1, const Tensor& y,
                float beta = 0.0f) {
  b.run(BinaryDesc{BinaryKind::kMul, x0.desc, x1.desc, y.desc, beta},
        BinaryArgs{.a = x0.data, .b = x1.data, .y = y.data});
}
// The gradient of mul's factor b, given y = a * b: db = dy * a + beta * db
// where b is shaped like a (kMul), else summed over H and W into b's
// {n, c, 1, 1} (kMulSum). The one place that chooses between the two.
inline BinaryDesc mul_factor_gradient_desc(const TensorDesc& dy, const TensorDesc& a,
                                           const TensorDesc& db, float beta = 0.0f) {
  const BinaryKind kind = db.shape == a.shape ? BinaryKind::kMul : BinaryKind::kMulSum;
  return BinaryDesc{kind, dy, a, db, beta};
}
inline void mul_factor_gradient(Backend& b, const Tensor& dy, const Tensor& a, const Tensor& db,
                                float beta = 0.0f) {
  b.run(mul_factor_gradient_desc(dy.desc, a.desc, db.desc, beta),
        BinaryArgs{.a = dy.data, .b = a.data, .y = db.data});
}
inline void concat_forward(Backend& b, std::span<const Tensor> xs, const Tensor& y) {
  ConcatDesc desc{.y = y.desc};
  std::vector<void*> data;
  for (const Tensor& x : xs) {
    desc.xs.push_back(x.desc);
    data.push_back(x.data);
  }
  b.run(desc, ConcatArgs{.xs = data, .y = y.data});
}
inline void concat_backward(Backend& b, const Tensor& dy, int64_t channel_offset,
                            const Tensor& dx, float beta) {
  b.run(ConcatDesc{Direction::kBackward, {dx.desc}, dy.desc, channel_offset, beta},
        ConcatArgs{.dy = dy.data, .dx = dx.data});
}

// ---------------------------------------------------------------- the loss
inline LossStats softmax_cross_entropy(Backend& b, const Tensor& logits, const int32_t* labels,
                                       float scale, const Tensor* dlogits,
                                       float label_smoothing = 0.0f) {
  LossStats stats;
  b.run(SoftmaxCrossEntropyDesc{logits.desc, dlogits != nullptr, scale, label_smoothing},
        SoftmaxCrossEntropyArgs{logits.data, labels, dlogits ? dlogits->data : nullptr, &stats});
  return stats;
}

// ------------------------------------------------ optimizers and reductions
inline std::vector<double> sum_squares(Backend& b, const float* x,
                                       std::span<const int64_t> offsets) {
  std::vector<double> sums;
  b.run(SumSquaresDesc{offsets.empty() ? 0 : offsets.size() - 1},
        SumSquaresArgs{x, offsets, &sums});
  return sums;
}
inline bool all_finite(Backend& b, const float* x, int64_t count) {
  bool finite = false;
  b.run(AllFiniteDesc{count}, AllFiniteArgs{x, &finite});
  return finite;
}

}  // namespace vtrain::worker
