// Naive reference implementations of every Backend op, on plain NCHW (OIHW
// for weights) float vectors in host memory, computed in double where it
// matters. They are the oracle the backends are tested against: written for
// obviousness, not speed.
//
// Half precision: an op "in type T" is the reference op run on inputs
// rounded(T, ...) and its outputs of type T rounded(T, ...) too: what a
// backend that stores T and accumulates in f32 computes, up to the
// accumulation's rounding (outputs that are always f32, such as weight
// gradients and batch-norm statistics, are not rounded).
#pragma once

#include <cstdint>
#include <vector>

#include "common/precision.h"
#include "worker/device/backend.h"

namespace vtrain::reference {

using worker::ConvProblem;
using worker::PoolDesc;
using worker::Shape;
using Vec = std::vector<float>;

// v with every element rounded to the nearest value of `type` (ties to
// even, as the devices round; v itself for kF32).
Vec rounded(common::DataType type, Vec v);

// y = conv(x, w) + bias (bias may be empty). Shapes from p (layouts ignored);
// p.groups > 1 is the grouped convolution below.
Vec conv_forward(const ConvProblem& p, const Vec& x, const Vec& w, const Vec& bias);
Vec conv_backward_data(const ConvProblem& p, const Vec& dy, const Vec& w);
// Returns dw; fills dbias (k entries) if non-null.
Vec conv_backward_filter(const ConvProblem& p, const Vec& x, const Vec& dy, Vec* dbias);

Vec relu_forward(const Vec& x);
Vec relu_backward(const Vec& y, const Vec& dy);
// relu(x + bias[c]) over NCHW `shape`, the sum rounded to `type` first.
Vec bias_relu_forward(common::DataType type, const Shape& shape, const Vec& x, const Vec& bias);
// Per channel, the sum of x over n, h and w (NCHW `shape`), in double.
Vec channel_sums(const Shape& shape, const Vec& x);

// Max pooling ties pick the first maximum in row-major window order; average
// pooling divides by the number of window elements inside the input.
Vec pooling_forward(const PoolDesc& p, const Shape& x_shape, const Vec& x);
Vec pooling_backward(const PoolDesc& p, const Shape& x_shape, const Vec& x, const Vec& dy);

// w is {out, in} with in = x.c * x.h * x.w.
Vec inner_product_forward(const Shape& x_shape, const Vec& x, int64_t out, const Vec& w,
                          const Vec& bias);
Vec inner_product_backward_data(const Shape& x_shape, int64_t out, const Vec& dy, const Vec& w);
Vec inner_product_backward_weights(const Shape& x_shape, int64_t out, const Vec& x,
                                   const Vec& dy, Vec* dbias);

struct BatchNormForward {
  Vec y;
  Vec mean;  // batch mean per channel
  Vec var;   // biased batch variance per channel
};
BatchNormForward batch_norm_forward_training(const Shape& s, const Vec& x, const Vec& gamma,
                                             const Vec& beta, float eps);
Vec batch_norm_forward_inference(const Shape& s, const Vec& x, const Vec& gamma, const Vec& beta,
                                 const Vec& mean, const Vec& var, float eps);
struct BatchNormBackward {
  Vec dx;
  Vec dgamma;
  Vec dbeta;
};
BatchNormBackward batch_norm_backward(const Shape& s, const Vec& x, const Vec& dy,
                                      const Vec& gamma, const Vec& mean, const Vec& var,
                                      float eps);

Vec add(const Vec& a, const Vec& b);

// ------------------------------------------------ the layers of issue 43

// The element-wise activations, as functions of double: f(x) and f'(x).
// gelu is the erf form, x * Phi(x) (PyTorch's default, not its tanh
// approximation).
enum class Activation { kSilu, kGelu, kSigmoid, kRelu6 };
double activation(Activation f, double x);
double activation_derivative(Activation f, double x);
// y = f(x) and dx = f'(x) * dy, element by element.
Vec activation_forward(Activation f, const Vec& x);
Vec activation_backward(Activation f, const Vec& x, const Vec& dy);

// y = a * b; b is shaped like a, or one value per sample and channel
// (b_shape = n x c x 1 x 1), broadcast over H and W.
Vec mul_forward(const Shape& a_shape, const Shape& b_shape, const Vec& a, const Vec& b);
struct MulBackward {
  Vec da;  // dy * b
  Vec db;  // dy * a, summed over H and W when b is broadcast
};
MulBackward mul_backward(const Shape& a_shape, const Shape& b_shape, const Vec& a, const Vec& b,
                         const Vec& dy);

// Convolution with `groups` groups (in place of p.groups): output channel k
// reads only input channels of its group, g = k / (p.k / groups), with
// weights {p.k, p.x.shape.c / groups, r, s}. groups = 1 is conv_forward.
Vec grouped_conv_forward(const ConvProblem& p, int64_t groups, const Vec& x, const Vec& w,
                         const Vec& bias);
Vec grouped_conv_backward_data(const ConvProblem& p, int64_t groups, const Vec& dy, const Vec& w);
// Returns dw; fills dbias (k entries) if non-null.
Vec grouped_conv_backward_filter(const ConvProblem& p, int64_t groups, const Vec& x,
                                 const Vec& dy, Vec* dbias);

// Inverted dropout with a given mask (keep[i] 1 or 0): y = x * keep / (1 - p).
// Its backward is the same map applied to dy.
Vec dropout_apply(const Vec& x, const std::vector<uint8_t>& keep, float p);
// Concatenation along channels of NCHW tensors with equal n, h, w.
Vec concat(const std::vector<Shape>& shapes, const std::vector<Vec>& xs);
std::vector<Vec> concat_backward(const std::vector<Shape>& shapes, const Vec& dy);

// With label smoothing s the target is q = (1 - s) * onehot + s / classes.
struct SoftmaxXent {
  double loss_sum = 0;  // sum over samples of -sum_j q[j] log softmax[j]
  int64_t correct = 0;
  Vec dlogits;  // (softmax - q) * scale
};
SoftmaxXent softmax_cross_entropy(int64_t n, int64_t classes, const Vec& logits,
                                  const std::vector<int32_t>& labels, float scale,
                                  float label_smoothing = 0.0f);

// In place, as SgdStep and AdamWStep (worker/device/backend.h) say, in
// float arithmetic in that order (a backend's kernel rounds the same way).
void sgd_update(Vec& w, const Vec& g, Vec& v, const worker::SgdStep& step);
void adamw_update(Vec& w, const Vec& g, Vec& m, Vec& v, const worker::AdamWStep& step);
// average += (1 - decay) * (x - average).
void moving_average(Vec& average, const Vec& x, float decay);
// Per segment [offsets[i], offsets[i + 1]): the sum of x^2, in double.
std::vector<double> sum_squares(const Vec& x, const std::vector<int64_t>& offsets);

}  // namespace vtrain::reference
